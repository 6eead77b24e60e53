//! Logging through the host.
//!
//! In a wasm build every line goes to the host's `log` import and lands in the host's log inside
//! the span of the current reconcile. Natively (unit tests) lines go to stderr and are kept per
//! thread, for [`crate::testing::take_logs`].
//!
//! ```
//! use wasmop_guest::log;
//! log::info!("scaling {} to {}", "memcached-sample", 3);
//! log::log(log::Level::Warn, "plain text works too");
//! ```

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected but handled.
    Warn,
    /// A failure.
    Error,
}

/// Writes one line to the host's log.
pub fn log(level: Level, message: &str) {
    imp::log(level, message);
}

#[cfg(target_arch = "wasm32")]
mod imp {
    pub(crate) fn log(level: super::Level, message: &str) {
        crate::guest::log(level, message);
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use std::cell::RefCell;

    use super::Level;

    thread_local! {
        // Per thread, because `cargo test` runs tests on parallel threads.
        static LINES: RefCell<Vec<(Level, String)>> = const { RefCell::new(Vec::new()) };
    }

    pub(crate) fn log(level: Level, message: &str) {
        eprintln!("[{level:?}] {message}");
        LINES.with(|l| l.borrow_mut().push((level, message.to_owned())));
    }

    pub(crate) fn take() -> Vec<(Level, String)> {
        LINES.with(|l| std::mem::take(&mut *l.borrow_mut()))
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use imp::take;

#[doc(hidden)]
#[macro_export]
macro_rules! __log {
    ($level:ident, $($arg:tt)*) => {
        $crate::log::log($crate::log::Level::$level, &::std::format!($($arg)*))
    };
}

/// Logs at [`Level::Trace`], formatting like `format!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __log_trace { ($($arg:tt)*) => { $crate::__log!(Trace, $($arg)*) }; }
/// Logs at [`Level::Debug`], formatting like `format!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __log_debug { ($($arg:tt)*) => { $crate::__log!(Debug, $($arg)*) }; }
/// Logs at [`Level::Info`], formatting like `format!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __log_info { ($($arg:tt)*) => { $crate::__log!(Info, $($arg)*) }; }
/// Logs at [`Level::Warn`], formatting like `format!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __log_warn { ($($arg:tt)*) => { $crate::__log!(Warn, $($arg)*) }; }
/// Logs at [`Level::Error`], formatting like `format!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __log_error { ($($arg:tt)*) => { $crate::__log!(Error, $($arg)*) }; }

// `#[macro_export]` puts macros at the crate root; these re-exports give them their real home,
// `wasmop_guest::log::info!` and friends.
#[doc(inline)]
pub use crate::__log_debug as debug;
#[doc(inline)]
pub use crate::__log_error as error;
#[doc(inline)]
pub use crate::__log_info as info;
#[doc(inline)]
pub use crate::__log_trace as trace;
#[doc(inline)]
pub use crate::__log_warn as warn;
