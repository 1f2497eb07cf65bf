//! The admin bearer token (`--admin-token-file`): loaded at start-up, reloaded when the file
//! changes (like the gRPC TLS files), and checked in constant time.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwapOption;

use crate::file_watch::{self, FileWatch, WatchError};

/// Why a token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file cannot be read.
    #[error("cannot read admin token file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file holds no token.
    #[error("admin token file {0} is empty")]
    Empty(PathBuf),
}

/// Why a call is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer …` header: 401.
    Missing,
    /// A token that is not the configured one, or no token configured at all: 403.
    Wrong,
}

/// The token mutating console calls must carry; none configured refuses them all.
#[derive(Clone, Default)]
pub struct AdminToken {
    /// The file it is read from.
    file: Option<PathBuf>,
    /// The token in force.
    token: Arc<ArcSwapOption<Box<str>>>,
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the token itself.
        f.debug_struct("AdminToken")
            .field("file", &self.file)
            .field("set", &self.token.load().is_some())
            .finish()
    }
}

impl AdminToken {
    /// No token: every mutating call is refused.
    pub fn none() -> AdminToken {
        AdminToken::default()
    }

    /// A fixed token (tests and embedders).
    pub fn fixed(token: &str) -> AdminToken {
        let token_box: Box<str> = token.into();
        AdminToken {
            file: None,
            token: Arc::new(ArcSwapOption::from_pointee(token_box)),
        }
    }

    /// The token held by `path`: its content without surrounding white space.
    pub fn load(path: &Path) -> Result<AdminToken, TokenError> {
        let token = read(path)?;
        Ok(AdminToken {
            file: Some(path.to_path_buf()),
            token: Arc::new(ArcSwapOption::from_pointee(token)),
        })
    }

    /// Reads the file again; a file that cannot be used keeps the previous token (logged).
    pub fn reload(&self) {
        let Some(path) = &self.file else { return };
        match read(path) {
            Ok(token) => {
                self.token.store(Some(Arc::new(token)));
                tracing::info!(file = %path.display(), "admin token reloaded");
            }
            Err(e) => tracing::error!("{e}; keeping the previous admin token"),
        }
    }

    /// Reloads the token whenever its file changes, until the guard is dropped; `None`
    /// without a file.
    pub fn watch(&self) -> Option<Result<FileWatch, WatchError>> {
        let path = self.file.clone()?;
        let token = self.clone();
        Some(file_watch::spawn(
            &[path.as_path()],
            file_watch::RecursiveMode::NonRecursive,
            "admin token",
            move || token.reload(),
        ))
    }

    /// Whether a token is configured (console reads need it then).
    pub fn is_set(&self) -> bool {
        self.token.load().is_some()
    }

    /// Checks an `Authorization` header value.
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<(), Refusal> {
        let Some(presented) = authorization.and_then(|h| h.strip_prefix(b"Bearer ")) else {
            return Err(Refusal::Missing);
        };
        let expected = self.token.load();
        match expected.as_deref() {
            Some(expected) if constant_time_eq(expected.as_bytes(), presented.trim_ascii()) => {
                Ok(())
            }
            _ => Err(Refusal::Wrong),
        }
    }
}

fn read(path: &Path) -> Result<Box<str>, TokenError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(TokenError::Empty(path.to_path_buf()));
    }
    Ok(token.into())
}

/// Equality whose time depends on the lengths only, not on where the bytes differ: a
/// guesser learns nothing from response times.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests;
