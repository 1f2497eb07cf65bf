//! The server's stop signal as a future, which every serving task awaits.

use tokio::sync::watch;

/// Completes once `stop` says true (or its sender is gone, which only happens once the
/// server is stopping anyway).
pub(super) async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}
