//! A hostile HTTP/2 client that writes frames by hand: it opens streams with HEADERS and never
//! sends their bodies, whatever the server's SETTINGS say. (A real client library would wait
//! for the server's MAX_CONCURRENT_STREAMS; an attacker does not.)

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// What the server sent back so far.
#[derive(Default)]
pub struct Seen {
    pub headers: AtomicU64,
    pub resets: AtomicU64,
    pub goaway: AtomicU64,
    /// PING acknowledgements (answers to [`Attacker::ping`]).
    pub ping_acks: AtomicU64,
    pub closed: AtomicU64,
}

/// One hostile connection.
pub struct Attacker {
    write: OwnedWriteHalf,
    next_stream: u32,
    pub seen: Arc<Seen>,
}

impl Attacker {
    /// Connects, sends the preface and an empty SETTINGS frame, and reads (counting) whatever
    /// the server sends, in the background.
    pub async fn connect(addr: SocketAddr) -> Attacker {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut read, mut write) = stream.into_split();
        write.write_all(PREFACE).await.unwrap();
        write.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
        let seen = Arc::new(Seen::default());
        let counts = seen.clone();
        tokio::spawn(async move {
            let mut buffer = Vec::new();
            let mut chunk = [0u8; 16 * 1024];
            loop {
                match read.read(&mut chunk).await {
                    Ok(0) | Err(_) => {
                        counts.closed.store(1, Ordering::SeqCst);
                        return;
                    }
                    Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                }
                while buffer.len() >= 9 {
                    let length = u32::from_be_bytes([0, buffer[0], buffer[1], buffer[2]]) as usize;
                    if buffer.len() < 9 + length {
                        break;
                    }
                    match buffer[3] {
                        HEADERS => counts.headers.fetch_add(1, Ordering::SeqCst),
                        RST_STREAM => counts.resets.fetch_add(1, Ordering::SeqCst),
                        GOAWAY => counts.goaway.fetch_add(1, Ordering::SeqCst),
                        PING if buffer[4] & ACK != 0 => {
                            counts.ping_acks.fetch_add(1, Ordering::SeqCst)
                        }
                        _ => 0,
                    };
                    buffer.drain(..9 + length);
                }
            }
        });
        Attacker {
            write,
            next_stream: 1,
            seen,
        }
    }

    /// Sends a PING, a control frame the server must acknowledge (`seen.ping_acks`); false
    /// once the server has closed the connection.
    pub async fn ping(&mut self) -> bool {
        self.write
            .write_all(&frame(PING, 0, 0, &[0; 8]))
            .await
            .is_ok()
    }

    /// Whether the server has closed the connection.
    pub fn is_closed(&self) -> bool {
        self.seen.closed.load(Ordering::SeqCst) != 0
    }

    /// Opens `count` ShouldRateLimit streams (HEADERS, no body); stops early, returning how
    /// many were written, once the server has closed the connection.
    pub async fn open_streams(&mut self, count: usize) -> usize {
        let block = request_headers("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
        let mut batch = Vec::new();
        let mut written = 0;
        for _ in 0..count {
            batch.extend_from_slice(&frame(HEADERS, END_HEADERS, self.next_stream, &block));
            self.next_stream += 2;
            written += 1;
            if batch.len() > 64 * 1024 {
                if self.write.write_all(&batch).await.is_err() {
                    return written;
                }
                batch.clear();
            }
        }
        if self.write.write_all(&batch).await.is_err() {
            return written;
        }
        written
    }
}

/// One frame: 9-byte header and payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = (payload.len() as u32).to_be_bytes();
    let mut out = vec![length[1], length[2], length[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK header block for a gRPC call to `path`: literal fields, no Huffman, no indexing.
fn request_headers(path: &str) -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static table)
    let mut literal = |index: Option<u8>, name: &str, value: &str| {
        match index {
            Some(index) => block.push(index),
            None => {
                block.push(0x00);
                block.push(name.len() as u8);
                block.extend_from_slice(name.as_bytes());
            }
        }
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    };
    literal(Some(0x04), "", path); // :path
    literal(Some(0x01), "", "floodgate"); // :authority
    literal(None, "content-type", "application/grpc");
    literal(None, "te", "trailers");
    block
}

/// The resident memory of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

/// The `grpc-status` the server at `addr` answers to one gRPC call to `path` (as
/// `/package.Service/Method`) whose body is `frame`, sent as is over a plain HTTP/2 client:
/// bytes no gRPC client would send. `end` ends the request stream after them (a unary call);
/// without it the stream stays open, as an RLQS client's does. Each step waits at most
/// [`super::EVENTUALLY`]; the status is read from the headers (a trailers-only answer) or
/// from the trailers.
pub async fn grpc_status_of(
    addr: SocketAddr,
    path: &str,
    frame: &'static [u8],
    end: bool,
) -> String {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let request = ::http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut body) = client.send_request(request, false).unwrap();
    body.send_data(bytes::Bytes::from_static(frame), end)
        .unwrap();
    let response = tokio::time::timeout(super::EVENTUALLY, response)
        .await
        .expect("the response came in time")
        .unwrap();
    if let Some(status) = response.headers().get("grpc-status") {
        return status.to_str().unwrap().to_string();
    }
    let mut body = response.into_body();
    while tokio::time::timeout(super::EVENTUALLY, body.data())
        .await
        .expect("the body came in time")
        .is_some()
    {}
    let trailers = body.trailers().await.unwrap().unwrap();
    trailers["grpc-status"].to_str().unwrap().to_string()
}
