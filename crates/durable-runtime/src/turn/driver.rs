//! The turn driver: polls the body (then, if the core says so, the undos) and asks the core
//! after every poll whether the turn ends.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use durable_core::{End, Millis, Next, Pending};

use super::child::compensate;
use super::{TurnState, panic_message};
use crate::clock::BoxFuture;
use crate::error::BodyResult;

/// What the driver polls.
enum Polling {
    /// The workflow body.
    Body(BoxFuture<'static, BodyResult>),
    /// The undos, after the core said to compensate (the body was dropped).
    Undos(BoxFuture<'static, ()>),
}

/// Polls the body until the turn ends; resolves to the core's [`End`], whose commit the
/// caller applies.
pub(crate) struct TurnDriver {
    polling: Polling,
    t: Arc<TurnState>,
    /// While the body awaits something outside the ctx: the time the core said to ask again
    /// ([`Pending::IdleUntil`]) and a timer on the engine clock that wakes the driver then.
    idle: Option<(Millis, BoxFuture<'static, ()>)>,
    /// A hold's commit ([`TurnState::hold_commit`]) being applied: polled to its end before
    /// anything else (the body does not move meanwhile; no other commit can overtake it).
    hold_commit: Option<BoxFuture<'static, bool>>,
    /// While the turn holds its sleeps ([`Pending::HoldUntil`]): when they are due, and the
    /// wait ([`TurnState::hold_wait`]), dropped by any other answer of the core.
    hold_wait: Option<(Millis, BoxFuture<'static, bool>)>,
}

impl TurnDriver {
    pub(crate) fn new(t: Arc<TurnState>, body: BoxFuture<'static, BodyResult>) -> Self {
        TurnDriver { polling: Polling::Body(body), t, idle: None, hold_commit: None, hold_wait: None }
    }
}

impl Future for TurnDriver {
    type Output = End;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<End> {
        // Before the core is asked anything: a stop from outside the turn set after this
        // point wakes this task again, one set before it is seen by the questions below.
        self.t.driven_by(cx.waker());
        loop {
            let this = &mut *self;
            if let Some(commit) = this.hold_commit.as_mut() {
                let Poll::Ready(going_on) = commit.as_mut().poll(cx) else { return Poll::Pending };
                this.hold_commit = None;
                if !going_on {
                    this.hold_wait = None;
                }
            }
            let now = this.t.now();
            let polled = std::panic::catch_unwind(AssertUnwindSafe(|| match &mut this.polling {
                Polling::Body(body) => body.as_mut().poll(cx).map(Some),
                Polling::Undos(undos) => undos.as_mut().poll(cx).map(|()| None),
            }));
            let may_hold = this.t.env.may_hold();
            let answer = {
                let mut turn = this.t.turn.lock();
                turn.allow_holds(may_hold);
                match polled {
                    Err(panic) => return Poll::Ready(turn.on_panic(&panic_message(panic.as_ref()), now)),
                    Ok(Poll::Ready(None)) => return Poll::Ready(turn.on_compensated(now)),
                    Ok(Poll::Ready(Some(r))) => Pending::Next(turn.on_body_done(r.map_err(|e| e.to_step_error()), now)),
                    Ok(Poll::Pending) => turn.on_pending(now),
                }
            };
            match answer {
                Pending::KeepPolling => {
                    this.idle = None;
                    this.hold_wait = None;
                    return Poll::Pending;
                }
                Pending::HoldUntil { commit, until } => {
                    this.idle = None;
                    // The wait's deadline is absolute: applying the commit first delays nothing.
                    if this.hold_wait.as_ref().is_none_or(|(at, _)| *at != until) {
                        this.hold_wait = Some((until, Box::pin(this.t.clone().hold_wait(until))));
                    }
                    if let Some(commit) = commit {
                        this.hold_commit = Some(Box::pin(this.t.clone().hold_commit(commit, until)));
                        continue;
                    }
                    let (_, wait) = this.hold_wait.as_mut().expect("set above");
                    let Poll::Ready(going_on) = wait.as_mut().poll(cx) else { return Poll::Pending };
                    this.hold_wait = None;
                    if going_on {
                        // Due: the parked sleeps begin again, and the body is polled.
                        this.t.end_hold();
                    }
                }
                Pending::IdleUntil(at) => {
                    this.hold_wait = None;
                    // Nothing the turn knows of will wake the body: a timer asks the core again
                    // at `at` (armed once per deadline; spurious wake-ups keep it).
                    if this.idle.as_ref().is_none_or(|(armed, _)| *armed != at) {
                        this.idle = Some((at, this.t.env.sleep_until(at)));
                    }
                    let (_, timer) = this.idle.as_mut().expect("armed above");
                    if timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // Due: poll the body once more and ask again.
                    this.idle = None;
                }
                Pending::Next(Next::End(end)) => {
                    this.hold_wait = None;
                    return Poll::Ready(end);
                }
                // Replacing the body drops it (its calls tell the turn they are gone, so the
                // turn lock must not be held here), then the undos run.
                Pending::Next(Next::Compensate) => {
                    this.idle = None;
                    this.hold_wait = None;
                    this.polling = Polling::Undos(Box::pin(compensate(this.t.clone())));
                }
            }
        }
    }
}
