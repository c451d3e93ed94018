-- durable-store-postgres, schema version 23: a signal and the claim of the run it wakes in one
-- write.
--
-- An engine that keeps a suspended run's turn in memory (a warm run) and signals it used to make
-- two writes before the run went on: `send_signal`, then `claim_run` for the run it woke. Now the
-- `send_signal` operation reads an optional `claim` (`{"id", "owner", "until", "now", "from"}`,
-- the fields of `claim_run`): when the signal is delivered to the run `id` names, that run is
-- claimed in the same transaction, after the wake, exactly as `claim_run` claims it, and the
-- answer carries `claim_run`'s answer as `claim`. Delivered to another run (the token's oldest
-- wait is not that run's), or buffered, nothing is claimed and the answer has no `claim`.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

CREATE OR REPLACE FUNCTION __SCHEMA__.signal_op(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_delivery jsonb := __SCHEMA__.send_signal(p ->> 'token', p ->> 'payload', (p ->> 'now')::bigint);
BEGIN
    IF jsonb_typeof(p -> 'claim') = 'object' AND v_delivery ->> 'run' = p -> 'claim' ->> 'id' THEN
        RETURN jsonb_build_object('delivery', v_delivery, 'claim', __SCHEMA__.claim_run(p -> 'claim'));
    END IF;
    RETURN jsonb_build_object('delivery', v_delivery);
END
$$;

-- `apply` as in version 19, but for `send_signal`, which goes through `signal_op`.
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
            WHEN 'send_signal' THEN __SCHEMA__.signal_op(v_op)
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
