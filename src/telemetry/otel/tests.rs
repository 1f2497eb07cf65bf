use super::*;

/// Instance ids are well-formed version-4 UUIDs, different each time.
#[test]
fn instance_ids_are_uuids() {
    let id = random_instance_id();
    assert_eq!(id.len(), 36);
    assert_eq!(&id[14..15], "4");
    assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"));
    assert_ne!(id, random_instance_id());
}
