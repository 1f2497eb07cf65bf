//! The deadline of a whole load: a load (reading, parsing, validating every file, or every
//! resource of an xDS push) runs on its own thread and is given up after a deadline, so
//! reload and shutdown never wait on it; at most [`MAX_LOADS_RUNNING`] loads run at once,
//! abandoned ones included.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use crate::config::{Config, ConfigError, ConfigErrors};

/// Longest a load (reading, parsing, validating every file) may take before it is abandoned.
pub const LOAD_DEADLINE: Duration = Duration::from_secs(10);

/// Most loads running at once, abandoned ones included: a file that makes every load slow
/// costs at most this many busy threads.
pub const MAX_LOADS_RUNNING: usize = 3;

/// Runs `load` (of the limits at `label`), giving up after `deadline` (an error naming
/// `label`); the load itself runs on its own thread and finishes, or not, in the background.
pub fn load_within(
    label: String,
    deadline: Duration,
    load: impl FnOnce() -> Result<Config, ConfigErrors> + Send + 'static,
) -> Result<Config, ConfigErrors> {
    static RUNNING: AtomicUsize = AtomicUsize::new(0);
    let refuse = |message: String| {
        Err(ConfigErrors(vec![ConfigError {
            file: label.clone(),
            path: String::new(),
            message,
        }]))
    };
    if RUNNING
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < MAX_LOADS_RUNNING).then_some(n + 1)
        })
        .is_err()
    {
        return refuse(format!(
            "{MAX_LOADS_RUNNING} earlier loads are still running (each abandoned after \
             {deadline:?}); not loading again until one ends"
        ));
    }
    let (tx, rx) = mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("limits-load".into())
        .spawn(move || {
            let loaded = load();
            RUNNING.fetch_sub(1, Ordering::AcqRel);
            // The receiver is gone when the load was abandoned.
            let _ = tx.send(loaded);
        });
    if let Err(e) = spawned {
        RUNNING.fetch_sub(1, Ordering::AcqRel);
        return refuse(format!("cannot start the load: {e}"));
    }
    match rx.recv_timeout(deadline) {
        Ok(loaded) => loaded,
        Err(_) => refuse(format!(
            "loading took longer than {deadline:?} and was abandoned; the previous limits stay \
             in force"
        )),
    }
}

#[cfg(test)]
mod tests;
