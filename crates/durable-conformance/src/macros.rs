//! The case list (one place) and the macros built from it: the [`CASES`](crate::CASES) table
//! and [`store_conformance_tests!`](crate::store_conformance_tests).

/// Emits one `#[test]` per conformance case, each running the case on a fresh store from the
/// factory expression, on a multi-thread tokio runtime owned by this crate (no
/// `#[tokio::test]` needed).
///
/// The expression is evaluated once per test and must implement
/// [`StoreFactory`](crate::StoreFactory). A case the store cannot run prints one line,
/// `skipped <case>: store lacks <requirement>`, and passes. The tests are named after the
/// cases (`claim_is_busy_under_live_lease`, …); to certify two stores in one file, call the
/// macro in two modules.
///
/// ```
/// use durable_conformance::FnFactory;
/// use durable_store_memory::MemoryStore;
///
/// mod memory {
///     use super::*;
///     durable_conformance::store_conformance_tests!(FnFactory::new(|| async { Ok(MemoryStore::new()) }));
/// }
/// ```
#[macro_export]
macro_rules! store_conformance_tests {
    ($factory:expr $(,)?) => {
        $crate::__store_cases!(__store_case_tests { $factory });
    };
}

/// The list of cases: `area::name(kind, [requirements])`, handed to `$callback` after the
/// callback's own arguments. The single source of [`CASES`](crate::CASES) and of the tests
/// emitted by [`store_conformance_tests!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __store_cases {
    ($callback:ident { $($args:tt)* }) => {
        $crate::$callback! {
            { $($args)* }
            runs::capabilities_are_constant(Store, []),
            runs::create_run_is_idempotent(Store, []),
            runs::create_run_keeps_the_trace_context(Store, []),
            runs::concurrent_creates_have_one_winner(Store, []),
            runs::create_runs_answers_each_item_in_order(Store, []),
            runs::create_runs_is_seen_whole(Store, []),
            runs::concurrent_create_runs_have_one_winner_per_id(Store, []),
            runs::missing_run_reads_as_absent(Store, []),
            runs::get_runs_reads_the_existing_ones(Store, []),
            runs::history_is_ordered_by_seq(Store, []),
            list::list_is_newest_first(Store, []),
            list::list_filters_by_workflow(Store, []),
            list::run_counts_by_workflow_and_status(Store, []),
            list::list_filters_by_statuses(Store, []),
            list::list_filters_by_namespace(Store, []),
            list::list_filters_by_tag(Store, []),
            list::list_filters_by_parent(Store, []),
            list::list_filters_by_created_range(Store, []),
            list::list_filters_combine(Store, []),
            list::list_limit_and_default_page_size(Store, []),
            list::list_cursor_visits_every_run_once(Store, []),
            list::list_rejects_malformed_cursor(Store, []),
            update::update_applies_only_from_expected_status(Store, []),
            update::update_with_no_expectation_matches_any_status(Store, []),
            update::update_missing_run_is_false(Store, []),
            update::update_forbidden_transition_is_conflict(Store, []),
            update::update_applies_every_patch_field(Store, []),
            update::concurrent_updates_have_one_winner(Store, []),
            update::update_truncates_history_from_seq(Store, []),
            update::update_wake_counts_as_a_delivery(Store, []),
            update::terminal_update_removes_waiters(Store, []),
            update::update_signals_are_sent_only_when_applied(Store, []),
            leases::claim_acquires_pending_run(Store, []),
            leases::claims_count_acquiring_claims(Store, []),
            leases::claim_run_from_reads_from_the_seq(Store, []),
            leases::claim_is_busy_under_live_lease(Store, []),
            leases::claim_again_by_owner_is_not_recovery(Store, []),
            leases::claim_terminal_run_reports_terminal(Store, []),
            leases::claim_missing_run_is_not_found(Store, []),
            leases::claim_takes_over_expired_lease(Store, []),
            leases::claim_after_release_is_not_recovery(Store, []),
            leases::concurrent_claims_have_one_winner(Store, []),
            leases::renew_only_by_owner(Store, []),
            leases::release_only_by_owner(Store, []),
            commit::commit_without_lease_is_lease_lost(Store, []),
            commit::step_commit_without_lease_is_refused(Store, []),
            commit::settle_without_lease_is_refused(Store, []),
            commit::commit_after_takeover_is_lease_lost(Store, []),
            commit::step_commit_is_atomic_with_settle(Store, []),
            commit::commit_upserts_checkpoints_by_seq(Store, []),
            commit::settle_records_terminal_status(Store, []),
            commit::settle_after_cancel_is_not_applied(Store, []),
            commit::settle_removes_waiters(Store, []),
            commit::suspend_parks_run_and_releases_lease(Store, []),
            commit::suspend_after_cancel_leaves_run_cancelled(Store, []),
            commit::suspend_after_delivery_stays_running(Store, []),
            commit::progress_resets_recovery_attempts(Store, []),
            commit::no_progress_keeps_recovery_attempts(Store, []),
            commit::wait_consuming_buffered_signal_wakes_turn(Store, []),
            commit::expire_wait_removes_waiter(Store, []),
            commit::expire_wait_raced_by_delivery_keeps_delivery(Store, []),
            commit::state_is_upserted_and_outlives_settle(Store, []),
            commit::children_are_created_idempotently(Store, []),
            commit::outgoing_signals_report_deliveries(Store, []),
            signals::signal_to_waiter_records_and_wakes(Store, []),
            signals::signal_and_claim_claims_the_run_it_wakes(Store, []),
            signals::signals_are_buffered_fifo_per_token(Store, []),
            signals::oldest_waiter_is_served_first(Store, []),
            signals::concurrent_signals_and_waits_lose_nothing(Store, []),
            signals::buffered_deliveries_are_listed_per_key(Store, []),
            signals::purging_buffered_deliveries_deletes_only_those_asked(Store, []),
            events::event_reaches_every_matching_waiter(Store, []),
            events::unmatched_event_is_buffered_for_a_matching_wait(Store, []),
            queues::pending_runs_by_priority_then_age(Store, []),
            queues::pending_runs_filter_and_limit(Store, []),
            queues::pending_runs_skip_leased_runs(Store, []),
            queues::due_runs_are_due_earliest_first(Store, []),
            queues::claim_due_runs_moves_wake_at_to_until(Store, []),
            queues::claim_due_runs_filter_and_limit(Store, []),
            queues::concurrent_due_claims_never_share_a_run(Store, []),
            queues::orphaned_runs_are_running_without_live_lease(Store, []),
            run_queue::enqueued_items_are_claimed_with_their_fields(Queue, [RunQueue]),
            run_queue::enqueue_drops_items_of_missing_runs(Queue, [RunQueue]),
            run_queue::one_unclaimed_item_per_run(Queue, [RunQueue]),
            run_queue::a_claimed_run_can_be_queued_again(Queue, [RunQueue]),
            run_queue::claims_are_by_priority_then_age_up_to_the_limit(Queue, [RunQueue]),
            run_queue::claims_filter_by_namespace(Queue, [RunQueue]),
            run_queue::expired_claims_are_redelivered(Queue, [RunQueue]),
            run_queue::released_items_are_claimable_at_once(Queue, [RunQueue]),
            run_queue::release_keeps_one_unclaimed_item_per_run(Queue, [RunQueue]),
            run_queue::merged_wakes_keep_a_claim(Queue, [RunQueue]),
            run_queue::ack_deletes_only_the_owners_claims(Queue, [RunQueue]),
            run_queue::concurrent_claims_hand_each_item_out_once(Queue, [RunQueue]),
            run_queue::due_scans_leave_runs_with_a_fresh_item_of_their_own(Queue, [RunQueue]),
            schedules::schedule_create_is_once_per_key(Store, []),
            schedules::schedule_save_is_compare_and_set(Store, []),
            schedules::schedule_save_creates_its_fires_with_it(Store, []),
            schedules::concurrent_fires_have_one_winner(Store, []),
            schedules::save_schedules_answers_each_in_order(Store, []),
            schedules::due_schedules_are_due_earliest_first(Store, []),
            schedules::list_and_delete_schedules(Store, []),
            schedules::publish_with_a_dedupe_id_happens_once(Store, []),
            schedules::a_full_batch_starts_in_the_publish_that_fills_it(Store, []),
            schedules::due_buffers_flush_once(Store, []),
            schedules::a_delayed_start_is_due_at_its_time(Store, []),
            tasks::dispatch_is_atomic_with_checkpoint_and_wait(Store, [Tasks]),
            tasks::a_task_keeps_its_trace_context(Store, [Tasks]),
            tasks::a_task_dispatched_to_a_worker_is_claimed_by_it(Store, [Tasks, ClaimedDispatch]),
            tasks::claims_by_priority_then_age_per_queue_and_namespace(Store, [Tasks]),
            tasks::claims_need_every_required_capability(Store, [Tasks]),
            tasks::concurrent_claimers_take_each_task_once(Store, [Tasks]),
            tasks::expired_lease_redelivers_the_same_attempt(Store, [Tasks]),
            tasks::heartbeat_extends_the_lease(Store, [Tasks]),
            tasks::heartbeat_without_the_task_is_lost_or_cancelled(Store, [Tasks]),
            tasks::completion_records_the_result_and_wakes_the_run(Store, [Tasks]),
            tasks::complete_task_and_claim_claims_the_woken_run(Store, [Tasks]),
            tasks::failed_attempt_is_recorded_waiting_without_wake_at(Store, [Tasks]),
            tasks::completion_is_once_per_attempt(Store, [Tasks]),
            tasks::completion_after_the_run_settled_is_run_terminal(Store, [Tasks]),
            tasks::redispatch_replaces_the_task_and_keeps_logs(Store, [Tasks]),
            tasks::released_tasks_are_claimable_at_once(Store, [Tasks]),
            tasks::unclaimed_task_expires_at_its_pickup_deadline(Store, [Tasks]),
            tasks::claimed_attempt_expires_from_its_first_claim(Store, [Tasks]),
            tasks::settle_finishes_the_runs_tasks(Store, [Tasks]),
            tasks::list_tasks_filters(Store, [Tasks]),
            tasks::queue_stats_count_per_queue(Store, [Tasks]),
            tasks::workers_register_refresh_and_expire(Store, [Tasks]),
            tasks::blocked_runs_wake_like_suspended_ones(Store, [Tasks]),
            tasks::a_claim_out_of_blocked_clears_the_blocked_error(Store, [Tasks]),
            admission::caps_concurrency(Store, [Admission]),
            admission::fixed_window_rate(Store, [Admission]),
            admission::highest_priority_first(Store, [Admission]),
            admission::fifo_by_default(Store, [Admission]),
            admission::lifo_when_configured(Store, [Admission]),
            admission::round_robin_across_fairness_keys(Store, [Admission]),
            admission::an_ungated_queue_admits_everything(Store, [Admission]),
            admission::a_dead_holders_slot_is_reclaimed(Store, [Admission]),
            admission::a_release_in_a_commit_hands_the_slot_on(Store, [Admission]),
            admission::settling_cancelling_or_deleting_a_run_releases_its_slots(Store, [Admission]),
            admission::a_keyed_start_waits_for_its_slot_or_is_refused(Store, [Admission]),
            admission::a_settle_claims_the_run_it_hands_its_key_to(Store, [Admission]),
            admission::runs_a_store_creates_take_their_key_and_are_never_refused(Store, [Admission]),
            admission::a_successor_takes_over_its_predecessors_key(Store, [Admission]),
            admission::a_settle_claims_a_suspended_run_handed_a_step_slot(Store, [Admission]),
            admission::concurrent_requests_never_exceed_the_limit(Store, [Admission]),
            admission::a_remote_steps_result_releases_its_slot(Store, [Admission, Tasks]),
            delete::delete_removes_run_and_subtree(Store, []),
            delete::delete_child_keeps_parent(Store, []),
            delete::delete_missing_run_is_zero(Store, []),
            delete::child_results_never_reach_another_run_with_the_parents_id(Store, []),
            payloads::large_payloads_round_trip(Store, []),
            payloads::unicode_ids_and_tokens_round_trip(Store, []),
            handles::handles_share_data_and_leases(TwoHandles, [SharedAcrossProcesses, SecondHandle]),
            handles::concurrent_claims_across_handles_have_one_winner(TwoHandles, [SharedAcrossProcesses, SecondHandle]),
            handles::concurrent_creates_across_handles_have_one_winner(TwoHandles, [SharedAcrossProcesses, SecondHandle]),
            handles::signal_race_across_handles_loses_nothing(TwoHandles, [SharedAcrossProcesses, SecondHandle]),
            queues::concurrent_due_claims_across_handles_never_share_a_run(TwoHandles, [SharedAcrossProcesses, SecondHandle]),
            run_queue::concurrent_claims_across_handles_hand_each_item_out_once(TwoQueues, [SharedAcrossProcesses, RunQueue, SecondQueue]),
            tasks::concurrent_claimers_across_handles_take_each_task_once(TwoHandles, [SharedAcrossProcesses, SecondHandle, Tasks]),
            admission::concurrent_requests_across_handles_never_exceed_the_limit(TwoHandles, [SharedAcrossProcesses, SecondHandle, Admission]),
            persistence::data_survives_reopen(Factory, [Persistent, Reopen]),
        }
    };
}

/// Builds [`CASES`](crate::CASES) from the case list.
#[doc(hidden)]
#[macro_export]
macro_rules! __store_case_table {
    ({} $($area:ident :: $name:ident ($kind:ident, [$($req:ident),*]),)*) => {
        /// Every case of the store suite, grouped by area, in the order [`run_all`] runs them.
        pub const CASES: &[Case] = &[$(
            Case {
                name: ::core::stringify!($name),
                area: ::core::stringify!($area),
                requires: &[$(Requirement::$req),*],
                run: $crate::__case_fn!($kind, $crate::cases::$area::$name),
            },
        )*];
    };
}

/// The [`CaseFn`](crate::CaseFn) calling a case function of the given kind.
#[doc(hidden)]
#[macro_export]
macro_rules! __case_fn {
    (Store, $f:path) => {
        $crate::CaseFn::Store(|store| ::std::boxed::Box::pin($f(store)))
    };
    (TwoHandles, $f:path) => {
        $crate::CaseFn::TwoHandles(|a, b| ::std::boxed::Box::pin($f(a, b)))
    };
    (Factory, $f:path) => {
        $crate::CaseFn::Factory(|factory, store| ::std::boxed::Box::pin($f(factory, store)))
    };
    (Queue, $f:path) => {
        $crate::CaseFn::Queue(|store, queue| ::std::boxed::Box::pin($f(store, queue)))
    };
    (TwoQueues, $f:path) => {
        $crate::CaseFn::TwoQueues(|store, a, b| ::std::boxed::Box::pin($f(store, a, b)))
    };
}

/// Emits one `#[test]` per case (see [`store_conformance_tests!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __store_case_tests {
    ({ $factory:expr } $($area:ident :: $name:ident ($kind:ident, [$($req:ident),*]),)*) => {
        $(
            #[test]
            fn $name() {
                $crate::__private::run_test(&$factory, ::core::stringify!($name));
            }
        )*
    };
}

/// Emits one `#[test]` per transport conformance case, each running the case on a fresh queue
/// from the factory expression (a [`TransportFactory`](crate::transport::TransportFactory)),
/// on a multi-thread tokio runtime owned by this crate. When the factory is
/// [unavailable](crate::transport::TransportFactory::unavailable), each test prints one line,
/// `skipped <case>: <reason>`, and passes.
///
/// See [`transport`](crate::transport) for an example.
#[macro_export]
macro_rules! transport_conformance_tests {
    ($factory:expr $(,)?) => {
        $crate::__transport_cases!(__transport_case_tests { $factory });
    };
}

/// The transport cases: `name(redelivery time in seconds)`, handed to `$callback`. The single
/// source of [`TRANSPORT_CASES`](crate::transport::TRANSPORT_CASES) and of the tests emitted by
/// [`transport_conformance_tests!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __transport_cases {
    ($callback:ident { $($args:tt)* }) => {
        $crate::$callback! {
            { $($args)* }
            delivered_at_least_once(60),
            claimed_by_one_consumer_at_a_time(60),
            redelivered_after_a_consumer_dies(1),
            handed_back_items_return_at_once(600),
            duplicate_sends_are_delivered_once(60),
            batches_of_500_arrive_whole(60),
            concurrency_is_respected(60),
            namespaces_are_isolated(60),
        }
    };
}

/// Builds [`TRANSPORT_CASES`](crate::transport::TRANSPORT_CASES) from the case list.
#[doc(hidden)]
#[macro_export]
macro_rules! __transport_case_table {
    ({} $($name:ident ($secs:literal),)*) => {
        /// Every case of the transport suite, in the order
        /// [`run_transport_all`](crate::transport::run_transport_all) runs them.
        pub const TRANSPORT_CASES: &[TransportCase] = &[$(
            TransportCase {
                name: ::core::stringify!($name),
                redeliver_after: ::std::time::Duration::from_secs($secs),
                run: |q| ::std::boxed::Box::pin($crate::transport::cases::$name(q)),
            },
        )*];
    };
}

/// Emits one `#[test]` per transport case (see [`transport_conformance_tests!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __transport_case_tests {
    ({ $factory:expr } $($name:ident ($secs:literal),)*) => {
        $(
            #[test]
            fn $name() {
                $crate::__private::run_transport_test(&$factory, ::core::stringify!($name));
            }
        )*
    };
}
