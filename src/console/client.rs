//! The console's HTTP client, for `floodgate bucket get|reset|set`: one plaintext HTTP/1.1
//! call to the admin port (which serves no TLS).

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use super::BucketRequest;

/// Why a console call could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The admin URL is not `http://host:port` (or `host:port`).
    #[error("invalid admin URL {0:?}: expected http://HOST:PORT")]
    Url(String),
    /// The server could not be reached or the exchange failed.
    #[error("cannot reach the admin port at {addr}: {message}")]
    Connect {
        /// The address.
        addr: String,
        /// What failed.
        message: String,
    },
}

/// Which console call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `POST /buckets/get`.
    Get,
    /// `POST /buckets/reset`.
    Reset,
    /// `POST /buckets/set`.
    Set,
}

impl Call {
    fn path(self) -> &'static str {
        match self {
            Call::Get => "/buckets/get",
            Call::Reset => "/buckets/reset",
            Call::Set => "/buckets/set",
        }
    }
}

/// Sends `request` to the console at `admin`, with `token` as bearer token if given;
/// returns the HTTP status and the body.
pub async fn send(
    admin: &str,
    call: Call,
    request: &BucketRequest,
    token: Option<&str>,
) -> Result<(u16, String), ClientError> {
    let authority = admin
        .strip_prefix("http://")
        .unwrap_or(admin)
        .trim_end_matches('/');
    if authority.is_empty() || authority.contains(['/', '@']) || admin.starts_with("https://") {
        return Err(ClientError::Url(admin.to_owned()));
    }
    let failed = |message: String| ClientError::Connect {
        addr: authority.to_owned(),
        message,
    };
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| failed(e.to_string()))?;
    tokio::spawn(connection);
    let body = serde_json::to_vec(request).map_err(|e| failed(e.to_string()))?;
    let mut builder = hyper::Request::post(call.path())
        .header(hyper::header::HOST, authority)
        .header(hyper::header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        builder = builder.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let http_request = builder
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| failed(e.to_string()))?;
    let response = sender
        .send_request(http_request)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| failed(e.to_string()))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}
