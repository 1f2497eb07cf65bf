use super::*;

/// It opens only after `threshold` consecutive failures; a success in between resets.
#[test]
fn opens_after_consecutive_failures() {
    let breaker = CircuitBreaker::new(3, Duration::ZERO);
    breaker.record_failure(&"boom");
    breaker.record_failure(&"boom");
    breaker.record_success();
    breaker.record_failure(&"boom");
    breaker.record_failure(&"boom");
    assert!(breaker.is_closed());
    breaker.record_failure(&"boom");
    assert!(!breaker.is_closed());
}

/// Transitions are published; a success closes an open circuit.
#[test]
fn publishes_transitions() {
    let breaker = CircuitBreaker::new(1, Duration::ZERO);
    let mut rx = breaker.subscribe();
    assert!(
        !*rx.borrow_and_update(),
        "not usable before anything succeeded"
    );
    breaker.record_success();
    assert!(*rx.borrow_and_update());
    breaker.record_failure(&"down");
    assert!(rx.has_changed().unwrap());
    assert!(!*rx.borrow_and_update());
    breaker.record_failure(&"still down");
    assert!(
        !rx.has_changed().unwrap(),
        "no repeat publication while open"
    );
    breaker.record_success();
    assert!(*rx.borrow_and_update());
    assert!(breaker.is_closed());
}

/// Failures right after a success (overload, not an outage) do not open the circuit.
#[test]
fn recent_success_keeps_it_closed() {
    let breaker = CircuitBreaker::new(2, Duration::from_secs(3600));
    breaker.record_success();
    for _ in 0..10 {
        breaker.record_failure(&"timeout");
    }
    assert!(breaker.is_closed());
    let never_succeeded = CircuitBreaker::new(2, Duration::from_secs(3600));
    never_succeeded.record_failure(&"refused");
    never_succeeded.record_failure(&"refused");
    assert!(!never_succeeded.is_closed());
}

/// Idle until a call succeeds, then again once the quiet period has passed since the last.
#[test]
fn idle_before_any_success_and_after_the_quiet_period() {
    let long = CircuitBreaker::new(1, Duration::from_secs(3600));
    assert!(long.is_idle(), "nothing has succeeded yet");
    long.record_success();
    assert!(!long.is_idle());
    long.record_success();
    assert!(
        !long.is_idle(),
        "a success in the steady state keeps it recent"
    );
    let none = CircuitBreaker::new(1, Duration::ZERO);
    none.record_success();
    assert!(none.is_idle(), "a quiet period of 0 has always passed");
}

/// Successes and failures from many threads at once leave a state the last of them
/// decides: after a final success the circuit is closed and its failures reset.
#[test]
fn concurrent_successes_and_failures_settle() {
    let breaker = CircuitBreaker::new(2, Duration::ZERO);
    std::thread::scope(|scope| {
        for t in 0..8 {
            let breaker = &breaker;
            scope.spawn(move || {
                for i in 0..2_000 {
                    if (i + t) % 3 == 0 {
                        breaker.record_failure(&"timeout");
                    } else {
                        breaker.record_success();
                    }
                }
            });
        }
    });
    breaker.record_success();
    assert!(breaker.is_closed());
    breaker.record_failure(&"timeout");
    assert!(
        breaker.is_closed(),
        "one failure after a success is below the threshold"
    );
    breaker.record_failure(&"timeout");
    assert!(!breaker.is_closed());
}

/// Each transition is in effect when its line is logged: whoever reads "circuit closed" and
/// sends a request finds the circuit closed (and "circuit open", open).
#[test]
fn transitions_are_logged_once_in_effect() {
    use std::sync::Arc;
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

    /// Records, at each event, whether the breaker was closed and published usable.
    struct Seen {
        breaker: Arc<CircuitBreaker>,
        at_events: Arc<Mutex<Vec<(bool, bool)>>>,
    }
    impl<S: tracing::Subscriber> Layer<S> for Seen {
        fn on_event(&self, _: &tracing::Event<'_>, _: Context<'_, S>) {
            let state = (self.breaker.is_closed(), *self.breaker.subscribe().borrow());
            self.at_events.lock().unwrap().push(state);
        }
    }

    let breaker = Arc::new(CircuitBreaker::new(1, Duration::ZERO));
    let at_events = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Seen {
        breaker: Arc::clone(&breaker),
        at_events: Arc::clone(&at_events),
    });
    tracing::subscriber::with_default(subscriber, || {
        breaker.record_success(); // usable
        breaker.record_failure(&"refused"); // open
        breaker.record_success(); // closed again
    });
    assert_eq!(
        *at_events.lock().unwrap(),
        [(true, true), (false, false), (true, true)]
    );
}
