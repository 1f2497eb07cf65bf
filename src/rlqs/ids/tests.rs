use super::*;

fn key(value: &str) -> BucketKey {
    BucketKey {
        domain: "edge".into(),
        entries: vec![("tenant".into(), value.into())],
    }
}

/// The same id held twice is stored and charged once; both places come back on drop.
#[test]
fn identical_ids_are_stored_once() {
    let ids = Arc::new(BucketIds::new(10, 10, 1 << 20, Arc::default()));
    let a = ids.subscribe(key("a"), None).unwrap();
    let b = ids.subscribe(key("a"), None).unwrap();
    assert!(Arc::ptr_eq(a.key(), b.key()));
    assert_eq!(ids.held(), (2, 2 * SUBSCRIPTION_BYTES + key("a").bytes()));
    drop(a);
    assert_eq!(ids.held(), (1, SUBSCRIPTION_BYTES + key("a").bytes()));
    drop(b);
    assert_eq!(ids.held(), (0, 0));
}

/// Past either bound a subscription is refused, and a freed place is taken again.
#[test]
fn the_bounds_hold() {
    let ids = Arc::new(BucketIds::new(2, 2, 1 << 20, Arc::default()));
    let a = ids.subscribe(key("a"), None).unwrap();
    let _b = ids.subscribe(key("b"), None).unwrap();
    assert_eq!(ids.subscribe(key("c"), None).err(), Some(Full::Buckets(2)));
    drop(a);
    assert!(ids.subscribe(key("c"), None).is_ok());

    let small = SUBSCRIPTION_BYTES + key("a").bytes();
    let ids = Arc::new(BucketIds::new(10, 10, small, Arc::default()));
    let _a = ids.subscribe(key("a"), None).unwrap();
    assert_eq!(
        ids.subscribe(key("b"), None).err(),
        Some(Full::Bytes(small))
    );
}

/// One peer holds at most its share, lingering subscriptions included; other peers and
/// streams without a peer address are not held back by it, and a freed place is its own
/// again.
#[test]
fn one_peer_holds_at_most_its_share() {
    let ids = Arc::new(BucketIds::new(10, 2, 1 << 20, Arc::default()));
    let (one, two): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
    let a = ids.subscribe(key("a"), Some(one)).unwrap();
    let _b = ids.subscribe(key("b"), Some(one)).unwrap();
    assert_eq!(
        ids.subscribe(key("c"), Some(one)).err(),
        Some(Full::Peer(2))
    );
    assert!(ids.subscribe(key("c"), Some(two)).is_ok());
    assert!(ids.subscribe(key("c"), None).is_ok());
    drop(a);
    assert!(ids.subscribe(key("c"), Some(one)).is_ok());
}
