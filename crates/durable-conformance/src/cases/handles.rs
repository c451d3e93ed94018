//! Two handles on one store (two connections to one SQLite file, two pools on one
//! PostgreSQL schema): what one writes the other sees, and atomicity holds across them.
//!
//! These cases run only for stores that declare `shared_across_processes` and whose factory
//! opens a second handle ([`StoreFactory::second_handle`](crate::StoreFactory::second_handle)).

use std::sync::Arc;

use durable_core::{ClaimOutcome, RunId, Store, StoreErrorKind};
use serde_json::json;

use super::fixtures::*;
use super::{leases, runs, signals};
use crate::CaseResult;

/// A run written through one handle reads the same through the other; a lease taken through
/// one is respected by the other (another owner is `Busy`, its commits `LeaseLost`), and
/// belongs to the owner, not the handle.
pub async fn handles_share_data_and_leases(a: Arc<dyn Store>, b: Arc<dyn Store>) -> CaseResult {
    let (a, b) = (&*a, &*b);
    create(a, new_run("r")).await?;
    assert_eq!(get(b, "r").await?, get(a, "r").await?);

    let held = acquire(a, claim("r", OWNER, T0)).await?;
    assert_eq!(b.claim_run(claim("r", OTHER, T0 + 1)).await?, ClaimOutcome::Busy(held));
    let mut zombie = commit("r", OTHER);
    zombie.checkpoints.push(completed("r", 0, json!("zombie")));
    assert_kind(b.commit(zombie).await, StoreErrorKind::LeaseLost);
    assert!(!b.renew_lease(&RunId::from("r"), OTHER, T0 + 2 * LEASE).await?);

    let mut c = commit("r", OWNER);
    c.checkpoints.push(completed("r", 0, json!("owner")));
    b.commit(c).await?;
    assert_eq!(history(a, "r").await?, vec![completed("r", 0, json!("owner"))]);
    assert!(a.release_lease(&RunId::from("r"), OWNER).await?);
    acquire(b, claim("r", OTHER, T0 + 3)).await?;
    assert_eq!(get(a, "r").await?.lease_owner.as_deref(), Some(OTHER));
    Ok(())
}

/// 16 claimers racing through both handles: exactly one acquires.
pub async fn concurrent_claims_across_handles_have_one_winner(a: Arc<dyn Store>, b: Arc<dyn Store>) -> CaseResult {
    leases::claim_race(&[a, b]).await
}

/// 16 creators of one id racing through both handles: exactly one creates.
pub async fn concurrent_creates_across_handles_have_one_winner(a: Arc<dyn Store>, b: Arc<dyn Store>) -> CaseResult {
    runs::create_race(&[a, b]).await
}

/// 50 signals racing 50 waits on one token through both handles: every payload consumed
/// exactly once.
pub async fn signal_race_across_handles_loses_nothing(a: Arc<dyn Store>, b: Arc<dyn Store>) -> CaseResult {
    signals::signal_race(&[a, b]).await
}
