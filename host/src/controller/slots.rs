//! How many parents of one plugin a host reconciles at once (`--concurrency`), however many
//! controllers run that plugin.
//!
//! A sharded host runs one controller per plugin on every shard it holds. Counted per
//! controller, a replica holding 12 shards would reconcile 12 times `--concurrency` parents at
//! once, and taking over a dead replica's shards would raise it further: more calls in the
//! sandbox, more requests to the API server, more memory in flight. [`Slots`] gives each plugin
//! one budget that all its controllers on the host draw from.
//!
//! ```
//! use wasmop::controller::Slots;
//!
//! let slots = Slots::new(2);
//! let (a, b) = (slots.of("memcached"), slots.of("memcached"));
//! let first = a.clone().try_acquire_owned().unwrap();
//! let second = b.clone().try_acquire_owned().unwrap();
//! assert!(a.clone().try_acquire_owned().is_err(), "two at once, over both controllers");
//! drop((first, second));
//! assert_eq!(slots.of("web-app").available_permits(), 2, "another plugin has its own");
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

/// Each plugin's reconcile slots on this host, by plugin ConfigMap. Clones share them.
#[derive(Debug, Clone)]
pub struct Slots {
    per_plugin: usize,
    plugins: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
}

impl Slots {
    /// `per_plugin` reconciles at once for each plugin (at least one).
    pub fn new(per_plugin: usize) -> Self {
        Slots {
            per_plugin: per_plugin.max(1),
            plugins: Arc::default(),
        }
    }

    /// The slots of the plugin loaded from `configmap`, the same for every controller of it.
    pub fn of(&self, configmap: &str) -> Arc<Semaphore> {
        let mut plugins = self.plugins.lock().expect("slots lock");
        plugins
            .entry(configmap.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_plugin)))
            .clone()
    }
}
