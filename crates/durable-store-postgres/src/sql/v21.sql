-- durable-store-postgres, schema version 21: a claim that takes a run out of `blocked` drops the
-- run's `blocked` error.
--
-- The engine marks a run `blocked` with the error `blocked: no compatible worker (…)` (code
-- `blocked`) while no live worker can take its remote step. When a worker's result (or a timer)
-- woke such a run before the engine's own pass unblocked it, the claim made it `running` and the
-- error stayed: `runs show` said "blocked" of a running or suspended run, a later block of the
-- run was never recorded (the engine blocks only a run without an error, which may be a cancel
-- request), and its turn was never resumed from an engine's memory.
--
-- Every claim writes `status = 'running'` (`claim_run`, and `complete_task` with a claim), so one
-- row trigger on that transition covers them all, and any later one: its `WHEN` is evaluated
-- without calling the function, which runs only for a run leaving `blocked`. Another error (a
-- cancel request) stays. `Store::claim_run` documents the rule. An error text that is not JSON
-- jsonb can read (a `\u0000` escape) is left as it is: the claim must never fail on it.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

CREATE OR REPLACE FUNCTION __SCHEMA__.claim_clears_blocked() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        IF (NEW.error::jsonb ->> 'code') = 'blocked' THEN
            NEW.error := NULL;
        END IF;
    EXCEPTION WHEN others THEN
        NULL;
    END;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS runs_claim_clears_blocked ON __SCHEMA__.runs;
CREATE TRIGGER runs_claim_clears_blocked
    BEFORE UPDATE OF status ON __SCHEMA__.runs
    FOR EACH ROW WHEN (OLD.status = 'blocked' AND NEW.status = 'running')
    EXECUTE FUNCTION __SCHEMA__.claim_clears_blocked();
