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
