//! The connection's task: the one place its socket is read and written. It writes what
//! callers buffered (`conn.rs`), in one write per pass, the script calls merging held back
//! while a script call is out ([`State::scripts_out`]); reads replies, framed by
//! `frame.rs`, and hands each to the caller waiting longest (a merged script call's to each
//! of its callers, split by `merge.rs`); and fails the calls whose deadline passed, on one
//! timer for all of them. It runs on the runtime that opened the connection (each thread's
//! pool opens its own, see `ThreadPools`).
//!
//! What a peer cannot do, whether a broken Redis or a man in the middle of a plaintext link:
//! make a connection hold more than one capped reply ([`MAX_REPLY`], or a script call's own
//! larger reply), refused at its header when it cannot fit; make it parse a byte twice (the
//! parser resumes where it stopped); or keep it reading after a call on it missed its
//! deadline: the connection then retires, takes no new call and closes once no call waits on
//! it (docs/redis.md, "What a connection reads, and for how long").

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_rustls::client::TlsStream;

use super::conn::{Closed, LATE, RETIRED, Shared, State, Waiting, lock};
use super::frame::{MAX_REPLY, OUT_KEEP, Parser};
use super::merge::{Merging, Split};

/// The bytes read at most in one read; a reply larger than this grows the buffer.
const READ_BUFFER: usize = 16 * 1024;

/// The connection's socket.
pub(super) enum Stream {
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
/// where a timer per call is registered and removed for every call.
pub(super) struct Task {
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
    pub(super) fn new(stream: Stream, shared: Shared) -> Task {
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
            state.scripts_out = 0;
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
    pub(super) fn drive(&mut self, cx: &mut Context<'_>) -> Result<(), Closed> {
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
                    // script calls written together merged into one, unless a script call
                    // is out: they wait for its reply and go out together then (group
                    // commit; a full merged call is already in `out`).
                    if state.scripts_out == 0 {
                        state.write_merged();
                    }
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
                if caller.script {
                    // The calls merging since go out on the task's next pass.
                    state.scripts_out = state.scripts_out.saturating_sub(1);
                }
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
    let total: usize = callers.iter().map(|caller| caller.part).sum();
    let mut split = Split::new(frame, total);
    for caller in callers.drain(..) {
        let piece = split.take(caller.part);
        if let Some(reply) = caller.reply {
            let _ = reply.send(Ok(piece.to_frame()));
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
    Closed::new(
        io::ErrorKind::InvalidData,
        &format!("Redis sent an error nobody asked for: {}", error.trim_end()),
    )
}

#[cfg(test)]
mod tests;
