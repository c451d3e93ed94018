-- durable-store-postgres, schema version 20: eager dispatch. A task may be dispatched already
-- claimed by a worker (`NewTask::claimed_by`): an engine hands the attempt to a worker beside
-- it that has a free slot, so no claim statement (and no wake-up of idle workers elsewhere)
-- follows. Measured with statement logging over `remote_chain` with 3 worker processes, the task
-- claim was about a tenth of the server's statement time.
--
-- `dispatch_tasks` writes such a task `claimed` by that worker as a claim at its `created_at`
-- stamps it (`Task::dispatched`): the lease from `created_at`, `claimed_at` and `heartbeat_at`
-- at `created_at`, one claim. It notifies only the queues that received a task left `queued`.

CREATE OR REPLACE FUNCTION __SCHEMA__.dispatch_tasks(p_tasks jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_queues text[];
BEGIN
    WITH put AS (
        INSERT INTO __SCHEMA__.tasks AS t (run_id, seq, attempt, name, queue, namespace, input, priority, requires,
                                           pickup_timeout_ms, timeout_ms, heartbeat_timeout_ms, created_at, state,
                                           trace_context, worker, lease_until, claimed_at, heartbeat_at, claims)
        SELECT DISTINCT ON (x ->> 'run_id', (x ->> 'seq')::bigint)
               x ->> 'run_id', (x ->> 'seq')::bigint, (x ->> 'attempt')::bigint, x ->> 'name', x ->> 'queue',
               x ->> 'namespace', x ->> 'input', (x ->> 'priority')::integer,
               ARRAY(SELECT r FROM jsonb_array_elements_text(x -> 'requires') AS r),
               (x ->> 'pickup_timeout_ms')::bigint, (x ->> 'timeout_ms')::bigint,
               (x ->> 'heartbeat_timeout_ms')::bigint, (x ->> 'created_at')::bigint,
               CASE WHEN x ->> 'claimed_by' IS NULL THEN 'queued' ELSE 'claimed' END, x ->> 'trace_context',
               x ->> 'claimed_by',
               CASE WHEN x ->> 'claimed_by' IS NOT NULL
                    THEN __SCHEMA__.saturating_add((x ->> 'created_at')::bigint, (x ->> 'heartbeat_timeout_ms')::numeric)
               END,
               CASE WHEN x ->> 'claimed_by' IS NOT NULL THEN (x ->> 'created_at')::bigint END,
               CASE WHEN x ->> 'claimed_by' IS NOT NULL THEN (x ->> 'created_at')::bigint END,
               CASE WHEN x ->> 'claimed_by' IS NOT NULL THEN 1 ELSE 0 END
          FROM jsonb_array_elements(p_tasks) WITH ORDINALITY AS a (x, i)
         ORDER BY x ->> 'run_id', (x ->> 'seq')::bigint, i DESC
        ON CONFLICT (run_id, seq) DO UPDATE
            SET attempt = excluded.attempt, name = excluded.name, queue = excluded.queue,
                namespace = excluded.namespace, input = excluded.input, priority = excluded.priority,
                requires = excluded.requires, pickup_timeout_ms = excluded.pickup_timeout_ms,
                timeout_ms = excluded.timeout_ms, heartbeat_timeout_ms = excluded.heartbeat_timeout_ms,
                created_at = excluded.created_at, trace_context = excluded.trace_context, state = excluded.state,
                worker = excluded.worker, lease_until = excluded.lease_until, claimed_at = excluded.claimed_at,
                heartbeat_at = excluded.heartbeat_at, progress = NULL, claims = excluded.claims, outcome = NULL
        RETURNING t.queue, t.state)
    SELECT ARRAY(SELECT DISTINCT queue FROM put WHERE state = 'queued') INTO v_queues;
    PERFORM __SCHEMA__.notify_tasks(q) FROM unnest(v_queues) AS q;
END
$$;
