-- durable-store-postgres, schema version 22: a child's result kept for its parent never reaches
-- another run given the parent's id.
--
-- A child's result goes to its parent's wait at the child's seq (`child:<parent>:<seq>`); with no
-- wait yet it is buffered, as any signal is. A parent that was cancelled (or completed without
-- joining the child) never takes it, and `delete_run` kept it: a run started later with the same
-- id (ids are the callers' idempotency keys) took it for the result of its own child at that seq,
-- and its real child's result was buffered in turn.
--
-- * `send_signal` drops a child's result whose parent is gone, completed or cancelled (a failed
--   or dead parent may be retried, and waits for it then): nothing is written, and the answer is
--   still "buffered" (NULL).
-- * `delete_run` deletes the buffered results of the removed runs' children too, after the runs
--   (so a child's settle that committed first, under its row lock, is seen by the purge).
-- * The results an older build buffered for parents that are gone, completed or cancelled are
--   deleted now, by the same rule.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

CREATE OR REPLACE FUNCTION __SCHEMA__.send_signal(p_token text, p_payload text, p_now bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_run text;
    v_seq bigint;
    v_name text;
    v_parent text;
BEGIN
    PERFORM pg_advisory_xact_lock(__SCHEMA__.lock_key('signal', p_token));
    -- Under the token's lock nobody else takes or adds waiters of this token; a waiter another
    -- transaction is removing (a timeout, a settle) is skipped by FOR UPDATE once it is gone.
    DELETE FROM __SCHEMA__.waiters
     WHERE wid = (SELECT w.wid FROM __SCHEMA__.waiters AS w
                   WHERE w.kind = 'signal' AND w.key = p_token ORDER BY w.wid LIMIT 1 FOR UPDATE)
    RETURNING run_id, seq, name INTO v_run, v_seq, v_name;
    IF FOUND THEN
        PERFORM __SCHEMA__.resolve(v_run, v_seq, v_name, 'signal', p_payload, p_now);
        RETURN jsonb_build_object('run', v_run, 'seq', v_seq);
    END IF;
    IF starts_with(p_token, 'child:') THEN
        v_parent := substring(p_token FROM '^child:(.+):[0-9]+$');
        IF v_parent IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM __SCHEMA__.runs AS r WHERE r.id = v_parent AND r.status NOT IN ('completed', 'cancelled')) THEN
            RETURN NULL;
        END IF;
    END IF;
    INSERT INTO __SCHEMA__.buffered_signals (token, payload, created_at) VALUES (p_token, p_payload, p_now);
    RETURN NULL;
END
$$;

-- `delete_run` of version 8, deleting the buffered results of the removed runs' children last.
CREATE OR REPLACE FUNCTION __SCHEMA__.delete_run(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_doomed text[];
    v_id text;
    v_count bigint;
BEGIN
    v_doomed := ARRAY(
        WITH RECURSIVE d (id, depth, path) AS (
            SELECT r.id, 0, ARRAY[r.id] FROM __SCHEMA__.runs AS r WHERE r.id = p ->> 'id'
            UNION ALL
            SELECT r.id, d.depth + 1, d.path || r.id FROM __SCHEMA__.runs AS r JOIN d ON r.parent_id = d.id
             WHERE NOT (r.id = ANY (d.path)))
        SELECT d.id FROM d ORDER BY d.depth, d.path);
    IF cardinality(v_doomed) = 0 THEN
        RETURN jsonb_build_object('deleted', 0);
    END IF;
    PERFORM __SCHEMA__.lock_keys(ARRAY(
        SELECT __SCHEMA__.lock_key(w.kind, w.key) FROM __SCHEMA__.waiters AS w WHERE w.run_id = ANY (v_doomed)));
    IF EXISTS (SELECT 1 FROM __SCHEMA__.admission_slots AS s WHERE s.run_id = ANY (v_doomed))
       OR EXISTS (SELECT 1 FROM __SCHEMA__.admission_waiters AS w WHERE w.run_id = ANY (v_doomed)) THEN
        PERFORM __SCHEMA__.admission_lock(ARRAY(
            SELECT s.gate FROM __SCHEMA__.admission_slots AS s WHERE s.run_id = ANY (v_doomed)
            UNION SELECT w.gate FROM __SCHEMA__.admission_waiters AS w WHERE w.run_id = ANY (v_doomed)));
        FOREACH v_id IN ARRAY v_doomed LOOP
            PERFORM __SCHEMA__.admission_wake(__SCHEMA__.admission_release_run(v_id, 0), NULL);
        END LOOP;
    END IF;
    DELETE FROM __SCHEMA__.checkpoints WHERE run_id = ANY (v_doomed);
    DELETE FROM __SCHEMA__.waiters WHERE run_id = ANY (v_doomed);
    DELETE FROM __SCHEMA__.run_state WHERE run_id = ANY (v_doomed);
    DELETE FROM __SCHEMA__.tasks WHERE run_id = ANY (v_doomed);
    DELETE FROM __SCHEMA__.runs WHERE id = ANY (v_doomed);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    -- The removed runs' `child:<id>:<digits>` tokens (one pass over the buffered signals: the
    -- token index follows the database's collation, which may not order by bytes).
    DELETE FROM __SCHEMA__.buffered_signals AS b
     WHERE starts_with(b.token, 'child:') AND substring(b.token FROM '^child:(.+):[0-9]+$') = ANY (v_doomed);
    RETURN jsonb_build_object('deleted', v_count);
END
$$;

DELETE FROM __SCHEMA__.buffered_signals AS b
 WHERE starts_with(b.token, 'child:')
   AND substring(b.token FROM '^child:(.+):[0-9]+$') IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.runs AS r
                    WHERE r.id = substring(b.token FROM '^child:(.+):[0-9]+$')
                      AND r.status NOT IN ('completed', 'cancelled'));
