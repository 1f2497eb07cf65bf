use super::Delay;

/// The smoothed delay rises half-way to a larger sample and falls an eighth of the way to
/// a smaller one.
#[test]
fn the_delay_rises_fast_and_falls_slowly() {
    let mut delay = Delay::default();
    assert_eq!(delay.observe(8_000), 4_000);
    assert_eq!(delay.observe(8_000), 6_000);
    assert_eq!(delay.observe(0), 5_250);
    assert_eq!(delay.get(), 5_250);
}
