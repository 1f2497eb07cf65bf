use super::*;

/// A runtime thread runs its task on a runtime with I/O and timers, and hands back its
/// output.
#[test]
fn runtime_thread_returns_the_output() {
    let handle = spawn_runtime_thread("test-rt".into(), || async {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        std::thread::current().name().map(str::to_owned)
    })
    .unwrap();
    let name = handle.join().unwrap().unwrap();
    assert_eq!(name.as_deref(), Some("test-rt"));
}
