-- durable-store-postgres, schema version 14: runs count the claims that acquired them.
--
-- An engine that kept a suspended run's turn in memory (a warm run) resumes it at its next claim
-- only if that claim is the run's very next one since the turn's own: `claims` is one past the
-- count it saw. Every claim that acquires the run increments it — `claim_run`, which is also what
-- a batch's `claim_run` operation runs, and so every claim of this store (a commit that hands a
-- slot on and a task's result claim the woken run with it) — and nothing else does: a busy or
-- terminal claim, a commit, a release, a patch leave it alone. Runs written before count from 0.
--
-- `claim_run` also reads the history from the seq the operation names (`from`, 0 when absent) on,
-- one range of the `(run_id, seq)` primary key: an engine resuming a kept turn holds the
-- checkpoints before it already.
--
-- Adding a column with a constant default rewrites no row (the default is kept in the catalog).
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

ALTER TABLE __SCHEMA__.runs ADD COLUMN claims bigint NOT NULL DEFAULT 0;

-- `claim_run` of version 8, counting the claim that acquires the run and reading the history from
-- `from` on.
CREATE OR REPLACE FUNCTION __SCHEMA__.claim_run(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_id text := p ->> 'id';
    v_owner text := p ->> 'owner';
    v_until bigint := (p ->> 'until')::bigint;
    v_now bigint := (p ->> 'now')::bigint;
    v_from bigint := COALESCE((p ->> 'from')::bigint, 0);
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
           recovery_attempts = recovery_attempts + CASE WHEN v_recovered THEN 1 ELSE 0 END,
           claims = claims + 1
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
                      FROM __SCHEMA__.checkpoints AS c WHERE c.run_id = v_id AND c.seq >= v_from));
END
$$;
