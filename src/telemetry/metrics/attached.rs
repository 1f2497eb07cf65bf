//! Metric families owned by modules above telemetry (which telemetry cannot name), such as
//! `rlqs`: each registers its families once with [`super::Metrics::attach`], and they are
//! encoded with the registry at every exposition.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};

/// One metric family attached after construction: its name, help and handle.
type AttachedFamily = (
    &'static str,
    &'static str,
    Box<dyn EncodeMetric + Send + Sync>,
);

/// The attached families, shared between [`super::Metrics`] and the registry's collector.
#[derive(Clone, Default)]
pub(super) struct Attached(Arc<Mutex<Vec<AttachedFamily>>>);

impl Attached {
    /// Adds a family to every exposition from now on.
    pub(super) fn push(
        &self,
        name: &'static str,
        help: &'static str,
        metric: Box<dyn EncodeMetric + Send + Sync>,
    ) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((name, help, metric));
    }
}

impl fmt::Debug for Attached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.0.lock().unwrap_or_else(PoisonError::into_inner).len();
        write!(f, "Attached({count})")
    }
}

impl Collector for Attached {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        for (name, help, metric) in self.0.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            let family = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
            metric.encode(family)?;
        }
        Ok(())
    }
}
