use prometheus_client::metrics::histogram::Histogram;

use super::*;
use crate::telemetry::metrics::exposition_of;

/// The exposition is what prometheus-client's `Histogram` writes for the same
/// observations (whole-µs durations, exact in both), whichever threads observe them.
#[test]
fn exposes_what_the_locked_histogram_exposes() {
    let bounds = || prometheus_client::metrics::histogram::exponential_buckets(0.000_05, 2.0, 16);
    let ours = DurationHistogram::new(bounds());
    let theirs = Histogram::new(bounds());
    let micros = [
        0, 1, 49, 50, 51, 100, 101, 3_000, 1_638_400, 1_638_401, 90_000_000,
    ];
    std::thread::scope(|scope| {
        for chunk in micros.chunks(3) {
            let (ours, theirs) = (&ours, &theirs);
            scope.spawn(move || {
                for &us in chunk {
                    ours.observe(Duration::from_micros(us));
                    theirs.observe(us as f64 / 1e6);
                }
            });
        }
    });
    let ours_text = exposition_of("d", ours.clone());
    let theirs_text = exposition_of("d", theirs.clone());
    assert_eq!(ours_text, theirs_text);
    assert_eq!(ours.count(), micros.len() as u64);
    assert!(
        ours_text.contains("d_bucket{le=\"0.00005\"} 4\n"),
        "{ours_text}"
    );
}
