//! # durable-conformance
//!
//! The public conformance suite of `durable` stores. Every rule of the
//! [`Store`](durable_core::Store) contract (the `# Contract` section of each method, and the
//! store rules of the design: atomic commits, compare-and-set settles, leases, signals that are
//! never lost, queues), and of the [`RunQueue`](durable_core::RunQueue) contract for stores that
//! keep one ([`TestStore::new_with_queue`]), is one case: a `pub async fn` in [`cases`] that drives a fresh store
//! through the trait and asserts what the contract promises. The in-tree stores certify
//! themselves with it, and so can yours.
//!
//! What is here:
//! - [`StoreFactory`]: how the suite gets a fresh, empty store per case (and, optionally, a
//!   second handle on the same data, or the data reopened after a drop). [`FnFactory`] turns a
//!   closure into one.
//! - [`store_conformance_tests!`]: emits one plain `#[test]` per case, each on a tokio runtime
//!   this crate owns, so `cargo test` lists and runs every case on its own.
//! - [`CASES`], [`run_case`] and [`run_all`] for custom harnesses.
//! - [`FaultyStore`]: a wrapper that injects errors and latency into any store, for testing
//!   how an engine copes with a failing backend (it passes the suite itself when no fault is
//!   armed).
//! - The workflow test harness: [`TestEngine`] (an engine on a virtual clock), [`FailFirst`],
//!   [`Counter`], and [`replay`]: [`replay::assert_replayable`] checks that the current workflow
//!   code still replays a recorded history (an export of a real run) without executing
//!   anything. Applications reach it, and [`FaultyStore`], as `durable::testing` (the facade's
//!   `testing` feature).
//! - [`sim`]: seeded simulation of whole engines (yours or the engine's sample workflows) with
//!   store faults, crashes and restarts, checked against a fault-free run.
//!
//! What the store suite does not do: it runs no engine and no workflow (the cases talk to the
//! store directly), measures no performance and asserts no durations; cases assert error
//! *kinds* ([`StoreErrorKind`](durable_core::StoreErrorKind)), never message text.
//!
//! ```
//! use durable_conformance::{FnFactory, StoreFactory};
//! use durable_store_memory::MemoryStore;
//!
//! fn memory() -> impl StoreFactory {
//!     FnFactory::new(|| async { Ok(MemoryStore::new()) })
//! }
//!
//! // In a test file: one `#[test]` per case.
//! durable_conformance::store_conformance_tests!(memory());
//! ```
//!
//! See the crate's README for the full "certify your store" guide.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod cases;
mod factory;
mod faulty;
mod harness;
mod macros;
pub mod replay;
pub mod sim;
mod suite;
pub mod transport;

#[doc(hidden)]
pub mod __private;

pub use factory::{FnFactory, StoreFactory, TestStore};
pub use faulty::{Call, Fault, FaultyStore, Method};
pub use harness::{Counter, FailFirst, TestEngine, next_event, test_config};
pub use suite::{
    CASES, Case, CaseError, CaseFn, CaseFuture, CaseOutcome, CaseResult, Requirement, SuiteReport, find_case, run_all,
    run_case,
};
