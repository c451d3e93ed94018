//! Support for the code [`store_conformance_tests!`](crate::store_conformance_tests) emits.
//! Not public API: it may change in any release.

use std::io::Write;

use crate::{CaseOutcome, StoreFactory, find_case, run_case};

/// Worker threads of each test's runtime: enough for the race cases to interleave for real,
/// whatever the machine.
const WORKER_THREADS: usize = 4;

/// Runs the case `name` on a fresh store from `factory`, on a runtime of its own; panics if it
/// fails, prints one line if it is skipped (also when the factory is
/// [unavailable](StoreFactory::unavailable): then with the factory's reason).
pub fn run_test(factory: &dyn StoreFactory, name: &str) {
    let case = find_case(name).unwrap_or_else(|| panic!("no conformance case is named {name}"));
    if let Some(reason) = factory.unavailable() {
        let _ = writeln!(std::io::stderr().lock(), "skipped {name}: {reason}");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build the tokio runtime for case {name}: {e}"));
    match runtime.block_on(run_case(factory, case)) {
        CaseOutcome::Passed => {}
        CaseOutcome::Skipped(req) => {
            // Written to the process's stderr, not through the test harness's capture, so the
            // skip shows in a plain `cargo test`.
            let _ = writeln!(std::io::stderr().lock(), "skipped {name}: store lacks {req}");
        }
        CaseOutcome::Failed(why) => panic!("conformance case {name} failed: {why}"),
    }
}

/// Runs the transport case `name` on a fresh queue from `factory`, on a runtime of its own;
/// panics if it fails, prints one line if it is skipped.
pub fn run_transport_test(factory: &dyn crate::transport::TransportFactory, name: &str) {
    use crate::transport::{TransportOutcome, find_transport_case, run_transport_case};
    let case = find_transport_case(name).unwrap_or_else(|| panic!("no transport conformance case is named {name}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build the tokio runtime for case {name}: {e}"));
    match runtime.block_on(run_transport_case(factory, case)) {
        TransportOutcome::Passed => {}
        TransportOutcome::Skipped(reason) => {
            let _ = writeln!(std::io::stderr().lock(), "skipped {name}: {reason}");
        }
        TransportOutcome::Failed(why) => panic!("transport conformance case {name} failed: {why}"),
    }
}
