//! What stores must carry unchanged: large payloads, unicode ids, names and tokens.

use std::sync::Arc;

use durable_core::{ClaimOutcome, Delivery, NewRun, ParentLink, Payload, RunFilter, RunId, RunStatus, Store, TurnEnd};
use serde_json::json;

use super::fixtures::*;
use crate::CaseResult;

/// The size of the large payloads: 1 MiB.
const MIB: usize = 1 << 20;

/// A JSON document of a little over 1 MiB, tagged with `tag`, written the way a store must
/// keep it byte for byte: unusual whitespace and key order, escapes, multi-byte characters.
fn large(tag: &str) -> Payload {
    let unit = "ascii, ünïcödé, 漢字, emoji 🚀, \"quotes\", back\\slash, tab\t, newline\n, nul\u{0}; ";
    let text: String = unit.chars().cycle().take(MIB).collect();
    let blob = serde_json::Value::String(text).to_string();
    let doc = format!("{{ \"z\" : 1,\n\t\"tag\":{tag:?} , \"blob\" :{blob}   }}");
    assert!(doc.len() > MIB, "the large payload is {} bytes", doc.len());
    Payload::from_trusted(doc)
}

/// Asserts that `actual` is `expected` byte for byte, without printing megabytes when not.
#[track_caller]
fn assert_same(actual: Option<&Payload>, expected: &Payload, what: &str) {
    let Some(actual) = actual else { panic!("{what}: no payload stored") };
    if actual.as_str() != expected.as_str() {
        let at = actual.as_str().bytes().zip(expected.as_str().bytes()).position(|(a, b)| a != b);
        panic!(
            "{what}: payload changed ({} bytes stored, {} sent, first difference at byte {at:?})",
            actual.len(),
            expected.len()
        );
    }
}

/// 1 MiB payloads round-trip byte-exact everywhere a payload is stored: run input and
/// output, checkpoint input and output, state, buffered and delivered signals, buffered and
/// delivered events.
pub async fn large_payloads_round_trip(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    create(s, NewRun { input: large("input"), ..new_run("r") }).await?;
    assert_same(Some(&get(s, "r").await?.input), &large("input"), "run input");
    acquire(s, claim("r", OWNER, T0)).await?;

    let mut cp = completed("r", 0, json!(null));
    cp.input = Some(large("checkpoint input"));
    cp.output = Some(large("checkpoint output"));
    let mut c = commit("r", OWNER);
    c.checkpoints.push(cp);
    c.state.push(("big".into(), large("state")));
    s.commit(c).await?;
    assert_eq!(s.send_signal("big-signal", large("buffered signal"), T0).await?, Delivery::Buffered);
    assert_eq!(s.publish_event("big-event", large("buffered event"), T0).await?, vec![]);
    register_wait(s, signal_wait("r", 1, "big-signal")).await?;
    register_wait(s, event_wait("r", 2, "big-event", json!({"z": 1}))).await?;

    park_on_signal(s, "w", 0, "direct", None).await?;
    s.send_signal("direct", large("delivered signal"), T0).await?;
    park(s, "e", event_wait("e", 0, "direct-event", json!({})), None).await?;
    s.publish_event("direct-event", large("delivered event"), T0).await?;

    let mut c = commit("r", OWNER);
    c.end = Some(TurnEnd::Settle { status: RunStatus::Completed, output: Some(large("output")), error: None });
    assert!(s.commit(c).await?.settled);

    let h = history(s, "r").await?;
    assert_same(h[0].input.as_ref(), &large("checkpoint input"), "checkpoint input");
    assert_same(h[0].output.as_ref(), &large("checkpoint output"), "checkpoint output");
    assert_same(h[1].output.as_ref(), &large("buffered signal"), "buffered signal");
    assert_same(h[2].output.as_ref(), &large("buffered event"), "buffered event");
    assert_same(s.get_state(&RunId::from("r"), "big").await?.as_ref(), &large("state"), "state");
    assert_same(get(s, "r").await?.output.as_ref(), &large("output"), "run output");
    assert_same(checkpoint_at(s, "w", 0).await?.output.as_ref(), &large("delivered signal"), "delivered signal");
    assert_same(checkpoint_at(s, "e", 0).await?.output.as_ref(), &large("delivered event"), "delivered event");
    Ok(())
}

/// Unicode (Cyrillic, CJK, emoji, `/` and `:`) in run ids, workflow names, namespaces, tags,
/// owners, checkpoint names, signal tokens, event names and state keys round-trips, filters,
/// pages and deletes like ASCII.
pub async fn unicode_ids_and_tokens_round_trip(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let id = "заказ-🚀/42";
    let child_id = "заказ-🚀/42.child.1";
    let (owner, token, event, key) = ("владелец-🚀", "сигнал/🚀", "событие-🚀", "ключ-🔑");
    let unicode_run = |run_id: &str, parent: Option<&str>| NewRun {
        workflow: "結帳-✓".into(),
        namespace: "名前空間".into(),
        tags: vec!["ταγ-🏷".into()],
        parent: parent.map(|p| ParentLink { run_id: RunId::from(p), seq: 3 }),
        ..new_run(run_id)
    };
    let created = create(s, unicode_run(id, None)).await?;
    assert_eq!(get(s, id).await?, created);
    create_all(s, ["заказ-🚀/43", "заказ:🚀/44"].map(|other| unicode_run(other, None))).await?;

    match s.claim_run(claim(id, owner, T0)).await? {
        ClaimOutcome::Acquired { run, .. } => assert_eq!(run.lease_owner.as_deref(), Some(owner)),
        other => panic!("expected the claim to acquire {id}, got {other:?}"),
    }
    let mut c = commit(id, owner);
    let mut cp = completed(id, 0, json!({"шаг": "готово 🚀"}));
    cp.name = "шаг-1 🚀".into();
    c.checkpoints.push(cp.clone());
    c.state.push((key.into(), json(json!("значение"))));
    c.waits = vec![signal_wait(id, 1, token), event_wait(id, 2, event, json!({"ключ": "значение"}))];
    c.children.push(unicode_run(child_id, Some(id)));
    s.commit(c).await?;

    assert_eq!(
        s.waiters(&RunId::from(id)).await?,
        vec![signal_wait(id, 1, token), event_wait(id, 2, event, json!({"ключ": "значение"}))]
    );
    let delivery = s.send_signal(token, json(json!("да")), T0 + 1).await?;
    assert_eq!(delivery, Delivery::Delivered { run_id: RunId::from(id), seq: 1 });
    let reached = s.publish_event(event, json(json!({"ключ": "значение", "🚀": 1})), T0 + 1).await?;
    assert_eq!(reached, vec![Delivery::Delivered { run_id: RunId::from(id), seq: 2 }]);
    assert_eq!(checkpoint_at(s, id, 0).await?, cp);
    assert_eq!(s.get_state(&RunId::from(id), key).await?, Some(json(json!("значение"))));

    let filters = [
        RunFilter { workflow: Some("結帳-✓".into()), ..RunFilter::default() },
        RunFilter { namespace: Some("名前空間".into()), ..RunFilter::default() },
        RunFilter { tag: Some("ταγ-🏷".into()), ..RunFilter::default() },
    ];
    let all = strings(&["заказ:🚀/44", "заказ-🚀/43", "заказ-🚀/42.child.1", "заказ-🚀/42"]);
    for filter in filters {
        assert_eq!(listed(s, filter).await?, all);
    }
    let children = RunFilter { parent: Some(RunId::from(id)), ..RunFilter::default() };
    assert_eq!(listed(s, children).await?, strings(&[child_id]));
    let mut page = RunFilter { limit: 1, ..RunFilter::default() };
    let mut paged = Vec::new();
    loop {
        let p = s.list_runs(&page).await?;
        paged.extend(ids(&p.runs));
        match p.next_cursor {
            Some(cursor) => page.cursor = Some(cursor),
            None => break,
        }
    }
    assert_eq!(paged, all, "cursors over unicode ids visit every run once");

    assert_eq!(s.delete_run(&RunId::from(id)).await?, 2);
    assert_eq!(s.get_run(&RunId::from(child_id)).await?, None);
    Ok(())
}
