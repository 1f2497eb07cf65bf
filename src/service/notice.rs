//! Telling the operator about something a client can make happen on every request, at a
//! bounded rate: a log line per request would be a cost the client controls.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Lets a message through at most once per period, counting the occurrences in between.
#[derive(Debug)]
pub(super) struct Notice {
    /// The period, µs.
    every_us: i64,
    /// When the next message may go out (µs of the decider's clock).
    next_us: AtomicI64,
    /// Occurrences since the last message went out.
    since: AtomicU64,
}

impl Notice {
    /// At most one message per `every_us`.
    pub(super) const fn every_us(every_us: i64) -> Notice {
        Notice {
            every_us,
            next_us: AtomicI64::new(i64::MIN),
            since: AtomicU64::new(0),
        }
    }

    /// Counts one occurrence at `now_us`; when a message is due, returns how many occurrences
    /// it covers (this one included). One caller wins a due message: the others count.
    pub(super) fn occurred(&self, now_us: i64) -> Option<u64> {
        self.since.fetch_add(1, Ordering::Relaxed);
        let next = self.next_us.load(Ordering::Relaxed);
        if now_us < next {
            return None;
        }
        self.next_us
            .compare_exchange(
                next,
                now_us.saturating_add(self.every_us),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .ok()?;
        Some(self.since.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests;
