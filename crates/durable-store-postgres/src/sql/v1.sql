-- durable-store-postgres, schema version 1: tables, indexes and the server-side functions that
-- apply every write in one round trip.
--
-- A template: `__SCHEMA__` is replaced by the quoted schema name and `__LOCK_SEED__` by a number
-- derived from it (so two schemas in one database never share advisory locks).
--
-- Conventions:
-- * Times are milliseconds since the epoch as bigint (u64 values past i64::MAX are clamped by the
--   client). Payloads are JSON text stored as `text`, never `jsonb`, so they come back byte for
--   byte. Ids are `COLLATE "C"`: ordered by bytes, like Rust strings.
-- * Every rule of the Store contract is checked inside the transaction that writes: compare-and-set
--   predicates are in the WHERE of the UPDATE (under the row lock the same function took), the
--   lease check is the first statement of a commit, waiters are taken with DELETE ... RETURNING.
-- * Signal tokens and event names are serialised with transaction-scoped advisory locks
--   (`lock_key`): a sender and a waiter on one token never both miss each other (a signal
--   buffered while a wait registers), whatever the isolation level. Functions that will lock
--   several keys and rows take the advisory locks first, in ascending key order, and row locks
--   after them: the common races (a signal against a timeout, against a settle) cannot deadlock.
-- * Contract outcomes (`lease_lost`, `not_found`, `conflict`) are returned as `{"err": ...}`
--   values, decided before anything is written, never raised: one failing operation of a batch
--   leaves the others alone without a subtransaction.

CREATE TABLE __SCHEMA__.runs (
    id                text COLLATE "C" PRIMARY KEY,
    workflow          text NOT NULL,
    version           bigint NOT NULL,
    namespace         text NOT NULL,
    status            text NOT NULL,
    input             text NOT NULL,
    output            text,
    error             text,
    tags              text[] NOT NULL DEFAULT '{}',
    priority          integer NOT NULL DEFAULT 0,
    parent_id         text COLLATE "C",
    parent_seq        bigint,
    created_at        bigint NOT NULL,
    updated_at        bigint NOT NULL,
    wake_at           bigint,
    lease_owner       text,
    lease_until       bigint,
    recovery_attempts bigint NOT NULL DEFAULT 0,
    wake_gen          bigint NOT NULL DEFAULT 0
);
-- Pollers: pending by priority then age, due timers by wake_at, running runs by age.
CREATE INDEX runs_pending ON __SCHEMA__.runs (priority DESC, created_at, id) WHERE status = 'pending';
CREATE INDEX runs_due ON __SCHEMA__.runs (wake_at, id) WHERE status = 'suspended';
CREATE INDEX runs_running ON __SCHEMA__.runs (updated_at, id) WHERE status = 'running';
-- list_runs (newest first), children by parent, runs by tag.
CREATE INDEX runs_created ON __SCHEMA__.runs (created_at DESC, id DESC);
CREATE INDEX runs_parent ON __SCHEMA__.runs (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX runs_tags ON __SCHEMA__.runs USING gin (tags);

CREATE TABLE __SCHEMA__.checkpoints (
    run_id     text COLLATE "C" NOT NULL,
    seq        bigint NOT NULL,
    name       text NOT NULL,
    kind       text NOT NULL,
    status     text NOT NULL,
    input      text,
    output     text,
    error      text,
    attempts   bigint NOT NULL DEFAULT 0,
    wake_at    bigint,
    started_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- wid is the registration order, which is the delivery order (registrations on one token are
-- serialised by the token's advisory lock, so wid order is commit order per token).
CREATE TABLE __SCHEMA__.waiters (
    wid        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id     text COLLATE "C" NOT NULL,
    seq        bigint NOT NULL,
    name       text NOT NULL,
    kind       text NOT NULL,
    key        text NOT NULL,
    matcher    text,
    created_at bigint NOT NULL,
    UNIQUE (run_id, seq)
);
CREATE INDEX waiters_key ON __SCHEMA__.waiters (kind, key, wid);

CREATE TABLE __SCHEMA__.buffered_signals (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token      text NOT NULL,
    payload    text NOT NULL,
    created_at bigint NOT NULL
);
CREATE INDEX buffered_signals_token ON __SCHEMA__.buffered_signals (token, id);

CREATE TABLE __SCHEMA__.buffered_events (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text NOT NULL,
    payload    text NOT NULL,
    created_at bigint NOT NULL
);
CREATE INDEX buffered_events_name ON __SCHEMA__.buffered_events (name, id);

CREATE TABLE __SCHEMA__.run_state (
    run_id text COLLATE "C" NOT NULL,
    key    text NOT NULL,
    value  text NOT NULL,
    PRIMARY KEY (run_id, key)
);

-- ---- locks ------------------------------------------------------------------------------------

-- The advisory lock key of a signal token (`signal`) or an event name (`event`).
CREATE FUNCTION __SCHEMA__.lock_key(p_kind text, p_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended(p_kind || ':' || p_key, __LOCK_SEED__)
$$;

-- Takes the transaction-scoped advisory locks of `p_keys` in ascending order (one global order:
-- two transactions locking overlapping sets cannot deadlock on them).
CREATE FUNCTION __SCHEMA__.lock_keys(p_keys bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_key bigint;
BEGIN
    FOR v_key IN SELECT DISTINCT u FROM unnest(p_keys) AS u ORDER BY u LOOP
        PERFORM pg_advisory_xact_lock(v_key);
    END LOOP;
END
$$;

-- ---- JSON matching, with serde_json's equality --------------------------------------------------
-- `json` (not `jsonb`): jsonb normalises numbers (`1e2` becomes `100`) and refuses `\u0000`, and
-- serde_json tells integers from floats. Duplicate keys: the last one counts, as in serde_json.

CREATE FUNCTION __SCHEMA__.json_scalar_text(p json) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT btrim(p::text, E' \t\n\r')
$$;

-- JSON text as `json`, with every `\u0000` escape (a NUL, which PostgreSQL's json operators
-- refuse to decode anywhere in a document) rewritten as `\uDBFF\uDFFF` (U+10FFFF, a
-- noncharacter). Matcher and payload are rewritten alike, so equality is kept (only a NUL and a
-- U+10FFFF would compare equal). `\\u0000` is an escaped backslash followed by `u0000`, not a
-- NUL: escaped backslashes are set aside first as a raw U+0001, which valid JSON text cannot
-- contain (scanning left to right, every `\\` pair is one escaped backslash).
CREATE FUNCTION __SCHEMA__.json_of(p text) RETURNS json
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN strpos(p, E'\\u0000') = 0 THEN p::json
                ELSE replace(replace(replace(p, E'\\\\', chr(1)), E'\\u0000', E'\\uDBFF\\uDFFF'), chr(1), E'\\\\')::json
           END
$$;

-- serde_json's number equality: integers (that fit i64/u64) equal by value, floats as f64, an
-- integer never equals a float.
CREATE FUNCTION __SCHEMA__.json_number_equal(p_a text, p_b text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_a_int boolean := p_a !~ '[.eE]' AND p_a !~ '^-0+$'
        AND p_a::numeric BETWEEN -9223372036854775808 AND 18446744073709551615;
    v_b_int boolean := p_b !~ '[.eE]' AND p_b !~ '^-0+$'
        AND p_b::numeric BETWEEN -9223372036854775808 AND 18446744073709551615;
BEGIN
    IF v_a_int <> v_b_int THEN
        RETURN false;
    ELSIF v_a_int THEN
        RETURN p_a::numeric = p_b::numeric;
    ELSE
        RETURN p_a::float8 = p_b::float8;
    END IF;
END
$$;

CREATE FUNCTION __SCHEMA__.json_equal(p_a json, p_b json) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_type text := json_typeof(p_a);
    v_key text;
    v_len integer;
BEGIN
    IF v_type IS DISTINCT FROM json_typeof(p_b) THEN
        RETURN false;
    END IF;
    IF v_type = 'object' THEN
        IF (SELECT count(DISTINCT k) FROM json_object_keys(p_a) AS k)
           <> (SELECT count(DISTINCT k) FROM json_object_keys(p_b) AS k) THEN
            RETURN false;
        END IF;
        FOR v_key IN SELECT DISTINCT k FROM json_object_keys(p_a) AS k LOOP
            IF (p_b -> v_key) IS NULL OR NOT __SCHEMA__.json_equal(p_a -> v_key, p_b -> v_key) THEN
                RETURN false;
            END IF;
        END LOOP;
        RETURN true;
    ELSIF v_type = 'array' THEN
        v_len := json_array_length(p_a);
        IF v_len <> json_array_length(p_b) THEN
            RETURN false;
        END IF;
        FOR i IN 0 .. v_len - 1 LOOP
            IF NOT __SCHEMA__.json_equal(p_a -> i, p_b -> i) THEN
                RETURN false;
            END IF;
        END LOOP;
        RETURN true;
    ELSIF v_type = 'number' THEN
        RETURN __SCHEMA__.json_number_equal(__SCHEMA__.json_scalar_text(p_a), __SCHEMA__.json_scalar_text(p_b));
    ELSIF v_type = 'string' THEN
        RETURN (p_a #>> '{}') = (p_b #>> '{}');
    ELSE
        RETURN __SCHEMA__.json_scalar_text(p_a) = __SCHEMA__.json_scalar_text(p_b);
    END IF;
END
$$;

-- durable_core::json_subset: every field of an object matcher is in the payload with a matching
-- value (recursively); any other matcher must equal the payload.
CREATE FUNCTION __SCHEMA__.json_subset(p_matcher json, p_payload json) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_key text;
BEGIN
    IF json_typeof(p_matcher) = 'object' AND json_typeof(p_payload) = 'object' THEN
        FOR v_key IN SELECT DISTINCT k FROM json_object_keys(p_matcher) AS k LOOP
            IF (p_payload -> v_key) IS NULL
               OR NOT __SCHEMA__.json_subset(p_matcher -> v_key, p_payload -> v_key) THEN
                RETURN false;
            END IF;
        END LOOP;
        RETURN true;
    END IF;
    RETURN __SCHEMA__.json_equal(p_matcher, p_payload);
END
$$;

-- ---- helpers -----------------------------------------------------------------------------------

-- NOTIFY `run_id` on the channel the batch named (PostgresOptions::notify_channel), if any.
CREATE FUNCTION __SCHEMA__.notify(p_run text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_channel text := current_setting('durable.notify_channel', true);
BEGIN
    IF v_channel IS NOT NULL AND v_channel <> '' AND octet_length(p_run) < 7900 THEN
        PERFORM pg_notify(v_channel, p_run);
    END IF;
END
$$;

-- Records a delivered payload as the `completed` checkpoint at the waiter's seq and wakes its
-- run: wake_gen + 1, and a suspended run is due now.
CREATE FUNCTION __SCHEMA__.resolve(p_run text, p_seq bigint, p_name text, p_kind text, p_payload text, p_now bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO __SCHEMA__.checkpoints (run_id, seq, name, kind, status, output, attempts, started_at, updated_at)
    VALUES (p_run, p_seq, p_name, p_kind, 'completed', p_payload, 0, p_now, p_now)
    ON CONFLICT (run_id, seq) DO UPDATE
        SET status = 'completed', output = excluded.output, updated_at = excluded.updated_at;
    UPDATE __SCHEMA__.runs
       SET wake_gen = wake_gen + 1,
           wake_at = CASE WHEN status = 'suspended' THEN LEAST(COALESCE(wake_at, p_now), p_now) ELSE wake_at END,
           updated_at = p_now
     WHERE id = p_run;
    PERFORM __SCHEMA__.notify(p_run);
END
$$;

-- ---- operations (each mirrors the Store method of the same name) ----------------------------------

-- `{"created": true}`, or `{"created": false, "run": <the existing run>}`.
CREATE FUNCTION __SCHEMA__.create_run(p_run jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_id text := p_run ->> 'id';
    v_existing jsonb;
BEGIN
    INSERT INTO __SCHEMA__.runs (id, workflow, version, namespace, status, input, tags, priority,
                                 parent_id, parent_seq, created_at, updated_at)
    VALUES (v_id, p_run ->> 'workflow', (p_run ->> 'version')::bigint, p_run ->> 'namespace', 'pending',
            p_run ->> 'input',
            ARRAY(SELECT t FROM jsonb_array_elements_text(p_run -> 'tags') WITH ORDINALITY AS x (t, i) ORDER BY i),
            (p_run ->> 'priority')::integer, p_run ->> 'parent_id', (p_run ->> 'parent_seq')::bigint,
            (p_run ->> 'created_at')::bigint, (p_run ->> 'created_at')::bigint)
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

-- `{"outcome": "acquired" | "busy" | "terminal" | "not_found", ...}`.
CREATE FUNCTION __SCHEMA__.claim_run(p jsonb) RETURNS jsonb
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
    SELECT * INTO v_prev FROM __SCHEMA__.runs WHERE id = v_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('outcome', 'not_found');
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

CREATE FUNCTION __SCHEMA__.renew_lease(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE __SCHEMA__.runs SET lease_until = (p ->> 'until')::bigint
     WHERE id = p ->> 'id' AND lease_owner = p ->> 'owner';
    RETURN jsonb_build_object('ok', FOUND);
END
$$;

CREATE FUNCTION __SCHEMA__.release_lease(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE __SCHEMA__.runs SET lease_owner = NULL, lease_until = NULL
     WHERE id = p ->> 'id' AND lease_owner = p ->> 'owner';
    RETURN jsonb_build_object('ok', FOUND);
END
$$;

-- Delivers to the oldest waiter on the token, or buffers. Returns the delivery or NULL (buffered).
CREATE FUNCTION __SCHEMA__.send_signal(p_token text, p_payload text, p_now bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_run text;
    v_seq bigint;
    v_name text;
BEGIN
    PERFORM pg_advisory_xact_lock(__SCHEMA__.lock_key('signal', p_token));
    -- Under the token's lock nobody else takes or adds waiters of this token; a waiter another
    -- transaction is removing (a timeout, a settle) is skipped by FOR UPDATE once it is gone.
    DELETE FROM __SCHEMA__.waiters
     WHERE wid = (SELECT w.wid FROM __SCHEMA__.waiters AS w
                   WHERE w.kind = 'signal' AND w.key = p_token ORDER BY w.wid LIMIT 1 FOR UPDATE)
    RETURNING run_id, seq, name INTO v_run, v_seq, v_name;
    IF FOUND THEN
        PERFORM __SCHEMA__.resolve(v_run, v_seq, v_name, 'signal', p_payload, p_now);
        RETURN jsonb_build_object('run', v_run, 'seq', v_seq);
    END IF;
    INSERT INTO __SCHEMA__.buffered_signals (token, payload, created_at) VALUES (p_token, p_payload, p_now);
    RETURN NULL;
END
$$;

-- Delivers to every matching waiter, or buffers. Returns the list of deliveries.
CREATE FUNCTION __SCHEMA__.publish_event(p_name text, p_payload text, p_now bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_payload json := __SCHEMA__.json_of(p_payload);
    v_waiter record;
    v_out jsonb := '[]'::jsonb;
BEGIN
    PERFORM pg_advisory_xact_lock(__SCHEMA__.lock_key('event', p_name));
    FOR v_waiter IN SELECT w.wid, w.run_id, w.seq, w.name, w.matcher FROM __SCHEMA__.waiters AS w
                     WHERE w.kind = 'event' AND w.key = p_name ORDER BY w.wid FOR UPDATE LOOP
        IF __SCHEMA__.json_subset(__SCHEMA__.json_of(COALESCE(v_waiter.matcher, 'null')), v_payload) THEN
            DELETE FROM __SCHEMA__.waiters WHERE wid = v_waiter.wid;
            PERFORM __SCHEMA__.resolve(v_waiter.run_id, v_waiter.seq, v_waiter.name, 'event', p_payload, p_now);
            v_out := v_out || jsonb_build_array(jsonb_build_object('run', v_waiter.run_id, 'seq', v_waiter.seq));
        END IF;
    END LOOP;
    IF jsonb_array_length(v_out) = 0 THEN
        INSERT INTO __SCHEMA__.buffered_events (name, payload, created_at) VALUES (p_name, p_payload, p_now);
    END IF;
    RETURN v_out;
END
$$;

-- Registers a wait, unless a buffered delivery satisfies it: then that delivery is consumed and
-- resolves the wait at once.
CREATE FUNCTION __SCHEMA__.register_wait(p_wait jsonb, p_now bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_run text := p_wait ->> 'run_id';
    v_seq bigint := (p_wait ->> 'seq')::bigint;
    v_name text := p_wait ->> 'name';
    v_kind text := p_wait ->> 'kind';
    v_key text := p_wait ->> 'key';
    v_matcher text := p_wait ->> 'matcher';
    v_payload text;
    v_event record;
BEGIN
    PERFORM pg_advisory_xact_lock(__SCHEMA__.lock_key(v_kind, v_key));
    IF v_kind = 'signal' THEN
        DELETE FROM __SCHEMA__.buffered_signals
         WHERE id = (SELECT b.id FROM __SCHEMA__.buffered_signals AS b
                      WHERE b.token = v_key ORDER BY b.id LIMIT 1 FOR UPDATE)
        RETURNING payload INTO v_payload;
        IF FOUND THEN
            PERFORM __SCHEMA__.resolve(v_run, v_seq, v_name, 'signal', v_payload, p_now);
            RETURN;
        END IF;
    ELSE
        FOR v_event IN SELECT b.id, b.payload FROM __SCHEMA__.buffered_events AS b
                        WHERE b.name = v_key ORDER BY b.id LOOP
            IF __SCHEMA__.json_subset(__SCHEMA__.json_of(COALESCE(v_matcher, 'null')), __SCHEMA__.json_of(v_event.payload)) THEN
                DELETE FROM __SCHEMA__.buffered_events WHERE id = v_event.id;
                IF FOUND THEN
                    PERFORM __SCHEMA__.resolve(v_run, v_seq, v_name, 'event', v_event.payload, p_now);
                    RETURN;
                END IF;
            END IF;
        END LOOP;
    END IF;
    -- Replaces an earlier registration at the same seq (a re-suspension re-registers); the new
    -- row gets a new wid, so it queues behind the waiters registered before it.
    DELETE FROM __SCHEMA__.waiters WHERE run_id = v_run AND seq = v_seq;
    INSERT INTO __SCHEMA__.waiters (run_id, seq, name, kind, key, matcher, created_at)
    VALUES (v_run, v_seq, v_name, v_kind, v_key, v_matcher, (p_wait ->> 'created_at')::bigint);
END
$$;

-- Applies one Commit: `{"woken", "settled", "deliveries", "raced"}` or `{"err": ...}`.
CREATE FUNCTION __SCHEMA__.commit(p jsonb) RETURNS jsonb
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
BEGIN
    -- 1. The advisory locks of every token this commit may touch (its run's waiters, its waits,
    --    its outgoing signals), before any row lock.
    PERFORM __SCHEMA__.lock_keys(ARRAY(
        SELECT __SCHEMA__.lock_key(w.kind, w.key) FROM __SCHEMA__.waiters AS w WHERE w.run_id = v_run
        UNION ALL
        SELECT __SCHEMA__.lock_key(x ->> 'kind', x ->> 'key') FROM jsonb_array_elements(p -> 'waits') AS x
        UNION ALL
        SELECT __SCHEMA__.lock_key('signal', x ->> 'token') FROM jsonb_array_elements(p -> 'signals') AS x));

    -- 2. The lease check: only the lease owner's commit gets the run row (and its lock).
    SELECT r.status INTO v_status FROM __SCHEMA__.runs AS r WHERE r.id = v_run AND r.lease_owner = v_owner FOR UPDATE;
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
    FOR v_seq IN SELECT (x #>> '{}')::bigint FROM jsonb_array_elements(p -> 'expire') AS x LOOP
        DELETE FROM __SCHEMA__.waiters WHERE run_id = v_run AND seq = v_seq;
        IF NOT FOUND THEN
            v_raced := v_raced || v_seq;
        END IF;
    END LOOP;

    -- 4. Checkpoints, upserted by seq (the last of duplicates wins), except raced ones.
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

    -- 5. Waits, query state, children, outgoing signals.
    FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'waits') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
        PERFORM __SCHEMA__.register_wait(v_item, v_now);
    END LOOP;
    FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'state') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
        INSERT INTO __SCHEMA__.run_state (run_id, key, value) VALUES (v_run, v_item ->> 0, v_item ->> 1)
        ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value;
    END LOOP;
    FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'children') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
        PERFORM __SCHEMA__.create_run(v_item);
    END LOOP;
    FOR v_item IN SELECT x FROM jsonb_array_elements(p -> 'signals') WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
        v_deliveries := v_deliveries
            || jsonb_build_array(COALESCE(__SCHEMA__.send_signal(v_item ->> 'token', v_item ->> 'payload', v_now),
                                          'null'::jsonb));
    END LOOP;

    -- 6. How the turn ends.
    IF v_end IS NULL THEN
        UPDATE __SCHEMA__.runs SET updated_at = v_now WHERE id = v_run;
    ELSIF v_end ->> 'type' = 'suspend' AND v_status = 'running' THEN
        -- Suspends only if nothing was delivered since the turn loaded the run: the wake_gen
        -- compare is part of the UPDATE.
        UPDATE __SCHEMA__.runs
           SET status = 'suspended', wake_at = (v_end ->> 'wake_at')::bigint, lease_owner = NULL,
               lease_until = NULL, updated_at = v_now
         WHERE id = v_run AND status = 'running' AND wake_gen = (v_end ->> 'seen_wake_gen')::bigint
           AND cardinality(v_raced) = 0;
        IF NOT FOUND THEN
            v_woken := true;
            UPDATE __SCHEMA__.runs SET updated_at = v_now WHERE id = v_run;
        END IF;
    ELSIF v_end ->> 'type' = 'settle' AND v_status = 'running' THEN
        UPDATE __SCHEMA__.runs
           SET status = v_end ->> 'status', output = v_end ->> 'output', error = v_end ->> 'error', wake_at = NULL,
               lease_owner = NULL, lease_until = NULL, updated_at = v_now
         WHERE id = v_run AND status = 'running';
        v_settled := FOUND;
        IF v_settled THEN
            -- A settled run must not swallow later signals.
            DELETE FROM __SCHEMA__.waiters WHERE run_id = v_run;
        END IF;
    END IF;
    -- A turn end that finds the run no longer running (an operator cancelled it mid-turn)
    -- changes nothing of the run row: terminal runs accept no transition.
    RETURN jsonb_build_object('woken', v_woken, 'settled', v_settled, 'deliveries', v_deliveries,
                              'raced', to_jsonb(v_raced));
END
$$;

-- Compare-and-set on a run row: `{"applied": bool}` or `{"err": "conflict", ...}`.
CREATE FUNCTION __SCHEMA__.update_run_if(p jsonb) RETURNS jsonb
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
    -- and a run that is suspended after the patch is due now.
    UPDATE __SCHEMA__.runs
       SET status = v_next,
           output = CASE WHEN (p ->> 'set_output')::boolean THEN p ->> 'output' ELSE output END,
           error = CASE WHEN (p ->> 'set_error')::boolean THEN p ->> 'error' ELSE error END,
           wake_at = CASE WHEN v_wake AND v_next = 'suspended'
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
        -- A settled run must not swallow later signals.
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

-- Deletes a run and its descendants: `{"deleted": n}`.
CREATE FUNCTION __SCHEMA__.delete_run(p jsonb) RETURNS jsonb
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
    DELETE FROM __SCHEMA__.runs WHERE id = ANY (v_doomed);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN jsonb_build_object('deleted', v_count);
END
$$;

-- ---- the batch entry point ----------------------------------------------------------------------

-- Applies a JSON array of operations in order, in the caller's transaction, and returns one
-- result (JSON text) per operation, in order. `p_channel`: the NOTIFY channel for run wake-ups
-- (NULL or '' for none).
CREATE FUNCTION __SCHEMA__.apply(p_ops jsonb, p_channel text) RETURNS SETOF text
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
            ELSE jsonb_build_object('err', 'unknown_op', 'message', format('unknown operation %s', v_op ->> 'op'))
        END)::text;
    END LOOP;
END
$$;
