//! Leases: `claim_run`, `renew_lease`, `release_lease`.

use std::sync::Arc;

use durable_core::{Checkpoint, ClaimOutcome, Run, RunId, RunStatus, Store, StoreResult};
use serde_json::json;

use super::fixtures::*;
use crate::CaseResult;

/// A claim of a pending run acquires it: `running`, leased to the owner until `lease_until`,
/// `updated_at = now`, nothing else changed; `previous` is `pending`, not a recovery.
pub async fn claim_acquires_pending_run(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let created = create(s, new_run("r")).await?;
    let mut expected = Run {
        status: RunStatus::Running,
        lease_owner: Some(OWNER.into()),
        lease_until: Some(T0 + 7 + LEASE),
        updated_at: T0 + 7,
        ..created
    };
    match s.claim_run(claim("r", OWNER, T0 + 7)).await? {
        ClaimOutcome::Acquired { run, history, previous, recovered } => {
            // A store that counts claims counts this one (see `claims_count_acquiring_claims`).
            assert!(run.claims <= 1, "the first claim of a run: claims {} (0 or 1)", run.claims);
            expected.claims = run.claims;
            assert_eq!(run, expected);
            assert_eq!(history, vec![]);
            assert_eq!(previous, RunStatus::Pending);
            assert!(!recovered, "claiming a pending run is not a recovery");
        }
        other => panic!("expected Acquired, got {other:?}"),
    }
    assert_eq!(get(s, "r").await?, expected);
    Ok(())
}

/// Another owner's claim while the lease is live (`lease_until >= now`, boundary included)
/// is `Busy` with the run, and writes nothing.
pub async fn claim_is_busy_under_live_lease(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let held = start(s, "r").await?;
    for now in [T0 + 1, T0 + LEASE] {
        assert_eq!(s.claim_run(claim("r", OTHER, now)).await?, ClaimOutcome::Busy(held.clone()), "claim at {now}");
        assert_eq!(get(s, "r").await?, held, "a busy claim writes nothing");
    }
    Ok(())
}

/// The owner may claim its run again, live lease or expired: acquired with the new
/// `lease_until`, never counted as a recovery.
pub async fn claim_again_by_owner_is_not_recovery(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    start(s, "r").await?;
    for now in [T0 + 5, T0 + 10 * LEASE] {
        match s.claim_run(claim("r", OWNER, now)).await? {
            ClaimOutcome::Acquired { run, previous, recovered, .. } => {
                assert_eq!(previous, RunStatus::Running);
                assert!(!recovered, "the owner re-claiming is not a recovery (at {now})");
                assert_eq!(run.recovery_attempts, 0);
                assert_eq!((run.lease_owner.as_deref(), run.lease_until), (Some(OWNER), Some(now + LEASE)));
                assert_eq!(get(s, "r").await?, run);
            }
            other => panic!("expected the owner to re-acquire at {now}, got {other:?}"),
        }
    }
    Ok(())
}

/// A claim of a terminal run is `Terminal` with the run, and writes nothing.
pub async fn claim_terminal_run_reports_terminal(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    use RunStatus::*;
    let terminal: [(&str, &[RunStatus]); 4] = [
        ("completed", &[Running, Completed]),
        ("failed", &[Running, Failed]),
        ("cancelled", &[Cancelled]),
        ("dead", &[Running, Dead]),
    ];
    for (id, path) in terminal {
        create(s, new_run(id)).await?;
        drive(s, id, path).await?;
        let before = get(s, id).await?;
        assert_eq!(s.claim_run(claim(id, OWNER, T0 + 1)).await?, ClaimOutcome::Terminal(before.clone()));
        assert_eq!(get(s, id).await?, before, "claiming a {id} run writes nothing");
    }
    Ok(())
}

/// A claim of a missing run is `NotFound`, and creates nothing.
pub async fn claim_missing_run_is_not_found(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    assert_eq!(s.claim_run(claim("missing", OWNER, T0)).await?, ClaimOutcome::NotFound);
    assert_eq!(s.get_run(&RunId::from("missing")).await?, None);
    Ok(())
}

/// A claim after another owner's lease expired (`lease_until < now`) takes the run over: a
/// recovery, `recovery_attempts` incremented each time, the history loaded.
pub async fn claim_takes_over_expired_lease(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    start(s, "r").await?;
    let mut c = commit("r", OWNER);
    c.checkpoints.push(completed("r", 0, json!("before the crash")));
    s.commit(c).await?;

    let takeovers = [(OTHER, T0 + LEASE + 1), ("engine-c", T0 + 2 * LEASE + 2)];
    for (attempt, (owner, now)) in (1..).zip(takeovers) {
        match s.claim_run(claim("r", owner, now)).await? {
            ClaimOutcome::Acquired { run, history, previous, recovered } => {
                assert!(recovered, "taking over an expired lease is a recovery");
                assert_eq!(previous, RunStatus::Running);
                assert_eq!(run.recovery_attempts, attempt);
                assert_eq!((run.lease_owner.as_deref(), run.lease_until), (Some(owner), Some(now + LEASE)));
                assert_eq!(run.updated_at, now);
                assert_eq!(history, vec![completed("r", 0, json!("before the crash"))]);
                assert_eq!(get(s, "r").await?, run);
            }
            other => panic!("expected {owner} to take over at {now}, got {other:?}"),
        }
    }
    Ok(())
}

/// A claim of a `running` run whose lease was released (not expired) is not a recovery.
pub async fn claim_after_release_is_not_recovery(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    start(s, "r").await?;
    assert!(s.release_lease(&RunId::from("r"), OWNER).await?);
    match s.claim_run(claim("r", OTHER, T0 + 1)).await? {
        ClaimOutcome::Acquired { run, previous, recovered, .. } => {
            assert_eq!(previous, RunStatus::Running);
            assert!(!recovered, "a released lease is handed over, not recovered");
            assert_eq!(run.recovery_attempts, 0);
            assert_eq!(run.lease_owner.as_deref(), Some(OTHER));
        }
        other => panic!("expected the released run to be acquired, got {other:?}"),
    }
    Ok(())
}

/// 16 concurrent claimers of one run: exactly one acquires, the others are `Busy`.
pub async fn concurrent_claims_have_one_winner(store: Arc<dyn Store>) -> CaseResult {
    claim_race(&[store]).await
}

/// The claim race of [`concurrent_claims_have_one_winner`], across `handles`.
pub(crate) async fn claim_race(handles: &[Arc<dyn Store>]) -> CaseResult {
    create(&*handles[0], new_run("r")).await?;
    let results = race(RACERS, |i| {
        let store = handle_for(handles, i);
        async move { store.claim_run(claim("r", &format!("engine-{i}"), T0)).await }
    })
    .await;
    let results = results.into_iter().collect::<StoreResult<Vec<_>>>()?;
    let winners: Vec<&Run> = results
        .iter()
        .filter_map(|o| match o {
            ClaimOutcome::Acquired { run, .. } => Some(run),
            ClaimOutcome::Busy(_) => None,
            other => panic!("a racing claim got {other:?}"),
        })
        .collect();
    assert_eq!(winners.len(), 1, "exactly one claimer acquires: {results:?}");
    let stored = get(&*handles[0], "r").await?;
    assert_eq!(stored.lease_owner, winners[0].lease_owner, "the winner holds the lease");
    // A store that counts claims counts the winner's only (the busy ones count nothing).
    assert!(winners[0].claims <= 1, "the first claim of a run: claims {} (0 or 1)", winners[0].claims);
    assert_eq!(stored.claims, winners[0].claims, "only the winning claim counts");
    Ok(())
}

/// `renew_lease` succeeds only for the owner holding the lease and then sets `lease_until`;
/// after another owner took the run over, the old owner's renewals fail.
pub async fn renew_only_by_owner(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let id = RunId::from("r");
    let held = start(s, "r").await?;
    assert!(!s.renew_lease(&id, OTHER, T0 + 999).await?, "a non-owner cannot renew");
    assert_eq!(get(s, "r").await?, held, "a refused renewal writes nothing");

    assert!(s.renew_lease(&id, OWNER, T0 + 2 * LEASE).await?);
    assert_eq!(get(s, "r").await?.lease_until, Some(T0 + 2 * LEASE));

    acquire(s, claim("r", OTHER, T0 + 2 * LEASE + 1)).await?;
    assert!(!s.renew_lease(&id, OWNER, T0 + 5 * LEASE).await?, "the lease was taken over");
    let run = get(s, "r").await?;
    assert_eq!((run.lease_owner.as_deref(), run.lease_until), (Some(OTHER), Some(T0 + 3 * LEASE + 1)));
    assert!(!s.renew_lease(&RunId::from("missing"), OWNER, T0).await?);
    Ok(())
}

/// `release_lease` clears the lease only for its owner, and leaves the status alone.
pub async fn release_only_by_owner(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let id = RunId::from("r");
    let held = start(s, "r").await?;
    assert!(!s.release_lease(&id, OTHER).await?, "a non-owner cannot release");
    assert_eq!(get(s, "r").await?, held);

    assert!(s.release_lease(&id, OWNER).await?);
    let run = get(s, "r").await?;
    assert_eq!((run.lease_owner, run.lease_until), (None, None));
    assert_eq!(run.status, RunStatus::Running, "releasing leaves the status unchanged");
    assert!(!s.release_lease(&id, OWNER).await?, "nothing left to release");
    assert!(!s.renew_lease(&id, OWNER, T0 + LEASE).await?, "a released lease cannot be renewed");
    assert!(!s.release_lease(&RunId::from("missing"), OWNER).await?);
    Ok(())
}

/// A store that counts claims (`Run::claims`) counts each claim that acquires the run, and
/// nothing else: not a busy or terminal claim, a commit, a release or a suspend. A store that
/// does not count them keeps 0 throughout (its runs always replay).
pub async fn claims_count_acquiring_claims(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let first = start(s, "r").await?;
    let counts = first.claims > 0;
    let expect = |n: u64| if counts { n } else { 0 };
    assert_eq!(first.claims, expect(1), "the first claim");
    // A busy claim counts nothing.
    assert!(matches!(s.claim_run(claim("r", OTHER, T0 + 1)).await?, ClaimOutcome::Busy(_)));
    assert_eq!(get(s, "r").await?.claims, expect(1), "a busy claim");
    // A commit, a suspend: nothing.
    let mut c = commit("r", OWNER);
    c.checkpoints.push(completed("r", 0, json!(0)));
    s.commit(c).await?;
    let mut c = commit("r", OWNER);
    c.end = suspend(&first, Some(T0 + 5));
    s.commit(c).await?;
    assert_eq!(get(s, "r").await?.claims, expect(1), "commits");
    // Each acquiring claim, the owner's or another's (after the release), counts one.
    for (n, owner) in [(2, OTHER), (3, OTHER), (4, OWNER)] {
        if owner == OWNER {
            assert!(s.release_lease(&RunId::new("r"), OTHER).await?);
        }
        match s.claim_run(claim("r", owner, T0 + 10)).await? {
            ClaimOutcome::Acquired { run, .. } => {
                assert_eq!(run.claims, expect(n), "claim {n} by {owner}");
                assert_eq!(get(s, "r").await?, run, "the claim's answer is the stored run");
            }
            other => panic!("expected claim {n} by {owner} to acquire the run, got {other:?}"),
        }
    }
    // A claim of a terminal run counts nothing.
    let mut c = commit("r", OWNER);
    c.end = Some(durable_core::TurnEnd::Settle { status: RunStatus::Completed, output: None, error: None });
    s.commit(c).await?;
    assert!(matches!(s.claim_run(claim("r", OWNER, T0 + 11)).await?, ClaimOutcome::Terminal(_)));
    assert_eq!(get(s, "r").await?.claims, expect(4), "a terminal claim");
    Ok(())
}

/// `claim_run_from` is `claim_run` whose history holds the checkpoints from the seq asked for
/// on: the same run, the same writes, the same count of claims.
pub async fn claim_run_from_reads_from_the_seq(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    for id in ["a", "b"] {
        let run = start(s, id).await?;
        let mut c = commit(id, OWNER);
        c.checkpoints = (0..5).map(|seq| completed(id, seq, json!(seq))).collect();
        c.end = suspend(&run, Some(T0 + 5));
        s.commit(c).await?;
    }
    let full = match s.claim_run(claim("a", OTHER, T0 + 10)).await? {
        ClaimOutcome::Acquired { run, history, previous, recovered } => (run, history, previous, recovered),
        other => panic!("expected the claim to acquire run a, got {other:?}"),
    };
    match s.claim_run_from(claim("b", OTHER, T0 + 10), 3).await? {
        ClaimOutcome::Acquired { run, history, previous, recovered } => {
            assert_eq!(history.iter().map(|cp| cp.seq).collect::<Vec<_>>(), [3, 4], "seqs from 3 on");
            let expected: Vec<Checkpoint> =
                full.1[3..].iter().map(|cp| Checkpoint { run_id: RunId::new("b"), ..cp.clone() }).collect();
            assert_eq!(history, expected);
            assert_eq!((previous, recovered), (full.2, full.3));
            let same = |r: &Run| (r.status, r.lease_owner.clone(), r.lease_until, r.updated_at, r.claims, r.wake_gen);
            assert_eq!(same(&run), same(&full.0), "the same claim as claim_run's");
            assert_eq!(get(s, "b").await?, run);
        }
        other => panic!("expected claim_run_from to acquire run b, got {other:?}"),
    }
    // Past the end: an empty history; the other outcomes as claim_run's.
    match s.claim_run_from(claim("b", OTHER, T0 + 11), 9).await? {
        ClaimOutcome::Acquired { history, .. } => assert_eq!(history, vec![]),
        other => panic!("expected the owner to claim run b again, got {other:?}"),
    }
    assert!(matches!(s.claim_run_from(claim("b", OWNER, T0 + 12), 0).await?, ClaimOutcome::Busy(_)));
    assert_eq!(s.claim_run_from(claim("missing", OWNER, T0), 0).await?, ClaimOutcome::NotFound);
    Ok(())
}
