-- durable-store-postgres, schema version 13: an enqueue that changes nothing writes nothing.
--
-- With the store-backed run queue every engine's pending poller queues the pending runs it finds
-- (up to `poll_batch`, every `poll_interval`), relying on the upsert to merge them into the items
-- already waiting. Measured with 1,000 runs started at once and three worker processes: each
-- poll was an `enqueue` of 500 items all of which were already queued, each one an
-- `ON CONFLICT DO UPDATE` that wrote a new version of the waiting item (a row lock, a tuple,
-- its index entries, WAL), 10-60 ms under the queue lock, during which the client's own enqueues
-- waited for that lock and the consumers' claims (`FOR UPDATE SKIP LOCKED`) skipped the locked
-- items and came back short.
--
-- The runs of the items are looked up by primary key, one probe per item. The join used to be
-- planned as a hash join over a scan of `runs` whenever the table had no statistics (a new schema,
-- autovacuum off): with 1,000 remote_chain runs (22,000 dead row versions) each enqueue read the
-- whole table, about 20 ms under the queue lock, 5.3 s of a 8.6 s run.
--
-- Now an item that the run's waiting (unclaimed) item already covers — a start, or a wake
-- merged into a wake with the same dedupe key — at no higher priority, is dropped before the
-- insert: no lock, no write. Its merge would have left the waiting item as it was, so the queue
-- reads the same. An item that does change the waiting one (a wake replacing a start, a higher
-- priority, a dedupe key that names a claim) is merged as before, and the upsert's `WHERE` skips
-- the write of a merge that a concurrent change made a no-op. Items of runs whose only item is
-- claimed are queued as before (the claim may belong to a consumer that died).
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

-- `enqueue` of version 10, dropping items the run's waiting item already covers.
CREATE OR REPLACE FUNCTION __SCHEMA__.enqueue(p jsonb) RETURNS jsonb
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
          FROM items AS it
          -- The run of each item by its key (`OFFSET 0` keeps the lookup a parameterised index
          -- probe per item): a join the planner may turn into a scan of every run row, dead
          -- versions included, when the table's statistics are missing or stale.
          JOIN LATERAL (SELECT r1.namespace, r1.priority FROM __SCHEMA__.runs AS r1
                         WHERE r1.id = it.run_id OFFSET 0) AS r ON true
         WHERE NOT EXISTS (
               SELECT 1 FROM __SCHEMA__.run_queue AS o
                WHERE o.run_id = it.run_id AND o.claimed_by IS NULL
                  AND o.priority >= GREATEST(it.priority, r.priority)
                  AND (it.reason = 'start' OR (o.reason = 'wake' AND o.dedupe_key = it.dedupe_key)))
         ORDER BY it.run_id
        ON CONFLICT (run_id) WHERE claimed_by IS NULL DO UPDATE
            SET reason = CASE WHEN excluded.reason = 'wake' THEN 'wake' ELSE q.reason END,
                dedupe_key = CASE WHEN excluded.reason = 'wake'
                                   AND (excluded.dedupe_key LIKE 'claim=%' OR q.dedupe_key NOT LIKE 'claim=%')
                                  THEN excluded.dedupe_key ELSE q.dedupe_key END,
                priority = GREATEST(q.priority, excluded.priority)
          WHERE excluded.priority > q.priority
             OR (excluded.reason = 'wake'
                 AND (q.reason <> 'wake'
                      OR (excluded.dedupe_key <> q.dedupe_key
                          AND (excluded.dedupe_key LIKE 'claim=%' OR q.dedupe_key NOT LIKE 'claim=%'))))
        RETURNING q.namespace)
    SELECT ARRAY(SELECT DISTINCT namespace FROM queued) INTO v_namespaces;
    PERFORM __SCHEMA__.notify_queue(ns) FROM unnest(v_namespaces) AS ns;
    RETURN jsonb_build_object('queued', cardinality(v_namespaces));
END
$$;
