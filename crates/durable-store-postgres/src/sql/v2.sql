-- durable-store-postgres, schema version 2: the run queue of the store-backed transport
-- (`durable_core::RunQueue`): runs to execute (starts and wakes), claimed with a lease so a
-- consumer that dies leaves its items to others. The twin of the SQLite store's `run_queue`.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.
--
-- * At most one *unclaimed* item per run: the partial unique index `run_queue_open` is the
--   arbiter of the enqueue's upsert (a wake replaces a start, the higher priority is kept).
--   A claimed item leaves the index, so a newer unclaimed item of the same run may sit next to it.
-- * Enqueue, ack and release are operations of `apply`, folded into batches (one round trip and
--   one transaction for everything waiting) by a writer of their own. A claim is one statement of its own
--   (`UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED)`, sent by the client): it never
--   waits for a lock, so it can never be part of a deadlock.
-- * Queue operations never share a transaction with run-row or signal locks: the store sends them
--   through a writer of their own (`PostgresStore`'s queue writer), and every enqueue and release
--   first takes the schema's queue advisory lock (`lock_key('queue', '')`), so queue transactions
--   that upsert items run one after the other, and only ever wait for that lock or for a claim
--   statement (which never waits): they cannot deadlock. Items are upserted in `run_id` order.
-- * `claim_run` is replaced: it no longer waits for a run row that another transaction holds (the
--   lease holder committing, a delivery waking the run): it answers `busy` with the run as last
--   committed, and the engine looks again (`recheck_later`). With a shared run queue, engines
--   often claim runs that another engine's batch is writing; waiting there put claims into
--   deadlock cycles with whole batches (each one a `deadlock_timeout` stall of two writers).
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

-- The advisory lock every enqueue and release takes (see the header).
CREATE FUNCTION __SCHEMA__.lock_queue() RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(__SCHEMA__.lock_key('queue', ''))
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
    PERFORM __SCHEMA__.lock_queue();
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
    PERFORM __SCHEMA__.lock_queue();
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

-- `claim_run` of version 1, except that a run row another transaction holds is not waited for:
-- the claim is `busy` (or `terminal`) with the run as last committed.
CREATE OR REPLACE FUNCTION __SCHEMA__.claim_run(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_id text := p ->> 'id';
    v_owner text := p ->> 'owner';
    v_until bigint := (p ->> 'until')::bigint;
    v_now bigint := (p ->> 'now')::bigint;
    v_prev __SCHEMA__.runs;
    v_run __SCHEMA__.runs;
    v_recovered boolean;
BEGIN
    -- The row lock makes the outcome reported below the state the UPDATE's predicate sees.
    SELECT * INTO v_prev FROM __SCHEMA__.runs WHERE id = v_id FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        SELECT * INTO v_prev FROM __SCHEMA__.runs WHERE id = v_id;
        IF NOT FOUND THEN
            RETURN jsonb_build_object('outcome', 'not_found');
        END IF;
        -- Another transaction is writing the run: someone else's for now.
        RETURN jsonb_build_object(
            'outcome', CASE WHEN v_prev.status IN ('pending', 'running', 'suspended') THEN 'busy' ELSE 'terminal' END,
            'run', to_jsonb(v_prev));
    END IF;
    v_recovered := v_prev.status = 'running' AND v_prev.lease_owner IS NOT NULL AND v_prev.lease_owner <> v_owner;
    UPDATE __SCHEMA__.runs
       SET status = 'running', lease_owner = v_owner, lease_until = v_until, updated_at = v_now,
           recovery_attempts = recovery_attempts + CASE WHEN v_recovered THEN 1 ELSE 0 END
     WHERE id = v_id
       AND status IN ('pending', 'running', 'suspended')
       AND NOT (lease_owner IS NOT NULL AND lease_owner <> v_owner AND lease_until IS NOT NULL AND lease_until >= v_now)
    RETURNING * INTO v_run;
    IF NOT FOUND THEN
        RETURN jsonb_build_object(
            'outcome', CASE WHEN v_prev.status IN ('pending', 'running', 'suspended') THEN 'busy' ELSE 'terminal' END,
            'run', to_jsonb(v_prev));
    END IF;
    RETURN jsonb_build_object(
        'outcome', 'acquired',
        'run', to_jsonb(v_run),
        'previous', v_prev.status,
        'recovered', v_recovered,
        'history', (SELECT COALESCE(jsonb_agg(to_jsonb(c) ORDER BY c.seq), '[]'::jsonb)
                      FROM __SCHEMA__.checkpoints AS c WHERE c.run_id = v_id));
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
