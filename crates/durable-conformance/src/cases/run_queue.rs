//! The run queue ([`RunQueue`]) a store keeps for the store-backed transport: one unclaimed
//! item per run, claims by namespace, priority and age, each item to exactly one claimer,
//! expired claims redelivered, ack and release by the owner only.
//!
//! These cases run only for stores whose factory hands the queue over
//! ([`TestStore::new_with_queue`](crate::TestStore::new_with_queue)); the race across two
//! handles also needs [`StoreFactory::second_queue`](crate::StoreFactory::second_queue).

use std::sync::Arc;

use durable_core::{Millis, NewRun, QueueReason, QueuedRun, RunId, RunQuery, RunQueue, Store};

use super::fixtures::*;
use crate::CaseResult;

/// How long the claims the cases take last.
const CLAIM: Millis = LEASE;

/// An item of `run` for `reason` with `priority`, for the pending state `key`; the namespace is
/// left to the queue (filled in from the run).
fn item(run: &str, reason: QueueReason, priority: i32, key: &str) -> QueuedRun {
    QueuedRun { id: 0, run_id: RunId::from(run), reason, namespace: None, priority, dedupe_key: key.into() }
}

/// A start of `run` at priority 0, for the pending state `start:<run>:1`.
fn start_item(run: &str) -> QueuedRun {
    item(run, QueueReason::Start, 0, &format!("start:{run}:1"))
}

/// Claims up to 100 items of `namespace` for `owner` at `now`, until `now + CLAIM`.
async fn take(queue: &dyn RunQueue, namespace: Option<&str>, owner: &str, now: Millis) -> CaseResult<Vec<QueuedRun>> {
    Ok(queue.claim_queued(namespace, owner, 100, now + CLAIM, now).await?)
}

/// The runs of `items`, in order.
fn runs(items: &[QueuedRun]) -> Vec<String> {
    items.iter().map(|i| i.run_id.to_string()).collect()
}

/// The ids of `items`, in order.
fn item_ids(items: &[QueuedRun]) -> Vec<u64> {
    items.iter().map(|i| i.id).collect()
}

/// Enqueued items are claimed as sent: the run, the reason, the priority, the dedupe key, the
/// namespace given or, when missing, the run's. The queue assigns each item an id of its own;
/// `queued_len` counts items claimed or not, until they are acked.
pub async fn enqueued_items_are_claimed_with_their_fields(
    store: Arc<dyn Store>,
    queue: Arc<dyn RunQueue>,
) -> CaseResult {
    let (s, q) = (&*store, &*queue);
    create(s, new_run("a")).await?;
    create(s, NewRun { namespace: "billing".into(), ..new_run("b") }).await?;
    assert_eq!(q.queued_len().await?, 0);
    let b = QueuedRun { namespace: Some("billing".into()), ..item("b", QueueReason::Wake, 3, "wake:b:7") };
    q.enqueue(vec![start_item("a"), b], T0).await?;
    assert_eq!(q.queued_len().await?, 2);

    let mut claimed = take(q, None, OWNER, T0 + 1).await?;
    claimed.sort_by(|x, y| x.run_id.cmp(&y.run_id));
    let ids = item_ids(&claimed);
    assert!(ids.iter().all(|id| *id != 0) && ids[0] != ids[1], "the queue assigns distinct ids: {claimed:?}");
    let expected = [
        QueuedRun { id: ids[0], namespace: Some("default".into()), ..start_item("a") },
        QueuedRun { id: ids[1], namespace: Some("billing".into()), ..item("b", QueueReason::Wake, 3, "wake:b:7") },
    ];
    assert_eq!(claimed, expected);
    assert_eq!(q.queued_len().await?, 2, "claimed items are still queued until acked");
    assert_eq!(take(q, None, OTHER, T0 + 2).await?, [], "claimed items are handed out once");

    q.ack_queued(&ids, OWNER).await?;
    assert_eq!(q.queued_len().await?, 0);
    assert_eq!(take(q, None, OTHER, T0 + 2 * CLAIM).await?, [], "acked items are gone for good");
    Ok(())
}

/// Items of runs that do not exist are dropped; the rest of the batch is queued.
pub async fn enqueue_drops_items_of_missing_runs(store: Arc<dyn Store>, queue: Arc<dyn RunQueue>) -> CaseResult {
    let (s, q) = (&*store, &*queue);
    create(s, new_run("a")).await?;
    q.enqueue(vec![start_item("ghost"), start_item("a"), item("phantom", QueueReason::Wake, 1, "wake:p:1")], T0)
        .await?;
    assert_eq!(q.queued_len().await?, 1);
    assert_eq!(runs(&take(q, None, OWNER, T0).await?), strings(&["a"]));
    Ok(())
}

/// A run has at most one unclaimed item: enqueueing it again (in a later batch or in the same
/// one) updates that item instead of adding one. A `Wake` replaces a `Start` (its dedupe key
/// with it), a `Start` does not replace a `Wake`, and the higher priority is kept.
pub async fn one_unclaimed_item_per_run(store: Arc<dyn Store>, queue: Arc<dyn RunQueue>) -> CaseResult {
    let (s, q) = (&*store, &*queue);
    create_all(s, ["a", "b"].map(new_run)).await?;
    q.enqueue(vec![item("a", QueueReason::Start, 1, "start:a:1")], T0).await?;
    q.enqueue(vec![item("a", QueueReason::Start, 3, "start:a:1")], T0 + 1).await?;
    assert_eq!(q.queued_len().await?, 1, "a second start of a queued run is not a second item");
    q.enqueue(vec![item("a", QueueReason::Wake, 2, "wake:a:1")], T0 + 2).await?;
    q.enqueue(vec![item("a", QueueReason::Start, 0, "start:a:1")], T0 + 3).await?;
    q.enqueue(
        vec![
            item("b", QueueReason::Start, 0, "start:b:1"),
            item("b", QueueReason::Wake, 5, "wake:b:1"),
            item("b", QueueReason::Start, 1, "start:b:1"),
        ],
        T0 + 4,
    )
    .await?;
    assert_eq!(q.queued_len().await?, 2);

    let mut claimed = take(q, None, OWNER, T0 + 5).await?;
    claimed.sort_by(|x, y| x.run_id.cmp(&y.run_id));
    let fields: Vec<_> =
        claimed.iter().map(|i| (i.run_id.as_str(), i.reason, i.priority, i.dedupe_key.as_str())).collect();
    assert_eq!(fields, [("a", QueueReason::Wake, 3, "wake:a:1"), ("b", QueueReason::Wake, 5, "wake:b:1")]);
    Ok(())
}

/// The limit is on *unclaimed* items: once a run's item is claimed (the run moved on to being
/// executed), a new enqueue for the next pending state, with its new dedupe key, is a new item,
/// claimable next to the first; after both are acked, the run can be queued again.
pub async fn a_claimed_run_can_be_queued_again(store: Arc<dyn Store>, queue: Arc<dyn RunQueue>) -> CaseResult {
    let (s, q) = (&*store, &*queue);
    create(s, new_run("a")).await?;
    q.enqueue(vec![start_item("a")], T0).await?;
    let first = take(q, None, OWNER, T0).await?;
    assert_eq!(runs(&first), strings(&["a"]));

    q.enqueue(vec![item("a", QueueReason::Wake, 0, "wake:a:1")], T0 + 1).await?;
    assert_eq!(q.queued_len().await?, 2, "the claimed item and the new one");
    let second = take(q, None, OTHER, T0 + 2).await?;
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second[0].id, first[0].id);
    assert_eq!(
        (second[0].run_id.as_str(), second[0].reason, second[0].dedupe_key.as_str()),
        ("a", QueueReason::Wake, "wake:a:1")
    );

    q.ack_queued(&item_ids(&first), OWNER).await?;
    q.ack_queued(&item_ids(&second), OTHER).await?;
    assert_eq!(q.queued_len().await?, 0);
    q.enqueue(vec![item("a", QueueReason::Start, 0, "start:a:2")], T0 + 3).await?;
    let third = take(q, None, OWNER, T0 + 4).await?;
    assert_eq!(third.iter().map(|i| i.dedupe_key.as_str()).collect::<Vec<_>>(), ["start:a:2"]);
    Ok(())
}

/// Claims hand out the highest priority first, then the oldest (earliest enqueued), in that
/// order, at most `limit` at a time (none for a limit of 0).
pub async fn claims_are_by_priority_then_age_up_to_the_limit(
    store: Arc<dyn Store>,
    queue: Arc<dyn RunQueue>,
) -> CaseResult {
    let (s, q) = (&*store, &*queue);
    let sends = [("low-old", 0, 0), ("high-new", 9, 5), ("mid-old", 5, 1), ("mid-new", 5, 3), ("low-new", 0, 4)];
    create_all(s, sends.map(|(id, _, _)| new_run(id))).await?;
    for (id, priority, t) in sends {
        q.enqueue(vec![item(id, QueueReason::Start, priority, &format!("start:{id}:1"))], T0 + t).await?;
    }
    assert_eq!(q.claim_queued(None, OWNER, 0, T0 + 10 + CLAIM, T0 + 10).await?, []);
    let first = q.claim_queued(None, OWNER, 2, T0 + 10 + CLAIM, T0 + 10).await?;
    assert_eq!(runs(&first), strings(&["high-new", "mid-old"]));
    let rest = q.claim_queued(None, OWNER, 10, T0 + 11 + CLAIM, T0 + 11).await?;
    assert_eq!(runs(&rest), strings(&["mid-new", "low-old", "low-new"]));
    Ok(())
}

/// A claim of a namespace hands out that namespace's items only (a missing namespace counts
/// as the run's); a claim of `None` hands out any.
pub async fn claims_filter_by_namespace(store: Arc<dyn Store>, queue: Arc<dyn RunQueue>) -> CaseResult {
    let (s, q) = (&*store, &*queue);
    let billing = |id| NewRun { namespace: "billing".into(), ..new_run(id) };
    create_all(s, [new_run("a"), billing("b"), billing("c"), new_run("d")]).await?;
    let c = QueuedRun { namespace: Some("billing".into()), ..start_item("c") };
    q.enqueue(vec![start_item("a"), start_item("b"), c, start_item("d")], T0).await?;

    let mut of_billing = runs(&take(q, Some("billing"), OWNER, T0 + 1).await?);
    of_billing.sort();
    assert_eq!(of_billing, strings(&["b", "c"]));
    assert_eq!(take(q, Some("nowhere"), OWNER, T0 + 1).await?, []);
    let mut any = runs(&take(q, None, OWNER, T0 + 1).await?);
    any.sort();
    assert_eq!(any, strings(&["a", "d"]));
    Ok(())
}

/// A claimed item stays invisible until its claim expires; then another claimer gets it again
/// (same item), and the first owner's ack or release no longer touches it.
pub async fn expired_claims_are_redelivered(store: Arc<dyn Store>, queue: Arc<dyn RunQueue>) -> CaseResult {
    let (s, q) = (&*store, &*queue);
    create(s, new_run("a")).await?;
    q.enqueue(vec![start_item("a")], T0).await?;
    let first = take(q, None, OWNER, T0).await?;
    assert_eq!(runs(&first), strings(&["a"]));

    assert_eq!(take(q, None, OTHER, T0 + CLAIM - 1).await?, [], "the claim is live");
    let again = take(q, None, OTHER, T0 + CLAIM + 1).await?;
    assert_eq!(again, first, "the expired claim's item, redelivered");

    q.ack_queued(&item_ids(&first), OWNER).await?;
    q.release_queued(&item_ids(&first), OWNER).await?;
    assert_eq!(q.queued_len().await?, 1, "the former owner's ack does not delete the item");
    assert_eq!(take(q, None, "engine-c", T0 + CLAIM + 2).await?, [], "nor does its release hand it back");
    q.ack_queued(&item_ids(&again), OTHER).await?;
    assert_eq!(q.queued_len().await?, 0);
    Ok(())
}

/// A released item is claimable again at once, long before its claim would have expired; a
/// release by anyone but the owner does nothing.
pub async fn released_items_are_claimable_at_once(store: Arc<dyn Store>, queue: Arc<dyn RunQueue>) -> CaseResult {
    let (s, q) = (&*store, &*queue);
    create_all(s, ["a", "b"].map(new_run)).await?;
    q.enqueue(vec![start_item("a")], T0).await?;
    q.enqueue(vec![start_item("b")], T0 + 1).await?;
    let claimed = take(q, None, OWNER, T0 + 2).await?;
    assert_eq!(runs(&claimed), strings(&["a", "b"]));

    q.release_queued(&item_ids(&claimed), OTHER).await?;
    assert_eq!(take(q, None, OTHER, T0 + 3).await?, [], "released by someone else: still claimed");
    q.release_queued(&item_ids(&claimed[..1]), OWNER).await?;
    assert_eq!(q.queued_len().await?, 2);
    let back = take(q, None, OTHER, T0 + 4).await?;
    assert_eq!(runs(&back), strings(&["a"]));
    assert_eq!((back[0].reason, back[0].dedupe_key.as_str()), (QueueReason::Start, "start:a:1"));
    Ok(())
}

/// Releasing a claimed item of a run that was queued again meanwhile keeps the run at one
/// unclaimed item: the two fold as an enqueue does (a `Wake` wins with its dedupe key, the
/// higher priority is kept), whichever of the two was the wake.
pub async fn release_keeps_one_unclaimed_item_per_run(store: Arc<dyn Store>, queue: Arc<dyn RunQueue>) -> CaseResult {
    let (s, q) = (&*store, &*queue);
    create_all(s, ["a", "b"].map(new_run)).await?;
    q.enqueue(vec![item("a", QueueReason::Start, 4, "start:a:1"), item("b", QueueReason::Wake, 0, "wake:b:1")], T0)
        .await?;
    let claimed = take(q, None, OWNER, T0).await?;
    assert_eq!(claimed.len(), 2);
    q.enqueue(vec![item("a", QueueReason::Wake, 1, "wake:a:1"), item("b", QueueReason::Start, 2, "start:b:2")], T0 + 1)
        .await?;
    assert_eq!(q.queued_len().await?, 4);

    q.release_queued(&item_ids(&claimed), OWNER).await?;
    assert_eq!(q.queued_len().await?, 2, "one item per run after the release");
    let mut back = take(q, None, OTHER, T0 + 2).await?;
    back.sort_by(|x, y| x.run_id.cmp(&y.run_id));
    let fields: Vec<_> =
        back.iter().map(|i| (i.run_id.as_str(), i.reason, i.priority, i.dedupe_key.as_str())).collect();
    assert_eq!(fields, [("a", QueueReason::Wake, 4, "wake:a:1"), ("b", QueueReason::Wake, 2, "wake:b:1")]);
    Ok(())
}

/// A wake sent for a claimed due run names the claim in its dedupe key
/// ([`QueuedRun::claim_key`]); merging a run's wakes into its one unclaimed item never loses
/// it (the later key wins unless only the earlier names a claim), on enqueue, within a batch
/// and on release.
pub async fn merged_wakes_keep_a_claim(store: Arc<dyn Store>, queue: Arc<dyn RunQueue>) -> CaseResult {
    let (s, q) = (&*store, &*queue);
    create_all(s, ["a", "b", "c"].map(new_run)).await?;
    let claimed = |run: &str, until: Millis| QueuedRun::claim_key(until, &format!("wake:{run}:1@e#1"));
    // a: the claim first, a plain wake later. b: in one batch. c: a plain wake, then the claim.
    q.enqueue(vec![item("a", QueueReason::Wake, 0, &claimed("a", T0 + CLAIM))], T0).await?;
    q.enqueue(vec![item("a", QueueReason::Wake, 0, "wake:a:2")], T0 + 1).await?;
    q.enqueue(
        vec![item("b", QueueReason::Wake, 0, &claimed("b", T0 + CLAIM)), item("b", QueueReason::Wake, 0, "wake:b:2")],
        T0 + 1,
    )
    .await?;
    q.enqueue(vec![item("c", QueueReason::Wake, 0, "wake:c:1")], T0).await?;
    q.enqueue(vec![item("c", QueueReason::Wake, 0, &claimed("c", T0 + CLAIM))], T0 + 1).await?;
    let mut first = take(q, None, OWNER, T0 + 2).await?;
    first.sort_by(|x, y| x.run_id.cmp(&y.run_id));
    let claims: Vec<_> = first.iter().map(|i| (i.run_id.as_str(), i.claimed_until())).collect();
    let until = Some(T0 + CLAIM);
    assert_eq!(claims, [("a", until), ("b", until), ("c", until)], "{first:?}");

    // Released while a plain wake of the run waits: the claim survives the fold.
    q.enqueue(vec![item("a", QueueReason::Wake, 0, "wake:a:3")], T0 + 3).await?;
    q.release_queued(&item_ids(&first), OWNER).await?;
    let back = take(q, Some("default"), OTHER, T0 + 4).await?;
    let a: Vec<_> = back.iter().filter(|i| i.run_id.as_str() == "a").map(QueuedRun::claimed_until).collect();
    assert_eq!(a, [until], "{back:?}");
    Ok(())
}

/// `ack_queued` deletes the items still claimed by the owner, and only those: not another
/// owner's, not unclaimed ones.
pub async fn ack_deletes_only_the_owners_claims(store: Arc<dyn Store>, queue: Arc<dyn RunQueue>) -> CaseResult {
    let (s, q) = (&*store, &*queue);
    create_all(s, ["a", "b"].map(new_run)).await?;
    q.enqueue(vec![start_item("a")], T0).await?;
    q.enqueue(vec![start_item("b")], T0 + 1).await?;
    let a = q.claim_queued(None, OWNER, 1, T0 + 2 + CLAIM, T0 + 2).await?;
    assert_eq!(runs(&a), strings(&["a"]));
    let b = take(q, None, OTHER, T0 + 2).await?;
    assert_eq!(runs(&b), strings(&["b"]));

    q.ack_queued(&item_ids(&a), OTHER).await?;
    assert_eq!(q.queued_len().await?, 2, "another owner's ack deletes nothing");
    q.release_queued(&item_ids(&b), OTHER).await?;
    q.ack_queued(&[a[0].id, b[0].id], OWNER).await?;
    assert_eq!(q.queued_len().await?, 1, "the owner's ack deletes its claim, not the unclaimed item");
    assert_eq!(runs(&take(q, None, OWNER, T0 + 3).await?), strings(&["b"]));
    Ok(())
}

/// 16 claimers racing for one item: exactly one gets it. Then 16 claimers racing for 40 items:
/// each item goes to exactly one of them. And 16 enqueues of one run racing: one item.
pub async fn concurrent_claims_hand_each_item_out_once(store: Arc<dyn Store>, queue: Arc<dyn RunQueue>) -> CaseResult {
    queue_race(&*store, &[queue]).await
}

/// [`concurrent_claims_hand_each_item_out_once`] with the claimers and senders alternating
/// between two handles on one store.
pub async fn concurrent_claims_across_handles_hand_each_item_out_once(
    store: Arc<dyn Store>,
    a: Arc<dyn RunQueue>,
    b: Arc<dyn RunQueue>,
) -> CaseResult {
    queue_race(&*store, &[a, b]).await
}

/// The races of the claim cases, with racers alternating between `queues`.
async fn queue_race(s: &dyn Store, queues: &[Arc<dyn RunQueue>]) -> CaseResult {
    let queue_for = |i: usize| queues[i % queues.len()].clone();
    create(s, new_run("solo")).await?;
    queue_for(0).enqueue(vec![start_item("solo")], T0).await?;
    let won = race(RACERS, |i| {
        let q = queue_for(i);
        async move { q.claim_queued(None, &format!("claimer-{i}"), 1, T0 + CLAIM, T0).await }
    })
    .await;
    let won: Vec<QueuedRun> = won.into_iter().collect::<Result<Vec<_>, _>>()?.into_iter().flatten().collect();
    assert_eq!(runs(&won), strings(&["solo"]), "exactly one claimer gets the item");

    let many: Vec<String> = (0..40).map(|i| format!("run-{i:02}")).collect();
    let (runs_to_create, items): (Vec<NewRun>, Vec<QueuedRun>) =
        many.iter().map(|id| (new_run(id), start_item(id))).unzip();
    create_all(s, runs_to_create).await?;
    queue_for(1).enqueue(items, T0 + 1).await?;
    let claims = race(RACERS, |i| {
        let q = queue_for(i);
        async move { q.claim_queued(None, &format!("claimer-{i}"), 5, T0 + 1 + CLAIM, T0 + 1).await }
    })
    .await;
    let mut claimed: Vec<String> = Vec::new();
    for items in claims {
        claimed.extend(runs(&items?));
    }
    claimed.sort();
    assert_eq!(claimed, many, "every item claimed exactly once");

    create(s, new_run("hot")).await?;
    let sent = race(RACERS, |i| {
        let q = queue_for(i);
        let send = match i % 2 {
            0 => start_item("hot"),
            _ => item("hot", QueueReason::Wake, 0, "wake:hot:1"),
        };
        async move { q.enqueue(vec![send], T0 + 2).await }
    })
    .await;
    sent.into_iter().collect::<Result<Vec<_>, _>>()?;
    let hot = take(&*queue_for(0), None, OWNER, T0 + 3).await?;
    assert_eq!(runs(&hot), strings(&["hot"]), "racing enqueues of one run leave one item");
    assert_eq!(hot[0].reason, QueueReason::Wake);
    Ok(())
}

/// Due scans asked to (`RunQuery::leave_queued_since`) leave out a due run that has an
/// unclaimed item of its own in this queue enqueued after that time and not after `now`: its
/// consumer executes it. A run whose item is older, stamped after `now` (another clock), or
/// claimed — even once the claim expired — or that has none, is due as ever, and so is every
/// run when the query does not ask. A run left out is dropped from the `limit` earliest due,
/// not replaced. `claim_due_runs` leaves the same runs alone (their `wake_at` unchanged).
pub async fn due_scans_leave_runs_with_a_fresh_item_of_their_own(
    store: Arc<dyn Store>,
    queue: Arc<dyn RunQueue>,
) -> CaseResult {
    let (s, q) = (&*store, &*queue);
    let due_at = T0 + 5;
    for id in ["ahead", "fresh", "none", "old", "taken"] {
        create(s, NewRun { start_at: Some(due_at), ..new_run(id) }).await?;
    }
    q.enqueue(vec![start_item("taken")], T0 + 20).await?;
    let taken = take(q, None, OWNER, T0 + 21).await?;
    assert_eq!(runs(&taken), ["taken"]);
    q.enqueue(vec![start_item("old")], T0).await?;
    q.enqueue(vec![start_item("fresh")], T0 + 30).await?;
    q.enqueue(vec![start_item("ahead")], T0 + 100).await?;

    let query = |now, since| RunQuery { namespace: None, workflows: None, now, limit: 100, leave_queued_since: since };
    let sorted = |mut ids: Vec<RunId>| {
        ids.sort();
        ids.into_iter().map(|id| id.to_string()).collect::<Vec<_>>()
    };
    let now = T0 + 40;
    let every = ["ahead", "fresh", "none", "old", "taken"];
    assert_eq!(sorted(s.due_runs(&query(now, None)).await?), every);
    assert_eq!(sorted(s.due_runs(&query(now, Some(T0 + 10))).await?), ["ahead", "none", "old", "taken"]);
    assert_eq!(sorted(s.due_runs(&query(now, Some(T0 + 29))).await?), ["ahead", "none", "old", "taken"]);
    assert_eq!(sorted(s.due_runs(&query(now, Some(T0 + 30))).await?), every);
    // A run left out is dropped from the `limit` earliest due, not replaced by a later one
    // (equal wake times: by id, "ahead" then "fresh").
    let first_two = RunQuery { limit: 2, ..query(now, Some(T0 + 10)) };
    assert_eq!(sorted(s.due_runs(&first_two).await?), ["ahead"]);
    // Later: "taken"'s claim has expired (its item still counts as claimed), "ahead"'s item is
    // no longer stamped after now.
    let later = T0 + 21 + CLAIM + 1;
    assert_eq!(sorted(s.due_runs(&query(later, Some(T0 + 10))).await?), ["none", "old", "taken"]);

    let until = now + LEASE;
    assert_eq!(sorted(s.claim_due_runs(&first_two, until).await?), ["ahead"]);
    let claimed = s.claim_due_runs(&query(now, Some(T0 + 10)), until).await?;
    assert_eq!(sorted(claimed), ["none", "old", "taken"]);
    assert_eq!(get(s, "fresh").await?.wake_at, Some(due_at), "a run left to its item keeps its wake time");
    assert_eq!(get(s, "old").await?.wake_at, Some(until));
    // Once its item is claimed, the run is the pollers' again.
    let items = take(q, None, OTHER, now).await?;
    assert_eq!(runs(&items), ["old", "fresh", "ahead"]);
    assert_eq!(sorted(s.claim_due_runs(&query(now, Some(T0 + 10)), until).await?), ["fresh"]);
    Ok(())
}
