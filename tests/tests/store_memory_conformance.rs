//! The reference store, `MemoryStore`, certified by the public store conformance suite: one
//! `#[test]` per case (the cases needing persistence or a second handle are reported skipped).

use durable_conformance::FnFactory;
use durable_store_memory::MemoryStore;

durable_conformance::store_conformance_tests!(FnFactory::new(|| async { Ok(MemoryStore::new()) }));
