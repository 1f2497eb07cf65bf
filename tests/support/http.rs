//! A minimal HTTP/1.1 client for the admin endpoints: one request per connection.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response: status code and body.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

/// Sends `method path` with an optional body (declared JSON) and reads the whole response.
pub async fn call(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> HttpResponse {
    call_with(
        addr,
        method,
        path,
        &[("Content-Type", "application/json")],
        body,
    )
    .await
}

/// Sends `method path` with exactly `headers` (besides Host, Connection and Content-Length)
/// and an optional body, and reads the whole response.
pub async fn call_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> HttpResponse {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let body = body.unwrap_or("");
    // `Host: addr` unless the caller names the host itself (a client that reached the port
    // under a DNS name).
    let host = if headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        String::new()
    } else {
        format!("Host: {addr}\r\n")
    };
    let headers: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let request = format!(
        "{method} {path} HTTP/1.1\r\n{host}Connection: close\r\n\
         {headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    HttpResponse {
        status,
        headers: head.to_string(),
        body: body.to_string(),
    }
}

/// `POST /json` with `body`.
pub async fn post_json(addr: SocketAddr, body: &str) -> HttpResponse {
    call(addr, "POST", "/json", Some(body)).await
}

/// The value of the unlabelled or fully labelled series `series` on `GET /metrics`.
pub async fn metric(addr: SocketAddr, series: &str) -> Option<f64> {
    let body = call(addr, "GET", "/metrics", None).await.body;
    body.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}
