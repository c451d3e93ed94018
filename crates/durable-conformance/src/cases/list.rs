//! `list_runs`: ordering, every filter field, page size and cursors.

use std::sync::Arc;

use durable_core::{Millis, NewRun, ParentLink, RunFilter, RunId, RunStatus, Store, StoreErrorKind};

use super::fixtures::*;
use crate::CaseResult;

/// One run of [`catalog`]: id, workflow, namespace, tags, parent, the statuses it goes through.
type CatalogRow =
    (&'static str, &'static str, &'static str, &'static [&'static str], Option<&'static str>, &'static [RunStatus]);

/// Creates the catalog the filter cases list from:
///
/// | id | workflow | namespace | tags    | parent | created | status    |
/// |----|----------|-----------|---------|--------|---------|-----------|
/// | a  | checkout | default   | vip     |        | T0+1    | pending   |
/// | b  | checkout | billing   |         |        | T0+2    | running   |
/// | c  | refund   | default   | vip, eu | a      | T0+3    | pending   |
/// | d  | refund   | billing   | eu      | a      | T0+4    | cancelled |
/// | e  | checkout | default   |         | c      | T0+5    | completed |
/// | f  | report   | default   | vip     |        | T0+6    | suspended |
async fn catalog(s: &dyn Store) -> CaseResult {
    use RunStatus::*;
    let rows: [CatalogRow; 6] = [
        ("a", "checkout", "default", &["vip"], None, &[]),
        ("b", "checkout", "billing", &[], None, &[Running]),
        ("c", "refund", "default", &["vip", "eu"], Some("a"), &[]),
        ("d", "refund", "billing", &["eu"], Some("a"), &[Cancelled]),
        ("e", "checkout", "default", &[], Some("c"), &[Running, Completed]),
        ("f", "report", "default", &["vip"], None, &[Running, Suspended]),
    ];
    for (i, (id, workflow, namespace, tags, parent, statuses)) in rows.into_iter().enumerate() {
        let run = NewRun {
            workflow: workflow.into(),
            namespace: namespace.into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            parent: parent.map(|p| ParentLink { run_id: RunId::from(p), seq: 1 }),
            ..new_run_at(id, T0 + 1 + i as Millis)
        };
        create(s, run).await?;
        drive(s, id, statuses).await?;
    }
    Ok(())
}

/// Lists the catalog with `filter` and compares the ids, newest first.
async fn assert_lists(s: &dyn Store, filter: RunFilter, expected: &[&str]) -> CaseResult {
    assert_eq!(listed(s, filter.clone()).await?, strings(expected), "list_runs with {filter:?}");
    Ok(())
}

/// Runs come newest first: `created_at` descending, then id descending.
pub async fn list_is_newest_first(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    create_all(s, [("p", 1), ("q", 3), ("r", 2), ("s", 3)].map(|(id, t)| new_run_at(id, T0 + t))).await?;
    assert_lists(s, RunFilter::default(), &["s", "q", "r", "p"]).await
}

/// `workflow` keeps the runs of that workflow.
pub async fn list_filters_by_workflow(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    catalog(s).await?;
    assert_lists(s, RunFilter { workflow: Some("checkout".into()), ..RunFilter::default() }, &["e", "b", "a"]).await?;
    assert_lists(s, RunFilter { workflow: Some("nope".into()), ..RunFilter::default() }, &[]).await
}

/// `statuses` keeps the runs in any of them; empty keeps every status.
pub async fn list_filters_by_statuses(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    catalog(s).await?;
    let by = |statuses: Vec<RunStatus>| RunFilter { statuses, ..RunFilter::default() };
    assert_lists(s, by(vec![RunStatus::Pending, RunStatus::Cancelled]), &["d", "c", "a"]).await?;
    assert_lists(s, by(vec![RunStatus::Completed]), &["e"]).await?;
    assert_lists(s, by(vec![RunStatus::Dead]), &[]).await?;
    assert_lists(s, by(vec![]), &["f", "e", "d", "c", "b", "a"]).await
}

/// `run_counts` counts the runs per workflow and status, ordered by workflow then status, and
/// follows deletes.
pub async fn run_counts_by_workflow_and_status(store: Arc<dyn Store>) -> CaseResult {
    use durable_core::RunCount;
    let s = &*store;
    assert_eq!(s.run_counts().await?, vec![], "run_counts of an empty store");
    catalog(s).await?;
    let count = |workflow: &str, status, count| RunCount { workflow: workflow.into(), status, count };
    use RunStatus::*;
    let expected = vec![
        count("checkout", Pending, 1),
        count("checkout", Running, 1),
        count("checkout", Completed, 1),
        count("refund", Pending, 1),
        count("refund", Cancelled, 1),
        count("report", Suspended, 1),
    ];
    assert_eq!(s.run_counts().await?, expected, "run_counts of the catalog");
    s.delete_run(&RunId::from("e")).await?;
    assert_eq!(s.run_counts().await?, [&expected[..2], &expected[3..]].concat(), "run_counts after a delete");
    Ok(())
}

/// `namespace` keeps the runs of that namespace.
pub async fn list_filters_by_namespace(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    catalog(s).await?;
    assert_lists(s, RunFilter { namespace: Some("billing".into()), ..RunFilter::default() }, &["d", "b"]).await
}

/// `tag` keeps the runs carrying that tag (among others).
pub async fn list_filters_by_tag(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    catalog(s).await?;
    assert_lists(s, RunFilter { tag: Some("vip".into()), ..RunFilter::default() }, &["f", "c", "a"]).await?;
    assert_lists(s, RunFilter { tag: Some("eu".into()), ..RunFilter::default() }, &["d", "c"]).await?;
    assert_lists(s, RunFilter { tag: Some("v".into()), ..RunFilter::default() }, &[]).await
}

/// `parent` keeps the direct children of that run (not grandchildren).
pub async fn list_filters_by_parent(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    catalog(s).await?;
    let children_of = |id: &str| RunFilter { parent: Some(RunId::from(id)), ..RunFilter::default() };
    assert_lists(s, children_of("a"), &["d", "c"]).await?;
    assert_lists(s, children_of("c"), &["e"]).await?;
    assert_lists(s, children_of("f"), &[]).await
}

/// `created_after` is inclusive, `created_before` exclusive; each works alone.
pub async fn list_filters_by_created_range(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    catalog(s).await?;
    let range = |after: Option<Millis>, before: Option<Millis>| RunFilter {
        created_after: after,
        created_before: before,
        ..RunFilter::default()
    };
    assert_lists(s, range(Some(T0 + 2), Some(T0 + 5)), &["d", "c", "b"]).await?;
    assert_lists(s, range(Some(T0 + 5), None), &["f", "e"]).await?;
    assert_lists(s, range(None, Some(T0 + 2)), &["a"]).await?;
    assert_lists(s, range(Some(T0 + 3), Some(T0 + 3)), &[]).await
}

/// Every filter field narrows: combined, they keep the runs matching all of them.
pub async fn list_filters_combine(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    catalog(s).await?;
    let refund_eu_default = RunFilter {
        workflow: Some("refund".into()),
        tag: Some("eu".into()),
        namespace: Some("default".into()),
        ..RunFilter::default()
    };
    assert_lists(s, refund_eu_default, &["c"]).await?;
    let old_checkout_in_default = RunFilter {
        workflow: Some("checkout".into()),
        namespace: Some("default".into()),
        statuses: vec![RunStatus::Pending, RunStatus::Completed],
        created_before: Some(T0 + 5),
        ..RunFilter::default()
    };
    assert_lists(s, old_checkout_in_default, &["a"]).await?;
    let children_of_a_pending = RunFilter {
        parent: Some(RunId::from("a")),
        statuses: vec![RunStatus::Pending],
        created_after: Some(T0 + 3),
        ..RunFilter::default()
    };
    assert_lists(s, children_of_a_pending, &["c"]).await
}

/// A page holds at most `limit` runs (100 when 0), and `next_cursor` is `Some` exactly when
/// more runs match.
pub async fn list_limit_and_default_page_size(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let total = 105;
    create_all(s, (0..total).map(|i| new_run_at(&format!("run-{i:03}"), T0 + i))).await?;
    for (limit, expected_len, more) in
        [(0, 100, true), (3, 3, true), (104, 104, true), (105, 105, false), (500, 105, false)]
    {
        let page = s.list_runs(&RunFilter { limit, ..RunFilter::default() }).await?;
        assert_eq!(page.runs.len(), expected_len, "page size with limit {limit}");
        assert_eq!(page.next_cursor.is_some(), more, "next_cursor with limit {limit} of {total} runs");
        assert_eq!(page.runs[0].id.as_str(), "run-104", "pages start with the newest run");
    }
    Ok(())
}

/// Paging with the cursor visits every matching run exactly once, in order, across runs that
/// share a `created_at`; the last page has no cursor.
pub async fn list_cursor_visits_every_run_once(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    let mut runs: Vec<NewRun> = (0..30)
        .map(|i| NewRun {
            namespace: if i % 3 == 0 { "other" } else { "main" }.into(),
            ..new_run_at(&format!("r{i:02}"), T0 + (i % 7))
        })
        .collect();
    create_all(s, runs.clone()).await?;
    runs.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));

    for (namespace, limit) in [(None, 4), (Some("main"), 3), (Some("main"), 1)] {
        let expected: Vec<String> =
            runs.iter().filter(|r| namespace.is_none_or(|ns| r.namespace == ns)).map(|r| r.id.to_string()).collect();
        let mut filter = RunFilter { namespace: namespace.map(Into::into), limit, ..RunFilter::default() };
        let mut seen = Vec::new();
        loop {
            let page = s.list_runs(&filter).await?;
            assert!(page.runs.len() <= limit, "a page of {} runs with limit {limit}", page.runs.len());
            seen.extend(ids(&page.runs));
            assert!(seen.len() <= expected.len(), "paging returned more runs than match: {seen:?}");
            match page.next_cursor {
                Some(cursor) => filter.cursor = Some(cursor),
                None => break,
            }
        }
        assert_eq!(seen, expected, "paging namespace {namespace:?} by {limit}");
    }
    Ok(())
}

/// A cursor that `list_runs` did not hand out is refused with `NotFound` (the kind the
/// in-tree cursor format, `durable_core::decode_cursor`, uses).
pub async fn list_rejects_malformed_cursor(store: Arc<dyn Store>) -> CaseResult {
    let s = &*store;
    create(s, new_run("r")).await?;
    let filter = RunFilter { cursor: Some("not a cursor".into()), ..RunFilter::default() };
    assert_kind(s.list_runs(&filter).await, StoreErrorKind::NotFound);
    Ok(())
}
