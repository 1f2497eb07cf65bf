use super::*;

/// The error redis-rs makes of a server's `-<reply>` line.
fn server_error(reply: &str) -> RedisError {
    match redis::parse_redis_value(format!("-{reply}\r\n").as_bytes()) {
        Ok(redis::Value::ServerError(e)) => e.into(),
        other => panic!("not a server error: {other:?}"),
    }
}

/// READONLY (a demoted master) retires the connection; a script error or a Redis that is
/// busy or full does not, so they never turn into a reconnect per request.
#[test]
fn only_transport_failures_and_readonly_retire_the_connection() {
    let retires = |error: RedisError| (retires_connection(&error), classify(&error).is_transient());
    assert_eq!(
        retires(server_error(
            "READONLY You can't write against a read only replica."
        )),
        (true, true)
    );
    let dropped = RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
    assert_eq!(retires(dropped), (true, true));
    for reply in [
        "LOADING loading",
        "BUSY script",
        "OOM full",
        "MASTERDOWN link down",
    ] {
        assert_eq!(retires(server_error(reply)), (false, true), "{reply}");
    }
    assert_eq!(
        retires(server_error(
            "ERR user_script:1: Script attempted to access a key"
        )),
        (false, false)
    );
}

/// An ACL refusal and a renamed command are outages; the refused command's arguments
/// (bucket keys, request data) never reach the error text.
#[test]
fn acl_and_unknown_commands_are_outages_without_request_data() {
    for reply in [
        "NOPERM No permissions to access a key",
        "NOPERM User u has no permissions to run the 'evalsha' command",
        "ERR unknown command 'EVALSHA', with args beginning with: 'abc' '1' 'fg:d:user=secret-value|tb1' ",
    ] {
        let error = classify(&server_error(reply));
        assert!(error.is_transient(), "{reply}");
        assert!(!error.to_string().contains("secret-value"), "{error}");
    }
    let long = format!("ERR {}", "x".repeat(1000));
    assert!(classify(&server_error(&long)).to_string().len() < 300);
}

/// A connection Redis closed while it sat idle (a restart, `timeout`, `CLIENT KILL`) is not
/// lent again, neither from the thread's reuse nor from the pool: the next call is lent a
/// live connection instead of failing on the closed one.
#[tokio::test]
async fn a_connection_closed_while_idle_is_not_lent() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}/", listener.local_addr().unwrap());
    let (close, mut closing) = tokio::sync::oneshot::channel::<()>();
    // Accepts every connection; on `close`, closes the ones accepted so far.
    tokio::spawn(async move {
        let mut open = Vec::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => open.push(accepted.unwrap().0),
                Ok(()) = &mut closing => break,
            }
        }
        open.clear();
        loop {
            open.push(listener.accept().await.unwrap().0);
        }
    });
    let store = RedisStore::new(&RedisSettings {
        url,
        sentinel: None,
        tls: RedisTls::default(),
        key_prefix: "fg:".into(),
        pool_size: 1,
        connect_timeout: Duration::from_secs(10),
        command_timeout: Duration::from_secs(10),
    })
    .unwrap();
    let first = store.lend().await.unwrap();
    close.send(()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !first.conn.is_closed() {
        assert!(
            Instant::now() < deadline,
            "the connection never saw its close"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let next = store.lend().await.unwrap();
    assert!(!next.conn.is_closed());
}

/// A call answered `-ERR max number of clients reached` (Redis at `maxclients`, refusing the
/// connection its command came on) is an outage for the failure policy, not a script defect.
#[test]
fn a_redis_at_maxclients_is_an_outage() {
    let error = classify(&server_error("ERR max number of clients reached"));
    assert!(error.is_transient(), "{error}");
    assert!(error.to_string().contains("no more connections"), "{error}");
}
