use super::Notice;

/// The first occurrence is told at once; the next message waits for the period and
/// says how many occurred since.
#[test]
fn once_per_period_with_the_count_between() {
    let notice = Notice::every_us(10);
    assert_eq!(notice.occurred(100), Some(1));
    assert_eq!(notice.occurred(101), None);
    assert_eq!(notice.occurred(109), None);
    assert_eq!(notice.occurred(110), Some(3));
    assert_eq!(notice.occurred(111), None);
}
