//! The controller of [`super`]: the adaptive bound on calls in flight and the queue in front
//! of it, with time passed in as a value (ns), so that it runs the same under the simulated
//! clock of the tests as under the real one ([`super::Shedder`]). The module doc of
//! [`super`] explains the mechanisms and why.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

/// How long the queue must stay non-empty to count as standing (CoDel's interval).
pub const INTERVAL: Duration = Duration::from_millis(100);

/// The bound never goes below this many calls in flight (TCP's smallest window after a
/// loss, RFC 5681: two segments): a store that completes a few calls per round trip (Redis
/// nearly down) still gets calls, so it is noticed when it recovers. Not higher: the floor
/// must stay under what the slowest store answers within a deadline (a Redis at 1,000
/// commands a second answers 10 in the default 10 ms). A floor above that (Netflix's
/// `AIMDLimit` default, 20) keeps every call past the deadline, and each call that times out
/// leaves its command queued in Redis while its place goes to the next: the queue in Redis
/// grows for as long as the load lasts, and no call is answered in time. A host too busy to
/// answer in time is not this floor's to fix: its delay is taken out of the latency
/// ([`super::host`]).
pub const MIN_LIMIT: u64 = 2;

/// The bound never goes above this: far beyond what one Redis completes within a deadline.
pub const MAX_LIMIT: u64 = 100_000;

/// The bound a store starts with, before any signal: enough for a busy replica's first
/// round trips; slow start raises it within a few round trips where more is needed.
pub const INITIAL_LIMIT: u64 = 64;

/// At most this many calls wait (the default `--max-in-flight`, which bounds them anyway):
/// a call is shed by its own deadline, not by the room in the queue.
pub const MAX_QUEUE: u64 = 10_000;

/// The latency compared with the target is a moving average over about this many answers:
/// the trend of the calls, not one call's tail (a host's scheduling hiccup, a slow packet),
/// which would cut the bound every round trip.
pub const SMOOTHING: u64 = 16;

/// The long-term latency (the baseline a rise is measured against) is a moving average over
/// about this many answers: Gradient2's long window.
pub const BASELINE_SMOOTHING: u64 = 512;

/// A rise of the short-term latency past this many times the long-term one (in tenths) is
/// congestion: Gradient2's RTT tolerance of 1.5.
const TOLERANCE_TENTHS: u64 = 15;

/// The bound grows at most this many times faster while the host's delay stretches the
/// calls' round trip (see `Controller::grow`).
pub const MAX_STRETCH: u64 = 32;

/// Fixed point of the bound: 2^20 is one call, so it can grow by a fraction per completion.
const ONE: u64 = 1 << 20;

/// How a call that held a place ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The store answered (whatever it answered).
    Answered,
    /// The store failed or timed out: a congestion signal whatever the latency.
    Failed,
    /// The caller went away first: a congestion signal only if it had waited past the target.
    Cancelled,
}

/// Something waiting for a place: told when it has one.
pub trait Waiter {
    /// Hands the waiter a place; false if it is gone (the place goes to the next waiter).
    fn wake(self) -> bool;
}

impl Waiter for oneshot::Sender<()> {
    fn wake(self) -> bool {
        self.send(()).is_ok()
    }
}

/// What [`Controller::enter`] decided for a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// The call holds a place: send it.
    Admitted,
    /// The call waits for a place, for at most this many ns; it is woken when it has one.
    Queued {
        /// The longest the call may wait.
        wait_ns: u64,
    },
    /// The queue is full: answer the call by the failure policy now.
    Shed,
}

/// A call waiting for a place.
#[derive(Debug)]
struct Waiting<W> {
    /// What is woken when the call has its place.
    waiter: W,
    /// After this (ns) the call cannot be answered in time: its own timer sheds it, and the
    /// queue forgets it.
    send_by_ns: u64,
}

/// The queue of calls waiting for a place.
#[derive(Debug)]
struct Queue<W> {
    /// Oldest first.
    waiters: VecDeque<Waiting<W>>,
    /// When the queue last went from empty to not empty (ns).
    busy_since_ns: u64,
}

impl<W> Queue<W> {
    /// A standing queue: not empty for the whole last [`INTERVAL`].
    fn standing(&self, now_ns: u64) -> bool {
        !self.waiters.is_empty() && now_ns.saturating_sub(self.busy_since_ns) > nanos(INTERVAL)
    }
}

/// The adaptive bound and the queue, with time passed in (see the module doc).
#[derive(Debug)]
pub struct Controller<W> {
    /// The Redis command deadline: also the whole time a call without a deadline of its own
    /// may take, waiting included.
    deadline_ns: u64,
    /// The short-term latency is congestion past this only if it also rose past the
    /// long-term one: half the deadline.
    target_ns: u64,
    /// The short-term latency is congestion past this whatever the long-term one: nine
    /// tenths of the deadline, so a slow drift cannot take the calls to the deadline.
    ceiling_ns: u64,
    /// Calls holding a place.
    in_flight: AtomicU64,
    /// The bound, in units of [`ONE`].
    limit: AtomicU64,
    /// True until the first congestion signal: the bound doubles per round trip meanwhile.
    slow_start: AtomicBool,
    /// Short-term moving average of the answers' latency (ns; 0 before the first).
    latency_ns: AtomicU64,
    /// Long-term moving average of the answers' latency (ns; 0 before the first).
    baseline_ns: AtomicU64,
    /// When the bound was last cut (ns); only a call sent after it may cut again.
    last_cut_ns: AtomicU64,
    /// How many calls wait (the queue's length, readable without its lock).
    waiting: AtomicU64,
    /// The calls waiting for a place.
    queue: Mutex<Queue<W>>,
}

impl<W: Waiter> Controller<W> {
    /// A controller for calls that have `deadline` to complete.
    pub fn new(deadline: Duration) -> Controller<W> {
        let deadline_ns = nanos(deadline).max(10);
        Controller {
            deadline_ns,
            target_ns: deadline_ns / 2,
            ceiling_ns: deadline_ns / 10 * 9,
            in_flight: AtomicU64::new(0),
            limit: AtomicU64::new(INITIAL_LIMIT * ONE),
            slow_start: AtomicBool::new(true),
            latency_ns: AtomicU64::new(0),
            baseline_ns: AtomicU64::new(0),
            last_cut_ns: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            queue: Mutex::new(Queue {
                waiters: VecDeque::new(),
                busy_since_ns: 0,
            }),
        }
    }

    /// The bound of calls in flight now.
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed) / ONE
    }

    /// Calls holding a place now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Calls waiting for a place now.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// A call arrives at `now_ns`, to be answered by `deadline_ns` (its client's deadline;
    /// `None`: none, and it may wait the Redis deadline): admitted, queued (then `waiter()`
    /// is what will be woken), or shed.
    ///
    /// `host_ns` is the host's scheduling delay on the calling thread now
    /// ([`super::host`]): a call sent now takes it on top of the store's latency.
    pub fn enter(
        &self,
        now_ns: u64,
        deadline_ns: Option<u64>,
        host_ns: u64,
        waiter: impl FnOnce() -> W,
    ) -> Entry {
        // A client that set no deadline waits for nobody's: it may wait the Redis deadline
        // for a place, whatever the latency (shed earlier, it would only send again).
        let send_by_ns = match deadline_ns {
            Some(deadline_ns) => {
                // It may wait as long as a call sent then is still answered in time, by the
                // answers' recent latency (the store's, and the host's delay now) and a
                // quarter more (the average lags a rising one).
                let latency_ns = self
                    .latency_ns
                    .load(Ordering::Relaxed)
                    .saturating_add(host_ns);
                deadline_ns.saturating_sub(latency_ns.saturating_add(latency_ns / 4))
            }
            None => now_ns.saturating_add(self.deadline_ns),
        };
        let deadline_ns = deadline_ns.unwrap_or(send_by_ns);
        if deadline_ns <= now_ns {
            // Its client gave up already: Redis would work for nobody.
            return Entry::Shed;
        }
        // Fast path: nobody waits (a newcomer does not pass a waiter) and a place is free.
        if self.waiting.load(Ordering::SeqCst) == 0 {
            let before = self.in_flight.fetch_add(1, Ordering::SeqCst);
            if before < self.limit() {
                return Entry::Admitted;
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        if send_by_ns <= now_ns {
            return Entry::Shed;
        }
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        self.prune(&mut queue, now_ns);
        if queue.waiters.len() as u64 >= MAX_QUEUE {
            if !queue.standing(now_ns) {
                return Entry::Shed;
            }
            // Last in, first out: the oldest waiter is the one to give up (its wait ends
            // now), not the newcomer, whose client is the likeliest to still be waiting.
            queue.waiters.pop_front();
        }
        if queue.waiters.is_empty() {
            queue.busy_since_ns = now_ns;
        }
        queue.waiters.push_back(Waiting {
            waiter: waiter(),
            send_by_ns,
        });
        self.waiting
            .store(queue.waiters.len() as u64, Ordering::SeqCst);
        // A place may have been freed since the fast path looked.
        self.drain(&mut queue, now_ns);
        Entry::Queued {
            wait_ns: send_by_ns - now_ns,
        }
    }

    /// A call that held a place since `sent_ns` ended at `now_ns`: adjust the bound, and give
    /// its place to a waiter, if any. `host_ns` is the host's scheduling delay on the calling
    /// thread ([`super::host`]): the part of the latency that is the host's, not the store's.
    pub fn end(&self, now_ns: u64, sent_ns: u64, end: End, host_ns: u64) {
        let waited = now_ns.saturating_sub(sent_ns);
        // The store's part of the latency: what the bound can change. A host too busy to
        // poll the answer at once adds a delay that fewer calls in flight do not remove (a
        // shed answer costs the host about what an answer from Redis does).
        let latency = waited.saturating_sub(host_ns);
        // How many times the store's round trip the host stretched this one to: the bound
        // grows by one per round trip *of the store* (see `grow`).
        let stretch = (waited / latency.max(1)).clamp(1, MAX_STRETCH);
        // The latency a cut is sized by: the average's, or for a failure none (a 10% cut).
        let (congested, latency, threshold) = match end {
            End::Answered => {
                let (average, baseline) = self.smoothed(latency);
                // Congestion is the short-term latency past the ceiling, or past the target
                // having risen past the long-term latency (Gradient2's tolerance): a delay
                // every call has had for a while, whatever the bound (the host's CPU,
                // a distant Redis), is not one that cutting the bound removes.
                let risen = baseline.saturating_mul(TOLERANCE_TENTHS) / 10;
                let threshold = self.target_ns.max(risen).min(self.ceiling_ns);
                // At the ceiling, one call more in flight must still fit under it: against a
                // slow store (a millisecond a call) one more call adds a tenth of the
                // deadline, and a bound that grows into it sends calls past the deadline.
                let one_more = average.saturating_add(average / self.limit().max(1));
                (
                    average > threshold || one_more > self.ceiling_ns,
                    average,
                    threshold,
                )
            }
            // A call that ran out of its time only because the host delayed it (without the
            // host's delay it took under the target) says nothing about the store: neither
            // a cut nor a sample. A failure that came sooner (a refused connection) is one.
            End::Failed
                if host_ns > 0 && waited >= self.ceiling_ns && latency <= self.target_ns =>
            {
                self.release(now_ns);
                return;
            }
            // A call that timed out took the deadline at least: the bound is cut as for an
            // answer that slow (to half), as TCP halves its window on a loss. A tenth per round
            // trip would keep the calls timing out for many round trips, each of them leaving
            // its command in Redis to be run for nobody.
            End::Failed if waited >= self.ceiling_ns => (true, latency, self.target_ns),
            End::Failed => (true, 0, 0),
            End::Cancelled if latency > self.target_ns => (true, 0, 0),
            // Gone before the target: says nothing about the store.
            End::Cancelled => {
                self.release(now_ns);
                return;
            }
        };
        if congested {
            self.cut(now_ns, sent_ns, latency, threshold);
        } else {
            self.grow(latency, stretch);
        }
        self.release(now_ns);
    }

    /// Gives a place back without a sample (a place granted to a waiter that was gone).
    pub fn release(&self, now_ns: u64) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            self.drain(&mut queue, now_ns);
        }
    }

    /// Adds an answer's latency to the short-term (over about [`SMOOTHING`] answers) and the
    /// long-term (about [`BASELINE_SMOOTHING`]) moving averages, and returns both. The
    /// long-term one falls at the short-term's pace once it is twice the short-term one
    /// (Gradient2: the load fell, forget the old latency). Racing completions may lose an
    /// update: an average does not mind.
    fn smoothed(&self, latency: u64) -> (u64, u64) {
        let average = moving(&self.latency_ns, latency, SMOOTHING);
        let baseline = self.baseline_ns.load(Ordering::Relaxed);
        let over = if baseline > average.saturating_mul(2) {
            SMOOTHING
        } else {
            BASELINE_SMOOTHING
        };
        (average, moving(&self.baseline_ns, latency, over))
    }

    /// Multiplicative decrease, once per round trip: only a call sent after the last cut
    /// saw the current bound, so only it may cut it again. The cut is 10%, or down to
    /// `threshold / latency` of the bound when the calls took longer (at most halving it),
    /// so an overshoot is undone in one round trip.
    fn cut(&self, now_ns: u64, sent_ns: u64, latency: u64, threshold: u64) {
        let last = self.last_cut_ns.load(Ordering::Relaxed);
        if sent_ns < last
            || self
                .last_cut_ns
                .compare_exchange(last, now_ns.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        self.slow_start.store(false, Ordering::Relaxed);
        // In 1/1024ths: between a half and nine tenths.
        let kept = if latency == 0 {
            921
        } else {
            (u128::from(threshold) * 1024 / u128::from(latency)).clamp(512, 921)
        };
        let _ = self
            .limit
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |limit| {
                let cut = u128::from(limit) * kept / 1024;
                Some(u64::try_from(cut).unwrap_or(limit).max(MIN_LIMIT * ONE))
            });
    }

    /// Additive increase (one per bound's worth of completions), only while the bound is in
    /// use: a bound nobody reaches says nothing. Until the first cut, and while calls take
    /// under half the target, one per completion instead (slow start: doubling per round
    /// trip, and stopping well before the target so it does not overshoot it).
    ///
    /// `stretch` times that while the host's delay stretches each call to `stretch` times the
    /// store's round trip: the calls waiting on the host are not in Redis, so the bound
    /// still grows by one per round trip of the store's, not of the host's (which would take
    /// seconds to reach the calls a busy host holds in flight).
    fn grow(&self, latency: u64, stretch: u64) {
        let limit = self.limit.load(Ordering::Relaxed);
        if self.in_flight.load(Ordering::Relaxed) * 2 * ONE < limit {
            return;
        }
        let step = if self.slow_start.load(Ordering::Relaxed) && latency <= self.target_ns / 2 {
            ONE
        } else {
            (ONE * ONE / limit.max(1)).max(1) * stretch
        };
        let _ = self
            .limit
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |limit| {
                Some((limit + step).min(MAX_LIMIT * ONE))
            });
    }

    /// Forgets the oldest waiters whose time ran out (their own timers shed them; this frees
    /// their room in the queue).
    fn prune(&self, queue: &mut Queue<W>, now_ns: u64) {
        while queue
            .waiters
            .front()
            .is_some_and(|waiting| waiting.send_by_ns <= now_ns)
        {
            queue.waiters.pop_front();
        }
        self.waiting
            .store(queue.waiters.len() as u64, Ordering::SeqCst);
    }

    /// Hands free places to waiters: the oldest first normally, the newest first while the
    /// queue stands.
    fn drain(&self, queue: &mut Queue<W>, now_ns: u64) {
        self.prune(queue, now_ns);
        while !queue.waiters.is_empty() {
            let before = self.in_flight.fetch_add(1, Ordering::SeqCst);
            if before >= self.limit() {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            let next = if queue.standing(now_ns) {
                queue.waiters.pop_back()
            } else {
                queue.waiters.pop_front()
            };
            let woken =
                next.is_some_and(|waiting| waiting.send_by_ns > now_ns && waiting.waiter.wake());
            if !woken {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.waiting
            .store(queue.waiters.len() as u64, Ordering::SeqCst);
    }
}

/// Moves the moving average in `cell` a `1 / over` of the way to `sample` and returns it (the
/// sample itself when the average is still 0).
fn moving(cell: &AtomicU64, sample: u64, over: u64) -> u64 {
    let average = cell.load(Ordering::Relaxed);
    let next = if average == 0 {
        sample
    } else if sample >= average {
        average + (sample - average) / over
    } else {
        average - (average - sample) / over
    };
    cell.store(next, Ordering::Relaxed);
    next
}

pub(super) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
