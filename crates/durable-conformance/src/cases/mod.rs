//! The cases of the store suite, one `pub async fn` per contract rule, grouped by area.
//!
//! Each case takes what it needs — a fresh store, two handles on one store, or the factory —
//! and returns [`CaseResult`](crate::CaseResult): assertions panic, unexpected store errors
//! come back with `?`. Every case starts from an empty store, uses the caller's clock only
//! (times from a fixed origin), and never sleeps: races are started together on a barrier and
//! joined. [`CASES`](crate::CASES) lists them all; [`run_case`](crate::run_case) runs one with
//! its fresh store and teardown.

mod fixtures;

pub mod admission;
pub mod commit;
pub mod delete;
pub mod events;
pub mod handles;
pub mod leases;
pub mod list;
pub mod payloads;
pub mod persistence;
pub mod queues;
pub mod run_queue;
pub mod runs;
pub mod schedules;
pub mod signals;
pub mod tasks;
pub mod update;
