use super::*;

/// Every listener shares the one address, port 0 included.
#[tokio::test]
async fn listeners_share_one_port() {
    let listeners = TcpListeners::bind("127.0.0.1:0".parse().unwrap(), 3)
        .await
        .unwrap();
    let addr = listeners.local_addr().unwrap();
    assert_ne!(addr.port(), 0);
    assert_eq!(listeners.threads(), 3);
    for extra in &listeners.extra {
        assert_eq!(extra.local_addr().unwrap(), addr);
    }
}

/// A stale socket file is replaced; the file is removed when the listener goes.
#[tokio::test]
async fn a_stale_socket_is_replaced_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("grpc.sock");
    let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
    drop(stale);
    assert!(path.exists(), "a dropped std listener leaves its file");
    let listener = GrpcListener::bind_unix(&path).unwrap();
    assert!(path.exists());
    drop(listener);
    assert!(!path.exists());
    // Not a socket: left alone, and an error.
    std::fs::write(&path, "data").unwrap();
    assert!(GrpcListener::bind_unix(&path).is_err());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
}
