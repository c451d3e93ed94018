//! # durable-transport
//!
//! Transports move work between engine instances: the run queue (starts and wakes) and step
//! tasks for remote workers. Until the fleet issue lands, runs are dispatched in-process by
//! `durable-runtime` and picked up from the store by its pollers.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
