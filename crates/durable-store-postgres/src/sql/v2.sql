-- durable-store-postgres, schema version 2: the run queue of the store-backed transport
-- (`durable_core::RunQueue`): runs to execute (starts and wakes), claimed with a lease so a
-- consumer that dies leaves its items to others. The twin of the SQLite store's `run_queue`.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.
--
-- * At most one *unclaimed* item per run: the partial unique index `run_queue_open` is the
--   arbiter of the enqueue's upsert (a wake replaces a start, the higher priority is kept).
--   A claimed item leaves the index, so a newer unclaimed item of the same run may sit next to it.
-- * Enqueue, ack and release are operations of `apply` (they ride in the writer's batches with
--   the step commits: no round trip of their own). A claim is one statement of its own
--   (`UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED)`, sent by the client): it never
--   waits for a lock, so it can never be part of a deadlock.
-- * Lock order: enqueue and release upsert items in `run_id` order, so two batches queueing the
--   same runs cannot deadlock on each other's items.
-- * With a notify channel configured (PostgresOptions::notify_channel, `C`), every enqueue and
--   release NOTIFYs `C:queue` with the namespace of the items it queued, once per namespace, when
--   its transaction commits: consumers (`PostgresStore::queue_wakeups`) claim at once instead of
--   at their next poll.

CREATE TABLE __SCHEMA__.run_queue (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      text COLLATE "C" NOT NULL,
    reason      text NOT NULL,
    namespace   text NOT NULL,
    priority    integer NOT NULL,
    dedupe_key  text NOT NULL,
    enqueued_at bigint NOT NULL,
    claimed_by  text,
    claim_until bigint
);
-- At most one unclaimed item per run.
CREATE UNIQUE INDEX run_queue_open ON __SCHEMA__.run_queue (run_id) WHERE claimed_by IS NULL;
-- Claims: highest priority first, then oldest; of any namespace or of one.
CREATE INDEX run_queue_next ON __SCHEMA__.run_queue (priority DESC, enqueued_at, id);
CREATE INDEX run_queue_ns_next ON __SCHEMA__.run_queue (namespace, priority DESC, enqueued_at, id);

-- NOTIFY `<channel>:queue` with `p_namespace`, if the batch named a channel.
CREATE FUNCTION __SCHEMA__.notify_queue(p_namespace text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_channel text := current_setting('durable.notify_channel', true);
BEGIN
    IF v_channel IS NOT NULL AND v_channel <> '' THEN
        PERFORM pg_notify(v_channel || ':queue', CASE WHEN octet_length(p_namespace) < 7900 THEN p_namespace ELSE '' END);
    END IF;
END
$$;

-- Queues runs: `{"items": [{run_id, reason, namespace, priority, dedupe_key}], "now"}`, at most one
-- item per run (the client merges duplicates). Items of runs that do not exist are dropped;
-- a missing namespace is the run's, the priority at least the run's. `{"queued": n}`.
CREATE FUNCTION __SCHEMA__.enqueue(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := (p ->> 'now')::bigint;
    v_namespaces text[];
BEGIN
    WITH items AS (
        SELECT x ->> 'run_id' AS run_id, x ->> 'reason' AS reason, x ->> 'namespace' AS namespace,
               (x ->> 'priority')::integer AS priority, x ->> 'dedupe_key' AS dedupe_key
          FROM jsonb_array_elements(p -> 'items') AS x),
    queued AS (
        INSERT INTO __SCHEMA__.run_queue AS q (run_id, reason, namespace, priority, dedupe_key, enqueued_at)
        SELECT it.run_id, it.reason, COALESCE(it.namespace, r.namespace), GREATEST(it.priority, r.priority),
               it.dedupe_key, v_now
          FROM items AS it JOIN __SCHEMA__.runs AS r ON r.id = it.run_id
         ORDER BY it.run_id
        ON CONFLICT (run_id) WHERE claimed_by IS NULL DO UPDATE
            SET reason = CASE WHEN excluded.reason = 'wake' THEN 'wake' ELSE q.reason END,
                dedupe_key = CASE WHEN excluded.reason = 'wake' THEN excluded.dedupe_key ELSE q.dedupe_key END,
                priority = GREATEST(q.priority, excluded.priority)
        RETURNING q.namespace)
    SELECT ARRAY(SELECT DISTINCT namespace FROM queued) INTO v_namespaces;
    PERFORM __SCHEMA__.notify_queue(ns) FROM unnest(v_namespaces) AS ns;
    RETURN jsonb_build_object('queued', cardinality(v_namespaces));
END
$$;

-- Deletes handled items still claimed by the owner: `{"ids": [...], "owner"}`.
CREATE FUNCTION __SCHEMA__.ack_queued(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM __SCHEMA__.run_queue
     WHERE id = ANY (ARRAY(SELECT (x #>> '{}')::bigint FROM jsonb_array_elements(p -> 'ids') AS x))
       AND claimed_by = p ->> 'owner';
    RETURN jsonb_build_object('ok', true);
END
$$;

-- Hands claimed items back, unhandled: each goes back in line (keeping its place), merged into
-- the run's unclaimed item if it has one by now. `{"ids": [...], "owner"}`.
CREATE FUNCTION __SCHEMA__.release_queued(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_namespaces text[];
BEGIN
    WITH gone AS (
        DELETE FROM __SCHEMA__.run_queue
         WHERE id = ANY (ARRAY(SELECT (x #>> '{}')::bigint FROM jsonb_array_elements(p -> 'ids') AS x))
           AND claimed_by = p ->> 'owner'
        RETURNING run_id, reason, namespace, priority, dedupe_key, enqueued_at),
    merged AS (
        SELECT DISTINCT ON (run_id) run_id, reason, namespace,
               max(priority) OVER (PARTITION BY run_id) AS priority, dedupe_key,
               min(enqueued_at) OVER (PARTITION BY run_id) AS enqueued_at
          FROM gone
         ORDER BY run_id, (reason = 'wake') DESC),
    back AS (
        INSERT INTO __SCHEMA__.run_queue AS q (run_id, reason, namespace, priority, dedupe_key, enqueued_at)
        SELECT run_id, reason, namespace, priority, dedupe_key, enqueued_at FROM merged ORDER BY run_id
        ON CONFLICT (run_id) WHERE claimed_by IS NULL DO UPDATE
            SET reason = CASE WHEN excluded.reason = 'wake' THEN 'wake' ELSE q.reason END,
                dedupe_key = CASE WHEN excluded.reason = 'wake' THEN excluded.dedupe_key ELSE q.dedupe_key END,
                priority = GREATEST(q.priority, excluded.priority),
                enqueued_at = LEAST(q.enqueued_at, excluded.enqueued_at)
        RETURNING q.namespace)
    SELECT ARRAY(SELECT DISTINCT namespace FROM back) INTO v_namespaces;
    PERFORM __SCHEMA__.notify_queue(ns) FROM unnest(v_namespaces) AS ns;
    RETURN jsonb_build_object('ok', true);
END
$$;

-- The batch entry point of version 1, plus the run-queue operations.
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
            WHEN 'publish_event' THEN jsonb_build_object('deliveries',
                __SCHEMA__.publish_event(v_op ->> 'name', v_op ->> 'payload', (v_op ->> 'now')::bigint))
            WHEN 'delete_run' THEN __SCHEMA__.delete_run(v_op)
            WHEN 'enqueue' THEN __SCHEMA__.enqueue(v_op)
            WHEN 'ack_queued' THEN __SCHEMA__.ack_queued(v_op)
            WHEN 'release_queued' THEN __SCHEMA__.release_queued(v_op)
            ELSE jsonb_build_object('err', 'unknown_op', 'message', format('unknown operation %s', v_op ->> 'op'))
        END)::text;
    END LOOP;
END
$$;
