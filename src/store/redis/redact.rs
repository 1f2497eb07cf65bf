//! Redis URLs without their secrets, for logs, `Debug` output and error messages.

/// Replaces the password of a URL like `redis://user:secret@host` with `***`, and that of a
/// unix-socket URL's `pass=` / `password=` query parameter
/// (`redis+unix:///run/redis.sock?pass=secret`).
///
/// Written not to be fooled by URL syntax in a password that was not percent-encoded (`/`,
/// `?`, `#`, `@`, `:`): the user information is everything between `://` and the *last* `@`
/// (hosts, paths and queries hold none), and it is kept only up to its first `:`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (userinfo, location) = match rest.rsplit_once('@') {
        Some((userinfo, location)) => (Some(userinfo), location),
        None => (None, rest),
    };
    let location = match location.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name @ ("pass" | "password"), _)) => format!("{name}=***"),
                    _ => pair.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => location.to_string(),
    };
    match userinfo {
        Some(userinfo) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let masked = if userinfo.contains(':') || !user.is_empty() {
                format!("{user}:***")
            } else {
                "***".to_string()
            };
            format!("{scheme}://{masked}@{location}")
        }
        None => format!("{scheme}://{location}"),
    }
}

/// `text` (an error message about `url`, which may quote it or parts of it) with every
/// secret of `url` (its password, its `pass=` value) replaced by `***`.
pub fn redact_in(text: &str, url: &str) -> String {
    let mut secrets: Vec<&str> = Vec::new();
    if let Some((_, rest)) = url.split_once("://") {
        let location = match rest.rsplit_once('@') {
            Some((userinfo, location)) => {
                secrets.extend(userinfo.split_once(':').map(|(_, password)| password));
                // A bare `redis://secret@host` may be a password too (older URL forms).
                if !userinfo.contains(':') {
                    secrets.push(userinfo);
                }
                location
            }
            None => rest,
        };
        if let Some((_, query)) = location.split_once('?') {
            secrets.extend(
                query
                    .split('&')
                    .filter_map(|pair| match pair.split_once('=') {
                        Some(("pass" | "password", value)) => Some(value),
                        _ => None,
                    }),
            );
        }
    }
    let mut text = text.replace(url, &redact_url(url));
    for secret in secrets.into_iter().filter(|s| !s.is_empty()) {
        text = text.replace(secret, "***");
    }
    text
}

#[cfg(test)]
mod tests;
