//! Plugins from ConfigMaps: read the bytes ([`source`]), compile and check them in the
//! sandbox, and keep one controller running per good plugin ([`registry`]).

pub mod registry;
pub mod source;

pub use registry::Registry;
pub use source::{PLUGIN_LABEL, PluginSource};
