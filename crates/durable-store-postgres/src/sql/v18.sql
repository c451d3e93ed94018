-- durable-store-postgres, schema version 18: the admission gate rows a commit or a batch locks
-- are locked in gate order, up front.
--
-- A commit locked the gates it releases in gate order (its step 1b), but then created its
-- children one by one, and `create_admitted` locked each keyed child's gate as it came: a
-- commit starting children at gates `a` then `b` and another starting children at `b` then `a`
-- each held one row and waited for the other's, until PostgreSQL's deadlock detector failed one
-- of them after `deadlock_timeout` (the writer ran it again). Batches did the same across their
-- operations: `lock_batch` ordered advisory keys and woken runs, not gate rows.
--
-- Now `commit_ordered` (what `apply` runs for a commit) takes, before `commit` runs, the commit's
-- advisory keys and then every gate row the commit will lock, one gate after the other in gate
-- order: the gates of its keyed children (a missing row inserted in its place in the order: a
-- child is never refused, so the commit creates its gate's row anyway, and an inserted row
-- holds off other inserts as a lock does), the gates it releases and, when it settles, every
-- gate its run holds or waits at. `commit` then takes each again, held already. A commit whose
-- lease is not held goes to `commit` at once, which refuses it having written nothing.
--
-- And `lock_batch` locks the rows of the gates a batch names (`gates`: keyed children and
-- starts, slots acquired or released) and of every gate of the runs that settle, complete a
-- task or are deleted in it, in gate order, after the advisory keys and before the rows of the
-- runs the batch delivers to: the same order as a commit (keys, gates, runs). A gate with no
-- row yet is created by the operation that first uses it, in the batch's order: two batches
-- each first using two new gates, in opposite orders, can still meet, and PostgreSQL's deadlock
-- detector still breaks that tie (the writer runs the batch again).
--
-- And `admission_acquire` reads no more of a long queue than its decision needs (see below).
--
-- Every function here is created or replaced: running this file again is harmless.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

-- A commit (`commit` of version 8), with its gate rows locked in gate order first when it has
-- keyed children (without any, `commit` orders its own: it locks the gates it releases together
-- in its step 1b). A commit `commit` will refuse (its lease is not held) goes to it at once, so
-- a refused commit writes no gate row.
CREATE OR REPLACE FUNCTION __SCHEMA__.commit_ordered(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_run text := p ->> 'run';
    v_gate record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM jsonb_array_elements(p -> 'children') AS c
                    WHERE jsonb_typeof(c -> 'admission') = 'object')
       OR NOT EXISTS (SELECT 1 FROM __SCHEMA__.runs AS r WHERE r.id = v_run AND r.lease_owner = p ->> 'owner') THEN
        RETURN __SCHEMA__.commit(p);
    END IF;
    -- 1. The advisory keys `commit` takes first (its step 1), before any row lock.
    PERFORM __SCHEMA__.lock_keys(ARRAY(
        SELECT __SCHEMA__.lock_key(w.kind, w.key) FROM __SCHEMA__.waiters AS w WHERE w.run_id = v_run
        UNION ALL
        SELECT __SCHEMA__.lock_key(x ->> 'kind', x ->> 'key') FROM jsonb_array_elements(p -> 'waits') AS x
        UNION ALL
        SELECT __SCHEMA__.lock_key('signal', x ->> 'token') FROM jsonb_array_elements(p -> 'signals') AS x));
    -- 2. Every gate row it locks, one gate after the other in gate order: the gates of its keyed
    --    children (a missing row is inserted, `GateRecord::new` as `admission_acquire` creates
    --    it: a child is never refused, so the commit creates it anyway), the gates it releases
    --    and, when it settles, every gate of its run. Inserting a row holds it as a lock does,
    --    so a new gate is taken in its place in the order too.
    FOR v_gate IN
        SELECT g.gate, a.admission FROM (
            SELECT c -> 'admission' ->> 'gate' AS gate FROM jsonb_array_elements(p -> 'children') AS c
             WHERE jsonb_typeof(c -> 'admission') = 'object'
            UNION
            SELECT x ->> 0 FROM jsonb_array_elements(COALESCE(p -> 'release_slots', '[]'::jsonb)) AS x
            UNION
            SELECT unnest(CASE WHEN jsonb_typeof(p -> 'end') = 'object' AND p -> 'end' ->> 'type' = 'settle'
                               THEN __SCHEMA__.admission_gates_of(v_run) ELSE '{}'::text[] END)) AS g
        LEFT JOIN LATERAL (
            SELECT c -> 'admission' AS admission FROM jsonb_array_elements(p -> 'children') AS c
             WHERE jsonb_typeof(c -> 'admission') = 'object' AND c -> 'admission' ->> 'gate' = g.gate
             LIMIT 1) AS a ON true
        ORDER BY g.gate
    LOOP
        IF v_gate.admission IS NOT NULL THEN
            INSERT INTO __SCHEMA__.admission_gates (gate, limits, next_ticket, round, window_start, window_count,
                                                    touched)
            SELECT v_gate.gate, v_gate.admission -> 'limits', 0, 0,
                   CASE WHEN x.period IS NULL THEN x.now ELSE x.now - x.now % x.period END, 0, x.now
              FROM (SELECT (v_gate.admission ->> 'now')::bigint AS now,
                           (v_gate.admission -> 'limits' ->> 'rate_period_ms')::bigint AS period) AS x
            ON CONFLICT (gate) DO NOTHING;
        END IF;
        PERFORM 1 FROM __SCHEMA__.admission_gates AS g WHERE g.gate = v_gate.gate FOR UPDATE;
    END LOOP;
    RETURN __SCHEMA__.commit(p);
END
$$;

-- `lock_batch` of version 12, locking the batch's gate rows in gate order between its advisory
-- keys and the rows of the runs it delivers to.
CREATE OR REPLACE FUNCTION __SCHEMA__.lock_batch(p jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_tokens text[] := ARRAY(SELECT jsonb_array_elements_text(p -> 'tokens'));
    v_events text[] := ARRAY(SELECT jsonb_array_elements_text(p -> 'events'));
    v_task_runs text[] := ARRAY(SELECT jsonb_array_elements_text(p -> 'task_runs'));
    v_targets text[];
BEGIN
    -- 1. Every advisory key, ascending (one statement: the locks are taken in the order the
    --    sorted keys are read).
    PERFORM pg_advisory_xact_lock(s.k) FROM (SELECT DISTINCT k FROM (
        WITH RECURSIVE doomed (id, path) AS (
            SELECT r.id, ARRAY[r.id] FROM __SCHEMA__.runs AS r
             WHERE r.id = ANY (ARRAY(SELECT jsonb_array_elements_text(p -> 'delete')))
            UNION ALL
            SELECT r.id, d.path || r.id FROM __SCHEMA__.runs AS r JOIN doomed AS d ON r.parent_id = d.id
             WHERE NOT (r.id = ANY (d.path)))
        SELECT __SCHEMA__.lock_key(w.kind, w.key) AS k FROM __SCHEMA__.waiters AS w
         WHERE w.run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(p -> 'probe') UNION ALL SELECT d.id FROM doomed AS d))
        UNION ALL
        SELECT __SCHEMA__.lock_key(k ->> 0, k ->> 1) FROM jsonb_array_elements(p -> 'keys') AS k
        UNION ALL
        SELECT __SCHEMA__.lock_key('buffer', jsonb_build_array(b ->> 0, b ->> 1)::text)
          FROM jsonb_array_elements(p -> 'buffers') AS b
        UNION ALL
        SELECT __SCHEMA__.lock_key('queue', '') WHERE COALESCE((p ->> 'queue')::boolean, false)) AS all_keys
     ORDER BY k) AS s;

    -- 2. The rows of the gates the batch names and of every gate of the runs that settle,
    --    complete a task or are deleted in it (all they may release), in gate order. Gates
    --    without a row yet are created by the operations, in their order.
    IF p ?| ARRAY['gates', 'settles', 'task_runs', 'delete'] THEN
        PERFORM __SCHEMA__.admission_lock(ARRAY(
            SELECT jsonb_array_elements_text(COALESCE(p -> 'gates', '[]'::jsonb))
            UNION
            SELECT unnest(__SCHEMA__.admission_gates_of(r.id)) FROM (
                SELECT jsonb_array_elements_text(COALESCE(p -> 'settles', '[]'::jsonb)) AS id
                UNION SELECT unnest(v_task_runs)
                UNION SELECT d.id FROM (
                    WITH RECURSIVE doomed (id, path) AS (
                        SELECT r.id, ARRAY[r.id] FROM __SCHEMA__.runs AS r
                         WHERE r.id = ANY (ARRAY(SELECT jsonb_array_elements_text(p -> 'delete')))
                        UNION ALL
                        SELECT r.id, d.path || r.id FROM __SCHEMA__.runs AS r JOIN doomed AS d ON r.parent_id = d.id
                         WHERE NOT (r.id = ANY (d.path)))
                    SELECT doomed.id FROM doomed) AS d) AS r));
    END IF;

    -- 3. The runs the batch delivers to, when there are two or more: their rows, in id order.
    IF cardinality(v_tokens) + cardinality(v_task_runs) < 2 AND cardinality(v_events) = 0 THEN
        RETURN;
    END IF;
    v_targets := ARRAY(
        SELECT w.run_id FROM __SCHEMA__.waiters AS w WHERE w.kind = 'signal' AND w.key = ANY (v_tokens)
        UNION
        SELECT w.run_id FROM __SCHEMA__.waiters AS w WHERE w.kind = 'event' AND w.key = ANY (v_events)
        UNION
        SELECT unnest(v_task_runs));
    IF cardinality(v_targets) >= 2 THEN
        PERFORM count(*) FROM (SELECT r.id FROM __SCHEMA__.runs AS r WHERE r.id = ANY (v_targets)
                                ORDER BY r.id FOR UPDATE) AS l;
    END IF;
END
$$;

-- `apply` of version 15, running a commit as `commit_ordered`, and `lock_batch` for a batch
-- that names gates or settling runs too.
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

-- `admission_acquire` of version 8, reading no more of a long queue than its decision needs:
-- the waiters ahead of a request are counted only as far as `decide` compares them
-- (`GateRecord::ahead_cap`), the queue's length only for a new request with a maximum and up
-- to it (a refusal counts them all, for its answer), and a fairness key's
-- round only at a gate with fairness. Before, each keyed start at a gate with n waiters read
-- all n twice: a bulk start of n keyed runs read about n² rows.
CREATE OR REPLACE FUNCTION __SCHEMA__.admission_acquire(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_gate text := p ->> 'gate';
    v_holder text := p ->> 'holder';
    v_key text := p ->> 'fairness_key';
    v_priority integer := (p ->> 'priority')::integer;
    v_limits jsonb := p -> 'limits';
    v_lease bigint := (p ->> 'lease_until')::bigint;
    v_max bigint := (p ->> 'max_waiting')::bigint;
    v_now bigint := (p ->> 'now')::bigint;
    v_period bigint := (p -> 'limits' ->> 'rate_period_ms')::bigint;
    v_conc bigint := (p -> 'limits' ->> 'concurrency')::bigint;
    v_g __SCHEMA__.admission_gates;
    v_handed jsonb := '[]'::jsonb;
    v_live bigint;
    v_waiting bigint;
    v_ahead bigint;
    v_cap bigint;
    v_queued boolean;
    v_rp bigint;
    v_rr bigint;
    v_rt bigint;
    v_key_round bigint;
    v_answer jsonb;
BEGIN
    -- The gate's row, created if new (`GateRecord::new`), and locked.
    INSERT INTO __SCHEMA__.admission_gates (gate, limits, next_ticket, round, window_start, window_count, touched)
    VALUES (v_gate, v_limits, 0, 0, CASE WHEN v_period IS NULL THEN v_now ELSE v_now - v_now % v_period END, 0, v_now)
    ON CONFLICT (gate) DO NOTHING;
    PERFORM 1 FROM __SCHEMA__.admission_gates AS g WHERE g.gate = v_gate FOR UPDATE;

    -- 1. Expired slots are reclaimed and handed on.
    DELETE FROM __SCHEMA__.admission_slots AS s WHERE s.gate = v_gate AND s.lease_until <= v_now;
    IF FOUND THEN
        v_handed := __SCHEMA__.admission_hand_off(v_gate, v_now);
    END IF;

    -- 2. A holder is admitted again (a leased slot takes the request's lease).
    UPDATE __SCHEMA__.admission_slots AS s SET lease_until = COALESCE(v_lease, s.lease_until)
     WHERE s.gate = v_gate AND s.holder = v_holder;
    IF FOUND THEN
        RETURN jsonb_build_object('admission', 'admitted', 'handed', v_handed);
    END IF;

    -- 3. The record takes the request's limits; its window rolls.
    SELECT * INTO v_g FROM __SCHEMA__.admission_gates AS g WHERE g.gate = v_gate;
    v_g.limits := v_limits;
    v_g.touched := GREATEST(v_g.touched, v_now);
    v_g := __SCHEMA__.admission_roll(v_g, v_now);
    v_live := __SCHEMA__.admission_live(v_gate, v_now);
    SELECT w.rank_priority, w.rank_round, w.rank_ticket INTO v_rp, v_rr, v_rt
      FROM __SCHEMA__.admission_waiters AS w WHERE w.gate = v_gate AND w.holder = v_holder;
    v_queued := FOUND;
    -- The queue's length matters only to a new request with a maximum: counted up to it.
    v_waiting := 0;
    IF NOT v_queued AND v_max IS NOT NULL THEN
        v_waiting := (SELECT count(*) FROM (SELECT 1 FROM __SCHEMA__.admission_waiters AS w
                                             WHERE w.gate = v_gate LIMIT v_max) AS l);
    END IF;
    IF NOT v_queued THEN
        -- `GateRecord::rank`, without taking the ticket yet.
        IF (v_limits ->> 'fairness')::boolean THEN
            v_key_round := __SCHEMA__.admission_key_round(v_gate, v_key);
        END IF;
        v_rp := CASE WHEN (v_limits ->> 'lowest_first')::boolean THEN v_priority ELSE -v_priority::bigint END;
        v_rr := CASE WHEN (v_limits ->> 'fairness')::boolean THEN GREATEST(COALESCE(v_key_round, v_g.round), v_g.round)
                     ELSE 0 END;
        v_rt := CASE WHEN (v_limits ->> 'lifo')::boolean THEN -v_g.next_ticket ELSE v_g.next_ticket END;
    END IF;
    -- The waiters ahead, counted no further than `decide` looks (`GateRecord::ahead_cap`): the
    -- free concurrency when limited, else the capacity; none when nothing limits.
    v_cap := __SCHEMA__.admission_capacity(v_limits, v_g.window_count, v_live);
    v_cap := CASE WHEN v_cap = 4294967295 THEN 0 WHEN v_conc IS NOT NULL THEN GREATEST(v_conc - v_live, 0) ELSE v_cap END;
    v_ahead := 0;
    IF v_cap > 0 THEN
        v_ahead := (SELECT count(*) FROM (SELECT 1 FROM __SCHEMA__.admission_waiters AS w
                                           WHERE w.gate = v_gate
                                             AND (w.rank_priority, w.rank_round, w.rank_ticket) < (v_rp, v_rr, v_rt)
                                           LIMIT v_cap) AS l);
    END IF;

    -- 4. `decide`.
    IF v_ahead < __SCHEMA__.admission_capacity(v_limits, v_g.window_count, v_live) THEN
        DELETE FROM __SCHEMA__.admission_waiters AS w WHERE w.gate = v_gate AND w.holder = v_holder;
        v_g := __SCHEMA__.admission_admitted(v_g, v_rr);
        IF v_conc IS NOT NULL THEN
            INSERT INTO __SCHEMA__.admission_slots AS s (gate, holder, run_id, acquired_at, lease_until)
            VALUES (v_gate, v_holder, p ->> 'run_id', v_now, v_lease)
            ON CONFLICT (gate, holder) DO UPDATE
                SET run_id = excluded.run_id, acquired_at = excluded.acquired_at, lease_until = excluded.lease_until;
        END IF;
        v_answer := jsonb_build_object('admission', 'admitted');
    ELSIF NOT v_queued AND v_max IS NOT NULL AND v_waiting >= v_max THEN
        -- A refusal writes nothing: the gate's record stays as it was. It reports every waiter
        -- (a rare answer: counted in full only here).
        SELECT count(*) INTO v_waiting FROM __SCHEMA__.admission_waiters AS w WHERE w.gate = v_gate;
        RETURN jsonb_build_object('admission', 'full', 'held', v_live, 'waiting', v_waiting, 'handed', v_handed);
    ELSE
        IF NOT v_queued THEN
            v_g.next_ticket := v_g.next_ticket + 1;
            INSERT INTO __SCHEMA__.admission_waiters (gate, holder, run_id, rank_priority, rank_round, rank_ticket,
                                                      priority, fairness_key, lease_ms, since)
            VALUES (v_gate, v_holder, p ->> 'run_id', v_rp, v_rr, v_rt, v_priority, v_key,
                    CASE WHEN v_lease IS NOT NULL THEN GREATEST(v_lease - v_now, 0) END, v_now);
        END IF;
        -- The window's end when the rate, not concurrency, holds the request back.
        v_answer := jsonb_build_object('admission', 'waiting', 'retry_at',
            CASE WHEN v_period IS NOT NULL
                      AND CASE WHEN v_conc IS NULL THEN 4294967295 ELSE GREATEST(v_conc - v_live, 0) END > v_ahead
                 THEN __SCHEMA__.saturating_add(v_g.window_start, v_period::numeric) END);
    END IF;
    PERFORM __SCHEMA__.admission_save(v_g);
    RETURN v_answer || jsonb_build_object('handed', v_handed);
END
$$;
