//! floodgate's own connection to one Redis server: the connection the store's pool lends
//! (see [`super::RedisStore`]).
//!
//! Why its own: a request's script call is written straight into the connection's output
//! buffer, the connection's task writes whatever is buffered in one write, and each reply is
//! handed back as the RESP bytes it came as, the script's packed doubles decoded from them in
//! place ([`super::script::call`]); redis-rs's multiplexed connection builds a `Cmd`, packs it
//! again into a fresh buffer, sends it through a channel to its task and parses the reply
//! into a `Value`, about a third of the client work the Redis path adds to a request
//! (docs/performance.md, "Where the Redis path's CPU goes"). The script calls written
//! together are merged into one `EVALSHA` as the task takes them, each caller still handed
//! its own reply; while one such call is out, the task leaves the script calls written since
//! merging until its reply comes (group commit), so a connection under load sends few,
//! large calls (docs/redis.md, "One `EVALSHA` for the requests ready together").
//!
//! A call goes down once and its reply comes up once: the caller hands [`Conn::call`] a
//! [`Call`], a value describing the command (a redis-rs `Cmd`, or a
//! [`super::apply::ScriptCall`] borrowed from the request), and gets its reply's [`Frame`]
//! back. The rooms, bottom to top:
//!
//! - `frame.rs`: RESP2 framing, both ways: a [`Call`] encoded into a buffer, and where each
//!   reply ends in the bytes read (a parser that resumes where it stopped and caps what it
//!   buffers).
//! - `merge.rs`: the script calls written together merged into one `EVALSHA`, and its reply
//!   split among them.
//! - `conn.rs`: the handle callers send on ([`Conn`]) and the state it shares with the task:
//!   the output buffer, the callers waiting in order, the deadlines.
//! - `task.rs`: the connection's I/O task, the one place its socket is read and written.
//! - `connect.rs`: TCP, TLS or a unix socket, the task spawned, `AUTH` and `SELECT`.
//!
//! A transport failure fails every call waiting on the connection and every later one, with
//! an I/O error: the store retires the connection and calls it an outage. Every other command
//! of the store (the probe, `DEL`, the RLQS share tables' scripts, `SCRIPT LOAD`, the pool's
//! `PING`) goes through the same connection as a [`Call::Command`]: [`Conn`] is a redis-rs
//! [`redis::aio::ConnectionLike`].

mod conn;
mod connect;
mod frame;
mod merge;
mod task;

pub use conn::{Conn, SCRIPT_LOAD_WINDOW, SCRIPT_LOADS, is_late};
pub use connect::connect;
pub use frame::{Call, Frame, MAX_REPLY, bulk_payload};
pub use merge::{LARGEST_MERGED_REPLY, MERGE_BYTES, MERGE_CALLS, MERGE_KEYS};

#[cfg(test)]
mod tests;
