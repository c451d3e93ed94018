//! The reference store, `MemoryStore`, certified by the public store conformance suite: one
//! `#[test]` per case, its run queue included (the cases needing persistence or a second handle
//! are reported skipped).

use durable_conformance::{FnFactory, TestStore};
use durable_store_memory::MemoryStore;

durable_conformance::store_conformance_tests!(FnFactory::new(|| async {
    Ok(TestStore::new_with_queue(MemoryStore::new()))
}));
