use super::*;

fn ask(capacity: u64, demand: Option<u64>) -> Ask {
    Ask {
        capacity,
        demand,
        life_us: 10_000_000,
    }
}

fn live_sum(table: &Table, now: i64) -> u64 {
    table
        .values()
        .filter(|row| row.expires_us > now)
        .map(|row| row.grant)
        .sum()
}

/// A lone holder with unknown demand gets the whole rate.
#[test]
fn a_lone_holder_gets_everything() {
    let mut table = Table::new();
    assert_eq!(settle(&mut table, "a", ask(100, None), 0), 100);
}

/// Two holders converge to their demands when these fit, and never hold more than the
/// rate between them at any step.
#[test]
fn shares_follow_demand_and_never_exceed_the_rate() {
    let mut table = Table::new();
    let mut grants = (0, 0);
    for step in 0..4 {
        grants.0 = settle(&mut table, "a", ask(100, Some(80)), step);
        assert!(live_sum(&table, step) <= 100);
        grants.1 = settle(&mut table, "b", ask(100, Some(20)), step);
        assert!(live_sum(&table, step) <= 100);
    }
    assert_eq!(grants, (80, 20));
}

/// Demands over the rate are cut max-min fair: the small one is met, the large ones
/// split the rest evenly.
#[test]
fn over_demand_is_split_max_min_fair() {
    let mut table = Table::new();
    for name in ["a", "b", "c"] {
        table.insert(
            name.to_owned(),
            Row {
                demand: Some(match name {
                    "a" => 10,
                    _ => 500,
                }),
                grant: 0,
                expires_us: 100,
            },
        );
    }
    assert_eq!(fair_target(&table, "a", 100), 10);
    assert_eq!(fair_target(&table, "b", 100), 45);
    assert_eq!(fair_target(&table, "c", 100), 45);
}

/// Rate no demand uses is split among the holders and one more: a newcomer finds some.
#[test]
fn spare_rate_leaves_room_for_a_newcomer() {
    let mut table = Table::new();
    assert_eq!(settle(&mut table, "a", ask(100, Some(10)), 0), 55);
    assert!(settle(&mut table, "b", ask(100, None), 0) > 0);
    assert!(live_sum(&table, 0) <= 100);
}

/// An expired row stops counting: its rate goes to the next holder that reports.
#[test]
fn an_expired_holder_loses_its_share() {
    let mut table = Table::new();
    let short = Ask {
        life_us: 5,
        ..ask(100, Some(100))
    };
    settle(&mut table, "a", short, 0);
    settle(&mut table, "b", ask(100, Some(100)), 0);
    assert_eq!(settle(&mut table, "b", ask(100, Some(100)), 10), 100);
    assert!(!table.contains_key("a"));
}

/// A newcomer squeezed out by a holder of the whole rate is served without reporting
/// again: the holder's re-evaluation shrinks it to its fair target, then the newcomer's
/// grows into what that freed; the sum stays within the rate at every step, and a
/// settled table re-evaluates to no change.
#[test]
fn reassessing_moves_a_full_bucket_to_a_newcomer() {
    let mut table = Table::new();
    assert_eq!(settle(&mut table, "a", ask(100, Some(100)), 0), 100);
    assert_eq!(settle(&mut table, "b", ask(100, Some(100)), 1), 0);
    assert_eq!(reassess(&mut table, "b", 100, 10_000_000, 2), None);
    assert_eq!(reassess(&mut table, "a", 100, 10_000_000, 3), Some(50));
    assert!(live_sum(&table, 3) <= 100);
    assert_eq!(reassess(&mut table, "b", 100, 10_000_000, 4), Some(50));
    assert_eq!(live_sum(&table, 4), 100);
    assert_eq!(reassess(&mut table, "a", 100, 10_000_000, 5), None);
    assert_eq!(reassess(&mut table, "gone", 100, 10_000_000, 5), None);
    assert!(!table.contains_key("gone"));
}

/// Whatever the order and demands, of reports and re-evaluations, the live grants never
/// sum past the rate.
#[test]
fn random_reports_keep_the_sum_within_the_rate() {
    let mut table = Table::new();
    let mut seed: u64 = 7;
    for now in 0..5_000i64 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let holder = format!("h{}", (seed >> 33) % 7);
        let demand = (!(seed >> 20).is_multiple_of(3)).then_some((seed >> 40) % 150);
        let life = Ask {
            life_us: i64::try_from((seed >> 12) % 50).unwrap_or(0) + 1,
            ..ask(97, demand)
        };
        if (seed >> 50).is_multiple_of(3) {
            reassess(&mut table, &holder, 97, life.life_us, now);
        } else {
            settle(&mut table, &holder, life, now);
        }
        assert!(live_sum(&table, now) <= 97, "at {now}: {table:?}");
    }
}
