-- durable-store-postgres, schema version 4: the same `commit`, and progress resets the recovery
-- count. A commit that carries checkpoints or a turn end (other than a settle to `dead`, which
-- is how an engine buries a run recovered too many times in a row), applied while the run is
-- `running`, sets the run's `recovery_attempts` to 0, so the count is of consecutive recoveries
-- without progress rather than of every recovery in the run's life. The reset is part of the
-- UPDATE of the run row each kind of commit already makes (the lease check of a commit that
-- does not end the turn, the suspend or its `woken` fallback, the settle): no extra statement.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

-- Applies one Commit: `{"woken", "settled", "deliveries", "raced"}` or `{"err": ...}`.
CREATE OR REPLACE FUNCTION __SCHEMA__.commit(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_run text := p ->> 'run';
    v_owner text := p ->> 'owner';
    v_now bigint := (p ->> 'now')::bigint;
    v_end jsonb := CASE WHEN jsonb_typeof(p -> 'end') = 'object' THEN p -> 'end' END;
    v_status text;
    v_raced bigint[] := '{}';
    v_seq bigint;
    v_item jsonb;
    v_deliveries jsonb := '[]'::jsonb;
    v_woken boolean := false;
    v_settled boolean := false;
    v_has_waits boolean := p -> 'waits' <> '[]'::jsonb;
    v_has_signals boolean := p -> 'signals' <> '[]'::jsonb;
    -- Progress (checkpoints, or a turn end other than a burial) resets `recovery_attempts` of a
    -- running run.
    v_progress boolean := (p -> 'checkpoints' <> '[]'::jsonb OR v_end IS NOT NULL)
                          AND COALESCE(v_end ->> 'status', '') <> 'dead';
BEGIN
    -- 1. The advisory locks of every token this commit may touch (its run's waiters, its waits,
    --    its outgoing signals), before any row lock.
    --    Most commits (a step's) have none of them: one index probe tells.
    IF v_has_waits OR v_has_signals
       OR EXISTS (SELECT 1 FROM __SCHEMA__.waiters AS w WHERE w.run_id = v_run) THEN
        PERFORM __SCHEMA__.lock_keys(ARRAY(
            SELECT __SCHEMA__.lock_key(w.kind, w.key) FROM __SCHEMA__.waiters AS w WHERE w.run_id = v_run
            UNION ALL
            SELECT __SCHEMA__.lock_key(x ->> 'kind', x ->> 'key') FROM jsonb_array_elements(p -> 'waits') AS x
            UNION ALL
            SELECT __SCHEMA__.lock_key('signal', x ->> 'token') FROM jsonb_array_elements(p -> 'signals') AS x));
    END IF;

    -- 2. The lease check: only the lease owner's commit gets the run row (and its lock).
    --    A commit that does not end the turn only touches `updated_at` (and, if it carries
    --    checkpoints, resets the recovery count of a running run): that UPDATE is the check.
    IF v_end IS NULL THEN
        UPDATE __SCHEMA__.runs AS r
           SET updated_at = v_now,
               recovery_attempts = CASE WHEN v_progress AND r.status = 'running' THEN 0 ELSE r.recovery_attempts END
         WHERE r.id = v_run AND r.lease_owner = v_owner
        RETURNING r.status INTO v_status;
    ELSE
        SELECT r.status INTO v_status FROM __SCHEMA__.runs AS r WHERE r.id = v_run AND r.lease_owner = v_owner
           FOR UPDATE;
    END IF;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM __SCHEMA__.runs AS r WHERE r.id = v_run) THEN
            RETURN jsonb_build_object('err', 'lease_lost');
        END IF;
        RETURN jsonb_build_object('err', 'not_found');
    END IF;
    IF v_end ->> 'type' = 'settle' AND v_status = 'running'
       AND NOT (v_status = ANY (ARRAY(SELECT jsonb_array_elements_text(v_end -> 'allowed_from')))) THEN
        RETURN jsonb_build_object('err', 'conflict', 'message',
                                  format('run %s: status %s cannot become %s', v_run, v_status, v_end ->> 'status'));
    END IF;

    -- 3. Expired waits first: a wait whose waiter a delivery already took keeps the delivery.
    IF p -> 'expire' <> '[]'::jsonb THEN
        FOR v_seq IN SELECT (x #>> '{}')::bigint FROM jsonb_array_elements(p -> 'expire') AS x LOOP
            DELETE FROM __SCHEMA__.waiters WHERE run_id = v_run AND seq = v_seq;
            IF NOT FOUND THEN
                v_raced := v_raced || v_seq;
            END IF;
        END LOOP;
    END IF;

    -- 4. Checkpoints, upserted by seq (the last of duplicates wins), except raced ones.
    IF p -> 'checkpoints' <> '[]'::jsonb THEN
        INSERT INTO __SCHEMA__.checkpoints AS c (run_id, seq, name, kind, status, input, output, error, attempts,
                                                 wake_at, started_at, updated_at)
        SELECT DISTINCT ON ((x ->> 'seq')::bigint)
               v_run, (x ->> 'seq')::bigint, x ->> 'name', x ->> 'kind', x ->> 'status', x ->> 'input',
               x ->> 'output', x ->> 'error', (x ->> 'attempts')::bigint, (x ->> 'wake_at')::bigint,
               (x ->> 'started_at')::bigint, (x ->> 'updated_at')::bigint
          FROM jsonb_array_elements(p -> 'checkpoints') WITH ORDINALITY AS t (x, i)
         WHERE NOT ((x ->> 'seq')::bigint = ANY (v_raced))
         ORDER BY (x ->> 'seq')::bigint, i DESC
        ON CONFLICT (run_id, seq) DO UPDATE
            SET name = excluded.name, kind = excluded.kind, status = excluded.status, input = excluded.input,
                output = excluded.output, error = excluded.error, attempts = excluded.attempts,
                wake_at = excluded.wake_at, started_at = excluded.started_at, updated_at = excluded.updated_at;
    END IF;

    -- 5. Waits, query state, children, outgoing signals.
    IF v_has_waits THEN
        FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'waits') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
            PERFORM __SCHEMA__.register_wait(v_item, v_now);
        END LOOP;
    END IF;
    IF p -> 'state' <> '[]'::jsonb THEN
        FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'state') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
            INSERT INTO __SCHEMA__.run_state (run_id, key, value) VALUES (v_run, v_item ->> 0, v_item ->> 1)
            ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value;
        END LOOP;
    END IF;
    IF p -> 'children' <> '[]'::jsonb THEN
        FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'children') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
            PERFORM __SCHEMA__.create_run(v_item);
        END LOOP;
    END IF;
    IF v_has_signals THEN
        FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'signals') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
            v_deliveries := v_deliveries
                || jsonb_build_array(COALESCE(__SCHEMA__.send_signal(v_item ->> 'token', v_item ->> 'payload', v_now),
                                              'null'::jsonb));
        END LOOP;
    END IF;

    -- 6. How the turn ends.
    IF v_end IS NULL THEN
        NULL; -- `updated_at` was set with the lease check
    ELSIF v_end ->> 'type' = 'suspend' AND v_status = 'running' THEN
        -- Suspends only if nothing was delivered since the turn loaded the run: the wake_gen
        -- compare is part of the UPDATE.
        UPDATE __SCHEMA__.runs
           SET status = 'suspended', wake_at = (v_end ->> 'wake_at')::bigint, lease_owner = NULL,
               lease_until = NULL, updated_at = v_now, recovery_attempts = 0
         WHERE id = v_run AND status = 'running' AND wake_gen = (v_end ->> 'seen_wake_gen')::bigint
           AND cardinality(v_raced) = 0;
        IF NOT FOUND THEN
            v_woken := true;
            UPDATE __SCHEMA__.runs SET updated_at = v_now, recovery_attempts = 0 WHERE id = v_run;
        END IF;
    ELSIF v_end ->> 'type' = 'settle' AND v_status = 'running' THEN
        UPDATE __SCHEMA__.runs
           SET status = v_end ->> 'status', output = v_end ->> 'output', error = v_end ->> 'error', wake_at = NULL,
               lease_owner = NULL, lease_until = NULL, updated_at = v_now,
               recovery_attempts = CASE WHEN v_progress THEN 0 ELSE recovery_attempts END
         WHERE id = v_run AND status = 'running';
        v_settled := FOUND;
        IF v_settled THEN
            -- A settled run must not swallow later signals.
            DELETE FROM __SCHEMA__.waiters WHERE run_id = v_run;
        END IF;
    END IF;
    -- A turn end that finds the run no longer running (an operator cancelled it mid-turn)
    -- changes nothing of the run row: terminal runs accept no transition.
    RETURN jsonb_build_object('woken', v_woken, 'settled', v_settled, 'deliveries', v_deliveries,
                              'raced', to_jsonb(v_raced));
END
$$;

