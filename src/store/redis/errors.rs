//! What a Redis error means for floodgate: an outage for the failure policy (transport
//! failures, a replica after a failover, a Redis not ready, an ACL or a renamed command that
//! refuses every request) or a defect to report (a script error), whether the connection it
//! came from must be replaced, and its text as logs may show it (no request data).

use redis::RedisError;

use crate::store::StoreError;

/// Whether the connection an error came from must be replaced: a transport failure, or
/// `READONLY`, the answer of a master that was demoted (a Sentinel failover, or a managed
/// service whose DNS name moved to the new primary) — only a new connection, looked up through
/// the sentinels or resolving the name again, reaches the new master. Nothing else a server
/// answers does: a script error or `OOM` would be answered the same on a new connection, so
/// reconnecting would only add load.
pub(super) fn retires_connection(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.is_unrecoverable_error()
        || error.code() == Some("READONLY")
}

/// Transport failures, a Redis that cannot take writes now, and a Redis that refuses what
/// every request needs (ACL, a renamed command) are outages, for the failure policy and
/// health; anything else (a script error) is a defect to report. Messages never carry
/// request data (see [`describe`]).
pub(super) fn classify(error: &RedisError) -> StoreError {
    let said = describe(error);
    if error.code() == Some("READONLY") {
        StoreError::Unavailable(format!("Redis is a replica now (failover?): {said}"))
    } else if retires_connection(error) {
        StoreError::Unavailable(format!("Redis connection failed: {said}"))
    } else if matches!(
        error.code(),
        Some("LOADING" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN" | "BUSY" | "OOM")
    ) {
        // Loading after a restart, a replica cut off from its master, a long script, or
        // maxmemory reached under noeviction: Redis cannot take writes now, which is an outage
        // for the failure policy to answer, not a defect in floodgate.
        StoreError::Unavailable(format!("Redis not ready: {said}"))
    } else if matches!(error.code(), Some("NOPERM" | "NOAUTH" | "WRONGPASS")) {
        // The ACL user may not run the script or touch the key prefix: every request fails
        // alike until an operator fixes the ACL, exactly like an outage.
        StoreError::Unavailable(format!("Redis refuses floodgate's user (ACL): {said}"))
    } else if is_at_maxclients(error) {
        // At `maxclients` Redis answers a new connection's first command with this and
        // closes it: no room for floodgate's connection, an outage for the failure policy,
        // not a defect of the script that happened to be that first command.
        StoreError::Unavailable(format!("Redis takes no more connections: {said}"))
    } else if error.code() == Some("NOSCRIPT") {
        // Redis lost the script again and the bounded loads (`script::call`) did not bring
        // it back: every request fails alike until Redis keeps it (or a peer that is not a
        // sane Redis is fixed), an outage for the failure policy and the breaker, whose
        // probe runs the script.
        StoreError::Unavailable(format!("Redis does not keep floodgate's script: {said}"))
    } else if is_unknown_command(error) {
        // EVALSHA / EVAL / SCRIPT renamed or disabled (`rename-command`).
        StoreError::Unavailable(format!(
            "Redis lacks a command floodgate needs (renamed or disabled?): {said}"
        ))
    } else {
        StoreError::Failed(format!("Redis script failed: {said}"))
    }
}

/// Whether Redis refused the connection for having `maxclients` clients already.
fn is_at_maxclients(error: &RedisError) -> bool {
    error.code() == Some("ERR")
        && error
            .detail()
            .is_some_and(|detail| detail.starts_with("max number of clients reached"))
}

/// Whether Redis answered that it does not know the command.
fn is_unknown_command(error: &RedisError) -> bool {
    error.code() == Some("ERR")
        && error
            .detail()
            .is_some_and(|detail| detail.starts_with("unknown command"))
}

/// Longest Redis error text carried into a [`StoreError`] (and so into logs and statuses).
const MAX_ERROR_TEXT: usize = 160;

/// A Redis error as logs may show it: no request data. Redis repeats a refused command's
/// arguments (`unknown command 'EVALSHA', with args beginning with: <keys>`), and those are
/// bucket keys made of request values: that part is cut, and the rest capped.
fn describe(error: &RedisError) -> String {
    let text = match (error.code(), error.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => error.to_string(),
    };
    let text = text
        .split_once(", with args beginning with")
        .map_or(text.as_str(), |(head, _)| head);
    match text.char_indices().nth(MAX_ERROR_TEXT) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}
