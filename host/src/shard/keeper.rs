//! Holds shards through Leases: one `coordination.k8s.io/v1` Lease per shard, and one per
//! replica saying it is alive, all in the host's namespace.
//!
//! Every [`TICK`] a replica lists the Leases and renews those of its own that are due: its
//! member Lease and the shard Leases it holds, each a third of its duration after the last
//! renewal, so twelve shards held on 15 s Leases cost the plane about three writes a second
//! rather than six. A Lease whose `resourceVersion` has not moved for its duration, as this
//! replica watched it (not by the writer's clock), is expired. With `m` live members each
//! replica holds `ceil(shards / m)` at most: a replica under that takes free or expired
//! shards, a few per tick; one over it, or the most loaded one while another holds less than
//! `floor(shards / m)`, gives one back per tick. So replicas joining or leaving move whole
//! shards, a few at a time.
//!
//! Each held shard has its own [`Fence`]: it opens on the renewal that acquired the Lease and
//! shuts the moment the Lease is lost or stops being renewed in time, as the leader's does.
//! Giving a shard back shuts its fence first and releases the Lease one tick later, so no
//! write of this replica can land after another takes it over.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Shard;
use crate::client::Fence;

/// How often Leases are renewed and the shards balanced.
pub const TICK: Duration = Duration::from_secs(2);

/// Shards taken per tick at most.
const TAKE_PER_TICK: usize = 4;

/// Label on every Lease of a sharded host: the prefix of its shard Leases.
pub const GROUP_LABEL: &str = "wasmop.io/shard-group";
/// Label: `shard` or `member`.
pub const ROLE_LABEL: &str = "wasmop.io/shard-role";

/// The shards this replica holds now, each with the fence its writes pass.
pub type Held = BTreeMap<Shard, Fence>;

/// How a replica takes part.
#[derive(Debug, Clone)]
pub struct Sharding {
    /// How many shards the hash space is cut into (the same on every replica).
    pub shards: u32,
    /// Prefix of the Lease names: `<prefix>-<i>-of-<n>` and `<prefix>-member-<identity>`.
    pub lease_prefix: String,
    /// How long a Lease is valid without renewal.
    pub duration: Duration,
}

/// Takes, renews, balances and gives back this replica's shards.
pub struct Keeper {
    api: Api<Lease>,
    client: Client,
    identity: String,
    sharding: Sharding,
    shards: Vec<Shard>,
    // What this replica holds: the Lease as last written, and the fence.
    held: BTreeMap<Shard, (Lease, Fence)>,
    tx: watch::Sender<Held>,
    // Each Lease's resourceVersion and since when this replica has seen it unchanged.
    seen: HashMap<String, (String, Instant)>,
    // A shard given back: its fence is shut; its Lease is released on the next tick.
    releasing: Vec<Lease>,
    // This replica's member Lease as last written, renewed without reading it first.
    member: Option<Lease>,
    // When the member Lease was last renewed.
    member_renewed: Option<Instant>,
    ticks: u64,
}

/// What one listing showed.
struct View {
    // Live members, this replica included.
    members: Vec<String>,
    // Holder of each shard whose Lease is live.
    holders: BTreeMap<Shard, String>,
    // Shard Leases by name.
    leases: HashMap<String, Lease>,
}

impl Keeper {
    /// A keeper for `identity` in `namespace`, and the shards it holds as they change.
    pub fn new(
        client: Client,
        namespace: &str,
        identity: &str,
        sharding: Sharding,
    ) -> (Keeper, watch::Receiver<Held>) {
        let (tx, rx) = watch::channel(Held::new());
        let keeper = Keeper {
            api: Api::namespaced(client.clone(), namespace),
            client,
            identity: identity.to_string(),
            shards: Shard::all(sharding.shards),
            sharding,
            held: BTreeMap::new(),
            tx,
            seen: HashMap::new(),
            releasing: Vec::new(),
            member: None,
            member_renewed: None,
            ticks: 0,
        };
        (keeper, rx)
    }

    /// Keeps shards until `stop` resolves, then gives every one back and leaves.
    pub async fn run(mut self, stop: impl Future<Output = ()>) {
        tracing::info!(
            shards = self.sharding.shards,
            identity = %self.identity,
            "sharding parents by namespace across replicas"
        );
        let mut stop = std::pin::pin!(stop);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = tick.tick() => self.tick().await,
            }
        }
        self.leave().await;
    }

    async fn tick(&mut self) {
        self.ticks += 1;
        self.renew_member().await;
        self.renew_held().await;
        for lease in std::mem::take(&mut self.releasing) {
            self.release(lease).await;
        }
        let view = match self.view().await {
            Ok(view) => view,
            Err(e) => {
                tracing::warn!(error = %crate::text::chain(&e), "listing shard Leases failed; holding what is held");
                return;
            }
        };
        // The first tick only announces this replica, so that replicas starting together see
        // each other before taking shards.
        if self.ticks > 1 {
            self.balance(&view).await;
        }
        self.publish();
    }

    fn publish(&self) {
        crate::telemetry::metrics::metrics()
            .shards_held
            .set(self.held.len() as i64);
        let held: Held = self
            .held
            .iter()
            .map(|(s, (_, f))| (*s, f.clone()))
            .collect();
        self.tx.send_if_modified(|now| {
            let same = now.len() == held.len()
                && now
                    .iter()
                    .zip(&held)
                    .all(|((a, fa), (b, fb))| a == b && fa.same(fb));
            if !same {
                *now = held;
            }
            !same
        });
    }

    fn member_name(&self) -> String {
        member_lease_name(&self.sharding.lease_prefix, &self.identity)
    }

    fn lease(&self, name: &str, role: &str) -> Lease {
        let now = MicroTime(Timestamp::now());
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(BTreeMap::from([
                    (GROUP_LABEL.into(), self.sharding.lease_prefix.clone()),
                    (ROLE_LABEL.into(), role.into()),
                ])),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.sharding.duration.as_secs() as i32),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..Default::default()
            }),
        }
    }

    async fn renew_member(&mut self) {
        let started = Instant::now();
        if !due(
            self.member_renewed,
            started,
            renew_every(self.sharding.duration),
        ) {
            return;
        }
        let name = self.member_name();
        let mut fresh = self.lease(&name, "member");
        // Read only when the last write is unknown or was overtaken (a restart, a conflict).
        let last = match self.member.take() {
            Some(last) => Ok(Some(last)),
            None => self.api.get_opt(&name).await,
        };
        let result = match last {
            Ok(Some(last)) => {
                fresh.metadata.resource_version = last.resource_version();
                self.api
                    .replace(&name, &PostParams::default(), &fresh)
                    .await
            }
            Ok(None) => self.api.create(&PostParams::default(), &fresh).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(lease) => {
                self.member = Some(lease);
                self.member_renewed = Some(started);
            }
            Err(e) => {
                tracing::warn!(lease = %name, error = %crate::text::chain(&e), "renewing this replica's member Lease failed")
            }
        }
    }

    /// Renews each held shard's Lease that is due through its fence's observer; a shard whose
    /// Lease names another holder, or whose fence shut for want of a renewal, is lost.
    async fn renew_held(&mut self) {
        let mut lost = Vec::new();
        let every = renew_every(self.sharding.duration);
        for (shard, (lease, fence)) in &mut self.held {
            if !due(fence.renewed_at(), Instant::now(), every) {
                continue;
            }
            let name = lease.name_any();
            let api: Api<Lease> = Api::namespaced(
                fence.observe(&self.client),
                &lease.namespace().unwrap_or_default(),
            );
            let mut next = lease.clone();
            if let Some(spec) = next.spec.as_mut() {
                spec.renew_time = Some(MicroTime(Timestamp::now()));
            }
            match api.replace(&name, &PostParams::default(), &next).await {
                Ok(renewed) if holder(&renewed) == Some(self.identity.as_str()) => *lease = renewed,
                Ok(_) => lost.push((*shard, "another replica holds it".to_string())),
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => lost.push((
                    *shard,
                    format!("it changed under this replica ({})", s.reason),
                )),
                Err(e) if !fence.is_open() => lost.push((
                    *shard,
                    format!("no renewal succeeded in time: {}", crate::text::chain(&e)),
                )),
                Err(e) => {
                    tracing::warn!(shard = %shard, error = %crate::text::chain(&e), "renewing a shard Lease failed; retrying")
                }
            }
        }
        for (shard, why) in lost {
            if let Some((_, fence)) = self.held.remove(&shard) {
                fence.lose();
                tracing::warn!(shard = %shard, "lost the shard's Lease: {why}; its writes stop");
            }
        }
    }

    async fn view(&mut self) -> Result<View, kube::Error> {
        let selector = format!("{GROUP_LABEL}={}", self.sharding.lease_prefix);
        let list = self
            .api
            .list(&ListParams::default().labels(&selector))
            .await?;
        let now = Instant::now();
        let mut seen = HashMap::new();
        let mut view = View {
            members: vec![self.identity.clone()],
            holders: BTreeMap::new(),
            leases: HashMap::new(),
        };
        for lease in list.items {
            let name = lease.name_any();
            let version = lease.resource_version().unwrap_or_default();
            let since = match self.seen.get(&name) {
                Some((v, since)) if *v == version => *since,
                _ => now,
            };
            seen.insert(name.clone(), (version, since));
            let live = now.duration_since(since) < self.duration_of(&lease);
            let who = holder(&lease).filter(|h| !h.is_empty()).map(str::to_string);
            let role = lease.labels().get(ROLE_LABEL).map(String::as_str);
            match (role, who) {
                (Some("member"), Some(who)) if live && who != self.identity => {
                    view.members.push(who)
                }
                (Some("shard"), Some(who)) if live => {
                    // Leases of a group run with another count are not this keeper's.
                    if let Some(shard) = Shard::from_lease_name(&self.sharding.lease_prefix, &name)
                        .filter(|s| s.count() as usize == self.shards.len())
                    {
                        view.holders.insert(shard, who);
                    }
                }
                _ => {}
            }
            view.leases.insert(name, lease);
        }
        self.seen = seen;
        view.members.sort();
        view.members.dedup();
        Ok(view)
    }

    fn duration_of(&self, lease: &Lease) -> Duration {
        lease
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .map_or(self.sharding.duration, |s| {
                Duration::from_secs(s.max(1) as u64)
            })
    }

    async fn balance(&mut self, view: &View) {
        let mut counts: BTreeMap<&str, usize> =
            view.members.iter().map(|m| (m.as_str(), 0)).collect();
        for holder in view.holders.values() {
            if let Some(n) = counts.get_mut(holder.as_str()) {
                *n += 1;
            }
        }
        counts.insert(&self.identity, self.held.len());
        let (most, least) = fair_share(self.shards.len(), view.members.len());
        let mine = self.held.len();
        let busiest = counts
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(id, _)| *id);
        let starved = counts.values().any(|&n| n < least);
        if mine > most || (mine > least && starved && busiest == Some(self.identity.as_str())) {
            self.give_back();
            return;
        }
        if mine >= most {
            return;
        }
        // Free shards, starting at a place of this replica's own so that replicas starting
        // together try different ones first.
        let start = super::fnv1a64(self.identity.as_bytes()) as usize % self.shards.len();
        let free: Vec<Shard> = (0..self.shards.len())
            .map(|i| self.shards[(start + i) % self.shards.len()])
            .filter(|s| !self.held.contains_key(s))
            // Held by nobody live, or by this identity before a restart.
            .filter(|s| view.holders.get(s).is_none_or(|h| *h == self.identity))
            .take((most - mine).min(TAKE_PER_TICK))
            .collect();
        for shard in free {
            let name = shard.lease_name(&self.sharding.lease_prefix);
            self.take(shard, view.leases.get(&name).cloned()).await;
        }
    }

    /// Gives back the highest shard held: its fence shuts now, its Lease goes next tick.
    fn give_back(&mut self) {
        if let Some((shard, (lease, fence))) = self.held.pop_last() {
            fence.lose();
            tracing::info!(shard = %shard, "giving the shard back to balance the replicas");
            self.releasing.push(lease);
        }
    }

    async fn take(&mut self, shard: Shard, existing: Option<Lease>) {
        let name = shard.lease_name(&self.sharding.lease_prefix);
        let mut wanted = self.lease(&name, "shard");
        // The fence opens on a write to the Lease it observes: an update is one; a Lease
        // created new is confirmed by one.
        let fence = Fence::new(&name, &self.identity, self.sharding.duration);
        fence.lead();
        let observed: Api<Lease> = Api::namespaced(
            fence.observe(&self.client),
            self.api.namespace().unwrap_or_default(),
        );
        let taken = match existing {
            Some(old) => {
                wanted.metadata.resource_version = old.resource_version();
                observed
                    .replace(&name, &PostParams::default(), &wanted)
                    .await
            }
            None => match self.api.create(&PostParams::default(), &wanted).await {
                Ok(created) => {
                    observed
                        .replace(&name, &PostParams::default(), &created)
                        .await
                }
                Err(e) => Err(e),
            },
        };
        match taken {
            Ok(lease) if fence.is_open() => {
                tracing::info!(shard = %shard, "took the shard; reconciling its parents");
                self.held.insert(shard, (lease, fence));
            }
            Ok(_) => {
                tracing::warn!(shard = %shard, "took the shard's Lease, but too late to use it")
            }
            // Another replica was faster.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => {
                tracing::warn!(shard = %shard, error = %crate::text::chain(&e), "taking a shard failed")
            }
        }
    }

    /// Marks a Lease free, as leader election does: no holder, a 1 s duration.
    async fn release(&self, mut lease: Lease) {
        let name = lease.name_any();
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
        }
        match self
            .api
            .replace(&name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %name, "released the shard's Lease"),
            // Someone else wrote it since: it is not ours to release.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => {
                tracing::warn!(lease = %name, error = %crate::text::chain(&e), "releasing a shard's Lease failed; it expires on its own")
            }
        }
    }

    /// Gives every shard back and removes this replica's member Lease.
    async fn leave(mut self) {
        let held = std::mem::take(&mut self.held);
        for (_, fence) in held.values() {
            fence.lose();
        }
        self.publish();
        let leases: Vec<Lease> = std::mem::take(&mut self.releasing)
            .into_iter()
            .chain(held.into_values().map(|(l, _)| l))
            .collect();
        for lease in leases {
            self.release(lease).await;
        }
        let name = self.member_name();
        if let Err(e) = self.api.delete(&name, &DeleteParams::default()).await {
            tracing::debug!(lease = %name, error = %crate::text::chain(&e), "removing the member Lease failed; it expires on its own");
        }
        tracing::info!("gave every shard back");
    }
}

/// Who each shard Lease of group `prefix` in `namespace` names as its holder, live or not:
/// for tools and tests that watch the shards move.
pub async fn holders(
    client: &Client,
    namespace: &str,
    prefix: &str,
) -> Result<BTreeMap<Shard, String>, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{GROUP_LABEL}={prefix},{ROLE_LABEL}=shard");
    let list = api.list(&ListParams::default().labels(&selector)).await?;
    Ok(list
        .items
        .iter()
        .filter_map(|l| {
            let shard = Shard::from_lease_name(prefix, &l.name_any())?;
            let who = holder(l).filter(|h| !h.is_empty())?;
            Some((shard, who.to_string()))
        })
        .collect())
}

fn holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref()
}

/// `<prefix>-member-<identity>`, cut to a valid object name.
fn member_lease_name(prefix: &str, identity: &str) -> String {
    let clean: String = identity
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let name = format!("{prefix}-member-{clean}");
    let hash = format!("{:08x}", super::fnv1a64(identity.as_bytes()) as u32);
    if name.len() <= 253 && clean == identity {
        name
    } else {
        // Distinct identities must not share a name once cut or cleaned.
        let mut cut: String = name.chars().take(240).collect();
        cut.push('-');
        cut.push_str(&hash);
        cut
    }
}

/// How often a Lease of `duration` is renewed: a third of it, and never more than once a tick.
fn renew_every(duration: Duration) -> Duration {
    (duration / 3).max(TICK)
}

/// Whether a Lease last renewed at `last` (never: `None`) is due at `now`. Ticks land a
/// little early or late, so one that would be due within half a tick is sent now rather than
/// a whole tick later.
fn due(last: Option<Instant>, now: Instant, every: Duration) -> bool {
    last.is_none_or(|t| now.saturating_duration_since(t) + TICK / 2 >= every)
}

/// Most and fewest shards a replica should hold: `(ceil, floor)` of `shards / members`.
pub fn fair_share(shards: usize, members: usize) -> (usize, usize) {
    let members = members.max(1);
    (shards.div_ceil(members), shards / members)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares() {
        assert_eq!(fair_share(3, 1), (3, 3));
        assert_eq!(fair_share(3, 3), (1, 1));
        assert_eq!(fair_share(4, 3), (2, 1));
        assert_eq!(fair_share(12, 5), (3, 2));
        assert_eq!(fair_share(2, 3), (1, 0));
        assert_eq!(fair_share(5, 0), (5, 5));
    }

    #[test]
    fn renewals_come_a_third_of_the_duration_apart() {
        let t = Instant::now();
        let at = |ms| t + Duration::from_millis(ms);
        assert!(due(None, t, renew_every(Duration::from_secs(15))));
        // 15 s Leases: every other tick (4 s), not every tick.
        let every = renew_every(Duration::from_secs(15));
        assert_eq!(every, Duration::from_secs(5));
        assert!(!due(Some(t), at(2_000), every));
        assert!(due(Some(t), at(4_000), every));
        // 6 s Leases (the tests'): every tick, even one that lands a little early.
        let every = renew_every(Duration::from_secs(6));
        assert!(due(Some(t), at(1_990), every));
        assert!(!due(Some(t), at(500), every));
        // Short Leases never renew more often than a tick.
        assert_eq!(renew_every(Duration::from_secs(3)), TICK);
        // From 10 s Leases up, a late renewal and one retry still land inside the fence's
        // validity (the duration less 1 s).
        for secs in [10, 15, 30, 60, 137] {
            let d = Duration::from_secs(secs);
            assert!(
                renew_every(d) + TICK + TICK / 2 < d - Duration::from_secs(1),
                "{secs}"
            );
        }
    }

    #[test]
    fn member_names_are_valid_and_distinct() {
        assert_eq!(member_lease_name("p", "host-a"), "p-member-host-a");
        let a = member_lease_name("p", "Host_A");
        let b = member_lease_name("p", "host-a");
        assert_ne!(a, b);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
        assert!(member_lease_name("p", &"x".repeat(400)).len() <= 253);
    }
}
