use super::*;

/// Every component must be healthy; an absent one counts as healthy.
#[test]
fn all_components_must_be_healthy() {
    let (_up_tx, up) = watch::channel(true);
    let (_down_tx, down) = watch::channel(false);
    assert_eq!(initially_serving(None, None), Ok(()));
    assert_eq!(initially_serving(Some(&up), None), Ok(()));
    assert_eq!(initially_serving(Some(&up), Some(&up)), Ok(()));
    assert_eq!(
        initially_serving(Some(&down), Some(&down)),
        Err(NotReady::Store)
    );
    assert_eq!(initially_serving(None, Some(&down)), Err(NotReady::Limits));
}

/// A component whose sender is gone keeps its last value.
#[tokio::test]
async fn a_closed_component_keeps_its_last_value() {
    let (tx, rx) = watch::channel(true);
    let mut component = Component::new(Some(rx));
    tx.send_replace(false);
    drop(tx);
    component.refresh();
    assert!(!component.healthy);
    let waited =
        tokio::time::timeout(std::time::Duration::from_millis(20), component.changed()).await;
    assert!(waited.is_err(), "a closed channel never changes again");
    assert!(!component.healthy && component.updates.is_none());
}
