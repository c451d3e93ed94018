//! The workspace's PostgreSQL test support keeps its promises: the skip line says how to run the
//! test, scratch schemas are unique, created by the first store and dropped with the guard — also
//! when the test panics.

use durable_store_postgres::test_support::{self, ScratchSchema, url_or_skip};

#[test]
fn the_skip_reason_says_how_to_run_the_test() {
    let reason = test_support::skip_reason();
    assert!(reason.starts_with("DURABLE_PG_URL is not set; to run it: "), "{reason}");
    assert!(reason.contains("DURABLE_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test"), "{reason}");
    assert_eq!(reason.lines().count(), 1, "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scratch_schema_is_unique_created_by_the_store_and_dropped_with_the_guard() {
    let Some(url) = url_or_skip("a_scratch_schema_is_unique_created_by_the_store_and_dropped_with_the_guard") else {
        return;
    };
    let (one, two) =
        (ScratchSchema::new(&url, "unique").await.unwrap(), ScratchSchema::new(&url, "unique").await.unwrap());
    assert_ne!(one.name(), two.name());
    assert!(one.name().starts_with("durable_test_unique_"), "{}", one.name());
    assert_eq!(one.application_name(), format!("durable-{}", one.name()));

    // Only the name is reserved; the first store creates the schema.
    assert!(!one.exists().await.unwrap());
    drop(one.connect().await.unwrap());
    assert!(one.exists().await.unwrap());
    let probe = ScratchSchema::new(&url, "probe").await.unwrap();
    let name = one.name().to_string();
    drop(one);
    assert!(!schema_exists(&probe, &name).await, "dropping the guard drops the schema");

    // drop_now: dropped at once, and dropping the guard afterwards does nothing.
    drop(two.connect().await.unwrap());
    two.drop_now().await.unwrap();
    assert!(!two.exists().await.unwrap());
    two.drop_now().await.unwrap();
}

#[test]
fn a_scratch_schema_is_dropped_when_the_test_panics() {
    let Some(url) = url_or_skip("a_scratch_schema_is_dropped_when_the_test_panics") else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (names, panicked) = {
        let (tx, rx) = std::sync::mpsc::channel();
        let url = url.clone();
        let result = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let scratch = ScratchSchema::new(&url, "panic").await.unwrap();
                drop(scratch.connect().await.unwrap());
                tx.send(scratch.name().to_string()).unwrap();
                panic!("a failing test");
            })
        })
        .join();
        (rx.try_iter().collect::<Vec<_>>(), result.is_err())
    };
    assert!(panicked);
    assert_eq!(names.len(), 1);
    runtime.block_on(async {
        let probe = ScratchSchema::new(&url, "probe").await.unwrap();
        assert!(!schema_exists(&probe, &names[0]).await, "the panicking test's schema was dropped");
    });
}

async fn schema_exists(on: &ScratchSchema, name: &str) -> bool {
    let client = on.client().await.unwrap();
    let row = client.query_one("SELECT count(*) FROM pg_namespace WHERE nspname = $1", &[&name]).await.unwrap();
    row.get::<_, i64>(0) > 0
}
