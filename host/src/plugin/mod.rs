//! Plugins from ConfigMaps: read the bytes ([`source`]), compile and check them in the
//! sandbox, check the host may do what it needs ([`access`]), and keep one controller running
//! per good plugin ([`registry`]).

pub mod access;
pub mod registry;
pub mod source;

pub use registry::{Registry, State, Status};
pub use source::{PLUGIN_LABEL, PluginSource};
