-- durable-store-postgres, schema version 16: a worker's result and the claim of the run it wakes
-- in one operation, with one write of the run row.
--
-- Measured on PostgreSQL 15 with 3 worker processes running `remote_chain` (1,000 runs of 5
-- remote no-op steps, each process an engine with a remote-step worker beside it), the server's
-- backends used about 80% of the machine's CPU. Every remote step wrote the run row three times
-- (the suspending commit, the result's wake, the claim of the woken run), each a new row version
-- with an entry in every index of `runs` (a status or lease change is never a HOT update), and
-- the result wrote its checkpoint twice (the upsert, then its attempt count).
--
-- Now `complete_task` reads an optional `claim` (`{"owner", "until", "now", "from"}`, the fields
-- of `claim_run`): when the result is accepted, the run is claimed for that owner in the same
-- `UPDATE` that wakes it — exactly the state `wake_run` then `claim_run` leave — and the answer
-- carries `claim_run`'s answer as `claim`. A run the claim cannot take (another owner's live
-- lease, a run waiting for its concurrency key) is woken as before, and the answer's `claim`
-- says `busy` with the run as woken. The checkpoint is written once, with its attempt count.
-- The client sends the claim for `Store::complete_task_and_claim`.
--
-- Every function here is created or replaced: running this file again is harmless.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

CREATE OR REPLACE FUNCTION __SCHEMA__.complete_task(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_run text := p ->> 'run_id';
    v_seq bigint := (p ->> 'seq')::bigint;
    v_now bigint := (p ->> 'now')::bigint;
    v_token text := p ->> 'token';
    v_logs jsonb := COALESCE(p -> 'logs', '[]'::jsonb);
    v_claim jsonb := CASE WHEN jsonb_typeof(p -> 'claim') = 'object' THEN p -> 'claim' END;
    v_prev __SCHEMA__.runs;
    v_new __SCHEMA__.runs;
    v_task __SCHEMA__.tasks;
    v_name text;
    v_outcome text;
    v_owner text;
    v_claim_now bigint;
    v_recovered boolean;
BEGIN
    -- 1. The wait token's advisory lock (as send_signal), then the run row, then the task row:
    --    the order a commit takes them.
    PERFORM pg_advisory_xact_lock(__SCHEMA__.lock_key('signal', v_token));
    SELECT * INTO v_prev FROM __SCHEMA__.runs AS r WHERE r.id = v_run FOR UPDATE;
    SELECT * INTO v_task FROM __SCHEMA__.tasks AS t WHERE t.run_id = v_run AND t.seq = v_seq FOR UPDATE;
    IF NOT FOUND OR v_task.attempt <> (p ->> 'attempt')::bigint OR v_task.state = 'finished' THEN
        RETURN jsonb_build_object('outcome', 'duplicate');
    END IF;
    -- 2. A settled (or deleted) run takes no result; its task is over.
    IF v_prev.id IS NULL OR v_prev.status NOT IN ('pending', 'running', 'suspended', 'blocked') THEN
        UPDATE __SCHEMA__.tasks SET state = 'finished', outcome = 'cancelled', lease_until = NULL, logs = logs || v_logs
         WHERE run_id = v_run AND seq = v_seq;
        RETURN jsonb_build_object('outcome', 'run_terminal');
    END IF;
    -- 3. The wait the dispatch registered, taken as a delivery takes it.
    DELETE FROM __SCHEMA__.waiters
     WHERE run_id = v_run AND seq = v_seq AND kind = 'signal' AND key = v_token
    RETURNING name INTO v_name;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('outcome', 'duplicate');
    END IF;
    -- 4. The checkpoint (with the attempt's number) and the task.
    IF jsonb_typeof(p -> 'output') = 'string' THEN
        INSERT INTO __SCHEMA__.checkpoints (run_id, seq, name, kind, status, output, attempts, started_at, updated_at)
        VALUES (v_run, v_seq, v_name, 'remote', 'completed', p ->> 'output', v_task.attempt, v_now, v_now)
        ON CONFLICT (run_id, seq) DO UPDATE
            SET status = 'completed', output = excluded.output, attempts = excluded.attempts,
                updated_at = excluded.updated_at;
        v_outcome := 'completed';
    ELSE
        INSERT INTO __SCHEMA__.checkpoints (run_id, seq, name, kind, status, error, attempts, started_at, updated_at)
        VALUES (v_run, v_seq, v_name, 'remote', 'waiting', p ->> 'error', v_task.attempt, v_now, v_now)
        ON CONFLICT (run_id, seq) DO UPDATE
            SET status = 'waiting', error = excluded.error, wake_at = NULL, attempts = excluded.attempts,
                updated_at = excluded.updated_at;
        v_outcome := CASE WHEN (p ->> 'timed_out')::boolean THEN 'timed_out' ELSE 'failed' END;
    END IF;
    UPDATE __SCHEMA__.tasks SET state = 'finished', outcome = v_outcome, lease_until = NULL, logs = logs || v_logs
     WHERE run_id = v_run AND seq = v_seq;

    -- 5. The wake, with the claim when there is one: `wake_run`'s changes and `claim_run`'s in
    --    one write of the row (the claim's predicate is `claim_run`'s).
    IF v_claim IS NOT NULL THEN
        v_owner := v_claim ->> 'owner';
        v_claim_now := (v_claim ->> 'now')::bigint;
        v_recovered := v_prev.status = 'running' AND v_prev.lease_owner IS NOT NULL AND v_prev.lease_owner <> v_owner;
        UPDATE __SCHEMA__.runs
           SET wake_gen = wake_gen + 1,
               wake_at = CASE WHEN status IN ('suspended', 'blocked') THEN LEAST(COALESCE(wake_at, v_now), v_now)
                              ELSE wake_at END,
               status = 'running', lease_owner = v_owner, lease_until = (v_claim ->> 'until')::bigint,
               updated_at = v_claim_now,
               recovery_attempts = recovery_attempts + CASE WHEN v_recovered THEN 1 ELSE 0 END,
               claims = claims + 1
         WHERE id = v_run
           AND NOT (status = 'pending' AND wake_at IS NOT NULL AND wake_at = 9223372036854775806)
           AND NOT (lease_owner IS NOT NULL AND lease_owner <> v_owner AND lease_until IS NOT NULL
                    AND lease_until >= v_claim_now)
        RETURNING * INTO v_new;
        IF FOUND THEN
            PERFORM __SCHEMA__.notify(v_run);
            RETURN jsonb_build_object(
                'outcome', 'accepted',
                'claim', jsonb_build_object(
                    'outcome', 'acquired',
                    'run', to_jsonb(v_new),
                    'previous', v_prev.status,
                    'recovered', v_recovered,
                    'history', (SELECT COALESCE(jsonb_agg(to_jsonb(c) ORDER BY c.seq), '[]'::jsonb)
                                  FROM __SCHEMA__.checkpoints AS c
                                 WHERE c.run_id = v_run AND c.seq >= COALESCE((v_claim ->> 'from')::bigint, 0))));
        END IF;
    END IF;
    PERFORM __SCHEMA__.wake_run(v_run, v_now);
    IF v_claim IS NOT NULL THEN
        SELECT * INTO v_new FROM __SCHEMA__.runs WHERE id = v_run;
        RETURN jsonb_build_object('outcome', 'accepted',
                                  'claim', jsonb_build_object('outcome', 'busy', 'run', to_jsonb(v_new)));
    END IF;
    RETURN jsonb_build_object('outcome', 'accepted');
END
$$;
