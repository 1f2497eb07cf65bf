//! The in-process store with the calls a test picks held until the test lets them through:
//! what the tests of draining, overload and refunds that outlive their caller need to hold a
//! request inside the store at a known point.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use floodgate::bucket::{Applied, BucketOp};
use floodgate::clock::Clock;
use floodgate::store::{MemoryStore, Store, StoreError};
use tokio::sync::Semaphore;

/// See the module. Each held call says it has arrived, waits for a pass, is applied by the
/// memory store, and says so.
pub struct HeldStore {
    inner: MemoryStore,
    /// Calls so far, held or not.
    calls: AtomicUsize,
    /// The one call held (0-based, in arrival order), or every call when `None`.
    held: Option<usize>,
    arrived: Semaphore,
    passes: Semaphore,
    applied: Semaphore,
}

impl HeldStore {
    /// Every call held, over buckets on `clock`.
    pub fn every_call(clock: Arc<dyn Clock>) -> Arc<HeldStore> {
        HeldStore::holding(None, clock)
    }

    /// Only the `index`-th call (0-based) held; the others answered at once.
    pub fn one_call(index: usize, clock: Arc<dyn Clock>) -> Arc<HeldStore> {
        HeldStore::holding(Some(index), clock)
    }

    fn holding(held: Option<usize>, clock: Arc<dyn Clock>) -> Arc<HeldStore> {
        Arc::new(HeldStore {
            inner: MemoryStore::new(clock),
            calls: AtomicUsize::new(0),
            held,
            arrived: Semaphore::new(0),
            passes: Semaphore::new(0),
            applied: Semaphore::new(0),
        })
    }

    /// Waits until one more held call has arrived (each arrival is waited for once).
    pub async fn arrived(&self) {
        self.arrived.acquire().await.unwrap().forget();
    }

    /// Lets `calls` held calls through, now or as they arrive.
    pub fn release(&self, calls: usize) {
        self.passes.add_permits(calls);
    }

    /// Lets every held call through from now on.
    pub fn release_all(&self) {
        self.passes.add_permits(Semaphore::MAX_PERMITS / 2);
    }

    /// Waits until one more held call has been applied.
    pub async fn applied(&self) {
        self.applied.acquire().await.unwrap().forget();
    }
}

#[async_trait]
impl Store for HeldStore {
    async fn apply(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if self.held.is_some_and(|held| held != call) {
            return self.inner.apply(ops).await;
        }
        self.arrived.add_permits(1);
        // Never closed: the test hands out the passes.
        self.passes.acquire().await.unwrap().forget();
        let applied = self.inner.apply(ops).await;
        self.applied.add_permits(1);
        applied
    }

    fn name(&self) -> &'static str {
        "held"
    }
}
