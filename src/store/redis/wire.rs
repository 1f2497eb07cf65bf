//! floodgate's own connection to one Redis server: the connection the store's pool lends
//! (see [`super::RedisStore`]), in place of redis-rs's multiplexed connection.
//!
//! Why: every request's script call went through redis-rs's `Cmd` (the arguments written into
//! it, then packed again into a fresh buffer), a channel to the connection's task and a
//! oneshot back, and a RESP parse of the reply into a `Value` — about a third of the client
//! work the Redis path adds to a request (docs/performance.md, "Where the Redis path's CPU
//! goes"). Here a call writes its command straight into the connection's output buffer
//! ([`Conn::request`]), the connection's task writes whatever is buffered in one write, and
//! each reply is handed back as the RESP bytes it came as: the script's packed doubles are
//! decoded from them in place ([`super::script::call`]). The script calls written together
//! are merged into one `EVALSHA` as the task takes them ([`Conn::script_call`]), each caller
//! still handed its own reply.
//!
//! What stays as it was: one connection carries many calls at once, in order (Redis answers
//! in order, so the n-th reply belongs to the n-th call still waiting); the connection's I/O
//! runs in a task of its own on the runtime that opened it (each thread's pool opens its own,
//! see `ThreadPools`); a call that gives up (its deadline) leaves its place in the queue, so
//! the replies after it still reach their callers. A call's deadline ([`Conn::until`]) is kept
//! by the connection's task on one timer for every call it carries, not by a timer per call.
//! The setup is redis-rs's, for what the store's URLs can say: TCP (`TCP_NODELAY`), TLS with
//! the same rustls settings ([`super::tls::client_config`]), a unix socket, `AUTH [user]
//! password` (retried without the user on a Redis older than 6, which knows no users),
//! `SELECT db`; RESP2 throughout. A transport failure fails every call waiting on the
//! connection and every later one, with an I/O error (the store retires the connection and
//! calls it an outage, as before).
//!
//! What a peer cannot do, whether a broken Redis or a man in the middle of a plaintext link:
//! make a connection hold more than one capped reply ([`MAX_REPLY`], or a script call's own
//! larger reply), refused at its header when it cannot fit; make it parse a byte twice (the
//! framing, `wire/frame.rs`, resumes where it stopped); or keep it reading after a call on it
//! missed its deadline: the connection then retires, takes no new call and closes once no
//! call waits on it (docs/redis.md, "What a connection reads, and for how long").
//!
//! Every other command of the store (the probe, `DEL`, the RLQS share tables' scripts,
//! `SCRIPT LOAD`, the pool's `PING`) goes through the same connection with redis-rs's
//! encoding and parsing: [`Conn`] is a redis-rs [`ConnectionLike`].

mod frame;

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use frame::{FrameError, Parser, parse_int};

/// One reply as it came: a whole RESP2 frame.
pub type Frame = Vec<u8>;

/// Why a connection stopped: every call on it fails with this, as an I/O error.
#[derive(Clone, Debug)]
struct Closed {
    kind: io::ErrorKind,
    text: String,
}

impl Closed {
    fn of(error: &io::Error) -> Closed {
        Closed {
            kind: error.kind(),
            text: error.to_string(),
        }
    }

    fn new(kind: io::ErrorKind, text: &str) -> Closed {
        Closed {
            kind,
            text: text.to_owned(),
        }
    }

    fn error(&self) -> RedisError {
        io::Error::new(self.kind, self.text.clone()).into()
    }

    /// What closes a connection that read a reply it cannot hand out (see [`frame`]).
    fn refused(error: FrameError) -> Closed {
        Closed {
            kind: io::ErrorKind::InvalidData,
            text: error.to_string(),
        }
    }
}

/// What a call sent on a connection that is retiring fails with (see [`State::retiring`]).
const RETIRED: &str = "the connection is retired: a call on it missed its deadline";

/// What a call that ran out of its deadline fails with (see [`is_late`]).
const LATE: &str = "the call's deadline passed before Redis answered";

/// Whether `error` is a call's deadline passing ([`Conn::until`]): the store answers it as the
/// call's timeout.
pub fn is_late(error: &RedisError) -> bool {
    error.is_timeout() && error.to_string().contains(LATE)
}

/// A call written and not yet answered.
struct Waiting {
    /// Where its reply goes; taken when its deadline passes (the reply, when it comes, is
    /// then dropped: the call keeps its place in the order of replies).
    reply: Option<oneshot::Sender<Result<Frame, Closed>>>,
    /// When it gives up, if it has a deadline.
    deadline: Option<Instant>,
    /// The first call of a merged script call ([`Conn::script_call`]): how many calls share
    /// its reply, itself and the ones after it (0: a reply of its own).
    shares: usize,
    /// In a merged script call, this call's bytes of the reply's payload.
    part: usize,
    /// The most bytes its reply may take ([`reply_cap`]); for a merged script call's first
    /// call, the whole merged reply's.
    most: usize,
}

/// The script calls ([`Conn::script_call`]) written since the connection's task last took
/// the output buffer, not yet in it: they go into it as one `EVALSHA` when the task takes it,
/// when another command is written after them, or when they reach a cap ([`MERGE_CALLS`],
/// [`MERGE_KEYS`], [`MERGE_BYTES`]). Their callers' [`Waiting`] entries are the last `calls`
/// of the queue.
#[derive(Default)]
struct Merging {
    /// The script's SHA1 (every call merged runs the same script).
    sha: &'static str,
    /// Every call's keys, RESP bulk strings, in order.
    keys: Vec<u8>,
    key_count: usize,
    /// One RESP bulk string per call: its packed operations.
    blobs: Vec<u8>,
    calls: usize,
}

/// The most calls merged into one script call. Redis runs a script to its end before it
/// serves anything else, so a merged call's size is how long it holds Redis (and the calls
/// behind it) at once: 64 requests of 4 token buckets are some 7 million instructions of
/// Redis (about 110,000 per request merged, docs/performance.md), milliseconds at most.
pub const MERGE_CALLS: usize = 64;

/// The most keys in one merged script call.
pub const MERGE_KEYS: usize = 512;

/// The most bytes of keys and operations in one merged script call.
pub const MERGE_BYTES: usize = 64 * 1024;

/// What the callers and the connection's task share. Only the connection's own thread
/// touches it in practice (the lock is never contended); it is a mutex because the store's
/// futures must be `Send`.
struct State {
    /// Commands written by callers, not yet taken by the task.
    out: Vec<u8>,
    /// Script calls written after `out`'s commands, still merging into one.
    merging: Merging,
    /// The callers waiting for a reply, in the order their commands were written.
    waiting: VecDeque<Waiting>,
    /// The earliest deadline of the calls written since the task last looked: it sets the
    /// task's timer sooner if it is set later than that (or not at all).
    soonest: Option<Instant>,
    /// Wakes the task; taken by the first caller that writes after the task last ran, so a
    /// pass's calls cost one wake-up.
    task: Option<Waker>,
    /// Set once the connection failed or every handle is gone.
    closed: Option<Closed>,
    /// Set once a call on it missed its deadline: the reply owed to that call is still to
    /// come before any later one, and a peer that missed one deadline is not trusted with
    /// more calls. Later calls fail at once, the calls waiting still get their replies (or
    /// their deadlines), and once none is left waiting the connection closes (the store
    /// marks it broken at the same time, and its pool replaces it).
    retiring: bool,
    /// When scripts were last loaded on it ([`Conn::may_load_script`]).
    script_loads: [Option<Instant>; SCRIPT_LOADS],
}

/// What a connection's handles and its task share: the state, and whether it is closed,
/// which the pool asks before every call it lends the connection to, without the lock.
struct Link {
    state: Mutex<State>,
    /// Set once `state.closed` is.
    closed: AtomicBool,
}

type Shared = Arc<Link>;

fn shared(state: State) -> Shared {
    Arc::new(Link {
        state: Mutex::new(state),
        closed: AtomicBool::new(false),
    })
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A connection: cheap to clone, every clone carries calls over the same socket. The socket
/// is closed when the last clone is dropped.
#[derive(Clone)]
pub struct Conn {
    handle: Arc<Handle>,
    db: i64,
    /// When the calls sent through this handle give up ([`Conn::until`]); `None`: never.
    deadline: Option<Instant>,
}

/// Closes the connection when the last [`Conn`] goes.
struct Handle(Shared);

impl Drop for Handle {
    fn drop(&mut self) {
        let mut state = lock(&self.0);
        if state.closed.is_none() {
            self.0.closed.store(true, Ordering::Release);
            state.closed = Some(Closed::new(
                io::ErrorKind::NotConnected,
                "connection dropped",
            ));
        }
        if let Some(task) = state.task.take() {
            task.wake();
        }
    }
}

impl Conn {
    /// Whether the connection has failed (or was closed): nothing sent on it can succeed.
    pub fn is_closed(&self) -> bool {
        self.handle.0.closed.load(Ordering::Acquire)
    }

    /// Every call sent through this handle from now on (redis-rs's commands through
    /// [`ConnectionLike`] included) fails at `deadline` if Redis has not answered it by then,
    /// with an error [`is_late`] recognises. The connection's task keeps the deadlines of all
    /// its calls on one timer: a timer per call, registered in tokio's timer wheel as the call
    /// waits and removed as it is answered, cost instructions on every call and, whenever it
    /// was the wheel's earliest, a write to the runtime's wake-up `eventfd` (about one call in
    /// five under load, docs/performance.md).
    pub fn until(&mut self, deadline: Instant) {
        self.deadline = Some(deadline);
    }

    /// Whether a script may be loaded over this connection at `now`, and if so, notes that
    /// one is: at most [`SCRIPT_LOADS`] loads in any [`SCRIPT_LOAD_WINDOW`] per connection. A
    /// Redis that forgets scripts as fast as they are loaded (or a peer answering `NOSCRIPT`
    /// to everything) would otherwise draw a load of the whole script for every call.
    pub fn may_load_script(&self, now: Instant) -> bool {
        let mut state = lock(&self.handle.0);
        // The oldest load noted (a slot never used is older than any).
        let Some(oldest) = state.script_loads.iter_mut().min() else {
            return false;
        };
        if oldest.is_some_and(|at| now < at + SCRIPT_LOAD_WINDOW) {
            return false;
        }
        *oldest = Some(now);
        true
    }

    /// The state, while calls may be sent: the connection neither closed nor retiring.
    fn sendable(&self) -> RedisResult<MutexGuard<'_, State>> {
        let state = lock(&self.handle.0);
        if let Some(closed) = &state.closed {
            return Err(closed.error());
        }
        if state.retiring {
            return Err(Closed::new(io::ErrorKind::ConnectionAborted, RETIRED).error());
        }
        Ok(state)
    }

    /// Sends the command `write` appends to the connection's output buffer (whole RESP2
    /// commands, exactly one) and returns its reply's frame, which may take [`MAX_REPLY`]
    /// bytes.
    pub async fn request(&self, write: impl FnOnce(&mut Vec<u8>)) -> RedisResult<Frame> {
        self.request_sized(0, write).await
    }

    /// [`Conn::request`] for a command answered with a bulk string of `reply_bytes` bytes (a
    /// script call sent alone): its reply may take that much, past [`MAX_REPLY`].
    pub async fn request_sized(
        &self,
        reply_bytes: usize,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> RedisResult<Frame> {
        let reply = {
            let mut state = self.sendable()?;
            // The script calls merging before it go first: the order of replies is the
            // order of commands.
            state.write_merged();
            let before = state.out.len();
            let written =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write(&mut state.out)));
            if let Err(panic) = written {
                // Half a command would take the next caller's command for its rest (and
                // that caller its reply): take it back before the panic goes on.
                state.out.truncate(before);
                drop(state);
                std::panic::resume_unwind(panic);
            }
            self.wait(&mut state, 0, reply_cap(reply_bytes))
        };
        answer(reply).await
    }

    /// Sends a call of the script `sha` with `keys` keys, which `write_keys` appends as RESP
    /// bulk strings, and the one argument after `now` (empty: Redis `TIME`), which
    /// `write_blob` appends as one RESP bulk string; returns its reply's frame, a bulk string
    /// of `reply_bytes` bytes (or whatever else Redis answered, an error for instance).
    ///
    /// The script calls written together (before the connection's task takes them, with no
    /// other command between them) are merged into one `EVALSHA` of every call's keys and
    /// arguments, `lua/apply.lua`'s batch convention: `EVALSHA sha K keys… "" blob_1 …
    /// blob_N`, whose reply is the calls' replies concatenated. Each call gets its own part
    /// as a bulk string of its own, so it reads exactly what a call alone reads; any other
    /// reply (an error, `NOSCRIPT` included) reaches every call merged, each then acting on
    /// it as a call alone would. A call alone is sent exactly as it always was. A call past
    /// its deadline fails alone; the others merged with it are answered.
    pub async fn script_call(
        &self,
        sha: &'static str,
        keys: usize,
        reply_bytes: usize,
        write_keys: impl FnOnce(&mut Vec<u8>),
        write_blob: impl FnOnce(&mut Vec<u8>),
    ) -> RedisResult<Frame> {
        let reply = {
            let mut guard = self.sendable()?;
            let state = &mut *guard;
            let merging = &state.merging;
            if merging.calls > 0
                && (merging.sha != sha
                    || merging.calls >= MERGE_CALLS
                    || merging.key_count + keys > MERGE_KEYS
                    || merging.keys.len() + merging.blobs.len() >= MERGE_BYTES)
            {
                state.write_merged();
            }
            let merging = &mut state.merging;
            let before = (merging.keys.len(), merging.blobs.len());
            let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                write_keys(&mut merging.keys);
                write_blob(&mut merging.blobs);
            }));
            if let Err(panic) = written {
                // As in `request`: half a call is taken back.
                merging.keys.truncate(before.0);
                merging.blobs.truncate(before.1);
                drop(guard);
                std::panic::resume_unwind(panic);
            }
            merging.sha = sha;
            merging.key_count += keys;
            merging.calls += 1;
            self.wait(state, reply_bytes, reply_cap(reply_bytes))
        };
        answer(reply).await
    }

    /// Queues the caller of the command just written (`part`: its bytes of a merged script
    /// call's reply; `most`: the most bytes its reply may take) and wakes the task.
    fn wait(
        &self,
        state: &mut State,
        part: usize,
        most: usize,
    ) -> oneshot::Receiver<Result<Frame, Closed>> {
        let (sender, reply) = oneshot::channel();
        state.waiting.push_back(Waiting {
            reply: Some(sender),
            deadline: self.deadline,
            shares: 0,
            part,
            most,
        });
        if let Some(deadline) = self.deadline
            && state.soonest.is_none_or(|soonest| deadline < soonest)
        {
            state.soonest = Some(deadline);
        }
        if let Some(task) = state.task.take() {
            task.wake();
        }
        reply
    }

    /// Sends a redis-rs command and parses its reply (server errors stay values, as
    /// [`ConnectionLike`] wants them).
    async fn command(&self, cmd: &Cmd) -> RedisResult<Value> {
        let frame = self.request(|out| cmd.write_packed_command(out)).await?;
        redis::parse_redis_value(&frame)
    }
}

/// The reply a call's caller waits for.
async fn answer(reply: oneshot::Receiver<Result<Frame, Closed>>) -> RedisResult<Frame> {
    match reply.await {
        Ok(Ok(frame)) => Ok(frame),
        Ok(Err(closed)) => Err(closed.error()),
        Err(_) => Err(Closed::new(io::ErrorKind::BrokenPipe, "connection closed").error()),
    }
}

impl State {
    /// Writes the script calls merging into `out` as one `EVALSHA` (one call: exactly its
    /// own command), and marks their first caller as sharing the reply with the others.
    fn write_merged(&mut self) {
        use std::io::Write as _;
        let merging = &mut self.merging;
        if merging.calls == 0 {
            return;
        }
        let out = &mut self.out;
        // Writes into a Vec<u8>, which cannot fail.
        let _ = write!(
            out,
            "*{}\r\n$7\r\nEVALSHA\r\n${}\r\n{}\r\n",
            4 + merging.key_count + merging.calls,
            merging.sha.len(),
            merging.sha
        );
        let count = merging.key_count.to_string();
        let _ = write!(out, "${}\r\n{count}\r\n", count.len());
        out.extend_from_slice(&merging.keys);
        out.extend_from_slice(b"$0\r\n\r\n");
        out.extend_from_slice(&merging.blobs);
        if merging.calls > 1
            && let Some(first) = self.waiting.len().checked_sub(merging.calls)
        {
            let payload = self.waiting.range(first..).map(|call| call.part).sum();
            let first = &mut self.waiting[first];
            first.shares = merging.calls;
            first.most = reply_cap(payload);
        }
        merging.keys.clear();
        merging.blobs.clear();
        if merging.keys.capacity() + merging.blobs.capacity() > OUT_KEEP {
            merging.keys = Vec::new();
            merging.blobs = Vec::new();
        }
        merging.key_count = 0;
        merging.calls = 0;
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.command(cmd))
    }

    /// Not used by the store: its commands go one at a time.
    fn req_packed_commands<'a>(
        &'a mut self,
        _pipeline: &'a Pipeline,
        _offset: usize,
        _count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async {
            Err(RedisError::from((
                ErrorKind::Client,
                "pipelines are not sent on floodgate's store connections",
            )))
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

/// The payload of a bulk-string reply frame (`$<n>\r\n<payload>\r\n`), `None` for any other
/// frame.
pub fn bulk_payload(frame: &[u8]) -> Option<&[u8]> {
    let rest = frame.strip_prefix(b"$")?;
    let end = rest.iter().position(|&b| b == b'\r')?;
    let n = usize::try_from(parse_int(&rest[..end])?).ok()?;
    rest.get(end + 2..end + 2 + n)
}

/// Connects to the server `info` names (TLS with `tls` for a `rediss://` address), within
/// `timeout` for the connection and its setup commands.
pub async fn connect(
    info: &ConnectionInfo,
    tls: &Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> RedisResult<Conn> {
    tokio::time::timeout(timeout, connect_now(info, tls))
        .await
        .unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connection to Redis timed out after {timeout:?}"),
            )
            .into())
        })
}

async fn connect_now(info: &ConnectionInfo, tls: &Arc<rustls::ClientConfig>) -> RedisResult<Conn> {
    let stream = match info.addr() {
        ConnectionAddr::Tcp(host, port) => Stream::Tcp(tcp(host, *port).await?),
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            ..
        } => {
            if *insecure {
                // What redis-rs answers too: floodgate is built without its insecure mode.
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "Cannot create insecure client without tls-rustls-insecure feature",
                )));
            }
            let name = rustls::pki_types::ServerName::try_from(host.clone()).map_err(|e| {
                RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "invalid TLS server name",
                    e.to_string(),
                ))
            })?;
            let socket = tcp(host, *port).await?;
            let stream = TlsConnector::from(Arc::clone(tls))
                .connect(name, socket)
                .await?;
            Stream::Tls(Box::new(stream))
        }
        ConnectionAddr::Unix(path) => unix(path).await?,
        other => {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "unsupported Redis address",
                other.to_string(),
            )));
        }
    };
    let shared = shared(State {
        out: Vec::with_capacity(4096),
        merging: Merging::default(),
        waiting: VecDeque::new(),
        soonest: None,
        task: None,
        closed: None,
        retiring: false,
        script_loads: [None; SCRIPT_LOADS],
    });
    tokio::spawn(Task::new(stream, Arc::clone(&shared)));
    let conn = Conn {
        handle: Arc::new(Handle(shared)),
        db: info.redis_settings().db(),
        deadline: None,
    };
    set_up(&conn, info).await?;
    Ok(conn)
}

async fn tcp(host: &str, port: u16) -> io::Result<TcpStream> {
    let socket = TcpStream::connect((host, port)).await?;
    socket.set_nodelay(true)?;
    Ok(socket)
}

#[cfg(unix)]
async fn unix(path: &Path) -> io::Result<Stream> {
    Ok(Stream::Unix(tokio::net::UnixStream::connect(path).await?))
}

#[cfg(not(unix))]
async fn unix(_path: &Path) -> io::Result<Stream> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "unix sockets are not supported on this platform",
    ))
}

/// `AUTH` and `SELECT`, answered as redis-rs answers them.
async fn set_up(conn: &Conn, info: &ConnectionInfo) -> RedisResult<()> {
    let settings = info.redis_settings();
    if let Some(password) = settings.password() {
        let auth = |user: Option<&str>| {
            let mut cmd = redis::cmd("AUTH");
            if let Some(user) = user {
                cmd.arg(user);
            }
            cmd.arg(password);
            cmd
        };
        let mut reply = conn.command(&auth(settings.username())).await?;
        if settings.username().is_some() && refused_user(&reply) {
            // A Redis before 6 knows no users: redis-rs retries with the password alone.
            reply = conn.command(&auth(None)).await?;
        }
        if !matches!(reply, Value::Okay) {
            return Err(RedisError::from((
                ErrorKind::AuthenticationFailed,
                "Password authentication failed",
            )));
        }
    }
    if settings.db() != 0 {
        let reply = conn
            .command(redis::cmd("SELECT").arg(settings.db()))
            .await?;
        if let Value::ServerError(error) = reply {
            return Err(RedisError::from((
                ErrorKind::Server(ServerErrorKind::ResponseError),
                "Redis server refused to switch database",
                error.details().unwrap_or_default().to_owned(),
            )));
        }
    }
    Ok(())
}

/// Whether `AUTH user password` was refused for its arity (a Redis before 6).
fn refused_user(reply: &Value) -> bool {
    let arity = "wrong number of arguments for 'auth' command";
    matches!(reply, Value::ServerError(error)
        if error.details().is_some_and(|detail| detail.contains(arity)))
}

/// The bytes read at most in one read; a reply larger than this grows the buffer.
const READ_BUFFER: usize = 16 * 1024;

/// The most an output buffer keeps once its commands are out: above it, a burst's memory
/// goes back rather than staying with the connection.
const OUT_KEEP: usize = 256 * 1024;

/// The most bytes a reply may take, unless its call expects a longer one (a script call's
/// own reply, when larger). What floodgate asks Redis for is answered in far less, the
/// largest being a merged script call's ([`LARGEST_MERGED_REPLY`]: 22,016 bytes of
/// payload); `SCRIPT LOAD` answers a 40-byte SHA1, RLQS's share script at most 100
/// integers, an error a line of a few hundred bytes. A longer reply comes from a peer that
/// is not a sane Redis (or from a man in the middle): it is refused as soon as its headers
/// say so, and the connection closes. The read buffer holds one reply and one read past it,
/// so it never grows past twice this (or twice the largest reply a waiting call expects).
pub const MAX_REPLY: usize = 32 * 1024;

/// The framing of a bulk-string reply around its payload: `$`, up to 20 digits, two CR LFs.
const BULK_FRAMING: usize = 25;

/// The largest reply of a merged script call: `lua/apply.lua` answers three values per call
/// (its header: `script::reply_len`) and five per key, eight bytes each, so [`MERGE_CALLS`]
/// calls of [`MERGE_KEYS`] keys in all get (3 · 64 + 5 · 512) · 8 = 22,016 bytes, in a bulk
/// string.
pub const LARGEST_MERGED_REPLY: usize = (3 * MERGE_CALLS + 5 * MERGE_KEYS) * 8 + BULK_FRAMING;

// Every merged script call's reply fits in the cap every reply has.
const _: () = assert!(LARGEST_MERGED_REPLY <= MAX_REPLY);

/// The most bytes the reply of a call expecting a bulk string of `payload` bytes may take:
/// [`MAX_REPLY`], or the bulk string framed if that is longer (a script call alone of more
/// keys than a merged call holds).
fn reply_cap(payload: usize) -> usize {
    MAX_REPLY.max(payload.saturating_add(BULK_FRAMING))
}

/// The most script loads one connection makes in any [`SCRIPT_LOAD_WINDOW`]
/// ([`Conn::may_load_script`]): the first call's load and one after a `SCRIPT FLUSH` fit in
/// the same second; a Redis that keeps forgetting the script gets two ~40 KB loads a second
/// per connection.
pub const SCRIPT_LOADS: usize = 2;

/// The span [`SCRIPT_LOADS`] counts loads in.
pub const SCRIPT_LOAD_WINDOW: Duration = Duration::from_secs(1);

/// The connection's socket.
enum Stream {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
}

impl Stream {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }

    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }
}

/// The connection's task: writes what callers buffered, reads replies and hands each to the
/// caller waiting longest, and fails the calls whose deadline passed. Ends when the connection
/// fails or its last handle is dropped.
///
/// The deadlines are kept on one timer, set to the earliest deadline of a waiting call and not
/// moved as calls are answered: when it fires, the calls past their deadline fail and it is
/// set to the earliest deadline left. Under load it fires about once per deadline's length,
/// where a timer per call was registered and removed for every call.
struct Task {
    stream: Stream,
    shared: Shared,
    /// Fires at `armed`, the earliest deadline of a call waiting when it was set (made when
    /// first needed).
    timer: Option<Pin<Box<Sleep>>>,
    armed: Option<Instant>,
    /// Commands being written; `written` of them are out.
    writing: Vec<u8>,
    written: usize,
    /// Written bytes may sit in the TLS session until flushed.
    flush: bool,
    /// Read bytes; `start..end` not yet handed out.
    read: Vec<u8>,
    start: usize,
    end: usize,
    /// Where the parse of the reply at `start` stands: each read resumes it.
    parser: Parser,
    /// The callers of the merged script call being answered ([`share`]), kept for the next.
    sharing: Vec<Waiting>,
}

impl Future for Task {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let task = self.get_mut();
        match task.drive(cx) {
            Ok(()) => Poll::Pending,
            Err(closed) => {
                task.close(closed);
                Poll::Ready(())
            }
        }
    }
}

/// A task dropped before it finished (its runtime shut down, or it panicked) closes the
/// connection too: nothing will read the replies of the calls waiting on it, so they fail
/// now rather than at their deadline, and the pool sees the connection closed.
impl Drop for Task {
    fn drop(&mut self) {
        self.close(Closed::new(
            io::ErrorKind::NotConnected,
            "the connection's task ended (its runtime shut down?)",
        ));
    }
}

impl Task {
    /// The task of a connection over `stream`, its buffers empty.
    fn new(stream: Stream, shared: Shared) -> Task {
        Task {
            stream,
            shared,
            timer: None,
            armed: None,
            writing: Vec::with_capacity(4096),
            written: 0,
            flush: false,
            read: vec![0; READ_BUFFER],
            start: 0,
            end: 0,
            parser: Parser::new(),
            sharing: Vec::new(),
        }
    }

    /// Marks the connection closed (by the first reason given) and fails every waiting call.
    fn close(&self, closed: Closed) {
        let (closed, waiting) = {
            let mut state = lock(&self.shared);
            let closed = state.closed.get_or_insert(closed).clone();
            self.shared.closed.store(true, Ordering::Release);
            state.task = None;
            // Never written: their callers are among the waiting, failed below.
            state.merging = Merging::default();
            (closed, std::mem::take(&mut state.waiting))
        };
        for caller in waiting {
            if let Some(reply) = caller.reply {
                let _ = reply.send(Err(closed.clone()));
            }
        }
    }

    /// Sets the timer to fire at `at`.
    fn arm(&mut self, at: Instant) {
        match &mut self.timer {
            Some(timer) => timer.as_mut().reset(at),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(at))),
        }
        self.armed = Some(at);
    }

    /// Fails the waiting calls whose deadline is `now` or past (the connection then retires,
    /// [`State::retiring`]), and returns the earliest deadline of those still waiting.
    fn expire(&self, now: Instant) -> Option<Instant> {
        let late = Closed::new(io::ErrorKind::TimedOut, LATE);
        let mut state = lock(&self.shared);
        let mut next: Option<Instant> = None;
        let mut retire = false;
        for call in &mut state.waiting {
            let Some(deadline) = call.deadline else {
                continue;
            };
            if call.reply.as_ref().is_none_or(|reply| reply.is_closed()) {
                // Answered by its deadline already, or its caller gave up: nothing to fail.
                continue;
            }
            if deadline <= now {
                if let Some(reply) = call.reply.take() {
                    let _ = reply.send(Err(late.clone()));
                }
                retire = true;
            } else if next.is_none_or(|next| deadline < next) {
                next = Some(deadline);
            }
        }
        if retire && !state.retiring {
            state.retiring = true;
            self.shared.closed.store(true, Ordering::Release);
        }
        next
    }

    /// Whether the connection is retiring ([`State::retiring`]) with no call left waiting for
    /// a reply: it closes.
    fn retired(state: &State) -> bool {
        state.retiring
            && state
                .waiting
                .iter()
                .all(|call| call.reply.as_ref().is_none_or(|reply| reply.is_closed()))
    }

    /// Sets the timer sooner if `soonest` (the earliest deadline of the calls written since
    /// the last look) is before it, or sets it if it is not set.
    fn note(&mut self, soonest: Option<Instant>) {
        if let Some(at) = soonest
            && self.armed.is_none_or(|armed| at < armed)
        {
            self.arm(at);
        }
    }

    /// Fails the calls past their deadline if the timer's time has come by the clock (its
    /// poll cannot tell while the task keeps reading: once the task's budget is spent it
    /// answers pending, and the runtime does not fire it meanwhile), and sets the timer for
    /// the earliest deadline left.
    fn expire_overdue(&mut self) {
        let now = Instant::now();
        if self.armed.is_some_and(|at| at <= now) {
            self.armed = None;
            if let Some(next) = self.expire(now) {
                self.arm(next);
            }
        }
    }

    /// Fails the calls past their deadline once the timer fires, and sets it again for the
    /// earliest deadline left. Returns whether it fired (the timer, set again, must be polled
    /// again).
    fn watch_deadlines(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(timer) = &mut self.timer else {
            return false;
        };
        if self.armed.is_none() || timer.as_mut().poll(cx).is_pending() {
            return false;
        }
        self.armed = None;
        if let Some(next) = self.expire(Instant::now()) {
            self.arm(next);
        }
        true
    }

    /// Works until the socket has nothing more to give or take; an error closes the
    /// connection.
    fn drive(&mut self, cx: &mut Context<'_>) -> Result<(), Closed> {
        loop {
            let mut progress = false;
            let soonest = {
                let mut state = lock(&self.shared);
                if let Some(closed) = &state.closed {
                    return Err(closed.clone());
                }
                if Task::retired(&state) {
                    return Err(Closed::new(io::ErrorKind::ConnectionAborted, RETIRED));
                }
                if self.written == self.writing.len() {
                    // Everything taken before is out: take what callers wrote since, the
                    // script calls written together merged into one.
                    state.write_merged();
                    self.writing.clear();
                    self.written = 0;
                    if self.writing.capacity() > OUT_KEEP {
                        self.writing = Vec::with_capacity(4096);
                    }
                    std::mem::swap(&mut self.writing, &mut state.out);
                }
                if !state
                    .task
                    .as_ref()
                    .is_some_and(|task| task.will_wake(cx.waker()))
                {
                    state.task = Some(cx.waker().clone());
                }
                state.soonest.take()
            };
            self.note(soonest);
            while self.written < self.writing.len() {
                match self.stream.poll_write(cx, &self.writing[self.written..]) {
                    Poll::Ready(Ok(0)) => {
                        return Err(Closed::new(io::ErrorKind::WriteZero, "Redis took no bytes"));
                    }
                    Poll::Ready(Ok(n)) => {
                        self.written += n;
                        self.flush = true;
                        progress = true;
                    }
                    Poll::Ready(Err(e)) => return Err(Closed::of(&e)),
                    Poll::Pending => break,
                }
            }
            if self.flush {
                match self.stream.poll_flush(cx) {
                    Poll::Ready(Ok(())) => self.flush = false,
                    Poll::Ready(Err(e)) => return Err(Closed::of(&e)),
                    Poll::Pending => {}
                }
            }
            if self.end == self.read.len() {
                // Full: move what is unparsed to the front, or grow for a large reply.
                if self.start > 0 {
                    self.read.copy_within(self.start..self.end, 0);
                    self.end -= self.start;
                    self.start = 0;
                } else {
                    self.read.resize(self.read.len() * 2, 0);
                }
            }
            let mut buf = ReadBuf::new(&mut self.read[self.end..]);
            match self.stream.poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) => {
                    let n = buf.filled().len();
                    if n == 0 {
                        return Err(Closed::new(
                            io::ErrorKind::UnexpectedEof,
                            "Redis closed the connection",
                        ));
                    }
                    self.end += n;
                    progress = true;
                    if !self.hand_out()? {
                        // Bytes that complete no reply: a socket may deliver such bytes
                        // without end (a reply that never ends) and never run dry, so the
                        // deadlines are kept here too.
                        self.expire_overdue();
                    }
                }
                Poll::Ready(Err(e)) => return Err(Closed::of(&e)),
                Poll::Pending => {}
            }
            if !progress {
                // Once the socket has no more to give (or bytes came that complete no reply,
                // above): a reply that came by the time the timer fired is its call's,
                // however many reads of whole replies it took to reach it.
                if self.watch_deadlines(cx) {
                    continue;
                }
                return Ok(());
            }
        }
    }

    /// Hands every whole reply read so far to its caller (a merged script call's to each of
    /// its callers, [`share`]); returns whether there was one.
    ///
    /// Each reply may take what its caller can use ([`Waiting::most`]; [`MAX_REPLY`] for a
    /// reply nobody waits for): a reply that cannot fit closes the connection as soon as its
    /// headers say so, and the parse resumes on each read where the last one stopped.
    fn hand_out(&mut self) -> Result<bool, Closed> {
        let mut any = false;
        let head_cap = |state: &State| state.waiting.front().map_or(MAX_REPLY, |call| call.most);
        let mut cap = head_cap(&lock(&self.shared));
        while let Some(len) = self
            .parser
            .frame_len(&self.read[self.start..self.end], cap)
            .map_err(Closed::refused)?
        {
            let frame = &self.read[self.start..self.start + len];
            self.start += len;
            let caller = {
                let mut state = lock(&self.shared);
                let caller = state.waiting.pop_front().ok_or_else(|| unasked(frame))?;
                if caller.shares > 1 {
                    // Queued together, so all there.
                    let more = caller.shares - 1;
                    self.sharing.push(caller);
                    for _ in 0..more {
                        let next = state.waiting.pop_front().ok_or_else(|| unasked(frame))?;
                        self.sharing.push(next);
                    }
                    cap = head_cap(&state);
                    None
                } else {
                    cap = head_cap(&state);
                    Some(caller)
                }
            };
            match caller {
                // A caller that gave up (its deadline) is gone: its reply is dropped.
                Some(caller) => {
                    if let Some(reply) = caller.reply {
                        let _ = reply.send(Ok(frame.to_vec()));
                    }
                }
                None => share(frame, &mut self.sharing),
            }
            any = true;
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.read.len() > READ_BUFFER {
                // Grown for a large reply, which is handed out: back to the usual size.
                self.read = vec![0; READ_BUFFER];
            }
        }
        Ok(any)
    }
}

/// Hands each caller of a merged script call its part of the reply `frame`: its
/// [`Waiting::part`] bytes of the bulk string, in order, as a bulk string of its own. Any other
/// reply (an error, or one whose length is not the parts' sum) goes to every caller as it
/// is: each then reads it as the reply of a call alone.
fn share(frame: &[u8], callers: &mut Vec<Waiting>) {
    use std::io::Write as _;
    let total: usize = callers.iter().map(|caller| caller.part).sum();
    match bulk_payload(frame) {
        Some(payload) if payload.len() == total => {
            let mut at = 0;
            for caller in callers.drain(..) {
                let part = &payload[at..at + caller.part];
                at += caller.part;
                if let Some(reply) = caller.reply {
                    let mut own = Vec::with_capacity(part.len() + 16);
                    // Writes into a Vec<u8>, which cannot fail.
                    let _ = write!(own, "${}\r\n", part.len());
                    own.extend_from_slice(part);
                    own.extend_from_slice(b"\r\n");
                    let _ = reply.send(Ok(own));
                }
            }
        }
        _ => {
            for caller in callers.drain(..) {
                if let Some(reply) = caller.reply {
                    let _ = reply.send(Ok(frame.to_vec()));
                }
            }
        }
    }
}

/// Why a reply no call waits for closes the connection. Redis sends one only as it closes
/// the connection itself (`-ERR max number of clients reached`): its text says why.
fn unasked(frame: &[u8]) -> Closed {
    let Some(error) = frame.strip_prefix(b"-") else {
        return Closed::new(
            io::ErrorKind::InvalidData,
            "Redis sent a reply nobody asked for",
        );
    };
    let error = String::from_utf8_lossy(&error[..error.len().min(200)]);
    Closed {
        kind: io::ErrorKind::InvalidData,
        text: format!("Redis sent an error nobody asked for: {}", error.trim_end()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The length of the whole command at the start of `buf` (the test peers read commands
    /// with the replies' framing: both are RESP2).
    fn frame_len(buf: &[u8]) -> Result<Option<usize>, FrameError> {
        Parser::new().frame_len(buf, usize::MAX)
    }

    /// A peer on a loopback port that, once it has read `commands` commands, reports it on
    /// `read` and then, when `go` says so, writes `replies` one byte at a time.
    async fn peer(
        commands: usize,
        replies: &'static [u8],
    ) -> (ConnectionInfo, oneshot::Receiver<()>, oneshot::Sender<()>) {
        use redis::IntoConnectionInfo;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("redis://{}/", listener.local_addr().unwrap());
        let (read_tx, read) = oneshot::channel();
        let (go, go_rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 1024];
            let mut count = 0;
            while count < commands {
                let n = socket.read(&mut buf).await.unwrap();
                assert!(n > 0, "the connection closed early");
                seen.extend_from_slice(&buf[..n]);
                count = 0;
                let mut at = 0;
                while let Some(len) = frame_len(&seen[at..]).unwrap() {
                    at += len;
                    count += 1;
                }
            }
            read_tx.send(()).unwrap();
            go_rx.await.unwrap();
            for byte in replies {
                socket.write_all(&[*byte]).await.unwrap();
                socket.flush().await.unwrap();
            }
            // Keep the socket open until the test is done with it.
            let _ = socket.read(&mut buf).await;
        });
        (url.into_connection_info().unwrap(), read, go)
    }

    fn echo(word: &'static str) -> impl FnOnce(&mut Vec<u8>) {
        move |out| redis::cmd("ECHO").arg(word).write_packed_command(out)
    }

    /// Replies that arrive a byte at a time still reach their callers in order, and a caller
    /// that gave up (its task dropped, as a deadline drops it) keeps its place: the callers
    /// after it get their own replies, not its.
    #[tokio::test]
    async fn replies_reach_their_callers_in_order() {
        let (info, read, go) = peer(3, b"$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n").await;
        let conn = open(&info).await;
        let (first, second, third) = (conn.clone(), conn.clone(), conn.clone());
        let gave_up = tokio::spawn(async move { first.request(echo("a")).await });
        // Yield until the first command is queued before the others.
        while lock(&conn.handle.0).waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        let b = tokio::spawn(async move { second.request(echo("b")).await });
        while lock(&conn.handle.0).waiting.len() < 2 {
            tokio::task::yield_now().await;
        }
        let c = tokio::spawn(async move { third.request(echo("c")).await });
        read.await.unwrap();
        gave_up.abort();
        assert!(gave_up.await.unwrap_err().is_cancelled());
        go.send(()).unwrap();
        assert_eq!(b.await.unwrap().unwrap(), b"$1\r\nb\r\n");
        assert_eq!(c.await.unwrap().unwrap(), b"$1\r\nc\r\n");
        assert!(!conn.is_closed());
    }

    /// A script call ([`Conn::script_call`]) whose keys and blob are `word`'s letters.
    fn script_call<'a>(
        conn: &'a Conn,
        word: &'static str,
        reply_bytes: usize,
    ) -> impl Future<Output = RedisResult<Frame>> + 'a {
        conn.script_call(
            "sha",
            1,
            reply_bytes,
            move |out| out.extend_from_slice(format!("$1\r\n{word}\r\n").as_bytes()),
            move |out| out.extend_from_slice(format!("$1\r\n{word}\r\n").as_bytes()),
        )
    }

    /// Script calls written together go out as one command, and its reply is split among
    /// them by their reply sizes, each part a bulk string of its own.
    #[tokio::test]
    async fn merged_script_calls_get_their_own_parts() {
        let (info, read, go) = peer(1, b"$6\r\nabcdef\r\n").await;
        let conn = open(&info).await;
        let calls = async {
            tokio::join!(
                script_call(&conn, "a", 2),
                script_call(&conn, "b", 3),
                script_call(&conn, "c", 1)
            )
        };
        let go = async {
            read.await.unwrap();
            go.send(()).unwrap();
        };
        // Bounded, so that calls sent apart (the peer answers one command) fail the test.
        let ((a, b, c), ()) =
            tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(calls, go) })
                .await
                .expect("the calls were not merged into one command");
        assert_eq!(a.unwrap(), b"$2\r\nab\r\n");
        assert_eq!(b.unwrap(), b"$3\r\ncde\r\n");
        assert_eq!(c.unwrap(), b"$1\r\nf\r\n");
    }

    /// A command written between script calls keeps its place: the calls before it go out
    /// (merged) before it, the ones after it merge apart, and every reply reaches its caller.
    #[tokio::test]
    async fn a_command_between_script_calls_keeps_its_place() {
        let (info, read, go) = peer(3, b"$2\r\nxx\r\n$5\r\nhello\r\n$4\r\nyyyz\r\n").await;
        let conn = open(&info).await;
        let calls = async {
            tokio::join!(
                script_call(&conn, "a", 2),
                conn.request(echo("hello")),
                script_call(&conn, "b", 3),
                script_call(&conn, "c", 1)
            )
        };
        let go = async {
            read.await.unwrap();
            go.send(()).unwrap();
        };
        // Bounded, so that commands sent otherwise than as three fail the test.
        let ((a, echoed, b, c), ()) =
            tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(calls, go) })
                .await
                .expect("not three commands: a, the ECHO, then b and c merged");
        assert_eq!(a.unwrap(), b"$2\r\nxx\r\n");
        assert_eq!(echoed.unwrap(), b"$5\r\nhello\r\n");
        assert_eq!(b.unwrap(), b"$3\r\nyyy\r\n");
        assert_eq!(c.unwrap(), b"$1\r\nz\r\n");
    }

    /// A merged call's caller that gave up before the reply (its future dropped, as a
    /// deadline or a client that left drops it) keeps its part: the calls after it get their
    /// own bytes, not its.
    #[tokio::test]
    async fn a_dropped_call_in_a_merged_call_keeps_its_part() {
        use futures_util::FutureExt as _;
        let (info, read, go) = peer(1, b"$6\r\nabcdef\r\n").await;
        let conn = open(&info).await;
        let mut a = Box::pin(script_call(&conn, "a", 2));
        assert!((&mut a).now_or_never().is_none());
        // Written, then dropped before the connection's task ever ran.
        assert!(script_call(&conn, "b", 3).now_or_never().is_none());
        let mut c = Box::pin(script_call(&conn, "c", 1));
        assert!((&mut c).now_or_never().is_none());
        let go = async {
            read.await.unwrap();
            go.send(()).unwrap();
        };
        let ((a, c), ()) = tokio::time::timeout(Duration::from_secs(60), async {
            tokio::join!(async { tokio::join!(a, c) }, go)
        })
        .await
        .expect("the calls were not merged into one command");
        assert_eq!(a.unwrap(), b"$2\r\nab\r\n");
        assert_eq!(c.unwrap(), b"$1\r\nf\r\n");
    }

    /// More script calls than [`MERGE_CALLS`] written together go out as two commands: the
    /// first [`MERGE_CALLS`] merged, the next one in a command of its own; each caller gets
    /// its own byte of the first reply, the last one the second reply.
    #[tokio::test]
    async fn calls_past_the_cap_start_another_command() {
        let mut replies = format!("${MERGE_CALLS}\r\n").into_bytes();
        replies.extend((0..MERGE_CALLS).map(|i| b'A' + (i % 26) as u8));
        replies.extend_from_slice(b"\r\n$1\r\nZ\r\n");
        let (info, read, go) = peer(2, Vec::leak(replies)).await;
        let conn = open(&info).await;
        let calls =
            futures_util::future::join_all((0..=MERGE_CALLS).map(|_| script_call(&conn, "k", 1)));
        let go = async {
            read.await.unwrap();
            go.send(()).unwrap();
        };
        let (answers, ()) =
            tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(calls, go) })
                .await
                .expect("not two commands");
        for (i, answer) in answers.into_iter().enumerate() {
            let expected = if i < MERGE_CALLS {
                b'A' + (i % 26) as u8
            } else {
                b'Z'
            };
            assert_eq!(
                answer.unwrap(),
                [b'$', b'1', b'\r', b'\n', expected, b'\r', b'\n'],
                "call {i}"
            );
        }
    }

    /// An error reply to a merged script call reaches every call in it, as it came.
    #[tokio::test]
    async fn an_error_for_a_merged_call_reaches_every_call() {
        let (info, read, go) = peer(1, b"-NOSCRIPT No matching script\r\n").await;
        let conn = open(&info).await;
        let calls = async { tokio::join!(script_call(&conn, "a", 8), script_call(&conn, "b", 8)) };
        let go = async {
            read.await.unwrap();
            go.send(()).unwrap();
        };
        let ((a, b), ()) =
            tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(calls, go) })
                .await
                .expect("the calls were not merged into one command");
        for frame in [a.unwrap(), b.unwrap()] {
            assert_eq!(frame, b"-NOSCRIPT No matching script\r\n");
        }
    }

    /// The merged calls' command is `EVALSHA sha K keys… "" blob_1 … blob_N`, and one call
    /// alone is exactly its own `EVALSHA sha k keys… "" blob`; the first caller of a merged
    /// call is marked as sharing the reply with the others.
    #[test]
    fn merged_calls_are_one_evalsha() {
        let mut state = State {
            out: Vec::new(),
            merging: Merging::default(),
            waiting: VecDeque::new(),
            soonest: None,
            task: None,
            closed: None,
            retiring: false,
            script_loads: [None; SCRIPT_LOADS],
        };
        for (calls, expected) in [
            (&[("k1", "b1")][..], &["k1", "", "b1"][..]),
            (
                &[("k1", "b1"), ("k2", "b2"), ("k3", "b3")][..],
                &["k1", "k2", "k3", "", "b1", "b2", "b3"][..],
            ),
        ] {
            for (key, blob) in calls {
                let m = &mut state.merging;
                m.sha = "sha";
                m.keys
                    .extend_from_slice(format!("$2\r\n{key}\r\n").as_bytes());
                m.key_count += 1;
                m.blobs
                    .extend_from_slice(format!("$2\r\n{blob}\r\n").as_bytes());
                m.calls += 1;
                state.waiting.push_back(Waiting {
                    reply: None,
                    deadline: None,
                    shares: 0,
                    part: 8,
                    most: MAX_REPLY,
                });
            }
            state.write_merged();
            let mut command = redis::cmd("EVALSHA");
            command.arg("sha").arg(calls.len()).arg(expected);
            assert_eq!(state.out, command.get_packed_command());
            let shares = if calls.len() > 1 { calls.len() } else { 0 };
            assert_eq!(state.waiting[0].shares, shares);
            assert_eq!(state.merging.calls, 0);
            state.out.clear();
            state.waiting.clear();
        }
    }

    /// A call whose deadline passes before its reply fails with the deadline's error, kept by
    /// the connection's task (no timer of the caller's own), and keeps its place: the call
    /// after it, without a deadline, still gets its own reply, not the late call's.
    #[tokio::test]
    async fn a_late_call_fails_at_its_deadline_and_keeps_its_place() {
        let (info, read, go) = peer(2, b"$1\r\na\r\n$1\r\nb\r\n").await;
        let conn = open(&info).await;
        let mut late = conn.clone();
        late.until(Instant::now() + Duration::from_millis(50));
        let late = tokio::spawn(async move { late.request(echo("a")).await });
        while lock(&conn.handle.0).waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        let next = tokio::spawn({
            let conn = conn.clone();
            async move { conn.request(echo("b")).await }
        });
        read.await.unwrap();
        // Bounded, so that a deadline nobody keeps fails the test instead of hanging it.
        let error = tokio::time::timeout(Duration::from_secs(60), late)
            .await
            .expect("the late call never failed")
            .unwrap()
            .unwrap_err();
        assert!(is_late(&error), "{error}");
        go.send(()).unwrap();
        assert_eq!(next.await.unwrap().unwrap(), b"$1\r\nb\r\n");
    }

    /// A connection on which a call missed its deadline retires: it says it is closed at
    /// once, later calls fail at once (an I/O error, which retires it from the pool), the
    /// call still waiting gets its own reply, and the connection then closes, though its
    /// handles are alive: a peer that missed a deadline is not read any longer.
    #[tokio::test]
    async fn a_connection_retires_after_a_late_call() {
        let (info, read, go) = peer(2, b"$1\r\na\r\n$1\r\nb\r\n").await;
        let conn = open(&info).await;
        let mut late = conn.clone();
        late.until(Instant::now() + Duration::from_millis(50));
        let late = tokio::spawn(async move { late.request(echo("a")).await });
        while lock(&conn.handle.0).waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        let mut next = conn.clone();
        next.until(Instant::now() + Duration::from_secs(600));
        let next = tokio::spawn(async move { next.request(echo("b")).await });
        read.await.unwrap();
        let error = tokio::time::timeout(Duration::from_secs(60), late)
            .await
            .expect("the late call never failed")
            .unwrap()
            .unwrap_err();
        assert!(is_late(&error), "{error}");
        assert!(conn.is_closed());
        assert!(lock(&conn.handle.0).closed.is_none(), "a call still waits");
        let refused = conn.request(echo("c")).await.unwrap_err();
        assert!(refused.is_io_error() && refused.to_string().contains(RETIRED));
        go.send(()).unwrap();
        assert_eq!(next.await.unwrap().unwrap(), b"$1\r\nb\r\n");
        closes(&conn).await;
    }

    /// A retiring connection whose only waiting call expires closes at that deadline, while
    /// its peer stays silent and its handles stay alive.
    #[tokio::test]
    async fn a_connection_closes_when_its_last_waiting_call_expires() {
        let (conn, _socket) = connected().await;
        let mut late = conn.clone();
        late.until(Instant::now() + Duration::from_millis(20));
        let error = late.request(echo("a")).await.unwrap_err();
        assert!(is_late(&error), "{error}");
        closes(&conn).await;
    }

    /// A connection may load a script [`SCRIPT_LOADS`] times in any [`SCRIPT_LOAD_WINDOW`].
    #[tokio::test]
    async fn script_loads_are_bounded_per_connection() {
        let (conn, _socket) = connected().await;
        let (now, half) = (Instant::now(), SCRIPT_LOAD_WINDOW / 2);
        assert!(conn.may_load_script(now));
        assert!(conn.may_load_script(now + half));
        assert!(!conn.may_load_script(now + half));
        assert!(!conn.may_load_script(now + SCRIPT_LOAD_WINDOW - Duration::from_millis(1)));
        assert!(conn.may_load_script(now + SCRIPT_LOAD_WINDOW));
        assert!(!conn.may_load_script(now + SCRIPT_LOAD_WINDOW));
        assert!(conn.may_load_script(now + SCRIPT_LOAD_WINDOW + half));
    }

    /// A call with a sooner deadline than the calls before it fails at its own deadline: the
    /// connection's timer, set for the later one, is set sooner.
    #[tokio::test]
    async fn a_sooner_deadline_sets_the_timer_sooner() {
        let (info, read, go) = peer(2, b"$1\r\na\r\n$1\r\nb\r\n").await;
        let conn = open(&info).await;
        let mut patient = conn.clone();
        patient.until(Instant::now() + Duration::from_secs(3600));
        let patient = tokio::spawn(async move { patient.request(echo("a")).await });
        while lock(&conn.handle.0).waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        let mut hurried = conn.clone();
        hurried.until(Instant::now() + Duration::from_millis(50));
        let hurried = tokio::spawn(async move { hurried.request(echo("b")).await });
        read.await.unwrap();
        // Bounded, so that a timer left at the later deadline fails the test.
        let error = tokio::time::timeout(Duration::from_secs(60), hurried)
            .await
            .expect("the sooner deadline was not kept")
            .unwrap()
            .unwrap_err();
        assert!(is_late(&error), "{error}");
        go.send(()).unwrap();
        assert_eq!(patient.await.unwrap().unwrap(), b"$1\r\na\r\n");
    }

    /// A peer flooding a reply that never ends closes the connection as soon as the reply
    /// cannot fit in what its call can take: an array announcing 2^31 − 1 elements, a bulk
    /// string announced at 512 MiB (both refused at their header), an array within the cap
    /// whose elements outgrow it, and bytes with no line end. The waiting call fails at once
    /// with an I/O error, long before its deadline, and the peer is cut off having sent at
    /// most what the cap and the sockets' buffers hold (loopback buffers take a few MiB).
    #[tokio::test]
    async fn a_reply_that_cannot_fit_closes_the_connection() {
        use redis::IntoConnectionInfo;
        use std::io::{Read, Write};
        for (head, flood) in [
            ("*2147483647\r\n", ":1\r\n"),
            ("$536870912\r\n", "x"),
            ("*8000\r\n", ":1000000\r\n"),
            ("+", "garbage"),
        ] {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let info = format!("redis://{}/", listener.local_addr().unwrap())
                .into_connection_info()
                .unwrap();
            // Reads the command, then floods until the connection is closed; returns the
            // bytes it got out.
            let peer = std::thread::spawn(move || {
                let (mut socket, _) = listener.accept().unwrap();
                let _ = socket.read(&mut [0; 1024]).unwrap();
                let mut sent = head.len() as u64;
                socket.write_all(head.as_bytes()).unwrap();
                let chunk = flood.repeat(64 * 1024 / flood.len());
                while socket.write_all(chunk.as_bytes()).is_ok() {
                    sent += chunk.len() as u64;
                    assert!(sent < 1 << 30, "the connection read 1 GiB of {head:?}");
                }
                sent
            });
            let mut conn = open(&info).await;
            conn.until(Instant::now() + Duration::from_secs(600));
            let error = tokio::time::timeout(Duration::from_secs(60), conn.request(echo("a")))
                .await
                .expect("the call never failed")
                .unwrap_err();
            assert!(error.is_io_error() && !is_late(&error), "{head:?}: {error}");
            assert!(conn.is_closed());
            let sent = tokio::task::spawn_blocking(move || peer.join().unwrap())
                .await
                .unwrap();
            assert!(sent < 16 << 20, "{head:?}: the peer got {sent} bytes out");
        }
    }

    /// A reply's cap: [`MAX_REPLY`], or a larger expected bulk string with its framing.
    #[test]
    fn a_reply_cap_is_the_cap_or_the_expected_reply() {
        assert_eq!(reply_cap(0), MAX_REPLY);
        assert_eq!(reply_cap(1 << 20), (1 << 20) + BULK_FRAMING);
    }

    /// Waits (a minute at most) until `conn`'s task has closed it.
    async fn closes(conn: &Conn) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while lock(&conn.handle.0).closed.is_none() {
            assert!(Instant::now() < deadline, "never closed");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// A connection to a loopback port, and the socket its peer accepted (the test plays
    /// Redis on it).
    async fn connected() -> (Conn, TcpStream) {
        use redis::IntoConnectionInfo;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let info = format!("redis://{}/", listener.local_addr().unwrap())
            .into_connection_info()
            .unwrap();
        let (conn, accepted) = tokio::join!(open(&info), listener.accept());
        (conn, accepted.unwrap().0)
    }

    /// A plain connection to `info` (the default TLS settings, unused without TLS).
    async fn open(info: &ConnectionInfo) -> Conn {
        let tls = super::super::tls::client_config(&Default::default()).unwrap();
        connect(info, &tls, Duration::from_secs(10)).await.unwrap()
    }

    /// A connection the peer closes fails the calls waiting on it and every later one, with
    /// an I/O error (which retires it from the pool), and says it is closed.
    #[tokio::test]
    async fn a_closed_connection_fails_every_call() {
        let (conn, socket) = connected().await;
        let waiting = tokio::spawn({
            let conn = conn.clone();
            async move { conn.request(echo("a")).await }
        });
        while lock(&conn.handle.0).waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        drop(socket);
        let error = waiting.await.unwrap().unwrap_err();
        assert!(error.is_io_error(), "{error}");
        assert!(conn.is_closed());
        let later = conn.request(echo("b")).await.unwrap_err();
        assert!(later.is_io_error(), "{later}");
    }

    /// A connection whose task is gone without finishing (its runtime shut down; a panic
    /// drops it the same way) is closed: the call waiting on it fails, and so does every
    /// later one, instead of waiting for replies nothing will ever read.
    #[test]
    fn a_connection_whose_task_is_gone_is_closed() {
        use redis::IntoConnectionInfo;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let info = format!("redis://{}/", listener.local_addr().unwrap())
            .into_connection_info()
            .unwrap();
        let tls = super::super::tls::client_config(&Default::default()).unwrap();
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let (first, second) = (runtime(), runtime());
        let conn = first
            .block_on(connect(&info, &tls, Duration::from_secs(10)))
            .unwrap();
        let waiting = second.spawn({
            let conn = conn.clone();
            async move { conn.request(echo("a")).await }
        });
        second.block_on(async {
            while lock(&conn.handle.0).waiting.is_empty() {
                tokio::task::yield_now().await;
            }
        });
        drop(first);
        assert!(conn.is_closed());
        let error = second.block_on(waiting).unwrap().unwrap_err();
        assert!(error.is_io_error(), "{error}");
        let later = second.block_on(conn.request(echo("b"))).unwrap_err();
        assert!(later.is_io_error(), "{later}");
    }

    /// A peer on a loopback port that answers each command with its last argument (`$-1`
    /// if that is not a bulk string), as a Redis answers `ECHO`.
    async fn echo_peer() -> ConnectionInfo {
        use redis::IntoConnectionInfo;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("redis://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 1024];
            loop {
                let n = socket.read(&mut buf).await.unwrap();
                if n == 0 {
                    return;
                }
                seen.extend_from_slice(&buf[..n]);
                while let Some(len) = frame_len(&seen).unwrap() {
                    let command = redis::parse_redis_value(&seen[..len]).unwrap();
                    seen.drain(..len);
                    let reply = match command {
                        Value::Array(mut args) => match args.pop() {
                            Some(Value::BulkString(arg)) => {
                                let mut reply = format!("${}\r\n", arg.len()).into_bytes();
                                reply.extend_from_slice(&arg);
                                reply.extend_from_slice(b"\r\n");
                                reply
                            }
                            _ => b"$-1\r\n".to_vec(),
                        },
                        _ => b"$-1\r\n".to_vec(),
                    };
                    socket.write_all(&reply).await.unwrap();
                }
            }
        });
        url.into_connection_info().unwrap()
    }

    /// A command its caller did not write whole (the caller panicked while writing it) is
    /// not sent: the next caller's command is not read as the rest of it, and the next
    /// caller gets its own reply.
    #[tokio::test]
    async fn a_command_half_written_is_not_sent() {
        let info = echo_peer().await;
        let conn = open(&info).await;
        let panicked = tokio::spawn({
            let conn = conn.clone();
            async move {
                conn.request(|out| {
                    out.extend_from_slice(b"*2\r\n$4\r\nECHO\r\n");
                    panic!("the caller failed while writing its command");
                })
                .await
            }
        });
        assert!(panicked.await.unwrap_err().is_panic());
        assert_eq!(conn.request(echo("b")).await.unwrap(), b"$1\r\nb\r\n");
        assert_eq!(conn.request(echo("c")).await.unwrap(), b"$1\r\nc\r\n");
    }

    /// An error Redis sends before any command (at `maxclients`, just before it closes the
    /// connection) closes the connection, and the calls made on it then say what Redis said.
    #[tokio::test]
    async fn an_error_nobody_asked_for_is_told() {
        use tokio::io::AsyncWriteExt;
        let (conn, mut socket) = connected().await;
        socket
            .write_all(b"-ERR max number of clients reached\r\n")
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !conn.is_closed() {
            assert!(tokio::time::Instant::now() < deadline, "never closed");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let error = conn.request(echo("a")).await.unwrap_err();
        assert!(error.is_io_error(), "{error}");
        assert!(
            error
                .to_string()
                .contains("ERR max number of clients reached"),
            "{error}"
        );
    }

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
        let shared = shared(State {
            out: command,
            merging: Merging::default(),
            waiting: VecDeque::new(),
            soonest: None,
            task: None,
            closed: None,
            retiring: false,
            script_loads: [None; SCRIPT_LOADS],
        });
        let (sender, mut reply) = oneshot::channel();
        lock(&shared).waiting.push_back(Waiting {
            reply: Some(sender),
            deadline: None,
            shares: 0,
            part: 0,
            // A call expecting a reply this large (a script call alone of many keys).
            most: reply_cap(BIG),
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

    /// Over TLS, a peer that ends its session (`close_notify`) in the middle of a reply
    /// fails the call waiting for it with an I/O error and closes the connection; the whole
    /// reply before it still reaches its caller.
    #[tokio::test]
    async fn a_tls_session_closed_mid_reply_fails_the_waiting_call() {
        use redis::IntoConnectionInfo;
        use rustls::pki_types::pem::PemObject;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = crate::pem::tests::pair();
        let ca = crate::pem::tests::write(&dir, "ca.pem", &cert);
        let tls = super::super::tls::client_config(&super::super::RedisTls {
            ca_file: Some(ca),
            cert_file: None,
            key_file: None,
        })
        .unwrap();
        let certs = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let server = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut session = acceptor.accept(socket).await.unwrap();
            let (mut seen, mut buf) = (Vec::new(), [0u8; 1024]);
            let mut count = 0;
            while count < 2 {
                let n = session.read(&mut buf).await.unwrap();
                assert!(n > 0, "the connection closed early");
                seen.extend_from_slice(&buf[..n]);
                let mut at = 0;
                count = 0;
                while let Some(len) = frame_len(&seen[at..]).unwrap() {
                    at += len;
                    count += 1;
                }
            }
            session.write_all(b"$1\r\na\r\n$5\r\nhe").await.unwrap();
            session.shutdown().await.unwrap();
            // The TCP connection stays open: only the TLS session ended.
            let _ = session.get_mut().0.read(&mut buf).await;
        });
        let info = format!("rediss://localhost:{port}/")
            .into_connection_info()
            .unwrap();
        let conn = connect(&info, &tls, Duration::from_secs(10)).await.unwrap();
        let first = tokio::spawn({
            let conn = conn.clone();
            async move { conn.request(echo("a")).await }
        });
        while lock(&conn.handle.0).waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        // Bounded, so that a connection that missed the end fails the test, not hangs it.
        let cut = tokio::time::timeout(Duration::from_secs(60), conn.request(echo("hello")))
            .await
            .expect("the call on the ended session never ended")
            .unwrap_err();
        assert_eq!(first.await.unwrap().unwrap(), b"$1\r\na\r\n");
        assert!(cut.is_io_error(), "{cut}");
        assert!(conn.is_closed());
    }

    /// A bulk string's payload is taken as it is, binary bytes and CR LF included.
    #[test]
    fn bulk_payload_is_the_bytes() {
        assert_eq!(
            bulk_payload(b"$4\r\n\r\n\0\x01\r\n"),
            Some(&b"\r\n\0\x01"[..])
        );
        assert_eq!(bulk_payload(b"$0\r\n\r\n"), Some(&b""[..]));
        assert_eq!(bulk_payload(b"$-1\r\n"), None);
        assert_eq!(bulk_payload(b"-ERR x\r\n"), None);
    }
}
