//! What the conformance suite does not look at: round trips per commit and per bulk create,
//! batching, the server-side event matcher against `durable_core::json_subset`, NOTIFY, schema
//! isolation and "forever" times.

mod common;

use std::time::Duration;

use common::{ScratchSchema, T0, hold_token_lock, new_run, parked_on_a_lock, url_or_skip};
use durable_core::{
    Checkpoint, CheckpointStatus, Claim, ClaimOutcome, Commit, Delivery, Payload, RunId, StepKind, Store, TurnEnd,
    WaitKind, Waiter, json_subset,
};
use durable_store_postgres::{Error, PostgresStore};

async fn claim(store: &PostgresStore, id: &str, lease_until: u64) {
    let claim = Claim { run_id: RunId::from(id), owner: "me".into(), lease_until, now: T0 };
    match store.claim_run(claim).await.unwrap() {
        ClaimOutcome::Acquired { .. } => {}
        other => panic!("claim of {id}: {other:?}"),
    }
}

fn step_commit(id: &str, seq: u32) -> Commit {
    let run_id = RunId::from(id);
    let mut c = Commit::new(run_id.clone(), "me", T0 + u64::from(seq));
    let mut cp = Checkpoint::new(run_id, seq, "step", StepKind::Step, CheckpointStatus::Completed, T0);
    cp.output = Some(Payload::from_trusted(seq.to_string()));
    c.checkpoints.push(cp);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_runs_is_one_round_trip_whatever_the_batch_size() {
    let Some(url) = url_or_skip("create_runs_is_one_round_trip_whatever_the_batch_size") else { return };
    let scratch = ScratchSchema::new(&url, "bulk").await.unwrap();
    let store = scratch.connect().await.unwrap();
    store.create_run(new_run("run-7")).await.unwrap();
    let before = store.stats();
    let answers = store.create_runs((0..1_000).map(|i| new_run(&format!("run-{i}"))).collect()).await.unwrap();
    let after = store.stats();
    assert_eq!(answers.len(), 1_000);
    assert_eq!(answers.iter().filter(|a| a.created()).count(), 999, "run-7 existed");
    assert_eq!(after.batches - before.batches, 1, "1,000 creates in one transaction, one round trip");
    assert_eq!(after.writes - before.writes, 1_000);
    assert_eq!(store.create_runs(Vec::new()).await.unwrap(), vec![]);
    assert_eq!(store.stats().batches, after.batches, "an empty batch sends nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_is_one_round_trip_and_concurrent_commits_share_them() {
    let Some(url) = url_or_skip("a_commit_is_one_round_trip_and_concurrent_commits_share_them") else { return };
    let scratch = ScratchSchema::new(&url, "rtt").await.unwrap();
    let store = scratch.connect().await.unwrap();
    store.create_run(new_run("solo")).await.unwrap();
    claim(&store, "solo", T0 + 60_000).await;

    let before = store.stats();
    for seq in 0..10 {
        store.commit(step_commit("solo", seq)).await.unwrap();
    }
    let after = store.stats();
    assert_eq!(after.writes - before.writes, 10);
    assert_eq!(after.batches - before.batches, 10, "one transaction, one round trip, per sequential commit");
    assert_eq!(after.round_trips() - before.round_trips(), 10);
    assert_eq!(store.history(&RunId::from("solo")).await.unwrap().len(), 10);

    // Concurrent commits are folded into shared transactions.
    let ids: Vec<String> = (0..100).map(|i| format!("run-{i}")).collect();
    for id in &ids {
        store.create_run(new_run(id)).await.unwrap();
        claim(&store, id, T0 + 60_000).await;
    }
    let before = store.stats();
    let mut tasks = Vec::new();
    for id in &ids {
        let (store, id) = (store.clone(), id.clone());
        tasks.push(tokio::spawn(async move { store.commit(step_commit(&id, 0)).await }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let after = store.stats();
    let (writes, batches) = (after.writes - before.writes, after.batches - before.batches);
    assert_eq!(writes, 100);
    assert!(batches < writes, "{writes} concurrent commits took {batches} transactions");
    eprintln!("100 concurrent commits: {batches} transactions ({:.2} round trips per commit)", batches as f64 / 100.0);
}

#[tokio::test]
async fn event_matching_on_the_server_follows_json_subset() {
    let Some(url) = url_or_skip("event_matching_on_the_server_follows_json_subset") else { return };
    let scratch = ScratchSchema::new(&url, "match").await.unwrap();
    drop(scratch.connect().await.unwrap());
    let client = scratch.client().await.unwrap();
    let sql = format!("SELECT \"{0}\".json_subset(\"{0}\".json_of($1), \"{0}\".json_of($2))", scratch.name());
    let cases: &[(&str, &str)] = &[
        ("{}", r#"{"a":1}"#),
        (r#"{"a":1}"#, r#"{"a":1,"b":2}"#),
        (r#"{"a":1}"#, r#"{"a":2}"#),
        (r#"{"a":1}"#, r#"{"b":1}"#),
        (r#"{"a":1}"#, r#"{"a":1.0}"#),
        (r#"{"a":1.0}"#, r#"{"a":1.00}"#),
        (r#"{"a":1e2}"#, r#"{"a":100}"#),
        (r#"{"a":1e2}"#, r#"{"a":100.0}"#),
        (r#"{"a":-0}"#, r#"{"a":0}"#),
        (r#"{"a":-0}"#, r#"{"a":-0.0}"#),
        (r#"{"a":-5}"#, r#"{"a":-5}"#),
        (r#"{"a":0.1}"#, r#"{"a":0.10000000000000001}"#),
        (r#"{"a":18446744073709551615}"#, r#"{"a":18446744073709551615}"#),
        (r#"{"a":18446744073709551616}"#, r#"{"a":18446744073709551616.0}"#),
        (r#"{"a":[1,2]}"#, r#"{"a":[1,2]}"#),
        (r#"{"a":[1,2]}"#, r#"{"a":[1,2,3]}"#),
        (r#"{"a":[2,1]}"#, r#"{"a":[1,2]}"#),
        (r#"{"a":{"b":1}}"#, r#"{"a":{"b":1,"c":2}}"#),
        (r#"{"a":[{"b":1}]}"#, r#"{"a":[{"b":1,"c":2}]}"#),
        (r#"{"a":[{"b":1,"c":2}]}"#, r#"{"a":[{"c":2,"b":1}]}"#),
        (r#"{"a":"\u00e9"}"#, r#"{"a":"é"}"#),
        (r#"{"k\u00e9":1}"#, r#"{"ké":1}"#),
        (r#"{"a":"x\u0000y"}"#, r#"{"a":"x\u0000y"}"#),
        (r#"{"a":"x\u0000y"}"#, r#"{"a":"x\\u0000y"}"#),
        (r#"{"a":"x\\\u0000y"}"#, r#"{"a":"x\\\u0000y"}"#),
        (r#"{"a":1,"a":2}"#, r#"{"a":2}"#),
        (r#"{"a":2}"#, r#"{"a":1,"a":2}"#),
        (r#"{"a":null}"#, r#"{}"#),
        (r#"{"a":null}"#, r#"{"a":null}"#),
        (r#"{"a":true}"#, r#"{"a":true}"#),
        (r#"{"a":true}"#, r#"{"a":false}"#),
        (r#""x""#, r#""x""#),
        ("1", "1"),
        ("1", "1.0"),
        (r#"{"a":1}"#, "[1]"),
        ("{}", "[]"),
        ("null", "null"),
        (" {\n\t\"a\" : 1 } ", r#"{"a":1}"#),
        (r#"{"a":{"b":{"c":[1,{"d":"e"}]}}}"#, r#"{"z":0,"a":{"b":{"c":[1,{"d":"e"}],"x":1}}}"#),
    ];
    for (matcher, payload) in cases {
        let expected = json_subset(&serde_json::from_str(matcher).unwrap(), &serde_json::from_str(payload).unwrap());
        let got: bool = client.query_one(&sql, &[matcher, payload]).await.unwrap().get(0);
        assert_eq!(got, expected, "matcher {matcher} against payload {payload}");
    }
}

#[tokio::test]
async fn notify_announces_created_and_woken_runs() {
    let Some(url) = url_or_skip("notify_announces_created_and_woken_runs") else { return };
    let scratch = ScratchSchema::new(&url, "notify").await.unwrap();
    let channel = format!("wake_{}", scratch.name());
    let store = PostgresStore::connect_with(&url, scratch.options().notify_channel(&channel)).await.unwrap();
    let mut wakeups = store.listen().await.unwrap();

    store.create_run(new_run("a")).await.unwrap();
    assert_eq!(wakeups.recv().await, Some(RunId::from("a")));

    claim(&store, "a", T0 + 60_000).await;
    let mut c = Commit::new(RunId::from("a"), "me", T0);
    c.waits.push(Waiter {
        run_id: RunId::from("a"),
        seq: 0,
        name: "approval".into(),
        kind: WaitKind::Signal { token: "tok".into() },
        created_at: T0,
    });
    c.end = Some(TurnEnd::Suspend { wake_at: None, seen_wake_gen: 0 });
    assert!(!store.commit(c).await.unwrap().woken);
    let delivered = store.send_signal("tok", Payload::from_trusted("1"), T0 + 1).await.unwrap();
    assert_eq!(delivered, Delivery::Delivered { run_id: RunId::from("a"), seq: 0 });
    assert_eq!(wakeups.recv().await, Some(RunId::from("a")), "the delivery wakes the run");

    // Without a channel there is nothing to listen to.
    let quiet = scratch.connect().await.unwrap();
    assert!(matches!(quiet.listen().await, Err(Error::InvalidOptions { .. })));
}

#[tokio::test]
async fn schemas_are_isolated_and_forever_round_trips() {
    let Some(url) = url_or_skip("schemas_are_isolated_and_forever_round_trips") else { return };
    let (one, two) = (ScratchSchema::new(&url, "iso").await.unwrap(), ScratchSchema::new(&url, "iso").await.unwrap());
    let (a, b) = (one.connect().await.unwrap(), two.connect().await.unwrap());
    a.create_run(new_run("r")).await.unwrap();
    assert_eq!(b.get_run(&RunId::from("r")).await.unwrap(), None, "another schema sees nothing");
    assert!(b.create_run(new_run("r")).await.unwrap().created());

    // A lease "forever" (u64::MAX) is stored as i64::MAX and reads back as u64::MAX.
    claim(&a, "r", u64::MAX).await;
    let run = a.get_run(&RunId::from("r")).await.unwrap().unwrap();
    assert_eq!(run.lease_until, Some(u64::MAX));
}

/// With two write connections, a batch stuck on a lock does not hold up the next one: the
/// other connection takes it. (With one, the next write waits behind the stuck batch, and this
/// test fails.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_parked_on_a_lock_does_not_hold_up_the_next_one() {
    let Some(url) = url_or_skip("a_batch_parked_on_a_lock_does_not_hold_up_the_next_one") else { return };
    let scratch = ScratchSchema::new(&url, "conns").await.unwrap();
    let store = PostgresStore::connect_with(&url, scratch.options().write_connections(2)).await.unwrap();
    let admin = scratch.client().await.unwrap();
    hold_token_lock(&scratch, &admin, "tok").await;
    let parked = {
        let store = store.clone();
        tokio::spawn(async move { store.send_signal("tok", Payload::from_trusted("1".to_string()), T0).await })
    };
    assert!(parked_on_a_lock(&scratch, &admin).await, "the signal's batch waits for the token lock");
    // A hang guard, not a timing assertion: the lock is held until after this write.
    let next = tokio::time::timeout(Duration::from_secs(30), store.create_run(new_run("other"))).await;
    next.expect("the next write waited behind the parked batch").unwrap();
    assert!(!parked.is_finished(), "the signal is still parked");
    admin.batch_execute("COMMIT").await.unwrap();
    assert_eq!(parked.await.unwrap().unwrap(), Delivery::Buffered);
}

/// `claim_run_from` leaves the checkpoints before the seq on the server: a row there that does
/// not decode (a status no build writes) fails `claim_run`, naming its seq, but not a claim that
/// reads from past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_run_from_reads_only_the_checkpoints_from_the_seq() {
    let Some(url) = url_or_skip("claim_run_from_reads_only_the_checkpoints_from_the_seq") else { return };
    let scratch = ScratchSchema::new(&url, "claim_from").await.unwrap();
    let store = scratch.connect().await.unwrap();
    store.create_run(new_run("r")).await.unwrap();
    claim(&store, "r", T0 + 60_000).await;
    for seq in 0..3 {
        store.commit(step_commit("r", seq)).await.unwrap();
    }
    let admin = scratch.client().await.unwrap();
    admin
        .batch_execute(&format!(
            "UPDATE \"{}\".checkpoints SET status = 'garbled' WHERE run_id = 'r' AND seq = 0",
            scratch.name()
        ))
        .await
        .unwrap();
    let claim_of =
        |owner: &str| Claim { run_id: RunId::from("r"), owner: owner.into(), lease_until: T0 + 60_000, now: T0 };
    match store.claim_run_from(claim_of("me"), 1).await.unwrap() {
        ClaimOutcome::Acquired { history, .. } => {
            assert_eq!(history.iter().map(|cp| cp.seq).collect::<Vec<_>>(), [1, 2]);
        }
        other => panic!("expected the claim from seq 1 to acquire run r, got {other:?}"),
    }
    let e = store.claim_run(claim_of("me")).await.expect_err("the whole history holds the garbled row");
    assert!(e.to_string().contains("run r seq 0: status"), "{e}");
}

/// Claims of one run racing from two handles, round after round (each round's winner commits a
/// step and releases the lease; a claim of the winner's own lease while its commit writes the row
/// is among them): the run's claim count is exactly the number of claims that acquired it, and
/// each winner's answer carries the count so far.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_claims_count_each_acquiring_claim_once() {
    let Some(url) = url_or_skip("racing_claims_count_each_acquiring_claim_once") else { return };
    let scratch = ScratchSchema::new(&url, "claim_count").await.unwrap();
    let stores =
        [std::sync::Arc::new(scratch.connect().await.unwrap()), std::sync::Arc::new(scratch.connect().await.unwrap())];
    stores[0].create_run(new_run("r")).await.unwrap();
    let mut acquired = 0u64;
    for round in 0..10u32 {
        let now = T0 + u64::from(round);
        let racers: Vec<_> = (0..8)
            .map(|i| {
                let store = stores[i % 2].clone();
                tokio::spawn(async move {
                    let claim =
                        Claim { run_id: RunId::from("r"), owner: format!("o{i}"), lease_until: now + 60_000, now };
                    (format!("o{i}"), store.claim_run(claim).await.unwrap())
                })
            })
            .collect();
        let mut winners = Vec::new();
        for racer in racers {
            match racer.await.unwrap() {
                (owner, ClaimOutcome::Acquired { run, .. }) => winners.push((owner, run.claims)),
                (_, ClaimOutcome::Busy(_)) => {}
                (_, other) => panic!("round {round}: a racing claim got {other:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: one claim acquires: {winners:?}");
        acquired += 1;
        let (owner, claims) = winners.pop().unwrap();
        assert_eq!(claims, acquired, "round {round}: the winner's answer counts its claim");
        // The winner commits while it claims again (its own lease: acquires, or is busy while the
        // commit holds the row), then releases.
        let mut c = step_commit("r", round);
        c.owner = owner.clone();
        let again = Claim { run_id: RunId::from("r"), owner: owner.clone(), lease_until: now + 60_000, now };
        let (committed, claimed) = tokio::join!(stores[0].commit(c), stores[1].claim_run(again));
        committed.unwrap();
        match claimed.unwrap() {
            ClaimOutcome::Acquired { run, .. } => {
                acquired += 1;
                assert_eq!(run.claims, acquired, "round {round}: the owner's claim again counts");
            }
            ClaimOutcome::Busy(_) => {}
            other => panic!("round {round}: the owner's claim again got {other:?}"),
        }
        assert!(stores[0].release_lease(&RunId::from("r"), &owner).await.unwrap());
        let run = stores[1].get_run(&RunId::from("r")).await.unwrap().unwrap();
        assert_eq!(run.claims, acquired, "round {round}: the stored count");
    }
}
