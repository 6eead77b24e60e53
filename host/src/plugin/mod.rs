//! Plugins from ConfigMaps: read the bytes ([`source`]), compile and check them in the
//! sandbox and check the host may do what they need ([`load`], [`access`]), hand each only what its own
//! identity may read ([`reads`]), and follow the
//! ConfigMaps, handing every good version to whoever runs controllers ([`registry`]), each
//! recorded as a revision in the cluster ([`revision`]) and rolled out as its ConfigMap asks
//! ([`rollout`]). Compiled plugins are shared between the host's replicas ([`artifacts`]).

pub mod access;
pub mod artifacts;
pub mod identity;
pub mod load;
pub mod notice;
pub mod oci;
pub mod offline;
pub mod package;
pub mod rbac;
pub mod reads;
pub mod registry;
pub mod revision;
pub mod rollout;
pub mod script_tests;
pub mod source;

pub use identity::Identity;
pub use load::{LoadError, Loaded, Loader};
pub use notice::Notice;
pub use registry::{Activation, Canary, Registry, State, Status, Supervise};
pub use source::{PLUGIN_LABEL, PluginSource};
