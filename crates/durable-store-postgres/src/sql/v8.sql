-- durable-store-postgres, schema version 8: flow control (`durable_core::admission`). Admission
-- gates, the slots held at them and the requests waiting for one, kept as
-- `durable_core::admission::AdmissionBook` keeps them, and written by the same rules.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.
--
-- * One `admission_gates` row per gate (`GateRecord`): its limits (as the client last sent them,
--   in the store's own JSON format, see `ops::LimitsJson`), the next arrival ticket, the fairness
--   round being served, the rate window and `touched`, the latest time any call on the gate
--   brought. One `admission_slots` row per held slot, one `admission_waiters` row per queued
--   request, with its rank as three columns (priority, round, ticket: compared in that order,
--   the least served first, as `Rank` is).
-- * Every call that reads or writes a gate's slots or waiters first locks the gate's row
--   (`INSERT … ON CONFLICT DO NOTHING` for an acquire, which may create it, then
--   `SELECT … FOR UPDATE`): acquirers and releasers of one gate, in any process, are
--   serialised, so a limit is never exceeded. A call touching several gates locks their rows in
--   gate order (`admission_lock`), and a commit, a patch or a delete locks its gates before the
--   run row (the order an acquire's hand-off takes them: gate, then the woken run).
-- * The arithmetic is `GateRecord`'s: `admission_roll` is `roll`, `admission_capacity` is
--   `capacity`, the decision in `admission_acquire` is `decide`, the hand-off loop in
--   `admission_hand_off` is `Gate::hand_off`. Counts are `u32` there: "unlimited" is
--   4294967295 here, and the rate window's count saturates at it.
-- * A slot handed to a waiter wakes its run (`admission_wake`): a run created waiting for its
--   concurrency key (`pending`, `wake_at = GATED` = i64::MAX - 1) is due now; any other run is woken
--   as a delivery wakes it (`wake_run` of version 7); either way wake_gen + 1 and NOTIFY.
-- * Commits apply `release_slots` and, on an applied settle, release everything the run has
--   (`admission_release_run`), in their own transaction; so do `update_run_if` to a terminal
--   status and `delete_run` (which hands each freed slot on at its gate's `touched` time). The
--   commit answers the woken runs in `handed_off`.
-- * A keyed start (`create_admitted`) is decided before the run is written; a refused one
--   (`queue_full`) writes no run. A keyed bulk start (`create_runs`) runs its creates in a
--   subtransaction: one refused start undoes the whole group and answers `queue_full`.
-- * `claim_run` answers `busy` for a run waiting for its key; `renew_lease` extends the leased
--   slots of the run with its lease.

-- ---- tables ------------------------------------------------------------------------------------

CREATE TABLE __SCHEMA__.admission_gates (
    gate         text COLLATE "C" PRIMARY KEY,
    limits       jsonb NOT NULL,
    next_ticket  bigint NOT NULL,
    round        bigint NOT NULL,
    window_start bigint NOT NULL,
    window_count bigint NOT NULL,
    touched      bigint NOT NULL
);

CREATE TABLE __SCHEMA__.admission_slots (
    gate        text COLLATE "C" NOT NULL,
    holder      text COLLATE "C" NOT NULL,
    run_id      text COLLATE "C" NOT NULL,
    acquired_at bigint NOT NULL,
    lease_until bigint,
    PRIMARY KEY (gate, holder)
);
-- A run's slots (released when it settles, renewed with its lease).
CREATE INDEX admission_slots_run ON __SCHEMA__.admission_slots (run_id);

CREATE TABLE __SCHEMA__.admission_waiters (
    gate          text COLLATE "C" NOT NULL,
    holder        text COLLATE "C" NOT NULL,
    run_id        text COLLATE "C" NOT NULL,
    rank_priority bigint NOT NULL,
    rank_round    bigint NOT NULL,
    rank_ticket   bigint NOT NULL,
    priority      integer NOT NULL,
    fairness_key  text COLLATE "C" NOT NULL,
    lease_ms      bigint,
    since         bigint NOT NULL,
    PRIMARY KEY (gate, holder)
);
-- The queue of a gate, best first (its head, and how many rank before a request).
CREATE INDEX admission_waiters_rank ON __SCHEMA__.admission_waiters (gate, rank_priority, rank_round, rank_ticket);
-- The last round a fairness key's waiters hold.
CREATE INDEX admission_waiters_key ON __SCHEMA__.admission_waiters (gate, fairness_key, rank_round);
-- A run's queued requests.
CREATE INDEX admission_waiters_run ON __SCHEMA__.admission_waiters (run_id);

-- ---- GateRecord's helpers ------------------------------------------------------------------------
-- The statements that read slots and waiters are each in one small function of their own: the
-- plan test (`tests/pg_plans.rs`) EXPLAINs the same text (`src/admission.rs`, checked by a unit test).

-- `GateRecord::capacity`: how many more may be admitted with `p_live` slots held (4294967295:
-- nothing limits).
CREATE FUNCTION __SCHEMA__.admission_capacity(p_limits jsonb, p_window_count bigint, p_live bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT LEAST(
        CASE WHEN p_limits ->> 'concurrency' IS NULL THEN 4294967295
             ELSE GREATEST((p_limits ->> 'concurrency')::bigint - p_live, 0) END,
        CASE WHEN p_limits ->> 'rate_limit' IS NULL THEN 4294967295
             ELSE GREATEST((p_limits ->> 'rate_limit')::bigint - p_window_count, 0) END)
$$;

-- `GateRecord::roll`: a new rate window (aligned to the period) once the current one is over.
CREATE FUNCTION __SCHEMA__.admission_roll(p_g __SCHEMA__.admission_gates, p_now bigint)
RETURNS __SCHEMA__.admission_gates
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_period bigint := (p_g.limits ->> 'rate_period_ms')::bigint;
BEGIN
    IF v_period IS NOT NULL AND p_now >= __SCHEMA__.saturating_add(p_g.window_start, v_period::numeric) THEN
        p_g.window_start := p_now - p_now % v_period;
        p_g.window_count := 0;
    END IF;
    RETURN p_g;
END
$$;

-- `GateRecord::admitted`: one more admission in the window; with fairness, the round served
-- catches up with the admitted rank's.
CREATE FUNCTION __SCHEMA__.admission_admitted(p_g __SCHEMA__.admission_gates, p_round bigint)
RETURNS __SCHEMA__.admission_gates
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    p_g.window_count := LEAST(p_g.window_count + 1, 4294967295);
    IF (p_g.limits ->> 'fairness')::boolean THEN
        p_g.round := GREATEST(p_g.round, p_round);
    END IF;
    RETURN p_g;
END
$$;

-- Stores a gate's record (its row is locked).
CREATE FUNCTION __SCHEMA__.admission_save(p_g __SCHEMA__.admission_gates) RETURNS void
LANGUAGE sql AS $$
    UPDATE __SCHEMA__.admission_gates
       SET limits = p_g.limits, next_ticket = p_g.next_ticket, round = p_g.round, window_start = p_g.window_start,
           window_count = p_g.window_count, touched = p_g.touched
     WHERE gate = p_g.gate
$$;

-- Slots of a gate that count at `p_now` (a leased one until its lease passes).
CREATE FUNCTION __SCHEMA__.admission_live(p_gate text, p_now bigint) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT count(*) FROM __SCHEMA__.admission_slots AS s
             WHERE s.gate = p_gate AND (s.lease_until IS NULL OR s.lease_until > p_now));
END
$$;

-- The holder at the head of a gate's queue (NULL: none waits).
CREATE FUNCTION __SCHEMA__.admission_head(p_gate text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT w.holder FROM __SCHEMA__.admission_waiters AS w
             WHERE w.gate = p_gate ORDER BY w.rank_priority, w.rank_round, w.rank_ticket LIMIT 1);
END
$$;

-- How many waiters of a gate rank before a rank.
CREATE FUNCTION __SCHEMA__.admission_ahead(p_gate text, p_priority bigint, p_round bigint, p_ticket bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT count(*) FROM __SCHEMA__.admission_waiters AS w
             WHERE w.gate = p_gate AND (w.rank_priority, w.rank_round, w.rank_ticket) < (p_priority, p_round, p_ticket));
END
$$;

-- The round after the last one a fairness key's waiters hold (NULL: the key has none waiting).
CREATE FUNCTION __SCHEMA__.admission_key_round(p_gate text, p_key text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT max(w.rank_round) + 1 FROM __SCHEMA__.admission_waiters AS w
             WHERE w.gate = p_gate AND w.fairness_key = p_key);
END
$$;

-- The gates a release of run `p_run` looks at: those it holds or waits at (their expired slots
-- are reclaimed too; other gates are left to the next call on them), in gate order.
CREATE FUNCTION __SCHEMA__.admission_gates_of(p_run text) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN ARRAY(SELECT x.gate FROM (
        SELECT s.gate FROM __SCHEMA__.admission_slots AS s WHERE s.run_id = p_run
        UNION SELECT w.gate FROM __SCHEMA__.admission_waiters AS w WHERE w.run_id = p_run) AS x
        ORDER BY x.gate);
END
$$;

-- Locks the rows of `p_gates` (those that exist) in gate order: transactions locking
-- overlapping sets of gates cannot deadlock on them.
CREATE FUNCTION __SCHEMA__.admission_lock(p_gates text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(p_gates) > 0 THEN
        PERFORM 1 FROM __SCHEMA__.admission_gates AS g WHERE g.gate = ANY (p_gates) ORDER BY g.gate FOR UPDATE;
    END IF;
END
$$;

-- ---- hand-off, release, wake ---------------------------------------------------------------------

-- `Gate::hand_off`: hands the free capacity of a gate (its row locked) to the best waiters, at
-- `p_now` or the gate's `touched` time if later. Returns the hand-offs,
-- `[{gate, holder, run_id, at}]`, in the order made.
CREATE FUNCTION __SCHEMA__.admission_hand_off(p_gate text, p_now bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_g __SCHEMA__.admission_gates;
    v_w __SCHEMA__.admission_waiters;
    v_holder text;
    v_at bigint;
    v_out jsonb := '[]'::jsonb;
BEGIN
    SELECT * INTO v_g FROM __SCHEMA__.admission_gates AS g WHERE g.gate = p_gate FOR UPDATE;
    IF NOT FOUND THEN
        RETURN v_out;
    END IF;
    v_at := GREATEST(v_g.touched, p_now);
    v_g.touched := v_at;
    v_g := __SCHEMA__.admission_roll(v_g, v_at);
    LOOP
        EXIT WHEN __SCHEMA__.admission_capacity(v_g.limits, v_g.window_count,
                                                __SCHEMA__.admission_live(p_gate, v_at)) = 0;
        v_holder := __SCHEMA__.admission_head(p_gate);
        EXIT WHEN v_holder IS NULL;
        DELETE FROM __SCHEMA__.admission_waiters AS w WHERE w.gate = p_gate AND w.holder = v_holder
        RETURNING * INTO v_w;
        v_g := __SCHEMA__.admission_admitted(v_g, v_w.rank_round);
        IF v_g.limits ->> 'concurrency' IS NOT NULL THEN
            INSERT INTO __SCHEMA__.admission_slots AS s (gate, holder, run_id, acquired_at, lease_until)
            VALUES (p_gate, v_w.holder, v_w.run_id, v_at,
                    CASE WHEN v_w.lease_ms IS NOT NULL THEN __SCHEMA__.saturating_add(v_at, v_w.lease_ms::numeric) END)
            ON CONFLICT (gate, holder) DO UPDATE
                SET run_id = excluded.run_id, acquired_at = excluded.acquired_at, lease_until = excluded.lease_until;
        END IF;
        v_out := v_out || jsonb_build_array(
            jsonb_build_object('gate', p_gate, 'holder', v_w.holder, 'run_id', v_w.run_id, 'at', v_at));
    END LOOP;
    PERFORM __SCHEMA__.admission_save(v_g);
    RETURN v_out;
END
$$;

-- `AdmissionBook::release`: deletes `p_holder`'s slot and waiter row at `p_gate`, reclaims the
-- gate's expired slots, and hands the freed capacity on. Returns the hand-offs.
CREATE FUNCTION __SCHEMA__.admission_release(p_gate text, p_holder text, p_now bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_freed boolean;
    v_reclaimed boolean;
BEGIN
    PERFORM 1 FROM __SCHEMA__.admission_gates AS g WHERE g.gate = p_gate FOR UPDATE;
    IF NOT FOUND THEN
        RETURN '[]'::jsonb;
    END IF;
    DELETE FROM __SCHEMA__.admission_slots AS s WHERE s.gate = p_gate AND s.holder = p_holder;
    v_freed := FOUND;
    DELETE FROM __SCHEMA__.admission_waiters AS w WHERE w.gate = p_gate AND w.holder = p_holder;
    DELETE FROM __SCHEMA__.admission_slots AS s WHERE s.gate = p_gate AND s.lease_until <= p_now;
    v_reclaimed := FOUND;
    IF v_freed OR v_reclaimed THEN
        RETURN __SCHEMA__.admission_hand_off(p_gate, p_now);
    END IF;
    RETURN '[]'::jsonb;
END
$$;

-- `AdmissionBook::release_run`: releases every slot and queued request of `p_run`, reclaims the
-- expired slots of the gates it had something at, and hands the freed capacity on, gate by gate.
-- Returns the hand-offs. (Should a hand-off of another transaction give the run a slot at a gate
-- while this one locks, that gate is released in a second pass.)
CREATE FUNCTION __SCHEMA__.admission_release_run(p_run text, p_now bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_gates text[] := __SCHEMA__.admission_gates_of(p_run);
    v_gate text;
    v_freed boolean;
    v_reclaimed boolean;
    v_out jsonb := '[]'::jsonb;
BEGIN
    WHILE cardinality(v_gates) > 0 LOOP
        PERFORM __SCHEMA__.admission_lock(v_gates);
        FOREACH v_gate IN ARRAY v_gates LOOP
            DELETE FROM __SCHEMA__.admission_slots AS s WHERE s.gate = v_gate AND s.run_id = p_run;
            v_freed := FOUND;
            DELETE FROM __SCHEMA__.admission_waiters AS w WHERE w.gate = v_gate AND w.run_id = p_run;
            DELETE FROM __SCHEMA__.admission_slots AS s WHERE s.gate = v_gate AND s.lease_until <= p_now;
            v_reclaimed := FOUND;
            IF v_freed OR v_reclaimed THEN
                v_out := v_out || __SCHEMA__.admission_hand_off(v_gate, p_now);
            END IF;
        END LOOP;
        v_gates := ARRAY(SELECT s.gate FROM __SCHEMA__.admission_slots AS s WHERE s.run_id = p_run
                         UNION SELECT w.gate FROM __SCHEMA__.admission_waiters AS w WHERE w.run_id = p_run
                         ORDER BY 1);
    END LOOP;
    RETURN v_out;
END
$$;

-- Wakes the runs of hand-offs, at `p_now` (NULL: each at its hand-off's time), one wake per
-- hand-off: a run waiting for its concurrency key is due now; any other run is woken as a
-- delivery wakes it (wake_gen + 1, a parked run due now). NOTIFYs each woken run.
CREATE FUNCTION __SCHEMA__.admission_wake(p_handed jsonb, p_now bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_h jsonb;
    v_at bigint;
BEGIN
    FOR v_h IN SELECT x FROM jsonb_array_elements(p_handed) WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
        v_at := COALESCE(p_now, (v_h ->> 'at')::bigint);
        UPDATE __SCHEMA__.runs
           SET wake_gen = wake_gen + 1,
               wake_at = CASE WHEN status = 'pending' AND wake_at = 9223372036854775806 THEN v_at
                              WHEN status IN ('suspended', 'blocked') THEN LEAST(COALESCE(wake_at, v_at), v_at)
                              ELSE wake_at END,
               updated_at = v_at
         WHERE id = v_h ->> 'run_id';
        IF FOUND THEN
            PERFORM __SCHEMA__.notify(v_h ->> 'run_id');
        END IF;
    END LOOP;
END
$$;

-- The run ids of hand-offs, in order.
CREATE FUNCTION __SCHEMA__.admission_runs(p_handed jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT COALESCE(jsonb_agg(x -> 'run_id' ORDER BY i), '[]'::jsonb)
      FROM jsonb_array_elements(p_handed) WITH ORDINALITY AS t (x, i)
$$;

-- A task's result (Store::complete_task): v7's `complete_task`, and the admission slot a gated
-- remote step holds while its attempt is out released and handed on once the result is accepted.
-- The slot's gate is locked first (gates before run rows, the order commits take them).
CREATE FUNCTION __SCHEMA__.complete_task_admitted(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_run text := p ->> 'run_id';
    v_now bigint := (p ->> 'now')::bigint;
    v_holder text := v_run || ':' || (p ->> 'seq');
    v_gate text;
    v_answer jsonb;
BEGIN
    SELECT s.gate INTO v_gate FROM __SCHEMA__.admission_slots AS s WHERE s.run_id = v_run AND s.holder = v_holder;
    IF v_gate IS NOT NULL THEN
        PERFORM __SCHEMA__.admission_lock(ARRAY[v_gate]);
    END IF;
    v_answer := __SCHEMA__.complete_task(p);
    IF v_gate IS NOT NULL AND v_answer ->> 'outcome' = 'accepted' THEN
        PERFORM __SCHEMA__.admission_wake(__SCHEMA__.admission_release(v_gate, v_holder, v_now), v_now);
    END IF;
    RETURN v_answer;
END
$$;

-- ---- acquire ---------------------------------------------------------------------------------------

-- `AdmissionBook::acquire`: `p` is a SlotRequest (`ops::SlotRequestJson`). Answers
-- `{"admission": "admitted" | "waiting" | "full", "retry_at", "held", "waiting", "handed"}`, the
-- hand-offs of a reclaim in `handed` (their runs are not woken here: the caller wakes them).
CREATE FUNCTION __SCHEMA__.admission_acquire(p jsonb) RETURNS jsonb
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
    SELECT count(*) INTO v_waiting FROM __SCHEMA__.admission_waiters AS w WHERE w.gate = v_gate;
    IF NOT v_queued THEN
        -- `GateRecord::rank`, without taking the ticket yet.
        v_key_round := __SCHEMA__.admission_key_round(v_gate, v_key);
        v_rp := CASE WHEN (v_limits ->> 'lowest_first')::boolean THEN v_priority ELSE -v_priority::bigint END;
        v_rr := CASE WHEN (v_limits ->> 'fairness')::boolean THEN GREATEST(COALESCE(v_key_round, v_g.round), v_g.round)
                     ELSE 0 END;
        v_rt := CASE WHEN (v_limits ->> 'lifo')::boolean THEN -v_g.next_ticket ELSE v_g.next_ticket END;
    END IF;
    v_ahead := __SCHEMA__.admission_ahead(v_gate, v_rp, v_rr, v_rt);

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
        -- A refusal writes nothing: the gate's record stays as it was.
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

-- Store::acquire_slot: `admission_acquire`, waking the runs a reclaim handed slots to.
CREATE FUNCTION __SCHEMA__.acquire_slot(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_answer jsonb := __SCHEMA__.admission_acquire(p);
BEGIN
    PERFORM __SCHEMA__.admission_wake(v_answer -> 'handed', (p ->> 'now')::bigint);
    RETURN v_answer - 'handed';
END
$$;

-- Store::release_slot: `{"handed": [run ids]}`.
CREATE FUNCTION __SCHEMA__.release_slot(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_handed jsonb := __SCHEMA__.admission_release(p ->> 'gate', p ->> 'holder', (p ->> 'now')::bigint);
BEGIN
    PERFORM __SCHEMA__.admission_wake(v_handed, (p ->> 'now')::bigint);
    RETURN jsonb_build_object('handed', __SCHEMA__.admission_runs(v_handed));
END
$$;

-- ---- keyed starts ----------------------------------------------------------------------------------

-- `create_run` with a concurrency key (`p_admission`, a SlotRequest; NULL: a plain create): an
-- existing run is answered as is, nothing decided; else the request (holder: the run) is decided
-- first. Full: `{"err": "queue_full", "gate", "held", "waiting"}` and no run written; waiting: the
-- run is created `pending` with `wake_at = GATED` (`"gated": true` in the answer).
CREATE FUNCTION __SCHEMA__.create_admitted(p_run jsonb, p_admission jsonb) RETURNS jsonb
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

-- Store::create_runs with keyed starts: `p` is `{"runs": [{"run", "admission"}]}`. Answers
-- `{"answers": [create_admitted's answer per run]}`, or, if a start is refused, its
-- `queue_full` answer with nothing of the group written (a subtransaction).
CREATE FUNCTION __SCHEMA__.create_runs(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_item jsonb;
    v_answer jsonb;
    v_answers jsonb := '[]'::jsonb;
BEGIN
    BEGIN
        FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'runs') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
            v_answer := __SCHEMA__.create_admitted(v_item -> 'run', v_item -> 'admission');
            IF v_answer ->> 'err' = 'queue_full' THEN
                RAISE EXCEPTION USING ERRCODE = 'DQ001', MESSAGE = 'durable: a keyed start of the group was refused';
            END IF;
            v_answers := v_answers || jsonb_build_array(v_answer);
        END LOOP;
    EXCEPTION WHEN SQLSTATE 'DQ001' THEN
        RETURN v_answer;
    END;
    RETURN jsonb_build_object('answers', v_answers);
END
$$;

-- ---- the run paths, with admission ---------------------------------------------------------------

-- `claim_run` of version 7: a run waiting for its concurrency key is `busy`.
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
       AND NOT (status = 'pending' AND wake_at IS NOT NULL AND wake_at = 9223372036854775806)
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

-- `renew_lease` of version 1, extending the run's leased slots with its lease.
CREATE OR REPLACE FUNCTION __SCHEMA__.renew_lease(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE __SCHEMA__.runs SET lease_until = (p ->> 'until')::bigint
     WHERE id = p ->> 'id' AND lease_owner = p ->> 'owner';
    IF NOT FOUND THEN
        RETURN jsonb_build_object('ok', false);
    END IF;
    UPDATE __SCHEMA__.admission_slots AS s SET lease_until = (p ->> 'until')::bigint
     WHERE s.run_id = p ->> 'id' AND s.lease_until IS NOT NULL;
    RETURN jsonb_build_object('ok', true);
END
$$;

-- `commit` of version 7, plus `release_slots` (released after the tasks, as by release_slot),
-- an applied settle releasing everything the run has at admission gates, and the woken runs in
-- `handed_off` (woken last, after the turn's end is applied). The gates are locked before the
-- run row.
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
    v_has_releases boolean := COALESCE(p -> 'release_slots', '[]'::jsonb) <> '[]'::jsonb;
    v_handed jsonb := '[]'::jsonb;
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
    -- 1b. The admission gates it may release at, in gate order, before the run row.
    IF v_has_releases OR v_end ->> 'type' = 'settle' THEN
        PERFORM __SCHEMA__.admission_lock(ARRAY(
            SELECT x ->> 0 FROM jsonb_array_elements(COALESCE(p -> 'release_slots', '[]'::jsonb)) AS x
            UNION
            SELECT unnest(CASE WHEN v_end ->> 'type' = 'settle'
                               THEN __SCHEMA__.admission_gates_of(v_run) ELSE '{}'::text[] END)));
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

    -- 5. Waits, query state, children, outgoing signals, tasks, released slots.
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
    IF v_has_releases THEN
        FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'release_slots') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
            v_handed := v_handed || __SCHEMA__.admission_release(v_item ->> 0, v_item ->> 1, v_now);
        END LOOP;
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
            -- A settled run must not swallow later signals, nor keep workers busy, nor slots.
            DELETE FROM __SCHEMA__.waiters WHERE run_id = v_run;
            PERFORM __SCHEMA__.finish_tasks_of(v_run);
            v_handed := v_handed || __SCHEMA__.admission_release_run(v_run, v_now);
        END IF;
    END IF;
    -- A turn end that finds the run no longer running (an operator cancelled it mid-turn)
    -- changes nothing of the run row: terminal runs accept no transition.

    -- 7. The runs released slots went to are woken.
    IF v_handed <> '[]'::jsonb THEN
        PERFORM __SCHEMA__.admission_wake(v_handed, v_now);
    END IF;
    RETURN jsonb_build_object('woken', v_woken, 'settled', v_settled, 'deliveries', v_deliveries,
                              'raced', to_jsonb(v_raced), 'handed_off', __SCHEMA__.admission_runs(v_handed));
END
$$;

-- `update_run_if` of version 7: a patch that leaves the run terminal releases its admission
-- slots and queued requests and wakes the runs they go to (its gates locked before its row).
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
    IF v_status IN ('completed', 'failed', 'cancelled', 'dead') THEN
        PERFORM __SCHEMA__.admission_lock(__SCHEMA__.admission_gates_of(v_id));
    END IF;
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
        -- A settled run must not swallow later signals, nor keep slots. Its tasks stay as they
        -- are: no claim takes them, a heartbeat is told to stop, and a result finds the run
        -- terminal and finishes the task (`run_terminal`).
        DELETE FROM __SCHEMA__.waiters WHERE run_id = v_id;
        PERFORM __SCHEMA__.admission_wake(__SCHEMA__.admission_release_run(v_id, v_now), v_now);
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

-- `delete_run` of version 7, releasing the runs' admission slots and queued requests. As
-- `MemoryStore::delete_run`: run by run, the root first, then breadth first (each run's
-- children in id order); a deletion knows no time, so each gate hands its freed slots on at its
-- `touched` time, and the runs they go to are woken at that time.
CREATE OR REPLACE FUNCTION __SCHEMA__.delete_run(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_doomed text[];
    v_id text;
    v_count bigint;
BEGIN
    v_doomed := ARRAY(
        WITH RECURSIVE d (id, depth, path) AS (
            SELECT r.id, 0, ARRAY[r.id] FROM __SCHEMA__.runs AS r WHERE r.id = p ->> 'id'
            UNION ALL
            SELECT r.id, d.depth + 1, d.path || r.id FROM __SCHEMA__.runs AS r JOIN d ON r.parent_id = d.id
             WHERE NOT (r.id = ANY (d.path)))
        SELECT d.id FROM d ORDER BY d.depth, d.path);
    IF cardinality(v_doomed) = 0 THEN
        RETURN jsonb_build_object('deleted', 0);
    END IF;
    PERFORM __SCHEMA__.lock_keys(ARRAY(
        SELECT __SCHEMA__.lock_key(w.kind, w.key) FROM __SCHEMA__.waiters AS w WHERE w.run_id = ANY (v_doomed)));
    IF EXISTS (SELECT 1 FROM __SCHEMA__.admission_slots AS s WHERE s.run_id = ANY (v_doomed))
       OR EXISTS (SELECT 1 FROM __SCHEMA__.admission_waiters AS w WHERE w.run_id = ANY (v_doomed)) THEN
        PERFORM __SCHEMA__.admission_lock(ARRAY(
            SELECT s.gate FROM __SCHEMA__.admission_slots AS s WHERE s.run_id = ANY (v_doomed)
            UNION SELECT w.gate FROM __SCHEMA__.admission_waiters AS w WHERE w.run_id = ANY (v_doomed)));
        FOREACH v_id IN ARRAY v_doomed LOOP
            PERFORM __SCHEMA__.admission_wake(__SCHEMA__.admission_release_run(v_id, 0), NULL);
        END LOOP;
    END IF;
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

-- The batch entry point of version 7: `create_run` with an optional concurrency key, keyed bulk
-- starts (`create_runs`), `acquire_slot` and `release_slot`.
CREATE OR REPLACE FUNCTION __SCHEMA__.apply(p_ops jsonb, p_channel text) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    v_op jsonb;
BEGIN
    PERFORM set_config('durable.notify_channel', COALESCE(p_channel, ''), true);
    FOR v_op IN SELECT x FROM jsonb_array_elements(p_ops) WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
        RETURN NEXT (CASE v_op ->> 'op'
            WHEN 'commit' THEN __SCHEMA__.commit(v_op)
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
