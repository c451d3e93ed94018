-- durable-store-postgres, schema version 7: remote steps. The tasks a run hands to worker
-- processes (`durable_core::task`), the workers' descriptors, and the `blocked` run status.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.
--
-- * One `tasks` row per remote step, keyed `(run_id, seq)`: the latest attempt's dispatch, where
--   it stands (`queued`, `claimed`, `finished`) and the log lines of every attempt (`jsonb`:
--   they are shown, never replayed). The input and the progress are payloads: `text`, byte for
--   byte. `deadline` (generated) is when the attempt expires unfinished: `created_at +
--   pickup_timeout` until its first claim, `claimed_at + timeout` after it.
-- * A commit's `tasks` are upserted `queued` at their `(run_id, seq)` (a re-dispatch replaces the
--   attempt and keeps the logs), in the transaction that records the step's `running` checkpoint
--   and registers its wait (`remote:<run>:<seq>`): a transactional outbox. An applied settle
--   finishes the run's unfinished tasks (`cancelled`). A run made terminal by `update_run_if`
--   (an operator's cancel) keeps them as they are: claims skip tasks of terminal runs,
--   heartbeats answer `cancelled`, and a result finishes the task (`run_terminal`).
-- * `complete_task` is an operation of `apply`, batched like a signal: under the wait token's
--   advisory lock (the lock `send_signal` takes) it locks the run row, then the task row (the
--   order a commit takes them), takes the waiter with `DELETE … RETURNING`, writes the
--   checkpoint and wakes the run as a delivery does (`wake_run`, shared with `resolve`).
-- * A claim is one statement sent by the client (`UPDATE … FROM (SELECT … FOR UPDATE SKIP
--   LOCKED)`): it never waits for a lock. Heartbeats and releases are one function call each,
--   in a transaction of their own on the pool (they lock task rows only, never a run row).
-- * With a notify channel (`C`), a commit that queues tasks and a release NOTIFY `C:tasks` with
--   the queue's name once per queue, when the transaction commits
--   (`PostgresStore::task_wakeups`).
-- * `blocked` is a parked run, like `suspended`: deliveries, events, results and `wake` patches
--   make it due, `due_runs` finds it, `claim_run` takes it.

-- ---- blocked runs ------------------------------------------------------------------------------

DROP INDEX __SCHEMA__.runs_due;
CREATE INDEX runs_due ON __SCHEMA__.runs (wake_at, id)
    WHERE status IN ('suspended', 'blocked', 'pending') AND wake_at IS NOT NULL;
DROP INDEX __SCHEMA__.runs_active_created;
CREATE INDEX runs_active_created ON __SCHEMA__.runs (created_at DESC, id DESC)
    WHERE status IN ('pending', 'running', 'suspended', 'blocked');

-- Wakes a run as a delivery does: wake_gen + 1, and a parked (suspended or blocked) run is due
-- now; NOTIFY its id.
CREATE FUNCTION __SCHEMA__.wake_run(p_run text, p_now bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE __SCHEMA__.runs
       SET wake_gen = wake_gen + 1,
           wake_at = CASE WHEN status IN ('suspended', 'blocked') THEN LEAST(COALESCE(wake_at, p_now), p_now)
                          ELSE wake_at END,
           updated_at = p_now
     WHERE id = p_run;
    PERFORM __SCHEMA__.notify(p_run);
END
$$;

-- `resolve` of version 1, waking the run with `wake_run` (blocked runs too).
CREATE OR REPLACE FUNCTION __SCHEMA__.resolve(p_run text, p_seq bigint, p_name text, p_kind text, p_payload text,
                                              p_now bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO __SCHEMA__.checkpoints (run_id, seq, name, kind, status, output, attempts, started_at, updated_at)
    VALUES (p_run, p_seq, p_name, p_kind, 'completed', p_payload, 0, p_now, p_now)
    ON CONFLICT (run_id, seq) DO UPDATE
        SET status = 'completed', output = excluded.output, updated_at = excluded.updated_at;
    PERFORM __SCHEMA__.wake_run(p_run, p_now);
END
$$;

-- `claim_run` of version 2, taking blocked runs too.
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
            'outcome', CASE WHEN v_prev.status IN ('pending', 'running', 'suspended', 'blocked') THEN 'busy'
                            ELSE 'terminal' END,
            'run', to_jsonb(v_prev));
    END IF;
    v_recovered := v_prev.status = 'running' AND v_prev.lease_owner IS NOT NULL AND v_prev.lease_owner <> v_owner;
    UPDATE __SCHEMA__.runs
       SET status = 'running', lease_owner = v_owner, lease_until = v_until, updated_at = v_now,
           recovery_attempts = recovery_attempts + CASE WHEN v_recovered THEN 1 ELSE 0 END
     WHERE id = v_id
       AND status IN ('pending', 'running', 'suspended', 'blocked')
       AND NOT (lease_owner IS NOT NULL AND lease_owner <> v_owner AND lease_until IS NOT NULL AND lease_until >= v_now)
    RETURNING * INTO v_run;
    IF NOT FOUND THEN
        RETURN jsonb_build_object(
            'outcome', CASE WHEN v_prev.status IN ('pending', 'running', 'suspended', 'blocked') THEN 'busy'
                            ELSE 'terminal' END,
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

-- ---- tasks and workers -------------------------------------------------------------------------

CREATE TABLE __SCHEMA__.tasks (
    run_id               text COLLATE "C" NOT NULL,
    seq                  bigint NOT NULL,
    attempt              bigint NOT NULL,
    name                 text NOT NULL,
    queue                text COLLATE "C" NOT NULL,
    namespace            text COLLATE "C" NOT NULL,
    input                text NOT NULL,
    priority             integer NOT NULL,
    requires             text[] NOT NULL DEFAULT '{}',
    pickup_timeout_ms    bigint,
    timeout_ms           bigint,
    heartbeat_timeout_ms bigint NOT NULL,
    created_at           bigint NOT NULL,
    state                text NOT NULL,
    worker               text,
    lease_until          bigint,
    claimed_at           bigint,
    heartbeat_at         bigint,
    progress             text,
    claims               bigint NOT NULL DEFAULT 0,
    logs                 jsonb NOT NULL DEFAULT '[]',
    outcome              text,
    deadline             bigint GENERATED ALWAYS AS (
        CASE WHEN claimed_at IS NULL THEN __SCHEMA__.saturating_add(created_at, pickup_timeout_ms::numeric)
             ELSE __SCHEMA__.saturating_add(claimed_at, timeout_ms::numeric) END) STORED,
    PRIMARY KEY (run_id, seq)
);
-- Claims: open tasks of a queue (and namespace) by priority, then age. Finished tasks (most of
-- the table, in time) are in no index but the primary key and the listing's.
CREATE INDEX tasks_claim ON __SCHEMA__.tasks (state, queue, namespace, priority DESC, created_at, run_id, seq)
    WHERE state <> 'finished';
-- Expired attempts (list_tasks by `expired_at`), earliest deadline first.
CREATE INDEX tasks_deadline ON __SCHEMA__.tasks (deadline) WHERE state <> 'finished' AND deadline IS NOT NULL;
-- Silent tasks (list_tasks by `silent_since`): by last heartbeat, or dispatch if never claimed.
CREATE INDEX tasks_silent ON __SCHEMA__.tasks ((COALESCE(heartbeat_at, created_at))) WHERE state <> 'finished';
-- The listing order.
CREATE INDEX tasks_created ON __SCHEMA__.tasks (created_at, run_id, seq);

CREATE TABLE __SCHEMA__.workers (
    id            text COLLATE "C" PRIMARY KEY,
    queues        text[] NOT NULL,
    capabilities  text[] NOT NULL,
    protocol_min  bigint NOT NULL,
    protocol_max  bigint NOT NULL,
    concurrency   bigint NOT NULL,
    started_at    bigint NOT NULL,
    heartbeat_at  bigint NOT NULL
);
CREATE INDEX workers_heartbeat ON __SCHEMA__.workers (heartbeat_at);

-- NOTIFY `<channel>:tasks` with `p_queue`, if the batch named a channel.
CREATE FUNCTION __SCHEMA__.notify_tasks(p_queue text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_channel text := current_setting('durable.notify_channel', true);
BEGIN
    IF v_channel IS NOT NULL AND v_channel <> '' THEN
        PERFORM pg_notify(v_channel || ':tasks', CASE WHEN octet_length(p_queue) < 7900 THEN p_queue ELSE '' END);
    END IF;
END
$$;

-- Finishes the unfinished tasks of a run that settled (outcome `cancelled`).
CREATE FUNCTION __SCHEMA__.finish_tasks_of(p_run text) RETURNS void
LANGUAGE sql AS $$
    UPDATE __SCHEMA__.tasks SET state = 'finished', outcome = 'cancelled', lease_until = NULL
     WHERE run_id = p_run AND state <> 'finished'
$$;

-- Upserts a commit's tasks `queued` (the last of duplicates wins; logs of a replaced attempt are
-- kept) and NOTIFYs each queue once.
CREATE FUNCTION __SCHEMA__.dispatch_tasks(p_tasks jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_queues text[];
BEGIN
    WITH put AS (
        INSERT INTO __SCHEMA__.tasks AS t (run_id, seq, attempt, name, queue, namespace, input, priority, requires,
                                           pickup_timeout_ms, timeout_ms, heartbeat_timeout_ms, created_at, state)
        SELECT DISTINCT ON (x ->> 'run_id', (x ->> 'seq')::bigint)
               x ->> 'run_id', (x ->> 'seq')::bigint, (x ->> 'attempt')::bigint, x ->> 'name', x ->> 'queue',
               x ->> 'namespace', x ->> 'input', (x ->> 'priority')::integer,
               ARRAY(SELECT r FROM jsonb_array_elements_text(x -> 'requires') AS r),
               (x ->> 'pickup_timeout_ms')::bigint, (x ->> 'timeout_ms')::bigint,
               (x ->> 'heartbeat_timeout_ms')::bigint, (x ->> 'created_at')::bigint, 'queued'
          FROM jsonb_array_elements(p_tasks) WITH ORDINALITY AS a (x, i)
         ORDER BY x ->> 'run_id', (x ->> 'seq')::bigint, i DESC
        ON CONFLICT (run_id, seq) DO UPDATE
            SET attempt = excluded.attempt, name = excluded.name, queue = excluded.queue,
                namespace = excluded.namespace, input = excluded.input, priority = excluded.priority,
                requires = excluded.requires, pickup_timeout_ms = excluded.pickup_timeout_ms,
                timeout_ms = excluded.timeout_ms, heartbeat_timeout_ms = excluded.heartbeat_timeout_ms,
                created_at = excluded.created_at, state = 'queued', worker = NULL, lease_until = NULL,
                claimed_at = NULL, heartbeat_at = NULL, progress = NULL, claims = 0, outcome = NULL
        RETURNING t.queue)
    SELECT ARRAY(SELECT DISTINCT queue FROM put) INTO v_queues;
    PERFORM __SCHEMA__.notify_tasks(q) FROM unnest(v_queues) AS q;
END
$$;

-- Records a task's result (Store::complete_task): `{"outcome": "accepted" | "duplicate" |
-- "run_terminal"}`. `p`: run_id, seq, attempt, token (the wait's), output (text) or error (a
-- StepError as JSON text) with timed_out, logs (a JSON array), now.
CREATE FUNCTION __SCHEMA__.complete_task(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_run text := p ->> 'run_id';
    v_seq bigint := (p ->> 'seq')::bigint;
    v_now bigint := (p ->> 'now')::bigint;
    v_token text := p ->> 'token';
    v_logs jsonb := COALESCE(p -> 'logs', '[]'::jsonb);
    v_status text;
    v_task __SCHEMA__.tasks;
    v_name text;
    v_outcome text;
BEGIN
    -- 1. The wait token's advisory lock (as send_signal), then the run row, then the task row:
    --    the order a commit takes them.
    PERFORM pg_advisory_xact_lock(__SCHEMA__.lock_key('signal', v_token));
    SELECT r.status INTO v_status FROM __SCHEMA__.runs AS r WHERE r.id = v_run FOR UPDATE;
    SELECT * INTO v_task FROM __SCHEMA__.tasks AS t WHERE t.run_id = v_run AND t.seq = v_seq FOR UPDATE;
    IF NOT FOUND OR v_task.attempt <> (p ->> 'attempt')::bigint OR v_task.state = 'finished' THEN
        RETURN jsonb_build_object('outcome', 'duplicate');
    END IF;
    -- 2. A settled (or deleted) run takes no result; its task is over.
    IF v_status IS NULL OR v_status NOT IN ('pending', 'running', 'suspended', 'blocked') THEN
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
    -- 4. The checkpoint, and the wake.
    IF jsonb_typeof(p -> 'output') = 'string' THEN
        PERFORM __SCHEMA__.resolve(v_run, v_seq, v_name, 'remote', p ->> 'output', v_now);
        v_outcome := 'completed';
    ELSE
        INSERT INTO __SCHEMA__.checkpoints (run_id, seq, name, kind, status, error, attempts, started_at, updated_at)
        VALUES (v_run, v_seq, v_name, 'remote', 'waiting', p ->> 'error', 0, v_now, v_now)
        ON CONFLICT (run_id, seq) DO UPDATE
            SET status = 'waiting', error = excluded.error, wake_at = NULL, updated_at = excluded.updated_at;
        PERFORM __SCHEMA__.wake_run(v_run, v_now);
        v_outcome := CASE WHEN (p ->> 'timed_out')::boolean THEN 'timed_out' ELSE 'failed' END;
    END IF;
    UPDATE __SCHEMA__.checkpoints SET attempts = v_task.attempt WHERE run_id = v_run AND seq = v_seq;
    UPDATE __SCHEMA__.tasks SET state = 'finished', outcome = v_outcome, lease_until = NULL, logs = logs || v_logs
     WHERE run_id = v_run AND seq = v_seq;
    RETURN jsonb_build_object('outcome', 'accepted');
END
$$;

-- A worker's heartbeat (Store::heartbeat_task), in a transaction of its own:
-- `{"outcome": "extended", "until": n}`, `{"outcome": "lost"}` or `{"outcome": "cancelled"}`.
CREATE FUNCTION __SCHEMA__.heartbeat_task(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_run text := p ->> 'run_id';
    v_seq bigint := (p ->> 'seq')::bigint;
    v_now bigint := (p ->> 'now')::bigint;
    v_task __SCHEMA__.tasks;
    v_until bigint;
BEGIN
    SELECT * INTO v_task FROM __SCHEMA__.tasks AS t WHERE t.run_id = v_run AND t.seq = v_seq FOR UPDATE;
    IF NOT FOUND OR v_task.attempt <> (p ->> 'attempt')::bigint THEN
        RETURN jsonb_build_object('outcome', 'lost');
    END IF;
    IF v_task.state = 'finished' THEN
        RETURN jsonb_build_object('outcome', 'cancelled');
    END IF;
    IF v_task.state <> 'claimed' OR v_task.worker IS DISTINCT FROM p ->> 'worker' THEN
        RETURN jsonb_build_object('outcome', 'lost');
    END IF;
    IF v_task.deadline <= v_now
       OR NOT EXISTS (SELECT 1 FROM __SCHEMA__.runs AS r
                       WHERE r.id = v_run AND r.status IN ('pending', 'running', 'suspended', 'blocked')) THEN
        RETURN jsonb_build_object('outcome', 'cancelled');
    END IF;
    v_until := __SCHEMA__.saturating_add(v_now, v_task.heartbeat_timeout_ms::numeric);
    UPDATE __SCHEMA__.tasks
       SET lease_until = v_until, heartbeat_at = v_now,
           progress = CASE WHEN jsonb_typeof(p -> 'progress') = 'string' THEN p ->> 'progress' ELSE progress END,
           logs = CASE WHEN p -> 'logs' = '[]'::jsonb THEN logs ELSE logs || (p -> 'logs') END
     WHERE run_id = v_run AND seq = v_seq;
    RETURN jsonb_build_object('outcome', 'extended', 'until', v_until);
END
$$;

-- Hands claimed tasks back (Store::release_tasks), in a transaction of its own: `p` is
-- `{"worker", "tasks": [{run_id, seq, attempt}]}`; NOTIFYs each queue given work once.
CREATE FUNCTION __SCHEMA__.release_tasks(p jsonb, p_channel text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_queues text[];
BEGIN
    PERFORM set_config('durable.notify_channel', COALESCE(p_channel, ''), true);
    WITH back AS (
        UPDATE __SCHEMA__.tasks AS t SET state = 'queued', lease_until = NULL
          FROM jsonb_to_recordset(p -> 'tasks') AS x (run_id text, seq bigint, attempt bigint)
         WHERE t.run_id = x.run_id AND t.seq = x.seq AND t.attempt = x.attempt
           AND t.state = 'claimed' AND t.worker = p ->> 'worker'
        RETURNING t.queue)
    SELECT ARRAY(SELECT DISTINCT queue FROM back) INTO v_queues;
    PERFORM __SCHEMA__.notify_tasks(q) FROM unnest(v_queues) AS q;
END
$$;

-- ---- commit, update_run_if and delete_run, with tasks -------------------------------------------

-- `commit` of version 4, plus its `tasks` (upserted `queued`, after the run row's lock) and an
-- applied settle finishing the run's unfinished tasks.
CREATE OR REPLACE FUNCTION __SCHEMA__.commit(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_run text := p ->> 'run';
    v_owner text := p ->> 'owner';
    v_now bigint := (p ->> 'now')::bigint;
    v_end jsonb := CASE WHEN jsonb_typeof(p -> 'end') = 'object' THEN p -> 'end' END;
    v_status text;
    v_raced bigint[] := '{}';
    v_seq bigint;
    v_item jsonb;
    v_deliveries jsonb := '[]'::jsonb;
    v_woken boolean := false;
    v_settled boolean := false;
    v_has_waits boolean := p -> 'waits' <> '[]'::jsonb;
    v_has_signals boolean := p -> 'signals' <> '[]'::jsonb;
    v_has_tasks boolean := COALESCE(p -> 'tasks', '[]'::jsonb) <> '[]'::jsonb;
    -- Progress (checkpoints, or a turn end other than a burial) resets `recovery_attempts` of a
    -- running run.
    v_progress boolean := (p -> 'checkpoints' <> '[]'::jsonb OR v_end IS NOT NULL)
                          AND COALESCE(v_end ->> 'status', '') <> 'dead';
BEGIN
    -- 1. The advisory locks of every token this commit may touch (its run's waiters, its waits,
    --    its outgoing signals), before any row lock.
    --    Most commits (a step's) have none of them: one index probe tells.
    IF v_has_waits OR v_has_signals
       OR EXISTS (SELECT 1 FROM __SCHEMA__.waiters AS w WHERE w.run_id = v_run) THEN
        PERFORM __SCHEMA__.lock_keys(ARRAY(
            SELECT __SCHEMA__.lock_key(w.kind, w.key) FROM __SCHEMA__.waiters AS w WHERE w.run_id = v_run
            UNION ALL
            SELECT __SCHEMA__.lock_key(x ->> 'kind', x ->> 'key') FROM jsonb_array_elements(p -> 'waits') AS x
            UNION ALL
            SELECT __SCHEMA__.lock_key('signal', x ->> 'token') FROM jsonb_array_elements(p -> 'signals') AS x));
    END IF;

    -- 2. The lease check: only the lease owner's commit gets the run row (and its lock).
    IF v_end IS NULL THEN
        UPDATE __SCHEMA__.runs AS r
           SET updated_at = v_now,
               recovery_attempts = CASE WHEN v_progress AND r.status = 'running' THEN 0 ELSE r.recovery_attempts END
         WHERE r.id = v_run AND r.lease_owner = v_owner
        RETURNING r.status INTO v_status;
    ELSE
        SELECT r.status INTO v_status FROM __SCHEMA__.runs AS r WHERE r.id = v_run AND r.lease_owner = v_owner
           FOR UPDATE;
    END IF;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM __SCHEMA__.runs AS r WHERE r.id = v_run) THEN
            RETURN jsonb_build_object('err', 'lease_lost');
        END IF;
        RETURN jsonb_build_object('err', 'not_found');
    END IF;
    IF v_end ->> 'type' = 'settle' AND v_status = 'running'
       AND NOT (v_status = ANY (ARRAY(SELECT jsonb_array_elements_text(v_end -> 'allowed_from')))) THEN
        RETURN jsonb_build_object('err', 'conflict', 'message',
                                  format('run %s: status %s cannot become %s', v_run, v_status, v_end ->> 'status'));
    END IF;

    -- 3. Expired waits first: a wait whose waiter a delivery already took keeps the delivery.
    IF p -> 'expire' <> '[]'::jsonb THEN
        FOR v_seq IN SELECT (x #>> '{}')::bigint FROM jsonb_array_elements(p -> 'expire') AS x LOOP
            DELETE FROM __SCHEMA__.waiters WHERE run_id = v_run AND seq = v_seq;
            IF NOT FOUND THEN
                v_raced := v_raced || v_seq;
            END IF;
        END LOOP;
    END IF;

    -- 4. Checkpoints, upserted by seq (the last of duplicates wins), except raced ones.
    IF p -> 'checkpoints' <> '[]'::jsonb THEN
        INSERT INTO __SCHEMA__.checkpoints AS c (run_id, seq, name, kind, status, input, output, error, attempts,
                                                 wake_at, started_at, updated_at)
        SELECT DISTINCT ON ((x ->> 'seq')::bigint)
               v_run, (x ->> 'seq')::bigint, x ->> 'name', x ->> 'kind', x ->> 'status', x ->> 'input',
               x ->> 'output', x ->> 'error', (x ->> 'attempts')::bigint, (x ->> 'wake_at')::bigint,
               (x ->> 'started_at')::bigint, (x ->> 'updated_at')::bigint
          FROM jsonb_array_elements(p -> 'checkpoints') WITH ORDINALITY AS t (x, i)
         WHERE NOT ((x ->> 'seq')::bigint = ANY (v_raced))
         ORDER BY (x ->> 'seq')::bigint, i DESC
        ON CONFLICT (run_id, seq) DO UPDATE
            SET name = excluded.name, kind = excluded.kind, status = excluded.status, input = excluded.input,
                output = excluded.output, error = excluded.error, attempts = excluded.attempts,
                wake_at = excluded.wake_at, started_at = excluded.started_at, updated_at = excluded.updated_at;
    END IF;

    -- 5. Waits, query state, children, outgoing signals, tasks.
    IF v_has_waits THEN
        FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'waits') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
            PERFORM __SCHEMA__.register_wait(v_item, v_now);
        END LOOP;
    END IF;
    IF p -> 'state' <> '[]'::jsonb THEN
        FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'state') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
            INSERT INTO __SCHEMA__.run_state (run_id, key, value) VALUES (v_run, v_item ->> 0, v_item ->> 1)
            ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value;
        END LOOP;
    END IF;
    IF p -> 'children' <> '[]'::jsonb THEN
        FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'children') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
            PERFORM __SCHEMA__.create_run(v_item);
        END LOOP;
    END IF;
    IF v_has_signals THEN
        FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'signals') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
            v_deliveries := v_deliveries
                || jsonb_build_array(COALESCE(__SCHEMA__.send_signal(v_item ->> 'token', v_item ->> 'payload', v_now),
                                              'null'::jsonb));
        END LOOP;
    END IF;
    IF v_has_tasks THEN
        PERFORM __SCHEMA__.dispatch_tasks(p -> 'tasks');
    END IF;

    -- 6. How the turn ends.
    IF v_end IS NULL THEN
        NULL; -- `updated_at` was set with the lease check
    ELSIF v_end ->> 'type' = 'suspend' AND v_status = 'running' THEN
        -- Suspends only if nothing was delivered since the turn loaded the run: the wake_gen
        -- compare is part of the UPDATE.
        UPDATE __SCHEMA__.runs
           SET status = 'suspended', wake_at = (v_end ->> 'wake_at')::bigint, lease_owner = NULL,
               lease_until = NULL, updated_at = v_now, recovery_attempts = 0
         WHERE id = v_run AND status = 'running' AND wake_gen = (v_end ->> 'seen_wake_gen')::bigint
           AND cardinality(v_raced) = 0;
        IF NOT FOUND THEN
            v_woken := true;
            UPDATE __SCHEMA__.runs SET updated_at = v_now, recovery_attempts = 0 WHERE id = v_run;
        END IF;
    ELSIF v_end ->> 'type' = 'settle' AND v_status = 'running' THEN
        UPDATE __SCHEMA__.runs
           SET status = v_end ->> 'status', output = v_end ->> 'output', error = v_end ->> 'error', wake_at = NULL,
               lease_owner = NULL, lease_until = NULL, updated_at = v_now,
               recovery_attempts = CASE WHEN v_progress THEN 0 ELSE recovery_attempts END
         WHERE id = v_run AND status = 'running';
        v_settled := FOUND;
        IF v_settled THEN
            -- A settled run must not swallow later signals, nor keep workers busy.
            DELETE FROM __SCHEMA__.waiters WHERE run_id = v_run;
            PERFORM __SCHEMA__.finish_tasks_of(v_run);
        END IF;
    END IF;
    -- A turn end that finds the run no longer running (an operator cancelled it mid-turn)
    -- changes nothing of the run row: terminal runs accept no transition.
    RETURN jsonb_build_object('woken', v_woken, 'settled', v_settled, 'deliveries', v_deliveries,
                              'raced', to_jsonb(v_raced));
END
$$;

-- `update_run_if` of version 1: `wake` makes a blocked run due too.
CREATE OR REPLACE FUNCTION __SCHEMA__.update_run_if(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_id text := p ->> 'id';
    v_expected text[] := ARRAY(SELECT jsonb_array_elements_text(p -> 'expected'));
    v_status text := p ->> 'status';
    v_allowed text[] := ARRAY(SELECT jsonb_array_elements_text(p -> 'allowed_from'));
    v_now bigint := (p ->> 'now')::bigint;
    v_wake boolean := (p ->> 'wake')::boolean;
    v_set_wake_at boolean := (p ->> 'set_wake_at')::boolean;
    v_current text;
    v_next text;
    v_item jsonb;
BEGIN
    PERFORM __SCHEMA__.lock_keys(ARRAY(
        SELECT __SCHEMA__.lock_key(w.kind, w.key) FROM __SCHEMA__.waiters AS w WHERE w.run_id = v_id
        UNION ALL
        SELECT __SCHEMA__.lock_key('signal', x ->> 'token') FROM jsonb_array_elements(p -> 'signals') AS x));
    -- The row lock makes the outcome reported below the state the UPDATE's predicate sees.
    SELECT r.status INTO v_current FROM __SCHEMA__.runs AS r WHERE r.id = v_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('applied', false);
    END IF;
    IF cardinality(v_expected) > 0 AND NOT (v_current = ANY (v_expected)) THEN
        RETURN jsonb_build_object('applied', false);
    END IF;
    IF v_status IS NOT NULL AND NOT (v_current = ANY (v_allowed)) THEN
        RETURN jsonb_build_object('err', 'conflict', 'message',
                                  format('run %s: status %s cannot become %s', v_id, v_current, v_status));
    END IF;
    v_next := COALESCE(v_status, v_current);
    -- The compare of this compare-and-set is the WHERE. `wake` acts as a delivery: wake_gen + 1,
    -- and a run that is parked (suspended or blocked) after the patch is due now.
    UPDATE __SCHEMA__.runs
       SET status = v_next,
           output = CASE WHEN (p ->> 'set_output')::boolean THEN p ->> 'output' ELSE output END,
           error = CASE WHEN (p ->> 'set_error')::boolean THEN p ->> 'error' ELSE error END,
           wake_at = CASE WHEN v_wake AND v_next IN ('suspended', 'blocked')
                          THEN LEAST(COALESCE(CASE WHEN v_set_wake_at THEN (p ->> 'wake_at')::bigint ELSE wake_at END,
                                              v_now), v_now)
                          ELSE CASE WHEN v_set_wake_at THEN (p ->> 'wake_at')::bigint ELSE wake_at END END,
           lease_owner = CASE WHEN (p ->> 'release_lease')::boolean THEN NULL ELSE lease_owner END,
           lease_until = CASE WHEN (p ->> 'release_lease')::boolean THEN NULL ELSE lease_until END,
           recovery_attempts = CASE WHEN (p ->> 'reset_recovery')::boolean THEN 0 ELSE recovery_attempts END,
           wake_gen = wake_gen + CASE WHEN v_wake THEN 1 ELSE 0 END,
           updated_at = v_now
     WHERE id = v_id
       AND (cardinality(v_expected) = 0 OR status = ANY (v_expected))
       AND (v_status IS NULL OR status = ANY (v_allowed));
    IF NOT FOUND THEN
        RAISE EXCEPTION 'durable: run % changed under its row lock', v_id;
    END IF;
    IF (p ->> 'clear_failed_checkpoints')::boolean THEN
        DELETE FROM __SCHEMA__.checkpoints WHERE run_id = v_id AND status = 'failed';
    END IF;
    IF p ->> 'truncate_history_from' IS NOT NULL THEN
        DELETE FROM __SCHEMA__.checkpoints WHERE run_id = v_id AND seq >= (p ->> 'truncate_history_from')::bigint;
    END IF;
    IF v_next IN ('completed', 'failed', 'cancelled', 'dead') THEN
        -- A settled run must not swallow later signals. Its tasks stay as they are: no claim
        -- takes them, a heartbeat is told to stop, and a result finds the run terminal and
        -- finishes the task (`run_terminal`).
        DELETE FROM __SCHEMA__.waiters WHERE run_id = v_id;
    END IF;
    FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'signals') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
        PERFORM __SCHEMA__.send_signal(v_item ->> 'token', v_item ->> 'payload', v_now);
    END LOOP;
    IF v_wake OR (v_next = 'pending' AND v_current <> 'pending') THEN
        PERFORM __SCHEMA__.notify(v_id);
    END IF;
    RETURN jsonb_build_object('applied', true);
END
$$;

-- `delete_run` of version 1, deleting the runs' tasks too.
CREATE OR REPLACE FUNCTION __SCHEMA__.delete_run(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_doomed text[];
    v_count bigint;
BEGIN
    v_doomed := ARRAY(
        WITH RECURSIVE d (id) AS (
            SELECT r.id FROM __SCHEMA__.runs AS r WHERE r.id = p ->> 'id'
            UNION
            SELECT r.id FROM __SCHEMA__.runs AS r JOIN d ON r.parent_id = d.id)
        SELECT d.id FROM d);
    IF cardinality(v_doomed) = 0 THEN
        RETURN jsonb_build_object('deleted', 0);
    END IF;
    PERFORM __SCHEMA__.lock_keys(ARRAY(
        SELECT __SCHEMA__.lock_key(w.kind, w.key) FROM __SCHEMA__.waiters AS w WHERE w.run_id = ANY (v_doomed)));
    DELETE FROM __SCHEMA__.checkpoints WHERE run_id = ANY (v_doomed);
    DELETE FROM __SCHEMA__.waiters WHERE run_id = ANY (v_doomed);
    DELETE FROM __SCHEMA__.run_state WHERE run_id = ANY (v_doomed);
    DELETE FROM __SCHEMA__.tasks WHERE run_id = ANY (v_doomed);
    DELETE FROM __SCHEMA__.runs WHERE id = ANY (v_doomed);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN jsonb_build_object('deleted', v_count);
END
$$;

-- ---- the batch entry point ----------------------------------------------------------------------

-- The batch entry point of version 6, plus `complete_task`.
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
            WHEN 'complete_task' THEN __SCHEMA__.complete_task(v_op)
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
