use super::*;

/// Past the bound, the connection idle longest makes way, however recently it was
/// accepted relative to busy ones; a busy connection never does; with all busy, none.
#[test]
fn the_longest_idle_connection_makes_way() {
    let places = Arc::new(ConnectionBound::new(3));
    let (a, taken) = places.take().unwrap();
    assert_eq!(taken, Taken::Free);
    let (b, _) = places.take().unwrap();
    let (c, _) = places.take().unwrap();
    // a is the oldest, but busy; b is idle since it was accepted; c had a call that ended.
    let a_call = a.activity().begin_call();
    drop(c.activity().begin_call());
    let (d, taken) = places.take().unwrap();
    assert_eq!(taken, Taken::Evicted);
    assert!(b.activity().is_evicted());
    assert!(!a.activity().is_evicted() && !c.activity().is_evicted());
    // The evicted one closing frees nothing: its place is d's.
    drop(b);
    assert_eq!(places.taken.load(Ordering::Acquire), 3);
    let (e, _) = places.take().unwrap();
    assert!(c.activity().is_evicted());
    drop(c);
    // d (idle since accepted) goes before e (accepted later).
    let (f, _) = places.take().unwrap();
    assert!(d.activity().is_evicted());
    drop(d);
    let _e_call = e.activity().begin_call();
    let _f_call = f.activity().begin_call();
    assert!(places.take().is_none(), "every connection is busy");
    drop(a_call);
    let (_g, taken) = places.take().unwrap();
    assert_eq!(taken, Taken::Evicted);
    assert!(a.activity().is_evicted());
}

/// A connection that finished its calls more recently is kept over one idle longer.
#[test]
fn idle_time_counts_from_the_last_call() {
    let places = Arc::new(ConnectionBound::new(2));
    let (old, _) = places.take().unwrap();
    let (young, _) = places.take().unwrap();
    let call = old.activity().begin_call();
    while micros_since(places.epoch) <= young.activity().idle_since.load(Ordering::Relaxed) {
        std::hint::spin_loop();
    }
    drop(call);
    let (_new, _) = places.take().unwrap();
    assert!(young.activity().is_evicted());
    assert!(!old.activity().is_evicted());
}

/// Freed places are taken again without evicting anyone.
#[test]
fn freed_places_are_reused() {
    let places = Arc::new(ConnectionBound::new(1));
    let (first, _) = places.take().unwrap();
    drop(first);
    let (second, taken) = places.take().unwrap();
    assert_eq!(taken, Taken::Free);
    assert!(!second.activity().is_evicted());
}
