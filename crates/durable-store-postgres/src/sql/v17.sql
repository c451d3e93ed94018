-- durable-store-postgres, schema version 17: every run the engine creates takes its workflow's
-- concurrency key, and a run continued as new hands its key's slot to its successor.
--
-- Until now only `Store::create_run(s)` decided a key (`create_admitted`). A commit's children
-- (`ctx.child`, the successor of `continue_as_new`), a publish's starts (event triggers), a
-- schedule's fires and a flushed trigger buffer's run were created by `create_run` with no
-- decision at all, so they ran past the key's limit.
--
-- Now a run's JSON may carry its `admission` (a SlotRequest): `create_run` hands such a run to
-- `create_admitted` without the request's `max_waiting` — nobody is there to be refused, and a
-- refusal would leave the rest of its write half done — so the run is admitted or waits
-- `pending` (`wake_at = GATED`) for its slot. `create_admitted` first passes the slot of the
-- request's `succeeds` (the run that continued as new) at the same gate to the new run, if that
-- run holds one: admitted at once, ahead of the waiters, the gate's slots unchanged.
-- `flush_buffer` reads the run's `admission` from its operation (only the engine can compute a
-- key from the gathered input), and flushes a buffer only while it is due.
--
-- Every function here is created or replaced: running this file again is harmless.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

-- `create_run` of version 9, handing a run with a concurrency key to `create_admitted`.
CREATE OR REPLACE FUNCTION __SCHEMA__.create_run(p_run jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_id text := p_run ->> 'id';
    v_existing jsonb;
BEGIN
    IF jsonb_typeof(p_run -> 'admission') = 'object' THEN
        RETURN __SCHEMA__.create_admitted(p_run - 'admission', (p_run -> 'admission') - 'max_waiting');
    END IF;
    INSERT INTO __SCHEMA__.runs (id, workflow, version, namespace, status, input, tags, priority,
                                 parent_id, parent_seq, created_at, updated_at, wake_at, trace_context)
    VALUES (v_id, p_run ->> 'workflow', (p_run ->> 'version')::bigint, p_run ->> 'namespace', 'pending',
            p_run ->> 'input',
            ARRAY(SELECT t FROM jsonb_array_elements_text(p_run -> 'tags') WITH ORDINALITY AS x (t, i) ORDER BY i),
            (p_run ->> 'priority')::integer, p_run ->> 'parent_id', (p_run ->> 'parent_seq')::bigint,
            (p_run ->> 'created_at')::bigint, (p_run ->> 'created_at')::bigint, (p_run ->> 'start_at')::bigint,
            p_run ->> 'trace_context')
    ON CONFLICT (id) DO NOTHING;
    IF FOUND THEN
        PERFORM __SCHEMA__.notify(v_id);
        RETURN jsonb_build_object('created', true);
    END IF;
    SELECT to_jsonb(r) INTO v_existing FROM __SCHEMA__.runs AS r WHERE r.id = v_id;
    IF v_existing IS NULL THEN
        RETURN jsonb_build_object('err', 'conflict', 'message',
                                  format('run %s: the insert conflicted but the run is gone (deleted concurrently)', v_id));
    END IF;
    RETURN jsonb_build_object('created', false, 'run', v_existing);
END
$$;

-- `create_admitted` of version 8, passing the slot of the request's `succeeds` on first.
CREATE OR REPLACE FUNCTION __SCHEMA__.create_admitted(p_run jsonb, p_admission jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_id text := p_run ->> 'id';
    v_existing jsonb;
    v_answer jsonb;
BEGIN
    IF p_admission IS NULL OR jsonb_typeof(p_admission) <> 'object' THEN
        RETURN __SCHEMA__.create_run(p_run);
    END IF;
    SELECT to_jsonb(r) INTO v_existing FROM __SCHEMA__.runs AS r WHERE r.id = v_id;
    IF v_existing IS NOT NULL THEN
        RETURN jsonb_build_object('created', false, 'run', v_existing);
    END IF;
    IF p_admission ->> 'succeeds' IS NOT NULL THEN
        PERFORM __SCHEMA__.admission_lock(ARRAY[p_admission ->> 'gate']);
        UPDATE __SCHEMA__.admission_slots
           SET holder = v_id, run_id = v_id, acquired_at = (p_admission ->> 'now')::bigint, lease_until = NULL
         WHERE gate = p_admission ->> 'gate' AND holder = p_admission ->> 'succeeds';
        IF FOUND THEN
            RETURN __SCHEMA__.create_run(p_run);
        END IF;
    END IF;
    v_answer := __SCHEMA__.admission_acquire(
        p_admission || jsonb_build_object('holder', v_id, 'run_id', v_id, 'lease_until', NULL));
    PERFORM __SCHEMA__.admission_wake(v_answer -> 'handed', (p_admission ->> 'now')::bigint);
    IF v_answer ->> 'admission' = 'full' THEN
        RETURN jsonb_build_object('err', 'queue_full', 'gate', p_admission ->> 'gate',
                                  'held', v_answer -> 'held', 'waiting', v_answer -> 'waiting');
    ELSIF v_answer ->> 'admission' = 'waiting' THEN
        RETURN __SCHEMA__.create_run(p_run || jsonb_build_object('start_at', 9223372036854775806))
               || jsonb_build_object('gated', true);
    END IF;
    RETURN __SCHEMA__.create_run(p_run);
END
$$;

-- `flush_buffer` of version 6, creating the run with the operation's `admission`, if any, and
-- only if the buffer is still due: an event that moved a debounce's due time after the engine
-- read it is not cut short, and the key the engine computed from the payload it read is the
-- key of the run's input.
CREATE OR REPLACE FUNCTION __SCHEMA__.flush_buffer(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_buf __SCHEMA__.trigger_buffers;
BEGIN
    -- The row lock waits for a publish adding to the buffer; the batch id is checked against the
    -- row as that publish left it (deleted, when it filled the buffer).
    SELECT * INTO v_buf FROM __SCHEMA__.trigger_buffers AS b
     WHERE b.workflow = p ->> 'workflow' AND b.key = p ->> 'key' AND b.batch_id = p ->> 'batch_id'
       AND b.due_at <= (p ->> 'now')::bigint FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('flushed', false);
    END IF;
    v_buf.run := __SCHEMA__.buffer_run(v_buf, NULL, (p ->> 'now')::bigint);
    IF jsonb_typeof(p -> 'admission') = 'object' THEN
        v_buf.run := v_buf.run || jsonb_build_object('admission', p -> 'admission');
    END IF;
    DELETE FROM __SCHEMA__.trigger_buffers WHERE workflow = v_buf.workflow AND key = v_buf.key;
    RETURN jsonb_build_object('flushed', true) || __SCHEMA__.create_started(v_buf.run, true);
END
$$;
