use prometheus_client::metrics::counter::Counter;

use super::*;
use crate::telemetry::metrics::exposition_of;

/// Adds from many threads, some before the counter is spread and some after, all count, and
/// the exposition is what a plain `Counter` given the same adds writes.
#[test]
fn counts_every_add_and_exposes_what_a_counter_exposes() {
    let ours = StripedCounter::default();
    let theirs = Counter::<u64>::default();
    let add = |n: u64| {
        ours.inc_by(n);
        theirs.inc_by(n);
    };
    add(3);
    assert!(!ours.inner().is_spread());
    ours.inner().spread();
    ours.inner().spread();
    assert!(ours.inner().is_spread());
    std::thread::scope(|scope| {
        for thread in 0..(2 * STRIPES as u64 + 1) {
            scope.spawn(move || {
                for i in 0..1_000 {
                    add(thread + i % 3);
                }
            });
        }
    });
    assert_eq!(ours.get(), theirs.get());
    let expected: u64 = 3
        + (0..(2 * STRIPES as u64 + 1))
            .map(|thread| (0..1_000).map(|i| thread + i % 3).sum::<u64>())
            .sum::<u64>();
    assert_eq!(ours.get(), expected);
    assert_eq!(
        exposition_of("c", ours.clone()),
        exposition_of("c", theirs.clone())
    );
}

/// A spread counter's stripes are a power of two, at most eight: the mask picks a stripe.
#[test]
fn stripes_are_a_power_of_two() {
    let count = stripe_count();
    assert!(count.is_power_of_two() && count <= STRIPES, "{count}");
}
