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
//! `floor(shards / m)`, gives one back per tick, and leaves it for another replica to take for
//! a Lease's duration. So replicas joining or leaving move whole shards, a few at a time.
//!
//! Replicas run with another `--shards` (a rolling update that changes it) cut the same
//! namespaces differently, so their Leases cannot keep the two counts apart: while any Lease
//! of another count is live, a replica takes nothing, and of two counts both holding shards
//! the smaller gives all of its back. The old replicas keep serving until the last one leaves.
//!
//! Each held shard has its own [`Fence`]: it opens on the renewal that acquired the Lease and
//! shuts the moment the Lease is lost or stops being renewed in time, as the leader's does.
//! Giving a shard back shuts its fence first and releases the Lease one tick later, so no
//! write of this replica can land after another takes it over.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
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
/// Label: the count of shards the replica was started with (`--shards`).
pub const COUNT_LABEL: &str = "wasmop.io/shard-count";

/// The shortest Lease duration a sharded replica accepts: renewed every tick, a Lease must
/// outlive a late tick and a retry.
pub const MIN_DURATION: Duration = Duration::from_secs(3 * TICK.as_secs());

/// The shards this replica holds now, each with the fence its writes pass.
pub type Held = BTreeMap<Shard, Fence>;

/// How a replica takes part.
#[derive(Debug, Clone)]
pub struct Sharding {
    /// How many shards the hash space is cut into (the same on every replica).
    pub shards: u32,
    /// Prefix of the Lease names: `<prefix>-<i>-of-<n>` and `<prefix>-member-<identity>`.
    pub lease_prefix: String,
    /// How long a Lease is valid without renewal; at least [`MIN_DURATION`].
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
    // Shards given back (or whose Lease cannot be created), and when: left alone for a
    // Lease's duration.
    given_back: HashMap<Shard, Instant>,
    // The other count whose live Leases keep this replica from taking shards, once logged.
    waiting_for: Option<u32>,
    // Shard Leases found under a name of this group but without its label, once logged.
    strangers: HashSet<String>,
    // This replica's member Lease as last written, renewed without reading it first.
    member: Option<Lease>,
    // When the member Lease was last renewed.
    member_renewed: Option<Instant>,
    ticks: u64,
}

/// What one listing showed.
#[derive(Default)]
struct View {
    // Live members run with this replica's count, this replica included.
    members: Vec<String>,
    // Holder of each shard whose Lease is live.
    holders: BTreeMap<Shard, String>,
    // Counts other than this replica's with a live shard Lease.
    other_counts: BTreeSet<u32>,
    // Shard Leases by name.
    leases: HashMap<String, Lease>,
}

/// What a replica does with its shards on one tick ([`plan`]).
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    Keep,
    /// Give back this many of the shards held.
    GiveBack(usize),
    Take(Vec<Shard>),
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
            given_back: HashMap::new(),
            waiting_for: None,
            strangers: HashSet::new(),
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
                // Shards lost while renewing stop now, not after the next good listing.
                self.publish();
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
                    (COUNT_LABEL.into(), self.sharding.shards.to_string()),
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
            ..View::default()
        };
        let count = self.sharding.shards;
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
                    // A member of a host version that did not label its count shares ours.
                    let theirs = lease.labels().get(COUNT_LABEL);
                    if theirs.is_none_or(|c| c.parse() == Ok(count)) {
                        view.members.push(who)
                    }
                }
                (Some("shard"), Some(who)) if live => {
                    match Shard::from_lease_name(&self.sharding.lease_prefix, &name) {
                        Some(shard) if shard.count() == count => {
                            view.holders.insert(shard, who);
                        }
                        // This identity's own, from before a restart with another count:
                        // that process is gone.
                        Some(_) if who == self.identity => {}
                        Some(shard) => {
                            view.other_counts.insert(shard.count());
                        }
                        None => {}
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

    /// How long `lease` stays live unrenewed: what it says, but never shorter than this
    /// replica's own duration, so that whoever can write a Lease cannot cut a holder's short.
    fn duration_of(&self, lease: &Lease) -> Duration {
        let stated = lease.spec.as_ref().and_then(|s| s.lease_duration_seconds);
        let stated = Duration::from_secs(stated.unwrap_or(0).max(0) as u64);
        stated.max(self.sharding.duration)
    }

    async fn balance(&mut self, view: &View) {
        let now = Instant::now();
        let duration = self.sharding.duration;
        self.given_back
            .retain(|_, at| now.duration_since(*at) < duration);
        let waiting_for = view.other_counts.last().copied();
        if waiting_for != self.waiting_for {
            match waiting_for {
                Some(other) => tracing::warn!(
                    shards = self.sharding.shards,
                    other,
                    "replicas run with --shards {other} hold shard Leases of this group; taking no shard while they do"
                ),
                None => tracing::info!(
                    shards = self.sharding.shards,
                    "no Lease of another shard count is live any more; taking shards"
                ),
            }
            self.waiting_for = waiting_for;
        }
        let held: BTreeSet<Shard> = self.held.keys().copied().collect();
        let cooling: BTreeSet<Shard> = self.given_back.keys().copied().collect();
        let count = self.sharding.shards;
        match plan(&self.identity, count, &held, view, &self.shards, &cooling) {
            Plan::Keep => {}
            Plan::GiveBack(n) => {
                let why = match waiting_for {
                    Some(_) => "a larger --shards holds shards too",
                    None => "balancing the replicas",
                };
                for _ in 0..n {
                    self.give_back(why);
                }
            }
            Plan::Take(free) => {
                for shard in free {
                    let name = shard.lease_name(&self.sharding.lease_prefix);
                    self.take(shard, view.leases.get(&name).cloned()).await;
                }
            }
        }
    }

    /// Gives back the highest shard held: its fence shuts now, its Lease goes next tick.
    fn give_back(&mut self, why: &str) {
        if let Some((shard, (lease, fence))) = self.held.pop_last() {
            fence.lose();
            self.given_back.insert(shard, Instant::now());
            tracing::info!(shard = %shard, "giving the shard back: {why}");
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
        let creating = existing.is_none();
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
            // Another replica was faster, or a Lease of that name is not labelled as ours.
            Err(kube::Error::Api(s)) if s.code == 409 && creating => {
                self.stranger(shard, &name).await
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => {
                tracing::warn!(shard = %shard, error = %crate::text::chain(&e), "taking a shard failed")
            }
        }
    }

    /// After creating `shard`'s Lease `name` failed: if a Lease of that name exists without
    /// this group's label, no replica lists it, so the shard cannot be held until it is
    /// deleted. Says so once, and leaves the shard alone for a Lease's duration so that the
    /// takes of each tick go to shards that can be held.
    async fn stranger(&mut self, shard: Shard, name: &str) {
        if !self.strangers.contains(name) {
            let Ok(Some(lease)) = self.api.get_opt(name).await else {
                return;
            };
            if lease.labels().get(GROUP_LABEL) == Some(&self.sharding.lease_prefix) {
                return;
            }
            tracing::warn!(
                lease = name,
                label = GROUP_LABEL,
                "a Lease has the name of a shard of this group but not its label; the shard stays unheld until it is deleted"
            );
            self.strangers.insert(name.to_string());
        }
        self.given_back.insert(shard, Instant::now());
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

/// What replica `me`, started with `count` shards and holding `held`, does after listing
/// `view`. It takes none of `cooling` (the shards it gave back lately): the replica it gave
/// one back for gets it, not this one on its very next tick.
fn plan(
    me: &str,
    count: u32,
    held: &BTreeSet<Shard>,
    view: &View,
    shards: &[Shard],
    cooling: &BTreeSet<Shard>,
) -> Plan {
    let mine = held.len();
    if let Some(&other) = view.other_counts.last() {
        // Both counts cut the same namespaces: one of them yields, the smaller.
        return if mine > 0 && other > count {
            Plan::GiveBack(mine)
        } else {
            Plan::Keep
        };
    }
    let mut counts: BTreeMap<&str, usize> = view.members.iter().map(|m| (m.as_str(), 0)).collect();
    for holder in view.holders.values() {
        if let Some(n) = counts.get_mut(holder.as_str()) {
            *n += 1;
        }
    }
    counts.insert(me, mine);
    let (most, least) = fair_share(shards.len(), view.members.len());
    let busiest = counts
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(id, _)| *id);
    let starved = counts.values().any(|&n| n < least);
    if mine > most || (mine > least && starved && busiest == Some(me)) {
        return Plan::GiveBack(1);
    }
    if mine >= most {
        return Plan::Keep;
    }
    // Free shards, starting at a place of this replica's own so that replicas starting
    // together try different ones first.
    let start = super::fnv1a64(me.as_bytes()) as usize % shards.len();
    let free: Vec<Shard> = (0..shards.len())
        .map(|i| shards[(start + i) % shards.len()])
        .filter(|s| !held.contains(s) && !cooling.contains(s))
        // Held by nobody live, or by this identity before a restart.
        .filter(|s| view.holders.get(s).is_none_or(|h| h == me))
        .take((most - mine).min(TAKE_PER_TICK))
        .collect();
    if free.is_empty() {
        Plan::Keep
    } else {
        Plan::Take(free)
    }
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

    /// Replicas ticking in turn over one table of Lease holders, as [`Keeper`] does: a shard
    /// given back names its holder until that holder's next tick releases it. Returns what
    /// each holds after `rounds`, and the round of the last change.
    fn simulate(count: u32, names: &[&str], start: &[&[u32]], rounds: u64) -> (Vec<usize>, u64) {
        let shards = Shard::all(count);
        let cooling_rounds = 8; // a 15 s Lease over 2 s ticks
        let mut table: BTreeMap<Shard, String> = BTreeMap::new();
        let mut held: Vec<BTreeSet<Shard>> = vec![BTreeSet::new(); names.len()];
        let mut releasing: Vec<Vec<Shard>> = vec![Vec::new(); names.len()];
        let mut given: Vec<BTreeMap<Shard, u64>> = vec![BTreeMap::new(); names.len()];
        for (r, indices) in start.iter().enumerate() {
            for &i in *indices {
                let shard = shards[i as usize];
                table.insert(shard, names[r].to_string());
                held[r].insert(shard);
            }
        }
        let mut last_change = 0;
        for round in 1..=rounds {
            for (r, me) in names.iter().enumerate() {
                for shard in std::mem::take(&mut releasing[r]) {
                    table.remove(&shard);
                }
                let view = View {
                    members: names.iter().map(|n| n.to_string()).collect(),
                    holders: table.clone(),
                    ..View::default()
                };
                given[r].retain(|_, at| round - *at < cooling_rounds);
                let cooling = given[r].keys().copied().collect();
                match plan(me, count, &held[r], &view, &shards, &cooling) {
                    Plan::Keep => {}
                    Plan::GiveBack(n) => {
                        for _ in 0..n {
                            let shard = held[r].pop_last().unwrap();
                            releasing[r].push(shard);
                            given[r].insert(shard, round);
                        }
                        last_change = round;
                    }
                    Plan::Take(free) => {
                        for shard in free {
                            assert!(table.get(&shard).is_none_or(|h| h == me));
                            table.insert(shard, me.to_string());
                            held[r].insert(shard);
                        }
                        last_change = round;
                    }
                }
            }
        }
        assert_eq!(table.len(), shards.len(), "every shard is held: {table:?}");
        (held.iter().map(BTreeSet::len).collect(), last_change)
    }

    #[test]
    fn a_replica_joining_gets_its_share_when_it_does_not_divide_evenly() {
        // 12 shards on four replicas, and a fifth joins: it must end with 2 and stay there,
        // not watch the busiest give one back and take it again on every other tick.
        let four: [&[u32]; 4] = [&[0, 1, 2], &[3, 4, 5], &[6, 7, 8], &[9, 10, 11]];
        let (held, settled) = simulate(12, &["a", "b", "c", "d", "e"], &four, 100);
        assert!(held.iter().all(|&n| n == 2 || n == 3), "{held:?}");
        assert_eq!(held.iter().sum::<usize>(), 12);
        assert!(settled < 30, "the last move came on round {settled}");
        // Evenly: from one replica to three.
        let one: [&[u32]; 1] = [&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]];
        let (held, settled) = simulate(12, &["a", "b", "c"], &one, 100);
        assert_eq!(held, vec![4, 4, 4]);
        assert!(settled < 30, "the last move came on round {settled}");
        // From nothing, together.
        let (held, _) = simulate(16, &["a", "b", "c", "d", "e"], &[], 100);
        assert!(held.iter().all(|&n| n == 3 || n == 4), "{held:?}");
    }

    #[test]
    fn of_two_counts_holding_shards_the_smaller_gives_all_back_and_none_is_taken() {
        let shards = Shard::all(12);
        let view = |other: u32| View {
            members: vec!["a".into()],
            other_counts: BTreeSet::from([other]),
            ..View::default()
        };
        let none = BTreeSet::new();
        let three: BTreeSet<Shard> = shards[..3].iter().copied().collect();
        // Started with 12 while Leases of 16 are live: everything goes back.
        assert_eq!(
            plan("a", 12, &three, &view(16), &shards, &none),
            Plan::GiveBack(3)
        );
        // The larger count keeps what it holds, and neither takes more.
        assert_eq!(plan("a", 12, &three, &view(8), &shards, &none), Plan::Keep);
        assert_eq!(plan("a", 12, &none, &view(16), &shards, &none), Plan::Keep);
        assert_eq!(plan("a", 12, &none, &view(8), &shards, &none), Plan::Keep);
        // Alone in its count, it takes four a tick.
        let alone = View {
            members: vec!["a".into()],
            ..View::default()
        };
        assert!(
            matches!(plan("a", 12, &none, &alone, &shards, &none), Plan::Take(t) if t.len() == 4)
        );
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
