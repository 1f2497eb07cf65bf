//! The last few limits loads (start-up and reloads), for the operator console: when the
//! limits last changed, and what the last failed load said.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;

/// Loads remembered; older ones are forgotten (the counters keep the totals).
pub const HISTORY_LEN: usize = 20;

/// Longest error text kept per load: a load of many bad files lists them all.
pub const MAX_DETAIL: usize = 2_000;

/// One limits load.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoadRecord {
    /// When, in ms since the Unix epoch.
    pub at_unix_ms: u64,
    /// Whether the new limits are in force.
    pub ok: bool,
    /// What was loaded (domains), or why it failed.
    pub detail: String,
}

/// The bounded history of limits loads.
#[derive(Debug, Default)]
pub struct LoadHistory(Mutex<VecDeque<LoadRecord>>);

impl LoadHistory {
    /// Remembers a load, forgetting the oldest beyond [`HISTORY_LEN`].
    pub fn record(&self, at_unix_ms: u64, ok: bool, detail: &str) {
        let detail = match detail.char_indices().nth(MAX_DETAIL) {
            Some((at, _)) => format!("{}…", &detail[..at]),
            None => detail.to_owned(),
        };
        let mut loads = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if loads.len() == HISTORY_LEN {
            loads.pop_front();
        }
        loads.push_back(LoadRecord {
            at_unix_ms,
            ok,
            detail,
        });
    }

    /// The remembered loads, newest first.
    pub fn newest_first(&self) -> Vec<LoadRecord> {
        let loads = self.0.lock().unwrap_or_else(|e| e.into_inner());
        loads.iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests;
