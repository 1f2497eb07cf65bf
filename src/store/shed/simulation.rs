//! The controller against a simulated store, on a virtual clock: an open loop of calls from
//! half the store's capacity to ten times it and back, event by event, no real time.
//!
//! The store is one Redis: a FIFO server of `capacity` calls per second (each takes
//! `1 / capacity` of its time), half a network round trip away, so a call's latency grows
//! with the calls queued in front of it. A call whose answer would come after the deadline
//! fails at the deadline (the store still does its work, as Redis does). Each call carries
//! the Redis deadline as its client's (as Envoy's would, with its timeout at that value).

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::rc::Rc;
use std::time::Duration;

use super::{Controller, End, Entry, Waiter};

const MS: u64 = 1_000_000;
const SECOND: u64 = 1_000_000_000;

/// The store's capacity, calls per second.
const CAPACITY: u64 = 10_000;
/// The store's round trip with no queue.
const ROUND_TRIP: u64 = MS;
/// The calls' deadline (`--redis-timeout-ms`).
const DEADLINE: u64 = 10 * MS;

/// A simulated waiter: woken means recorded in `granted`, unless its wait already ran out.
struct SimWaiter {
    id: u64,
    world: Rc<RefCell<Waiters>>,
}

/// The waiters' side of the queue.
#[derive(Default)]
struct Waiters {
    /// Woken by the last event, to be sent.
    granted: Vec<u64>,
    /// No longer waiting: woken, or their wait ran out.
    gone: HashSet<u64>,
}

impl Waiter for SimWaiter {
    fn wake(self) -> bool {
        let mut world = self.world.borrow_mut();
        if world.gone.contains(&self.id) {
            return false;
        }
        world.granted.push(self.id);
        true
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// The next call of the open loop arrives.
    Arrive,
    /// Call `id`, sent at `sent`, is answered (`late`: fails at the deadline instead).
    Done { id: u64, sent: u64, late: bool },
    /// Call `id`'s wait for a place runs out.
    WaitEnds { id: u64 },
}

/// What happened during one step of the schedule.
#[derive(Debug, Default)]
struct Step {
    /// Offered load, in units of capacity.
    load: f64,
    /// Answers within the deadline, by the time they came.
    ok: u64,
    /// Calls that failed at the deadline, by the time they failed.
    late: u64,
    /// Calls that arrived in this step and were shed (queue full or wait ran out).
    shed: u64,
    /// Of those, the ones that arrived more than a deadline into the step, when what the
    /// previous step left queued is gone.
    shed_late_in_step: u64,
    /// Latency from arrival of the calls answered or failed in this step (ns).
    latencies: Vec<u64>,
}

impl Step {
    /// The 99th percentile of `latencies` (sorted by [`simulate`]).
    fn p99(&self) -> u64 {
        let index = self.latencies.len() * 99 / 100;
        self.latencies.get(index).copied().unwrap_or(0)
    }
}

/// Counts a call that arrived at `arrived` as shed.
fn shed(steps: &mut [Step], arrived: u64) {
    let step = &mut steps[usize::try_from(arrived / SECOND).unwrap_or(usize::MAX)];
    step.shed += 1;
    if arrived % SECOND > DEADLINE {
        step.shed_late_in_step += 1;
    }
}

/// Runs `schedule` (offered load in units of capacity, one second each) against the store,
/// every answer reaching the controller `host_delay` ns late (a busy host's CPU: a delay no
/// bound on the calls removes).
fn simulate(schedule: &[f64], host_delay: u64) -> Vec<Step> {
    let controller = Controller::<SimWaiter>::new(Duration::from_nanos(DEADLINE));
    let world = Rc::new(RefCell::new(Waiters::default()));
    let mut steps: Vec<Step> = schedule
        .iter()
        .map(|&load| Step {
            load,
            ..Step::default()
        })
        .collect();
    let step_of = |t: u64| usize::try_from(t / SECOND).unwrap_or(usize::MAX);
    let end = SECOND * schedule.len() as u64;
    let mut events = BinaryHeap::new();
    events.push(Reverse((0u64, Event::Arrive)));
    let mut arrived_at = Vec::<u64>::new();
    let mut store_free = 0u64;
    // Deterministic exponential gaps (a Poisson open loop), from a fixed xorshift seed.
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut uniform = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut send = |id: u64, now: u64, events: &mut BinaryHeap<_>| {
        let start = store_free.max(now + ROUND_TRIP / 2);
        store_free = start + SECOND / CAPACITY;
        let answer = store_free + ROUND_TRIP / 2 + host_delay;
        let late = answer - now > DEADLINE;
        let at = if late { now + DEADLINE } else { answer };
        events.push(Reverse((
            at,
            Event::Done {
                id,
                sent: now,
                late,
            },
        )));
    };
    while let Some(Reverse((now, event))) = events.pop() {
        match event {
            Event::Arrive => {
                let Some(step) = steps.get(step_of(now)) else {
                    continue;
                };
                let gap = -(1.0 - uniform()).ln() / (step.load * CAPACITY as f64);
                let next = now + (gap * SECOND as f64) as u64;
                if next < end {
                    events.push(Reverse((next, Event::Arrive)));
                }
                let id = arrived_at.len() as u64;
                arrived_at.push(now);
                let waiter = || SimWaiter {
                    id,
                    world: world.clone(),
                };
                match controller.enter(now, Some(now + DEADLINE), waiter) {
                    Entry::Admitted => send(id, now, &mut events),
                    Entry::Queued { wait_ns } => {
                        events.push(Reverse((now + wait_ns, Event::WaitEnds { id })));
                    }
                    Entry::Shed => shed(&mut steps, now),
                }
            }
            Event::Done { id, sent, late } => {
                let step = &mut steps[step_of(now).min(schedule.len() - 1)];
                if late {
                    step.late += 1;
                } else {
                    step.ok += 1;
                }
                step.latencies.push(now - arrived_at[id as usize]);
                let end = if late { End::Failed } else { End::Answered };
                controller.end(now, sent, end);
            }
            Event::WaitEnds { id } => {
                // Not woken meanwhile: shed.
                if world.borrow_mut().gone.insert(id) {
                    shed(&mut steps, arrived_at[id as usize]);
                }
            }
        }
        // Calls woken by this event take their place now.
        let granted = std::mem::take(&mut world.borrow_mut().granted);
        for id in granted {
            world.borrow_mut().gone.insert(id);
            send(id, now, &mut events);
        }
    }
    for step in &mut steps {
        step.latencies.sort_unstable();
    }
    steps
}

/// Asserts the goals of an overload schedule: goodput at least 90% of capacity at every step
/// past capacity, admitted answers' p99 within the deadline, and nothing shed of the load
/// that arrives in the second after it falls back under capacity — from a deadline after the
/// fall on: a call arriving before meets the queue the overload left in Redis (up to a
/// deadline's worth, by construction), which no controller can empty faster than Redis does.
fn assert_goodput_holds(steps: &[Step]) {
    let report: Vec<String> = steps
        .iter()
        .map(|s| {
            format!(
                "{}C: ok {} late {} shed {} p99 {} µs",
                s.load,
                s.ok,
                s.late,
                s.shed,
                s.p99() / 1_000
            )
        })
        .collect();
    let report = report.join("\n");
    // Shown with --nocapture: the figures of the run.
    eprintln!("{report}");
    for step in steps {
        if step.load > 1.0 {
            assert!(
                step.ok * 10 >= CAPACITY * 9,
                "goodput under 90% of capacity at {}C:\n{report}",
                step.load
            );
        }
        assert!(
            step.p99() <= DEADLINE,
            "p99 past the deadline at {}C:\n{report}",
            step.load
        );
    }
    let last = steps.last().expect("a schedule");
    assert!(last.load < 1.0);
    assert_eq!(
        last.shed_late_in_step, 0,
        "shed after the load fell back:\n{report}"
    );
}

/// The schedule of the issue: half the capacity, then 1.5, 3 and 10 times it, then half again.
const SCHEDULE: [f64; 5] = [0.5, 1.5, 3.0, 10.0, 0.5];

/// From half the store's capacity to ten times it, the calls answered in time stay at 90% of
/// capacity or more, with p99 within the deadline; back under capacity, nothing is shed.
#[test]
fn goodput_holds_at_capacity_from_half_to_ten_times_it() {
    let steps = simulate(&SCHEDULE, 0);
    assert_goodput_holds(&steps);
}

/// The same schedule on a busy host, where every answer comes 7 ms late whatever the calls
/// in flight (past the target of half the deadline, as when the server, Redis and the load
/// share two cores): the bound does not spiral to its floor, goodput holds at capacity, and
/// nothing is shed once the load falls.
#[test]
fn goodput_holds_when_the_host_delays_every_answer() {
    let steps = simulate(&SCHEDULE, 7 * MS);
    assert_goodput_holds(&steps);
}

/// A store that stops answering (every call fails at the deadline) drives the bound to its
/// floor, not below, and the bound grows back once the store answers again.
#[test]
fn the_bound_falls_to_its_floor_and_grows_back() {
    let controller = Controller::<SimWaiter>::new(Duration::from_nanos(DEADLINE));
    let mut now = 0;
    for _ in 0..1_000 {
        assert_eq!(
            controller.enter(now, None, unreachable_waiter),
            Entry::Admitted
        );
        now += DEADLINE;
        controller.end(now, now - DEADLINE, End::Failed);
    }
    assert_eq!(controller.limit(), super::MIN_LIMIT);
    // Answers in a round trip again, with the bound in use: it grows.
    for _ in 0..10_000 {
        let held: Vec<Entry> = (0..controller.limit())
            .map(|_| controller.enter(now, None, unreachable_waiter))
            .collect();
        assert!(held.iter().all(|e| *e == Entry::Admitted));
        now += ROUND_TRIP;
        for _ in &held {
            controller.end(now, now - ROUND_TRIP, End::Answered);
        }
    }
    assert!(
        controller.limit() > 100,
        "grew back: {}",
        controller.limit()
    );
}

/// A waiter never created: the calls of this test are all admitted.
fn unreachable_waiter() -> SimWaiter {
    SimWaiter {
        id: u64::MAX,
        world: Rc::default(),
    }
}

/// A call waits for a place as long as it can still be answered by its deadline: past it,
/// it is shed at once; a client's deadline of 20 ms lets it wait longer than one without a
/// deadline (the Redis deadline stands in), and the answers' latency is kept free of it.
#[test]
fn a_call_waits_by_its_deadline_and_is_shed_past_it() {
    let controller = Controller::<SimWaiter>::new(Duration::from_nanos(DEADLINE));
    let world = Rc::new(RefCell::new(Waiters::default()));
    let waiter = |id| {
        let world = world.clone();
        move || SimWaiter { id, world }
    };
    let mut now = SECOND;
    let held: Vec<Entry> = (0..super::INITIAL_LIMIT)
        .map(|_| controller.enter(now, None, unreachable_waiter))
        .collect();
    assert!(held.iter().all(|e| *e == Entry::Admitted));
    // The bound is full: a call waits, by its own deadline.
    assert_eq!(controller.enter(now, Some(now), waiter(0)), Entry::Shed);
    assert_eq!(
        controller.enter(now, Some(now + 20 * MS), waiter(1)),
        Entry::Queued { wait_ns: 20 * MS }
    );
    assert_eq!(
        controller.enter(now, None, waiter(2)),
        Entry::Queued { wait_ns: DEADLINE }
    );
    // Answers take 4 ms now: a call waits only as long as one sent then is answered in time
    // (with a quarter of the latency to spare); one that could not be is shed at once.
    now += 4 * MS;
    controller.end(now, now - 4 * MS, End::Answered);
    assert_eq!(
        world.borrow().granted,
        [1],
        "the oldest waiter got the place"
    );
    assert_eq!(
        controller.enter(now, Some(now + 20 * MS), waiter(3)),
        Entry::Queued { wait_ns: 15 * MS }
    );
    assert_eq!(
        controller.enter(now, Some(now + 5 * MS), waiter(4)),
        Entry::Shed
    );
}
