//! A connection's handle and the state it shares with the connection's task: what a caller
//! touches. A call goes down once, as data ([`Call`]): [`Conn::call`] writes it into the
//! output buffer (or into the script calls merging, `merge.rs`), queues its caller and wakes
//! the task; its reply comes up once, through a oneshot the task answers (`task.rs`).
//!
//! One connection carries many calls at once, in order: Redis answers in order, so the n-th
//! reply belongs to the n-th call still waiting. A call that gives up (its deadline) keeps
//! its place in the queue, so the replies after it still reach their callers. A call's
//! deadline ([`Conn::until`]) is kept by the connection's task on one timer for every call it
//! carries, not by a timer per call.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::frame::{Call, Frame, FrameError, reply_cap};
use super::merge::Merging;

/// Why a connection stopped: every call on it fails with this, as an I/O error.
#[derive(Clone, Debug)]
pub(super) struct Closed {
    kind: io::ErrorKind,
    text: String,
}

impl Closed {
    pub(super) fn of(error: &io::Error) -> Closed {
        Closed {
            kind: error.kind(),
            text: error.to_string(),
        }
    }

    pub(super) fn new(kind: io::ErrorKind, text: &str) -> Closed {
        Closed {
            kind,
            text: text.to_owned(),
        }
    }

    pub(super) fn error(&self) -> RedisError {
        io::Error::new(self.kind, self.text.clone()).into()
    }

    /// What closes a connection that read a reply it cannot hand out (see `frame.rs`).
    pub(super) fn refused(error: FrameError) -> Closed {
        Closed {
            kind: io::ErrorKind::InvalidData,
            text: error.to_string(),
        }
    }
}

/// What a call sent on a connection that is retiring fails with (see [`State::retiring`]).
pub(super) const RETIRED: &str = "the connection is retired: a call on it missed its deadline";

/// What a call that ran out of its deadline fails with (see [`is_late`]).
pub(super) const LATE: &str = "the call's deadline passed before Redis answered";

/// Whether `error` is a call's deadline passing ([`Conn::until`]): the store answers it as the
/// call's timeout.
pub fn is_late(error: &RedisError) -> bool {
    error.is_timeout() && error.to_string().contains(LATE)
}

/// A call written and not yet answered.
pub(super) struct Waiting {
    /// Where its reply goes; taken when its deadline passes (the reply, when it comes, is
    /// then dropped: the call keeps its place in the order of replies).
    pub(super) reply: Option<oneshot::Sender<Result<Frame, Closed>>>,
    /// When it gives up, if it has a deadline.
    pub(super) deadline: Option<Instant>,
    /// The first call of a merged script call (`merge.rs`): how many calls share
    /// its reply, itself and the ones after it (0: a reply of its own).
    pub(super) shares: usize,
    /// In a merged script call, this call's bytes of the reply's payload.
    pub(super) part: usize,
    /// The most bytes its reply may take ([`reply_cap`]); for a merged script call's first
    /// call, the whole merged reply's.
    pub(super) most: usize,
    /// The first call of a script call (merged or alone): its reply ends one of
    /// [`State::scripts_out`].
    pub(super) script: bool,
}

/// What the callers and the connection's task share. Only the connection's own thread
/// touches it in practice (the lock is never contended); it is a mutex because the store's
/// futures must be `Send`.
pub(super) struct State {
    /// Commands written by callers, not yet taken by the task.
    pub(super) out: Vec<u8>,
    /// Script calls written after `out`'s commands, still merging into one.
    pub(super) merging: Merging,
    /// Script calls written (each one `EVALSHA`, merged or alone) whose reply has not come.
    /// While there is one, the task leaves the script calls written since merging (group
    /// commit): they go out together when its reply comes, or when they fill a merged call.
    pub(super) scripts_out: usize,
    /// The callers waiting for a reply, in the order their commands were written.
    pub(super) waiting: VecDeque<Waiting>,
    /// The earliest deadline of the calls written since the task last looked: it sets the
    /// task's timer sooner if it is set later than that (or not at all).
    pub(super) soonest: Option<Instant>,
    /// Wakes the task; taken by the first caller that writes after the task last ran, so a
    /// pass's calls cost one wake-up.
    pub(super) task: Option<Waker>,
    /// Set once the connection failed or every handle is gone.
    pub(super) closed: Option<Closed>,
    /// Set once a call on it missed its deadline: the reply owed to that call is still to
    /// come before any later one, and a peer that missed one deadline is not trusted with
    /// more calls. Later calls fail at once, the calls waiting still get their replies (or
    /// their deadlines), and once none is left waiting the connection closes (the store
    /// marks it broken at the same time, and its pool replaces it).
    pub(super) retiring: bool,
    /// When scripts were last loaded on it ([`Conn::may_load_script`]).
    pub(super) script_loads: [Option<Instant>; SCRIPT_LOADS],
}

/// What a connection's handles and its task share: the state, and whether it is closed,
/// which the pool asks before every call it lends the connection to, without the lock.
pub(super) struct Link {
    state: Mutex<State>,
    /// Set once `state.closed` is.
    pub(super) closed: AtomicBool,
}

pub(super) type Shared = Arc<Link>;

/// The link of a new connection in `state`.
pub(super) fn shared(state: State) -> Shared {
    Arc::new(Link {
        state: Mutex::new(state),
        closed: AtomicBool::new(false),
    })
}

/// Locks the state the handles and the task share.
pub(super) fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A connection: cheap to clone, every clone carries calls over the same socket. The socket
/// is closed when the last clone is dropped.
#[derive(Clone)]
pub struct Conn {
    pub(super) handle: Arc<Handle>,
    db: i64,
    /// When the calls sent through this handle give up ([`Conn::until`]); `None`: never.
    deadline: Option<Instant>,
}

/// Closes the connection when the last [`Conn`] goes.
pub(super) struct Handle(pub(super) Shared);

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
    /// The first handle on a new connection's link (`connect.rs`), whose calls go to
    /// database `db`.
    pub(super) fn new(shared: Shared, db: i64) -> Conn {
        Conn {
            handle: Arc::new(Handle(shared)),
            db,
            deadline: None,
        }
    }

    /// Whether the connection has failed (or was closed): nothing sent on it can succeed.
    pub fn is_closed(&self) -> bool {
        self.handle.0.closed.load(Ordering::Acquire)
    }

    /// Every call sent through this handle from now on (redis-rs's commands through
    /// [`ConnectionLike`] included) fails at `deadline` if Redis has not answered it by then,
    /// with an error [`is_late`] recognises. The connection's task keeps the deadlines of all
    /// its calls on one timer: a timer per call, registered in tokio's timer wheel as the call
    /// waits and removed as it is answered, costs instructions on every call and, whenever it
    /// is the wheel's earliest, a write to the runtime's wake-up `eventfd` (about one call in
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

    /// Sends `call` and returns its reply's frame. The call is data: it is encoded here,
    /// under the lock, straight into the output buffer (a [`Call::Script`] into the script
    /// calls merging, `merge.rs`); no code of the caller's runs while the lock is held, and
    /// nothing is allocated for it but the reply's channel and frame.
    ///
    /// A [`Call::Command`]'s reply may take [`super::MAX_REPLY`] bytes; a script call's, its
    /// bulk string of `reply_bytes`, past that cap if longer. The script calls written
    /// together (before the connection's task takes them, with no other command between
    /// them) are merged into one `EVALSHA` (`merge.rs`); each gets its own part of the
    /// reply as a bulk string of its own, or any other reply (an error, `NOSCRIPT` included)
    /// as it came. A call past its deadline fails alone; the others merged with it are
    /// answered.
    pub async fn call(&self, call: &Call<'_>) -> RedisResult<Frame> {
        let reply = {
            let mut guard = self.sendable()?;
            let state = &mut *guard;
            let reply_bytes = call.reply_bytes();
            match call {
                // A fixed `now` (tests) is a command of its own: a merged call has one
                // `now` for all, Redis `TIME`.
                Call::Script(script) if script.now_us.is_none() => {
                    if state.merging.is_closed_to(script) {
                        state.write_merged();
                    }
                    state.merging.push(script);
                    // While a script call is out, the task leaves the calls merging until its
                    // reply comes: it is woken only to write (a merged call filled at the
                    // cap) or to keep a deadline sooner than those it was told of.
                    let write = state.scripts_out == 0 || !state.out.is_empty();
                    self.wait(state, reply_bytes, reply_cap(reply_bytes), write)
                }
                _ => {
                    // The script calls merging before it go first: the order of replies is
                    // the order of commands.
                    state.write_merged();
                    let before = state.out.len();
                    let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        call.write(&mut state.out)
                    }));
                    if let Err(panic) = written {
                        // Half a command would take the next caller's command for its rest
                        // (and that caller its reply): take it back before the panic goes on.
                        state.out.truncate(before);
                        drop(guard);
                        std::panic::resume_unwind(panic);
                    }
                    self.wait(state, 0, reply_cap(reply_bytes), true)
                }
            }
        };
        answer(reply).await
    }

    /// Queues the caller of the command just written (`part`: its bytes of a merged script
    /// call's reply; `most`: the most bytes its reply may take) and wakes the task if it has
    /// something to `write`, or a deadline sooner than those it was told of to keep.
    fn wait(
        &self,
        state: &mut State,
        part: usize,
        most: usize,
        write: bool,
    ) -> oneshot::Receiver<Result<Frame, Closed>> {
        let (sender, reply) = oneshot::channel();
        state.waiting.push_back(Waiting {
            reply: Some(sender),
            deadline: self.deadline,
            shares: 0,
            part,
            most,
            script: false,
        });
        let mut wake = write;
        if let Some(deadline) = self.deadline
            && state.soonest.is_none_or(|soonest| deadline < soonest)
        {
            state.soonest = Some(deadline);
            wake = true;
        }
        if wake && let Some(task) = state.task.take() {
            task.wake();
        }
        reply
    }

    /// Sends a redis-rs command and parses its reply (server errors stay values, as
    /// [`ConnectionLike`] wants them).
    pub(super) async fn command(&self, cmd: &Cmd) -> RedisResult<Value> {
        let frame = self.call(&Call::Command(cmd)).await?;
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
    /// The state of a new connection: nothing written, nobody waiting.
    pub(super) fn new() -> State {
        State {
            out: Vec::with_capacity(4096),
            merging: Merging::default(),
            scripts_out: 0,
            waiting: VecDeque::new(),
            soonest: None,
            task: None,
            closed: None,
            retiring: false,
            script_loads: [None; SCRIPT_LOADS],
        }
    }

    /// Writes the script calls merging into `out` as one `EVALSHA` (one call: exactly its
    /// own command), marks their first caller as the script call's (and, merged, as sharing
    /// the reply with the others), and counts it out ([`State::scripts_out`]).
    pub(super) fn write_merged(&mut self) {
        let calls = self.merging.write_into(&mut self.out);
        if calls == 0 {
            return;
        }
        let Some(first) = self.waiting.len().checked_sub(calls) else {
            return;
        };
        self.scripts_out += 1;
        let payload = self.waiting.range(first..).map(|call| call.part).sum();
        let first = &mut self.waiting[first];
        first.script = true;
        if calls > 1 {
            first.shares = calls;
            first.most = reply_cap(payload);
        }
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

/// The most script loads one connection makes in any [`SCRIPT_LOAD_WINDOW`]
/// ([`Conn::may_load_script`]): the first call's load and one after a `SCRIPT FLUSH` fit in
/// the same second; a Redis that keeps forgetting the script gets two ~40 KB loads a second
/// per connection.
pub const SCRIPT_LOADS: usize = 2;

/// The span [`SCRIPT_LOADS`] counts loads in.
pub const SCRIPT_LOAD_WINDOW: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests;
