//! The bound on calls to Redis (`--redis-shedding`): an adaptive bound on the calls to Redis
//! in flight, and a queue in front of it, so that past Redis's capacity the calls Redis can
//! answer in time are answered, and a call that cannot be is shed: answered by the failure
//! policy without touching Redis.
//!
//! Envoy's fleet is an open loop: requests keep arriving whether or not floodgate answers the
//! earlier ones. Past what Redis can run, calls queue in front of Redis, every call waits
//! longer, and soon every call runs out of the command deadline (`--redis-timeout-ms`) after
//! Redis did its work for nothing. Two mechanisms, each with a long record in production:
//!
//! **The bound: an AIMD concurrency limit** (additive increase, multiplicative decrease), the
//! congestion control of TCP Reno (RFC 5681) as Netflix's `concurrency-limits` library applies
//! it to RPC servers (`AIMDLimit`: a call slower than a timeout counts as a drop), with the
//! congestion signal of its `Gradient2Limit`. While calls are not congested and the bound is
//! in use, the bound grows by one per bound's worth of completions (about one per round trip;
//! doubling per round trip until the first congestion signal while calls take under a quarter
//! of the deadline, as TCP's slow start). The answers' latency is followed by two moving
//! averages: a short-term one over the last [`SMOOTHING`] answers (the trend, not one call's
//! tail) and a long-term one over about [`BASELINE_SMOOTHING`] (Gradient2's long window; it
//! falls at the short-term pace once it is twice the short-term one, when the load fell).
//! Congestion is the short-term latency past the *target* (half the deadline) **and** risen
//! past 1.5 times the long-term one (Gradient2's tolerance), or past the *ceiling* (nine
//! tenths of the deadline) whatever the long-term one. On congestion the bound is multiplied
//! by `threshold / latency` (0.9 at most, 0.5 at least, so an overshoot is undone in one round
//! trip); a call that timed out halves it (it took the deadline at least: TCP halves its
//! window on a loss), one that failed sooner (a refused connection) multiplies it by 0.9. At
//! the ceiling the bound grows only while one more call in flight keeps the latency under it:
//! against a slow store each call adds a sizeable share of the deadline. At most once per
//! round trip: only a call sent after the last cut can cut again (TCP's fast recovery), so a
//! queue of slow calls already sent counts as one signal. The bound never goes under
//! [`MIN_LIMIT`] (2), so a Redis that nearly stopped still gets calls and its recovery is seen,
//! while a slow Redis (1,000 commands a second: 10 within the default deadline) is not sent
//! more calls than it answers in time: a call that timed out leaves its command queued in
//! Redis, and a floor above what Redis answers in time grows that queue for as long as the
//! load lasts.
//!
//! Why the rise and not the latency alone: a delay every call has had for a while, whatever
//! the bound — the host's CPU shared by the server, Redis and the load beyond what the probe
//! below sees (Redis's own wait for a core, the load generator's), or a distant Redis — is
//! not one that fewer calls in flight remove. An AIMD bound cut whenever latency passes a
//! fixed target reads it as congestion and cuts every round trip, to its floor, where it stays while the load lasts
//! (the bound then runs `floor / latency` calls a second, a fraction of what Redis can); the
//! long-term latency absorbs such a delay within about a long window, and the bound stays
//! where it was. A queue the bound itself builds in Redis is a rise, and is cut. A latency
//! that creeps up too slowly to be a rise is stopped at the ceiling, a tenth of the deadline
//! short of it. Only a host that alone takes a call past the ceiling keeps the bound at its
//! floor: no bound makes such calls answer in time.
//!
//! **The host's own delay is taken out first.** Once the host's CPU saturates (the server's
//! threads busy answering), a Redis reply waits in its runtime thread's run queue before its
//! call sees it, and that wait grows with the load, not with the calls sent to Redis: fewer
//! calls in flight do not shorten it, and a shed answer costs the host about what an OK one
//! does, so shedding frees nothing. A probe on each runtime thread ([`host`]: a timer's
//! lateness and one round of the run queue, smoothed) measures that wait; a completion on
//! that thread compares its latency *less the host's delay* (twice the probe's: a reply waits
//! for the connection's task, then the call's) with the target, the ceiling and
//! the long-term latency, and a call that timed out only because of that delay (under the
//! target without it) is neither a cut nor a failure. While the host stretches each call
//! to several times the store's round trip, the bound grows that many times faster (one per
//! round trip of the store's, up to [`MAX_STRETCH`] times), so it reaches the calls a busy
//! host holds in flight within a fraction of a second. A call's wait for a place counts the
//! host's delay as part of the latency it will have.
//!
//! Why not a bound computed by Little's law from the last interval (`answers × target /
//! interval`): it is only steady when calls take exactly the target; when they take longer
//! for a reason the bound does not control, every interval's bound is `bound × target /
//! latency`, smaller than the last, down to its floor. Any bound above Redis's
//! bandwidth-delay product (capacity × round trip, a few calls) keeps Redis busy, so goodput
//! stays at capacity while the sawtooth swings between 90% and 100%.
//!
//! **The queue: adaptive LIFO with CoDel's signal** ("Fail at scale", Ben Maurer, ACM Queue
//! 2015, as Facebook's RPC servers run it; CoDel from Nichols and Jacobson, ACM Queue 2012),
//! with each call's own deadline deciding how long it waits. A call beyond the bound waits
//! for a place:
//! - with its client's deadline (`grpc-timeout`, which Envoy always sends: its rate-limit
//!   filter's `timeout`, 20 ms by default; set around the call by [`within_deadline`]), for
//!   as long as a call sent then is still answered by it: its deadline less the recent
//!   (short-term) latency and a quarter more. A call whose deadline has passed, or that could
//!   not be answered by it even if sent now, is shed at once, without touching Redis: its
//!   client is gone or about to be, and an answer now lets Envoy apply its failure mode now.
//! - without one (grpcurl, a client of `/json`, a benchmark), for at most the Redis deadline
//!   (`--redis-timeout-ms`), whatever the latency: nobody gives up on it, and shed early it
//!   would only be sent again. Its answer comes within twice the Redis deadline (20 ms by
//!   default, Envoy's own default timeout).
//! - normally first in, first out; once the queue has not been empty for [`INTERVAL`] (a
//!   standing queue, CoDel's signal), last in, first out: the newest calls have the most
//!   time left, and an old call runs out of its time while newer ones are served. A client
//!   that retries at once gets served rather than queued behind its own earlier attempts.
//! - at most [`MAX_QUEUE`] calls wait (every gRPC call also holds a `--max-in-flight` place,
//!   which bounds them first); one more is shed at once — while the queue stands, the oldest
//!   waiter is shed instead and the newcomer waits.
//!
//! Why wait until the deadline rather than shed early: a shed answer costs the host nearly
//! as much CPU as an answer from Redis (the request's decoding, the policy's answer, the
//! gRPC response), and in a closed loop — clients that send the next request when the last
//! is answered, Envoy's downstream clients among them — a request shed early comes back at
//! once. Shedding a call before its client gives up frees no CPU: it spends it on answering
//! the same client again. A waiting call costs a queue entry and a timer.
//!
//! A call that is shed gets `--on-store-error`'s answer at once (see [`super::resilient`]).
//!
//! Cost on the request path while under the bound: one increment and one decrement of the
//! calls in flight, a load of the waiting count, one thread-local update that keeps the
//! host's probe awake ([`host::call_started`]), two thread-local reads of the host's delay,
//! two moving averages and one compare-and-swap of the bound per completion while it grows.
//! The queue's mutex is only taken while calls wait.
//!
//! Time is passed in as a value (ns since the shedder's start), so [`Controller`] runs the
//! same under a simulated clock (`simulation`, the tests below) as under the real one.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

mod controller;
pub mod host;
#[cfg(test)]
mod simulation;

use controller::nanos;
pub use controller::{
    BASELINE_SMOOTHING, Controller, End, Entry, INITIAL_LIMIT, INTERVAL, MAX_LIMIT, MAX_QUEUE,
    MAX_STRETCH, MIN_LIMIT, SMOOTHING, Waiter,
};
tokio::task_local! {
    /// The deadline of the call being answered, when its client sent one (gRPC's
    /// `grpc-timeout`): set by [`within_deadline`] around the call.
    static CALL_DEADLINE: Option<Instant>;
}

/// Runs `call` (one request's answer) with `deadline` as its client's deadline: the store
/// calls it makes may wait for a place until shortly before it, and are shed at once past
/// it. `None`: the client set none (they may wait up to the Redis deadline for a place).
///
/// Not an `async fn`: one would hold `call` twice (as its argument, then inside the scope it
/// awaits), doubling the state every request keeps while it waits for the store.
pub fn within_deadline<F: Future>(
    deadline: Option<Instant>,
    call: F,
) -> impl Future<Output = F::Output> {
    CALL_DEADLINE.scope(deadline, call)
}

/// The controller of one store, on the real clock.
#[derive(Debug)]
pub struct Shedder {
    /// Where the nanosecond clock starts.
    epoch: Instant,
    /// The bound and the queue.
    controller: Controller<oneshot::Sender<()>>,
}

/// A call to Redis holding a place until it is dropped or [`RedisCall::end`]ed: a drop without `end`
/// is a cancelled call (the request went away while the store worked).
#[derive(Debug)]
#[must_use = "dropping the call ends it at once"]
pub struct RedisCall<'a> {
    shedder: &'a Shedder,
    sent_ns: u64,
    end: End,
}

impl RedisCall<'_> {
    /// Ends the call: `failed` when the store failed or timed out.
    pub fn end(mut self, failed: bool) {
        self.end = if failed { End::Failed } else { End::Answered };
    }
}

impl Drop for RedisCall<'_> {
    fn drop(&mut self) {
        let shedder = self.shedder;
        shedder
            .controller
            .end(shedder.now_ns(), self.sent_ns, self.end, host::current());
    }
}

/// A queued call's ticket: a place granted to it and not taken (its wait ran out as the place
/// came, or the request went away) goes back to the controller.
struct Ticket<'a> {
    shedder: &'a Shedder,
    granted: oneshot::Receiver<()>,
    /// The place was taken by the call: nothing to give back.
    taken: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        self.granted.close();
        if self.granted.try_recv().is_ok() {
            self.shedder.controller.release(self.shedder.now_ns());
        }
    }
}

impl Shedder {
    /// A shedder for a store whose calls have `deadline` to complete.
    pub fn new(deadline: Duration) -> Shedder {
        Shedder {
            epoch: Instant::now(),
            controller: Controller::new(deadline),
        }
    }

    fn now_ns(&self) -> u64 {
        nanos(self.epoch.elapsed())
    }

    /// A place for a call — at once, or after a short wait in the queue — or `None` to shed
    /// the call: the queue is full, or its wait ran out.
    pub async fn admit(&self) -> Option<RedisCall<'_>> {
        host::call_started();
        let deadline_ns = CALL_DEADLINE
            .try_with(|deadline| *deadline)
            .ok()
            .flatten()
            .map(|deadline| nanos(deadline.saturating_duration_since(self.epoch)));
        let mut ticket = None;
        let entry = self
            .controller
            .enter(self.now_ns(), deadline_ns, host::current(), || {
                let (tx, rx) = oneshot::channel();
                ticket = Some(rx);
                tx
            });
        match entry {
            Entry::Admitted => {}
            Entry::Shed => return None,
            Entry::Queued { wait_ns } => {
                let mut ticket = Ticket {
                    shedder: self,
                    granted: ticket?,
                    taken: false,
                };
                let wait = Duration::from_nanos(wait_ns);
                match tokio::time::timeout(wait, &mut ticket.granted).await {
                    Ok(Ok(())) => {
                        // The place is ours now: the ticket must not give it back.
                        ticket.taken = true;
                    }
                    // The wait ran out, or the queue dropped us (older than a standing
                    // queue lets wait); a place granted meanwhile goes back with the ticket.
                    Ok(Err(_)) | Err(_) => return None,
                }
            }
        }
        Some(RedisCall {
            shedder: self,
            sent_ns: self.now_ns(),
            end: End::Cancelled,
        })
    }

    /// The bound of calls in flight now.
    pub fn limit(&self) -> u64 {
        self.controller.limit()
    }

    /// Calls waiting for a place now.
    pub fn waiting(&self) -> u64 {
        self.controller.waiting()
    }
}
