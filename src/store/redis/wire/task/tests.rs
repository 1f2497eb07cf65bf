use std::sync::Arc;

use tokio::sync::oneshot;

use super::*;
use crate::store::redis::wire::conn::shared;
use crate::store::redis::wire::frame::{bulk_payload, reply_cap};

/// After a reply larger than the read buffer and a command larger than the output
/// buffers keep, the buffers are back to their usual size: a long-lived connection does
/// not hold its largest reply's or largest burst's memory for good.
#[tokio::test]
async fn buffers_shrink_back_after_a_large_reply() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const BIG: usize = 1024 * 1024;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (client, accepted) = tokio::join!(
        TcpStream::connect(listener.local_addr().unwrap()),
        listener.accept()
    );
    let (client, (mut server, _)) = (client.unwrap(), accepted.unwrap());
    let mut command = format!("*2\r\n$4\r\nECHO\r\n${BIG}\r\n").into_bytes();
    command.resize(command.len() + BIG, b'x');
    command.extend_from_slice(b"\r\n");
    let length = command.len();
    // Echoes the command's argument once it has all of it.
    tokio::spawn(async move {
        let mut seen = vec![0; length];
        server.read_exact(&mut seen).await.unwrap();
        let mut reply = format!("${BIG}\r\n").into_bytes();
        reply.resize(reply.len() + BIG, b'x');
        reply.extend_from_slice(b"\r\n");
        server.write_all(&reply).await.unwrap();
        let _ = server.read(&mut seen).await;
    });
    let mut state = State::new();
    state.out = command;
    let shared = shared(state);
    let (sender, mut reply) = oneshot::channel();
    lock(&shared).waiting.push_back(Waiting {
        reply: Some(sender),
        deadline: None,
        shares: 0,
        part: 0,
        // A call expecting a reply this large (a script call alone of many keys).
        most: reply_cap(BIG),
        script: false,
    });
    let mut task = Task::new(Stream::Tcp(client), Arc::clone(&shared));
    let frame = std::future::poll_fn(|cx| {
        task.drive(cx).unwrap();
        Pin::new(&mut reply).poll(cx)
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(bulk_payload(&frame).map(<[u8]>::len), Some(BIG));
    assert_eq!(task.read.len(), READ_BUFFER);
    assert!(task.writing.capacity() <= OUT_KEEP);
    assert!(lock(&shared).out.capacity() <= OUT_KEEP);
}
