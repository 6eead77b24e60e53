//! Errors of the sandbox: [`SandboxError`] when the sandbox itself can't start, and
//! [`PluginError`] for anything one plugin did wrong (or that went wrong while running it).
//!
//! A [`PluginError`] always names the plugin and its digest, so a log line or an Event is enough
//! to tell which module misbehaved; [`PluginErrorKind::reason`] gives a stable UpperCamelCase
//! word for Event reasons and condition reasons.

use std::fmt;
use std::time::Duration;

/// The export of the `reconciler` interface a call went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Call {
    /// `manifest()`, called once when the plugin loads.
    Manifest,
    /// `related(parent)`.
    Related,
    /// `reconcile(request)`.
    Reconcile,
    /// A script interpreter's `init(file, source)`, called once when a script plugin loads.
    Init,
    /// A script's test file, run by `wasmop test`.
    Test,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Call::Manifest => "manifest",
            Call::Related => "related",
            Call::Reconcile => "reconcile",
            Call::Init => "init",
            Call::Test => "test",
        })
    }
}

/// wasmtime's error, as a standard error (`wasmtime::Error` is not one).
pub type EngineError = Box<dyn std::error::Error + Send + Sync>;

/// The sandbox could not be set up (an engine configuration the platform refuses). The cause
/// is the `source`, which `{:#}` prints after the message.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// wasmtime refused the engine configuration.
    #[error("cannot configure the WebAssembly engine")]
    Engine(#[source] EngineError),
    /// The epoch ticker thread could not be started.
    #[error("cannot start the epoch ticker thread")]
    Ticker(#[source] std::io::Error),
    /// The host functions could not be linked.
    #[error("cannot link the host functions")]
    Linker(#[source] EngineError),
}

/// A plugin failed to load or a call into it failed.
///
/// Displays as `plugin memcached (sha256:ab12cd34ef56…): deadline of 1s exceeded in reconcile`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginError {
    /// The manifest name, or `<unknown>` before the manifest is read.
    pub plugin: String,
    /// `sha256:<hex>` of the module bytes.
    pub digest: String,
    /// What went wrong.
    pub kind: PluginErrorKind,
}

/// The name used in a [`PluginError`] before the manifest is known.
pub const UNKNOWN_PLUGIN: &str = "<unknown>";

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digest = short_digest(&self.digest);
        write!(f, "plugin {} ({digest}): {}", self.plugin, self.kind)
    }
}

// The kind is part of the message, so it is not also a `source` (anyhow's `{:#}` would print
// it twice).
impl std::error::Error for PluginError {}

impl PluginError {
    pub(crate) fn new(plugin: &str, digest: &str, kind: PluginErrorKind) -> Self {
        Self {
            plugin: plugin.to_owned(),
            digest: digest.to_owned(),
            kind,
        }
    }

    /// Shorthand for `self.kind.reason()`.
    pub fn reason(&self) -> &'static str {
        self.kind.reason()
    }
}

/// What went wrong in a plugin.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PluginErrorKind {
    /// The guest trapped: a panic, `unreachable`, a stack overflow, an out-of-bounds access.
    Trap {
        /// The export that trapped.
        call: Call,
        /// wasmtime's description of the trap.
        message: String,
        /// The guest's own last words: its panic message (sent by the SDK's panic hook through
        /// `log`), else the tail of what it wrote to stderr.
        guest_message: Option<String>,
    },
    /// The call ran past its deadline (wall time while the guest runs) and was interrupted.
    DeadlineExceeded {
        /// The interrupted export.
        call: Call,
        /// The deadline in force.
        limit: Duration,
    },
    /// The guest asked for more linear memory than its cap allows (and then aborted).
    MemoryCap {
        /// The export that hit the cap.
        call: Call,
        /// The cap in bytes.
        limit: u64,
    },
    /// The bytes are not a WebAssembly component (garbage, a core module, or a component
    /// wasmtime refuses to compile).
    NotAComponent(String),
    /// A component, but not of the `wasmop:plugin@0.2.0` world: a missing export, an import the
    /// host doesn't provide, or another interface version.
    WrongInterface(String),
    /// The guest returned text that is not the JSON the contract asks for: malformed, or with
    /// more values or deeper nesting than the host parses
    /// ([`crate::config::RESPONSE_MAX_VALUES`], [`crate::config::RESPONSE_MAX_DEPTH`]; then it
    /// was not parsed at all).
    InvalidJson {
        /// The export that returned it.
        call: Call,
        /// The parser's complaint, or what was counted and the bound.
        detail: String,
    },
    /// Well-formed output that breaks the contract (e.g. a selector for an undeclared kind).
    InvalidOutput {
        /// The export that returned it.
        call: Call,
        /// Which rule it broke.
        detail: String,
    },
    /// The manifest is malformed (bad name, unknown kinds, duplicates…).
    InvalidManifest(String),
    /// The response is larger than the configured cap; it was not parsed.
    ResponseTooLarge {
        /// The export that returned it.
        call: Call,
        /// Its size in bytes.
        size: u64,
        /// The cap in bytes.
        limit: u64,
    },
    /// The guest returned its own error (`err(message)`).
    PluginFailed {
        /// The export that failed.
        call: Call,
        /// The guest's message.
        message: String,
    },
    /// The host failed, not the guest (a full instance pool, a lost worker thread…).
    Internal(String),
}

impl fmt::Display for PluginErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Trap {
                call,
                message,
                guest_message,
            } => {
                write!(f, "trapped in {call}: {message}")?;
                match guest_message {
                    Some(guest) => write!(f, " (guest: {guest})"),
                    None => Ok(()),
                }
            }
            Self::DeadlineExceeded { call, limit } => {
                write!(f, "deadline of {limit:?} exceeded in {call}")
            }
            Self::MemoryCap { call, limit } => {
                write!(
                    f,
                    "memory limit of {} exceeded in {call}",
                    human_bytes(*limit)
                )
            }
            Self::NotAComponent(detail) => {
                write!(f, "not a loadable WebAssembly component: {detail}")
            }
            Self::WrongInterface(detail) => {
                write!(
                    f,
                    "does not implement the wasmop:plugin@0.2.0 world: {detail}"
                )
            }
            Self::InvalidJson { call, detail } => write!(f, "invalid JSON from {call}: {detail}"),
            Self::InvalidOutput { call, detail } => {
                write!(f, "invalid output from {call}: {detail}")
            }
            Self::InvalidManifest(detail) => write!(f, "invalid manifest: {detail}"),
            Self::ResponseTooLarge { call, size, limit } => write!(
                f,
                "response of {} from {call} exceeds the limit of {}",
                human_bytes(*size),
                human_bytes(*limit)
            ),
            Self::PluginFailed { call, message } => write!(f, "{call} failed: {message}"),
            Self::Internal(detail) => write!(f, "internal error: {detail}"),
        }
    }
}

impl std::error::Error for PluginErrorKind {}

impl PluginErrorKind {
    /// A stable UpperCamelCase word for Event and condition reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Trap { .. } => "PluginTrapped",
            Self::DeadlineExceeded { .. } => "DeadlineExceeded",
            Self::MemoryCap { .. } => "MemoryLimitExceeded",
            Self::NotAComponent(_) => "NotAComponent",
            Self::WrongInterface(_) => "WrongInterface",
            Self::InvalidJson { .. } => "InvalidPluginJson",
            Self::InvalidOutput { .. } => "InvalidPluginOutput",
            Self::InvalidManifest(_) => "InvalidManifest",
            Self::ResponseTooLarge { .. } => "ResponseTooLarge",
            Self::PluginFailed { .. } => "PluginFailed",
            Self::Internal(_) => "InternalError",
        }
    }
}

/// `sha256:` and the first 12 hex digits: enough to tell modules apart in a log line.
fn short_digest(digest: &str) -> String {
    match digest.get(..19) {
        Some(short) if digest.len() > 19 => format!("{short}…"),
        _ => digest.to_owned(),
    }
}

/// Sizes for people: `64 MiB`, `1.5 KiB`, `300 bytes`.
pub(crate) fn human_bytes(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * 1024;
    let (unit, name) = if bytes >= MIB {
        (MIB, "MiB")
    } else if bytes >= KIB {
        (KIB, "KiB")
    } else {
        return format!("{bytes} bytes");
    };
    if bytes.is_multiple_of(unit) {
        format!("{} {name}", bytes / unit)
    } else {
        format!("{:.1} {name}", bytes as f64 / unit as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_plugin_digest_and_call() {
        let err = PluginError::new(
            "memcached",
            "sha256:ab12cd34ef5678900000000000000000",
            PluginErrorKind::DeadlineExceeded {
                call: Call::Reconcile,
                limit: Duration::from_secs(1),
            },
        );
        assert_eq!(
            err.to_string(),
            "plugin memcached (sha256:ab12cd34ef56…): deadline of 1s exceeded in reconcile"
        );
        assert_eq!(err.reason(), "DeadlineExceeded");
    }

    #[test]
    fn trap_shows_the_guest_message() {
        let kind = PluginErrorKind::Trap {
            call: Call::Reconcile,
            message: "wasm trap: wasm `unreachable` instruction executed".into(),
            guest_message: Some("boom at src/lib.rs:3:5".into()),
        };
        assert!(
            kind.to_string()
                .ends_with("(guest: boom at src/lib.rs:3:5)")
        );
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(64 << 20), "64 MiB");
        assert_eq!(human_bytes(4096 << 10), "4 MiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(300), "300 bytes");
        assert_eq!(human_bytes(5 * 1024 * 1024 + 1), "5.0 MiB");
    }
}
