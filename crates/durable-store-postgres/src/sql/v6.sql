-- durable-store-postgres, schema version 6: what starts runs besides a caller. Stored schedules
-- (saved with a compare-and-set on their revision, together with the runs they fire), event
-- publishes with dedupe ids and the runs they trigger, the buffers of gathering triggers
-- (debounce and batch), and delayed starts (a `pending` run with a `wake_at`).
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name and
-- `__LOCK_SEED__` by a number derived from it.
--
-- * Every write is an operation of `apply`, like the others: a publish (dedupe, deliveries,
--   trigger runs, buffers), a flush, a schedule save is one function call in the writer's batch,
--   one round trip. `save_schedules` sends one group of saves (one transaction), each applied on
--   its own.
-- * Schedules: the `ScheduleRecord` is kept whole as JSON text (`body`, so its input payload
--   comes back byte for byte); key, namespace, workflow, due time and revision are columns for
--   the queries and the compare-and-set. The compare is the `WHERE revision = expected` of the
--   UPDATE (or the primary key of the INSERT of a create): of concurrent savers with the same
--   expectation exactly one writes; the others find the winner's row and answer stale.
-- * Trigger buffers: one header row per open `(workflow, key)` and one row per gathered payload
--   (`trigger_buffer_payloads`), so a batch append writes one small row, not the whole batch
--   again. `gather` is `durable_core::TriggerBuffer::gather`; `pg_triggers.rs` runs it against
--   the core's function. Publishes feeding one buffer are serialised by the buffer's advisory
--   lock (`lock_key('buffer', ...)`, taken with the event name's, in ascending order, before any
--   row lock); a flush takes the header row's lock, so it either sees a buffer a publish has
--   finished with or none.
-- * Dedupe ids: `event_dedupe` remembers `(name, id)` until `keep_until`. The check is the
--   INSERT ... ON CONFLICT of the id (taking expiry into account), under the event name's
--   advisory lock: of concurrent duplicates exactly one publishes. A dedupe publish also prunes
--   a bounded number of expired ids (never waiting for a row).
-- * Delayed starts: `create_run` stores `start_at` as the run's `wake_at`; `pending_runs` scans
--   only pending runs without one (`runs_pending`), `due_runs` suspended and pending runs by
--   `wake_at` (`runs_due`).

-- ---- delayed starts ------------------------------------------------------------------------------

DROP INDEX __SCHEMA__.runs_pending;
CREATE INDEX runs_pending ON __SCHEMA__.runs (priority DESC, created_at, id)
    WHERE status = 'pending' AND wake_at IS NULL;
DROP INDEX __SCHEMA__.runs_due;
CREATE INDEX runs_due ON __SCHEMA__.runs (wake_at, id)
    WHERE status IN ('suspended', 'pending') AND wake_at IS NOT NULL;

-- `create_run` of version 1, storing `start_at` as the run's `wake_at`.
CREATE OR REPLACE FUNCTION __SCHEMA__.create_run(p_run jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_id text := p_run ->> 'id';
    v_existing jsonb;
BEGIN
    INSERT INTO __SCHEMA__.runs (id, workflow, version, namespace, status, input, tags, priority,
                                 parent_id, parent_seq, created_at, updated_at, wake_at)
    VALUES (v_id, p_run ->> 'workflow', (p_run ->> 'version')::bigint, p_run ->> 'namespace', 'pending',
            p_run ->> 'input',
            ARRAY(SELECT t FROM jsonb_array_elements_text(p_run -> 'tags') WITH ORDINALITY AS x (t, i) ORDER BY i),
            (p_run ->> 'priority')::integer, p_run ->> 'parent_id', (p_run ->> 'parent_seq')::bigint,
            (p_run ->> 'created_at')::bigint, (p_run ->> 'created_at')::bigint, (p_run ->> 'start_at')::bigint)
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

-- A run started by a publish, a flush or a schedule save: `create_run`'s answer, with the run row
-- also when it was created if `p_row`. Those writes have already changed rows when they create
-- runs, so a create that conflicted with a concurrent delete cannot be answered as an error
-- without them: it is raised as a serialization failure instead, and the writer runs the batch
-- again (the run is gone by then).
CREATE FUNCTION __SCHEMA__.create_started(p_run jsonb, p_row boolean) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_answer jsonb := __SCHEMA__.create_run(p_run);
BEGIN
    IF v_answer ? 'err' THEN
        RAISE EXCEPTION USING ERRCODE = 'serialization_failure', MESSAGE = v_answer ->> 'message';
    END IF;
    IF p_row AND (v_answer ->> 'created')::boolean THEN
        v_answer := v_answer || jsonb_build_object(
            'run', (SELECT to_jsonb(r) FROM __SCHEMA__.runs AS r WHERE r.id = p_run ->> 'id'));
    END IF;
    RETURN v_answer;
END
$$;

-- `a + b` for u64 millisecond values, saturating at the largest time the store keeps (the client
-- maps u64 values past i64::MAX to i64::MAX, and back to u64::MAX).
CREATE FUNCTION __SCHEMA__.saturating_add(p_a bigint, p_b numeric) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT LEAST(p_a::numeric + p_b, 9223372036854775807)::bigint
$$;

-- ---- schedules -----------------------------------------------------------------------------------

CREATE TABLE __SCHEMA__.schedules (
    key       text COLLATE "C" PRIMARY KEY,
    namespace text NOT NULL,
    workflow  text NOT NULL,
    due_at    bigint,
    revision  bigint NOT NULL,
    -- The whole `ScheduleRecord` as JSON text (its revision included).
    body      text NOT NULL
);
-- due_schedules: earliest first, then key; a schedule that is never due is not in it.
CREATE INDEX schedules_due ON __SCHEMA__.schedules (due_at, key) WHERE due_at IS NOT NULL;
-- list_schedules of one namespace, by key.
CREATE INDEX schedules_namespace ON __SCHEMA__.schedules (namespace, key);

-- Creates (`expected` null) or replaces revision `expected` of a schedule, and creates the runs
-- of `start` with it: `{"saved": true, "revision": n}`, or, writing nothing,
-- `{"saved": false, "current": <the stored body or null>}`.
CREATE FUNCTION __SCHEMA__.save_schedule(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_key text := p ->> 'key';
    v_expected bigint := (p ->> 'expected')::bigint;
    v_revision bigint := COALESCE(v_expected + 1, 1);
    v_item jsonb;
BEGIN
    IF v_expected IS NULL THEN
        INSERT INTO __SCHEMA__.schedules (key, namespace, workflow, due_at, revision, body)
        VALUES (v_key, p ->> 'namespace', p ->> 'workflow', (p ->> 'due_at')::bigint, v_revision, p ->> 'body')
        ON CONFLICT (key) DO NOTHING;
    ELSE
        -- The compare of this compare-and-set is the WHERE: a concurrent saver that got there
        -- first changed the revision, and this UPDATE, re-checked against its row, writes nothing.
        UPDATE __SCHEMA__.schedules
           SET namespace = p ->> 'namespace', workflow = p ->> 'workflow', due_at = (p ->> 'due_at')::bigint,
               revision = v_revision, body = p ->> 'body'
         WHERE key = v_key AND revision = v_expected;
    END IF;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('saved', false,
                                  'current', (SELECT s.body FROM __SCHEMA__.schedules AS s WHERE s.key = v_key));
    END IF;
    FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'start') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
        PERFORM __SCHEMA__.create_started(v_item, false);
    END LOOP;
    RETURN jsonb_build_object('saved', true, 'revision', v_revision);
END
$$;

-- `{"deleted": bool}`.
CREATE FUNCTION __SCHEMA__.delete_schedule(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM __SCHEMA__.schedules WHERE key = p ->> 'key';
    RETURN jsonb_build_object('deleted', FOUND);
END
$$;

-- ---- trigger buffers -------------------------------------------------------------------------------

CREATE TABLE __SCHEMA__.trigger_buffers (
    workflow  text COLLATE "C" NOT NULL,
    key       text COLLATE "C" NOT NULL,
    -- The namespace of the run it starts (due_buffers filters on it).
    namespace text NOT NULL,
    batch_id  text NOT NULL,
    due_at    bigint NOT NULL,
    first_at  bigint NOT NULL,
    last_at   bigint NOT NULL,
    -- Payloads gathered (rows of trigger_buffer_payloads).
    size      bigint NOT NULL,
    -- How it gathers: {"kind": "debounce", "quiet_ms"} or {"kind": "batch", "max_items", "max_wait_ms"}.
    gather    jsonb NOT NULL,
    -- The run it starts, as `create_run` reads it (id and input are filled in when it starts).
    run       jsonb NOT NULL,
    PRIMARY KEY (workflow, key)
);
-- due_buffers: earliest first, then workflow and key.
CREATE INDEX trigger_buffers_due ON __SCHEMA__.trigger_buffers (due_at, workflow, key);

-- The payloads of a buffer, oldest first (`n` from 0), as text: byte for byte.
CREATE TABLE __SCHEMA__.trigger_buffer_payloads (
    workflow text COLLATE "C" NOT NULL,
    key      text COLLATE "C" NOT NULL,
    n        bigint NOT NULL,
    payload  text NOT NULL,
    PRIMARY KEY (workflow, key, n),
    FOREIGN KEY (workflow, key) REFERENCES __SCHEMA__.trigger_buffers (workflow, key) ON DELETE CASCADE
);

-- The run a buffer starts at `p_now` (TriggerBuffer::into_run): `trig:<workflow>:<batch_id>`, with
-- the last payload (debounce) or every payload as a JSON array (batch), and `p_extra` (a payload
-- not stored yet) after them.
CREATE FUNCTION __SCHEMA__.buffer_run(p_buf __SCHEMA__.trigger_buffers, p_extra text, p_now bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_input text;
BEGIN
    IF p_buf.gather ->> 'kind' = 'debounce' THEN
        v_input := COALESCE(p_extra,
                            (SELECT b.payload FROM __SCHEMA__.trigger_buffer_payloads AS b
                              WHERE b.workflow = p_buf.workflow AND b.key = p_buf.key ORDER BY b.n DESC LIMIT 1),
                            'null');
    ELSE
        v_input := '[' || concat_ws(',',
                                    (SELECT string_agg(b.payload, ',' ORDER BY b.n)
                                       FROM __SCHEMA__.trigger_buffer_payloads AS b
                                      WHERE b.workflow = p_buf.workflow AND b.key = p_buf.key),
                                    p_extra) || ']';
    END IF;
    RETURN p_buf.run || jsonb_build_object('id', 'trig:' || p_buf.workflow || ':' || p_buf.batch_id,
                                           'input', v_input, 'created_at', p_now);
END
$$;

-- TriggerBuffer::gather: adds the payload to the open buffer of the append's `(workflow, key)`, or
-- opens one. NULL when the buffer is kept; when it is full, it is deleted and its run created:
-- `create_started`'s answer, with the run. The caller holds the buffer's advisory lock.
CREATE FUNCTION __SCHEMA__.gather(p jsonb, p_payload text, p_now bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_buf __SCHEMA__.trigger_buffers;
    v_open boolean;
BEGIN
    SELECT * INTO v_buf FROM __SCHEMA__.trigger_buffers AS b
     WHERE b.workflow = p ->> 'workflow' AND b.key = p ->> 'key' FOR UPDATE;
    v_open := FOUND;
    IF NOT v_open THEN
        v_buf.workflow := p ->> 'workflow';
        v_buf.key := p ->> 'key';
        v_buf.namespace := p -> 'run' ->> 'namespace';
        v_buf.batch_id := p ->> 'batch_id';
        v_buf.gather := p -> 'gather';
        v_buf.run := p -> 'run';
        v_buf.size := 0;
        v_buf.first_at := p_now;
    END IF;
    v_buf.last_at := p_now;
    IF v_buf.gather ->> 'kind' = 'debounce' THEN
        v_buf.due_at := __SCHEMA__.saturating_add(p_now, (v_buf.gather ->> 'quiet_ms')::numeric);
    ELSIF v_buf.gather ->> 'kind' = 'batch' THEN
        IF v_buf.size + 1 >= GREATEST((v_buf.gather ->> 'max_items')::bigint, 1) THEN
            -- Full: its run starts with this payload; the buffer (and its payloads) go.
            v_buf.run := __SCHEMA__.buffer_run(v_buf, p_payload, p_now);
            IF v_open THEN
                DELETE FROM __SCHEMA__.trigger_buffers WHERE workflow = v_buf.workflow AND key = v_buf.key;
            END IF;
            RETURN __SCHEMA__.create_started(v_buf.run, true);
        END IF;
        v_buf.due_at := __SCHEMA__.saturating_add(v_buf.first_at, (v_buf.gather ->> 'max_wait_ms')::numeric);
    ELSE
        RAISE EXCEPTION 'durable: trigger buffer (%, %) gathers by an unknown kind %',
            v_buf.workflow, v_buf.key, v_buf.gather ->> 'kind';
    END IF;
    IF v_open THEN
        IF v_buf.gather ->> 'kind' = 'debounce' THEN
            -- A debounce keeps the last payload only.
            DELETE FROM __SCHEMA__.trigger_buffer_payloads WHERE workflow = v_buf.workflow AND key = v_buf.key;
            v_buf.size := 0;
        END IF;
        UPDATE __SCHEMA__.trigger_buffers
           SET last_at = v_buf.last_at, due_at = v_buf.due_at, size = v_buf.size + 1
         WHERE workflow = v_buf.workflow AND key = v_buf.key;
    ELSE
        INSERT INTO __SCHEMA__.trigger_buffers (workflow, key, namespace, batch_id, due_at, first_at, last_at, size,
                                                gather, run)
        VALUES (v_buf.workflow, v_buf.key, v_buf.namespace, v_buf.batch_id, v_buf.due_at, v_buf.first_at,
                v_buf.last_at, 1, v_buf.gather, v_buf.run);
    END IF;
    INSERT INTO __SCHEMA__.trigger_buffer_payloads (workflow, key, n, payload)
    VALUES (v_buf.workflow, v_buf.key, v_buf.size, p_payload);
    RETURN NULL;
END
$$;

-- Starts the run of a due buffer if it is still the generation `batch_id`:
-- `{"flushed": false}`, or `{"flushed": true, "created", "run"}`.
CREATE FUNCTION __SCHEMA__.flush_buffer(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_buf __SCHEMA__.trigger_buffers;
BEGIN
    -- The row lock waits for a publish adding to the buffer; the batch id is checked against the
    -- row as that publish left it (deleted, when it filled the buffer).
    SELECT * INTO v_buf FROM __SCHEMA__.trigger_buffers AS b
     WHERE b.workflow = p ->> 'workflow' AND b.key = p ->> 'key' AND b.batch_id = p ->> 'batch_id' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('flushed', false);
    END IF;
    v_buf.run := __SCHEMA__.buffer_run(v_buf, NULL, (p ->> 'now')::bigint);
    DELETE FROM __SCHEMA__.trigger_buffers WHERE workflow = v_buf.workflow AND key = v_buf.key;
    RETURN jsonb_build_object('flushed', true) || __SCHEMA__.create_started(v_buf.run, true);
END
$$;

-- ---- publish -------------------------------------------------------------------------------------

-- Remembered dedupe ids of publishes.
CREATE TABLE __SCHEMA__.event_dedupe (
    name       text NOT NULL,
    id         text NOT NULL,
    keep_until bigint NOT NULL,
    PRIMARY KEY (name, id)
);
CREATE INDEX event_dedupe_expiry ON __SCHEMA__.event_dedupe (keep_until);

-- Publishes an event (Store::publish): `{"duplicate": true}`, or
-- `{"deliveries": [...], "started": [...]}` (the `start` runs' create answers in order, then the
-- runs of full buffers, with their rows).
CREATE FUNCTION __SCHEMA__.publish(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_name text := p ->> 'name';
    v_payload text := p ->> 'payload';
    v_now bigint := (p ->> 'now')::bigint;
    v_dedupe jsonb := CASE WHEN jsonb_typeof(p -> 'dedupe') = 'object' THEN p -> 'dedupe' END;
    v_deliveries jsonb;
    v_started jsonb := '[]'::jsonb;
    v_item jsonb;
    v_run jsonb;
BEGIN
    -- 1. The event name's advisory lock and every buffer's, in one ascending order, before any row
    --    lock: publishes of one name (and so of one dedupe id) run one after the other, and so do
    --    the publishes feeding one buffer.
    PERFORM __SCHEMA__.lock_keys(ARRAY[__SCHEMA__.lock_key('event', v_name)] || ARRAY(
        SELECT __SCHEMA__.lock_key('buffer', jsonb_build_array(x ->> 'workflow', x ->> 'key')::text)
          FROM jsonb_array_elements(p -> 'gather') AS x));

    -- 2. The dedupe id: remembered unless it is and has not expired (then nothing happens).
    IF v_dedupe IS NOT NULL THEN
        INSERT INTO __SCHEMA__.event_dedupe AS d (name, id, keep_until)
        VALUES (v_name, v_dedupe ->> 'id', (v_dedupe ->> 'keep_until')::bigint)
        ON CONFLICT (name, id) DO UPDATE SET keep_until = excluded.keep_until WHERE d.keep_until < v_now;
        IF NOT FOUND THEN
            RETURN jsonb_build_object('duplicate', true);
        END IF;
        -- Forget a few expired ids (of any name), skipping any another transaction holds.
        DELETE FROM __SCHEMA__.event_dedupe
         WHERE (name, id) IN (SELECT e.name, e.id FROM __SCHEMA__.event_dedupe AS e
                               WHERE e.keep_until < v_now ORDER BY e.keep_until LIMIT 32 FOR UPDATE SKIP LOCKED);
    END IF;

    -- 3. Delivered to every matching waiter, or buffered for a later wait.
    v_deliveries := __SCHEMA__.publish_event(v_name, v_payload, v_now);

    -- 4. The runs it starts, then the buffers it feeds.
    FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'start') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
        v_started := v_started || jsonb_build_array(__SCHEMA__.create_started(v_item, false));
    END LOOP;
    FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'gather') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
        v_run := __SCHEMA__.gather(v_item, v_payload, v_now);
        IF v_run IS NOT NULL THEN
            v_started := v_started || jsonb_build_array(v_run);
        END IF;
    END LOOP;
    RETURN jsonb_build_object('deliveries', v_deliveries, 'started', v_started);
END
$$;

-- ---- the batch entry point -------------------------------------------------------------------------

-- The batch entry point of version 2: `publish` replaces `publish_event` (a plain event is a
-- publish without dedupe or triggers), plus flushes and schedule writes.
CREATE OR REPLACE FUNCTION __SCHEMA__.apply(p_ops jsonb, p_channel text) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    v_op jsonb;
BEGIN
    PERFORM set_config('durable.notify_channel', COALESCE(p_channel, ''), true);
    FOR v_op IN SELECT x FROM jsonb_array_elements(p_ops) WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
        RETURN NEXT (CASE v_op ->> 'op'
            WHEN 'commit' THEN __SCHEMA__.commit(v_op)
            WHEN 'create_run' THEN __SCHEMA__.create_run(v_op -> 'run')
            WHEN 'claim_run' THEN __SCHEMA__.claim_run(v_op)
            WHEN 'renew_lease' THEN __SCHEMA__.renew_lease(v_op)
            WHEN 'release_lease' THEN __SCHEMA__.release_lease(v_op)
            WHEN 'update_run_if' THEN __SCHEMA__.update_run_if(v_op)
            WHEN 'send_signal' THEN jsonb_build_object('delivery',
                __SCHEMA__.send_signal(v_op ->> 'token', v_op ->> 'payload', (v_op ->> 'now')::bigint))
            WHEN 'publish' THEN __SCHEMA__.publish(v_op)
            WHEN 'flush_buffer' THEN __SCHEMA__.flush_buffer(v_op)
            WHEN 'save_schedule' THEN __SCHEMA__.save_schedule(v_op)
            WHEN 'delete_schedule' THEN __SCHEMA__.delete_schedule(v_op)
            WHEN 'delete_run' THEN __SCHEMA__.delete_run(v_op)
            WHEN 'enqueue' THEN __SCHEMA__.enqueue(v_op)
            WHEN 'ack_queued' THEN __SCHEMA__.ack_queued(v_op)
            WHEN 'release_queued' THEN __SCHEMA__.release_queued(v_op)
            ELSE jsonb_build_object('err', 'unknown_op', 'message', format('unknown operation %s', v_op ->> 'op'))
        END)::text;
    END LOOP;
END
$$;
