//! Where the limits come from: files on disk or an xDS control plane, side by side, each
//! read off the request path and handed to [`crate::config`] to compile.
//!
//! Both sources have the same shape: read (files, or an ADS push converted to YAML), compile
//! within the load deadline ([`load_within`]), then publish through the one [`Publisher`]
//! (resolve the rules' series handles, swap the [`Snapshot`] the service reads, run the
//! server's hook, count the load) or record the failure and keep the limits in force.
//!
//! - [`files`] — `--config` or the reference's runtime layout: listing and reading the files
//!   safely, the [`files::Loader`] of start-up and reload, and hot reload (watch, load, swap);
//! - [`xds`] — the ADS client: push → YAML → compile → swap → ACK, or NACK with the errors;
//! - `publish` — the [`Publisher`];
//! - `snapshot` — the [`Snapshot`] it swaps: the compiled config and its rules' handles;
//! - `deadline` — the deadline of one load, and the bound on loads running at once;
//! - `metrics` — the loads' metrics ([`SourceMetrics`]) and [`history`], the last loads the
//!   console shows.

mod deadline;
pub mod files;
pub mod history;
mod metrics;
mod publish;
mod snapshot;
pub mod xds;

pub use deadline::{LOAD_DEADLINE, MAX_LOADS_RUNNING, load_within};
pub use history::{LoadHistory, LoadRecord};
pub use metrics::SourceMetrics;
pub use publish::{OnPublish, Publisher};
pub use snapshot::{Limits, Snapshot};
