-- durable-store-postgres, schema version 9: trace contexts. A run keeps the W3C `traceparent`
-- its spans join (set when it is created; children inherit their parent's), and a task keeps its
-- run's, so a worker's span joins the run's trace. Both columns are NULL on rows written before.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

ALTER TABLE __SCHEMA__.runs ADD COLUMN trace_context text;
ALTER TABLE __SCHEMA__.tasks ADD COLUMN trace_context text;

-- `create_run` of version 6, storing the run's trace context.
CREATE OR REPLACE FUNCTION __SCHEMA__.create_run(p_run jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_id text := p_run ->> 'id';
    v_existing jsonb;
BEGIN
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

-- `dispatch_tasks` of version 7, storing each task's trace context (a redispatch replaces it).
CREATE OR REPLACE FUNCTION __SCHEMA__.dispatch_tasks(p_tasks jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_queues text[];
BEGIN
    WITH put AS (
        INSERT INTO __SCHEMA__.tasks AS t (run_id, seq, attempt, name, queue, namespace, input, priority, requires,
                                           pickup_timeout_ms, timeout_ms, heartbeat_timeout_ms, created_at, state, trace_context)
        SELECT DISTINCT ON (x ->> 'run_id', (x ->> 'seq')::bigint)
               x ->> 'run_id', (x ->> 'seq')::bigint, (x ->> 'attempt')::bigint, x ->> 'name', x ->> 'queue',
               x ->> 'namespace', x ->> 'input', (x ->> 'priority')::integer,
               ARRAY(SELECT r FROM jsonb_array_elements_text(x -> 'requires') AS r),
               (x ->> 'pickup_timeout_ms')::bigint, (x ->> 'timeout_ms')::bigint,
               (x ->> 'heartbeat_timeout_ms')::bigint, (x ->> 'created_at')::bigint, 'queued', x ->> 'trace_context'
          FROM jsonb_array_elements(p_tasks) WITH ORDINALITY AS a (x, i)
         ORDER BY x ->> 'run_id', (x ->> 'seq')::bigint, i DESC
        ON CONFLICT (run_id, seq) DO UPDATE
            SET attempt = excluded.attempt, name = excluded.name, queue = excluded.queue,
                namespace = excluded.namespace, input = excluded.input, priority = excluded.priority,
                requires = excluded.requires, pickup_timeout_ms = excluded.pickup_timeout_ms,
                timeout_ms = excluded.timeout_ms, heartbeat_timeout_ms = excluded.heartbeat_timeout_ms,
                created_at = excluded.created_at, trace_context = excluded.trace_context, state = 'queued',
                worker = NULL, lease_until = NULL, claimed_at = NULL, heartbeat_at = NULL, progress = NULL, claims = 0, outcome = NULL
        RETURNING t.queue)
    SELECT ARRAY(SELECT DISTINCT queue FROM put) INTO v_queues;
    PERFORM __SCHEMA__.notify_tasks(q) FROM unnest(v_queues) AS q;
END
$$;
