//! The error a plugin returns: a message the host logs, records and retries on.
//!
//! Any `std::error::Error` converts into [`Error`], so `?` works on serde, parsing and I/O
//! errors alike; [`Error::msg`] makes one from text and [`Error::context`] prefixes where it
//! happened.

use std::fmt;

/// A plugin failure. Crosses the boundary as its message: the host backs off and retries.
///
/// Like `anyhow::Error`, it deliberately does not implement `std::error::Error`, which is what
/// lets every error type convert into it with `?`.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    message: String,
}

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with this message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
        }
    }

    /// Prefixes the message with where it happened: `"{context}: {message}"`.
    #[must_use]
    pub fn context(self, context: impl fmt::Display) -> Self {
        Self {
            message: format!("{context}: {}", self.message),
        }
    }

    /// The message, as the host will see it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl<E: std::error::Error> From<E> for Error {
    fn from(err: E) -> Self {
        Self::msg(err)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.message, f)
    }
}

impl From<Error> for String {
    fn from(err: Error) -> Self {
        err.message
    }
}

/// Returns early with an [`Error`] built like `format!`.
///
/// ```
/// fn check(size: i32) -> wasmop_guest::Result<()> {
///     if size < 0 {
///         wasmop_guest::bail!("spec.size must be ≥ 0, got {size}");
///     }
///     Ok(())
/// }
/// assert_eq!(check(-1).unwrap_err().message(), "spec.size must be ≥ 0, got -1");
/// ```
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return ::core::result::Result::Err($crate::Error::msg(::std::format!($($arg)*)))
    };
}

/// Returns an [`Error`] built like `format!` unless the condition holds.
///
/// ```
/// fn check(size: i32) -> wasmop_guest::Result<()> {
///     wasmop_guest::ensure!(size >= 0, "spec.size must be ≥ 0, got {size}");
///     Ok(())
/// }
/// assert_eq!(check(-1).unwrap_err().message(), "spec.size must be ≥ 0, got -1");
/// assert!(check(1).is_ok());
/// ```
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            $crate::bail!($($arg)*);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_std_errors_and_keeps_context() {
        fn parse() -> Result<serde_json::Value> {
            Ok(serde_json::from_str("{")?)
        }
        let err = parse().unwrap_err().context("request");
        assert!(err.message().starts_with("request: EOF"), "{err}");
    }
}
