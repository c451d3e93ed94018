-- durable-store-postgres, schema version 19: a run's settle in three statements when nothing
-- else hangs on it.
--
-- Measured with the function statistics of PostgreSQL 15 (`track_functions`) over `chain` with
-- 3 worker processes (1,000 runs of 5 no-op steps), a run's settle — the commit ending its last
-- turn, completed or failed — was the costliest write of a run: about 330 us of server time,
-- where a step's commit (`step_commit`, version 15) took about 90 us. `commit_ordered` probes the
-- keyed children and the lease; `commit` then probes the run's waiters, reads its admission gates
-- (`admission_gates_of`), locks the run row, checks `allowed_from`, tests a dozen empty JSON
-- arrays, updates the run, deletes its waiters, finishes its tasks (`finish_tasks_of`) and
-- releases its admission slots (`admission_release_run`, which reads its gates again): about a
-- dozen statements, most of which find nothing for a run that never waited, was never keyed and
-- has no remote step in flight.
--
-- Now the client sends `settle_commit` for a commit that ends the run and carries nothing but
-- checkpoints (no waits, expired waits, state, children, signals, tasks or released slots: a
-- workflow's return after its steps). The server checks in one statement that the run has no
-- waiter, no admission slot or queued request and no unfinished task; then the run's `UPDATE`
-- (its lease, `running`, and `running` among the allowed statuses, in its predicate) and the
-- checkpoints' upsert. Anything else — a waiter, a slot, a task, a lease not held, a run no
-- longer running, a transition not allowed — goes to `commit_ordered` unchanged, which answers
-- as before (nothing was written). The run's waiters, slots, requests and tasks are created only
-- by its own writes (a hand-off turns a queued request of the run into a slot), so none can
-- appear between the check and the `UPDATE`, which holds the run row. A batch carrying the
-- operation takes the same locks up front as for a settling `commit` (its run's waiter keys,
-- the gates of its run). The answer is `commit`'s.
--
-- The check is made again once the `UPDATE` holds the run row. A write of the same run in
-- flight in another batch (with `write_connections` above 1: the commit of a call the body
-- abandoned, sent before it was dropped) may hold the row and commit a waiter or a task while
-- the `UPDATE` waits; the second check, a statement of its own, sees it, and the batch fails
-- with a serialization failure, which the writer runs again: the settle then takes the
-- general path.
--
-- In a loop calling it directly the settle of such a run took about half the time of
-- `commit_ordered`'s.
--
-- Every function here is created or replaced: running this file again is harmless.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

-- Whether run `p_run` has a waiter, an admission slot or queued request, or an unfinished task:
-- what only the general commit's settle cleans up.
CREATE OR REPLACE FUNCTION __SCHEMA__.settle_needs_commit(p_run text) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM __SCHEMA__.waiters AS w WHERE w.run_id = p_run)
        OR EXISTS (SELECT 1 FROM __SCHEMA__.admission_slots AS s WHERE s.run_id = p_run)
        OR EXISTS (SELECT 1 FROM __SCHEMA__.admission_waiters AS w WHERE w.run_id = p_run)
        OR EXISTS (SELECT 1 FROM __SCHEMA__.tasks AS t WHERE t.run_id = p_run AND t.state <> 'finished');
END
$$;

-- A settle: `commit`'s operation with the name `settle_commit` and `end` a settle.
CREATE OR REPLACE FUNCTION __SCHEMA__.settle_commit(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_run text := p ->> 'run';
    v_end jsonb := p -> 'end';
BEGIN
    IF v_end ->> 'type' IS DISTINCT FROM 'settle' OR __SCHEMA__.settle_needs_commit(v_run) THEN
        RETURN __SCHEMA__.commit_ordered(p);
    END IF;
    -- `commit`'s settle, with its lease check and status checks in the predicate: progress (a
    -- turn end other than a burial) resets `recovery_attempts`.
    UPDATE __SCHEMA__.runs AS r
       SET status = v_end ->> 'status', output = v_end ->> 'output', error = v_end ->> 'error', wake_at = NULL,
           lease_owner = NULL, lease_until = NULL, updated_at = (p ->> 'now')::bigint,
           recovery_attempts = CASE WHEN v_end ->> 'status' <> 'dead' THEN 0 ELSE r.recovery_attempts END
     WHERE r.id = v_run AND r.lease_owner = p ->> 'owner' AND r.status = 'running'
       AND v_end -> 'allowed_from' ? 'running';
    IF NOT FOUND THEN
        RETURN __SCHEMA__.commit_ordered(p);
    END IF;
    IF __SCHEMA__.settle_needs_commit(v_run) THEN
        RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
            MESSAGE = format('run %s was written while its settle waited for it; the batch runs again', v_run);
    END IF;
    IF p -> 'checkpoints' <> '[]'::jsonb THEN
        INSERT INTO __SCHEMA__.checkpoints AS c (run_id, seq, name, kind, status, input, output, error, attempts,
                                                 wake_at, started_at, updated_at)
        SELECT DISTINCT ON ((x ->> 'seq')::bigint)
               v_run, (x ->> 'seq')::bigint, x ->> 'name', x ->> 'kind', x ->> 'status', x ->> 'input',
               x ->> 'output', x ->> 'error', (x ->> 'attempts')::bigint, (x ->> 'wake_at')::bigint,
               (x ->> 'started_at')::bigint, (x ->> 'updated_at')::bigint
          FROM jsonb_array_elements(p -> 'checkpoints') WITH ORDINALITY AS t (x, i)
         ORDER BY (x ->> 'seq')::bigint, i DESC
        ON CONFLICT (run_id, seq) DO UPDATE
            SET name = excluded.name, kind = excluded.kind, status = excluded.status, input = excluded.input,
                output = excluded.output, error = excluded.error, attempts = excluded.attempts,
                wake_at = excluded.wake_at, started_at = excluded.started_at, updated_at = excluded.updated_at;
    END IF;
    RETURN '{"woken": false, "settled": true, "deliveries": [], "raced": [], "handed_off": []}'::jsonb;
END
$$;

-- `apply` of version 18, with `settle_commit`.
CREATE OR REPLACE FUNCTION __SCHEMA__.apply(p_ops jsonb, p_channel text, p_locks jsonb) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    v_op jsonb;
BEGIN
    PERFORM set_config('durable.notify_channel', COALESCE(p_channel, ''), true);
    IF p_locks ?| ARRAY['delete', 'keys', 'buffers', 'queue', 'tokens', 'events', 'task_runs', 'gates'] THEN
        PERFORM __SCHEMA__.lock_batch(p_locks);
    ELSIF p_locks ? 'probe' THEN
        -- Only runs to probe (step commits, settles, patches without signals: a chain's
        -- batches): the keys of their waiters, ascending, then the gates of the runs settling,
        -- and nothing else of `lock_batch`.
        PERFORM pg_advisory_xact_lock(s.k)
           FROM (SELECT DISTINCT __SCHEMA__.lock_key(w.kind, w.key) AS k FROM __SCHEMA__.waiters AS w
                  WHERE w.run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(p_locks -> 'probe')))
                  ORDER BY k) AS s;
        IF p_locks ? 'settles' THEN
            PERFORM __SCHEMA__.admission_lock(ARRAY(
                SELECT unnest(__SCHEMA__.admission_gates_of(s))
                  FROM jsonb_array_elements_text(p_locks -> 'settles') AS s));
        END IF;
    END IF;
    FOR v_op IN SELECT x FROM jsonb_array_elements(p_ops) WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
        RETURN NEXT (CASE v_op ->> 'op'
            WHEN 'commit' THEN __SCHEMA__.commit_ordered(v_op)
            WHEN 'step_commit' THEN __SCHEMA__.step_commit(v_op)
            WHEN 'settle_commit' THEN __SCHEMA__.settle_commit(v_op)
            WHEN 'create_run' THEN __SCHEMA__.create_admitted(v_op -> 'run', v_op -> 'admission')
            WHEN 'create_runs' THEN __SCHEMA__.create_runs(v_op)
            WHEN 'claim_run' THEN __SCHEMA__.claim_run(v_op)
            WHEN 'renew_lease' THEN __SCHEMA__.renew_lease(v_op)
            WHEN 'release_lease' THEN __SCHEMA__.release_lease(v_op)
            WHEN 'update_run_if' THEN __SCHEMA__.update_run_if(v_op)
            WHEN 'send_signal' THEN jsonb_build_object('delivery',
                __SCHEMA__.send_signal(v_op ->> 'token', v_op ->> 'payload', (v_op ->> 'now')::bigint))
            WHEN 'complete_task' THEN __SCHEMA__.complete_task_admitted(v_op)
            WHEN 'publish' THEN __SCHEMA__.publish(v_op)
            WHEN 'flush_buffer' THEN __SCHEMA__.flush_buffer(v_op)
            WHEN 'save_schedule' THEN __SCHEMA__.save_schedule(v_op)
            WHEN 'delete_schedule' THEN __SCHEMA__.delete_schedule(v_op)
            WHEN 'delete_run' THEN __SCHEMA__.delete_run(v_op)
            WHEN 'acquire_slot' THEN __SCHEMA__.acquire_slot(v_op)
            WHEN 'release_slot' THEN __SCHEMA__.release_slot(v_op)
            WHEN 'enqueue' THEN __SCHEMA__.enqueue(v_op)
            WHEN 'ack_queued' THEN __SCHEMA__.ack_queued(v_op)
            WHEN 'release_queued' THEN __SCHEMA__.release_queued(v_op)
            ELSE jsonb_build_object('err', 'unknown_op', 'message', format('unknown operation %s', v_op ->> 'op'))
        END)::text;
    END LOOP;
END
$$;
