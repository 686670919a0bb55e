//! The gateway's shared state, built once from the configuration
//! (`build.rs`): the router, the domain map, the region directory and each
//! shard's upstream peer (`peer.rs`). The proxy reads it on every request;
//! the admin API, the health checker, the state file and the cluster and
//! DNS services change it at runtime.

mod build;
mod peer;

pub use peer::{build_peer, keepalive, peer_at, ShardPeer, UpstreamKey};

use crate::cluster::Shared;
use crate::config::Config;
use crate::hooks::GatewayHooks;
use crate::metrics::GatewayMetrics;
use crate::routing::{DomainMap, RegionDirectory, Router, Shard, ShardId};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

/// How to reach each shard, by its id. Looked up for every request: a
/// fast hash (the ids are the operator's, never a client's).
type Peers = HashMap<ShardId, Arc<ShardPeer>, foldhash::fast::RandomState>;

pub struct Control {
    pub config: Arc<Config>,
    pub router: Router,
    pub domains: DomainMap,
    pub regions: Option<RegionDirectory>,
    pub hooks: Arc<dyn GatewayHooks>,
    pub metrics: GatewayMetrics,
    /// Each request's line (DESIGN §7).
    pub access_log: crate::access_log::AccessLog,
    /// Spans and their export (DESIGN §7); off without `tracing`.
    pub tracer: crate::trace::Tracer,
    /// Cluster mode (DESIGN §4): what the cluster service shares.
    pub cluster: Option<Arc<Shared>>,
    /// TLS at the edge (DESIGN §5): certificates, ACME challenges.
    pub edge: Arc<crate::tls::Edge>,
    peers: ArcSwap<Peers>,
    /// Runtime changes since the configuration was loaded (the state file
    /// keeps them); its lock also serialises those changes.
    diff: Mutex<RuntimeDiff>,
}

impl Control {
    /// Builds everything the configuration describes. Fails if a shard's
    /// host does not resolve or the domain map is invalid (both checked by
    /// validation already; this is the last line).
    pub fn new(config: Config, hooks: Arc<dyn GatewayHooks>) -> Result<Control, String> {
        let peers = build::shard_peers(&config)?;
        let load = build::load_signal(&config, &hooks);
        let cluster = config.cluster.clone().map(Shared::new);
        let router = build::router(&config, &hooks, load, cluster.as_ref());
        let domains = build::domain_map(&config)?;
        let regions = build::region_directory(&config, cluster.as_ref())?;
        let edge = Arc::new(crate::tls::Edge::new(&config));
        let access_log = crate::access_log::AccessLog::new(&config.log)?;
        let tracer = crate::trace::Tracer::new(config.tracing.as_ref());
        Ok(Control {
            access_log,
            tracer,
            edge,
            config: Arc::new(config),
            router,
            domains,
            regions,
            hooks,
            metrics: GatewayMetrics::default(),
            cluster,
            peers: ArcSwap::from_pointee(peers),
            diff: Mutex::new(RuntimeDiff::default()),
        })
    }

    /// How to reach a shard (registered now or earlier in this request).
    pub fn peer(&self, id: &ShardId) -> Option<Arc<ShardPeer>> {
        self.peers.load().get(id).cloned()
    }

    /// Every shard's endpoint for the fast transport (its pools keep idle
    /// connections to these only).
    pub fn peer_keys(&self) -> std::collections::HashSet<UpstreamKey> {
        self.peers.load().values().map(|p| p.key.clone()).collect()
    }

    /// Points a shard whose host name now resolves to `addrs` at one of
    /// them: the current address while it is still among them (a name
    /// that answers its addresses in turn moves nothing), else the first.
    /// Returns the new address if it moved.
    pub fn repoint(&self, shard: &Shard, addrs: &[SocketAddr]) -> Option<SocketAddr> {
        let _serialised = self.diff.lock();
        // Removed meanwhile, or added again otherwise (another URL, another
        // protocol or PROXY setting): not this one.
        let set = self.router.shard_set();
        if set
            .get(shard.id.as_str())
            .is_none_or(|e| *e.shard != *shard)
        {
            return None;
        }
        let current = self.peers.load();
        let peer = current.get(&shard.id)?;
        if addrs.contains(&peer.addr) {
            return None;
        }
        let addr = *addrs.first()?;
        let moved = match peer_at(&self.config, shard, addr) {
            Ok(peer) => Arc::new(peer),
            Err(e) => {
                log::warn!("shard `{}`: {e}", shard.id);
                return None;
            }
        };
        let mut next = HashMap::clone(&current);
        next.insert(shard.id.clone(), moved);
        self.peers.store(Arc::new(next));
        Some(addr)
    }

    /// Registers a shard at runtime; `Ok(false)` if the id exists. Its
    /// host name (if it has one) is resolved with a blocking lookup: for
    /// the start's replay of the state file, before anything is served
    /// (as nginx resolves its upstreams at start); the admin API's and the
    /// cluster's [`Control::add_shard_resolved`] does not block.
    pub fn add_shard(&self, shard: Shard) -> Result<bool, String> {
        let peer = build_peer(&self.config, &shard)?;
        self.add_shard_at(shard, peer)
    }

    /// [`Control::add_shard`], its host name resolved without blocking a
    /// thread and within the lookup's deadline (a name that does not
    /// answer in time is an error naming why).
    pub async fn add_shard_resolved(&self, shard: Shard) -> Result<bool, String> {
        let addr = crate::dns::shard_addr(&shard).await?;
        let peer = peer_at(&self.config, &shard, addr)?;
        self.add_shard_at(shard, peer)
    }

    fn add_shard_at(&self, shard: Shard, peer: ShardPeer) -> Result<bool, String> {
        let peer = Arc::new(peer);
        let mut diff = self.diff.lock();
        if self.router.shard_set().get(shard.id.as_str()).is_some() {
            return Ok(false);
        }
        let mut next = HashMap::clone(&self.peers.load());
        next.insert(shard.id.clone(), peer);
        self.peers.store(Arc::new(next));
        diff.shard_added(&shard);
        self.publish(|| {
            let json = serde_json::to_string(&shard).unwrap_or_default();
            (format!("shard:{}", shard.id), json)
        });
        Ok(self.router.add_shard(shard))
    }

    /// Removes a shard; requests already on it finish.
    pub fn remove_shard(&self, id: &str) -> bool {
        let mut diff = self.diff.lock();
        let removed = self.router.remove_shard(id);
        if removed {
            let mut next = HashMap::clone(&self.peers.load());
            next.remove(id);
            self.peers.store(Arc::new(next));
            diff.shard_removed(id, self.config.shards.iter().any(|s| s.id.as_str() == id));
            self.publish(|| (format!("shard:{id}"), REMOVED.to_string()));
        }
        removed
    }

    /// Maps a host (or `*.suffix`) to a tenant.
    pub fn put_domain(&self, host: &str, tenant: &str) -> Result<(), String> {
        let mut diff = self.diff.lock();
        self.domains.add(host, tenant).map_err(|e| e.to_string())?;
        diff.domain_put(host, tenant);
        self.publish(|| (domain_field(host), tenant.to_string()));
        Ok(())
    }

    /// Removes a host mapping; `false` if there was none.
    pub fn delete_domain(&self, host: &str) -> bool {
        let mut diff = self.diff.lock();
        let removed = self.domains.remove(host);
        if removed {
            let normalized = crate::routing::domain::normalize(host);
            let configured = self
                .config
                .domains
                .map
                .iter()
                .any(|(h, _)| crate::routing::domain::normalize(h) == normalized);
            diff.domain_deleted(host, configured);
            self.publish(|| (domain_field(host), REMOVED.to_string()));
        }
        removed
    }

    /// Adds a tenant to the deny list; returns whether it was new.
    pub fn deny(&self, tenant: &str) -> bool {
        let mut diff = self.diff.lock();
        let added = self.router.deny(tenant);
        if added {
            diff.denied(tenant, self.config.limits.deny.iter().any(|t| t == tenant));
        }
        self.publish(|| (format!("deny:{tenant}"), "1".to_string()));
        added
    }

    /// Lifts a denial; returns whether the tenant was denied.
    pub fn undeny(&self, tenant: &str) -> bool {
        let mut diff = self.diff.lock();
        let removed = self.router.undeny(tenant);
        if removed {
            diff.undenied(tenant, self.config.limits.deny.iter().any(|t| t == tenant));
            self.publish(|| (format!("deny:{tenant}"), "0".to_string()));
        }
        removed
    }

    /// Drains a shard (shared in cluster mode).
    pub fn drain(&self, id: &str) -> bool {
        let known = self.router.drain(id);
        if known {
            self.publish(|| (format!("drain:{id}"), "1".to_string()));
        }
        known
    }

    /// Marks a shard healthy, which also ends a drain (the drain's end is
    /// shared in cluster mode; health stays each node's own).
    pub fn mark_healthy(&self, id: &str) -> bool {
        let was_draining = self.router.is_draining(id);
        let known = self.router.mark_healthy(id);
        if known && was_draining {
            self.publish(|| (format!("drain:{id}"), "0".to_string()));
        }
        known
    }

    /// Pins a tenant to a region (an override, shared in cluster mode).
    pub fn assign_region(&self, tenant: &str, region: &str) -> Result<(), String> {
        let Some(directory) = &self.regions else {
            return Err("no regions are configured".to_string());
        };
        directory
            .assign(tenant, region)
            .map_err(|e| e.to_string())?;
        self.publish(|| (format!("region:{tenant}"), region.to_string()));
        Ok(())
    }

    /// Forgets a tenant's region assignment; `false` if it had none.
    pub fn release_region(&self, tenant: &str) -> bool {
        let released = self.regions.as_ref().is_some_and(|d| d.release(tenant));
        if released {
            self.publish(|| (format!("region:{tenant}"), REMOVED.to_string()));
        }
        released
    }

    /// Shares a runtime change with the other nodes (cluster mode only).
    fn publish(&self, change: impl FnOnce() -> (String, String)) {
        if let Some(shared) = &self.cluster {
            let (field, value) = change();
            shared.publish(field, value);
        }
    }

    /// Applies a runtime change another node made (cluster mode): one field
    /// of the shared state, as `publish` wrote it. Unknown fields are
    /// logged and skipped (a newer node's). A shard's host name is resolved
    /// without blocking the cluster's thread, within the lookup deadline.
    pub async fn apply_shared(&self, field: &str, value: &str) {
        let Some((kind, key)) = field.split_once(':') else {
            log::warn!("cluster: unknown state field `{field}`");
            return;
        };
        let removed = value == REMOVED;
        match kind {
            "shard" if removed => {
                self.remove_shard(key);
            }
            "shard" => match serde_json::from_str::<Shard>(value) {
                Ok(shard) if self.router.shard_set().get(shard.id.as_str()).is_none() => {
                    if let Err(e) = self.add_shard_resolved(shard).await {
                        log::warn!("cluster: cannot add shard `{key}`: {e}");
                    }
                }
                Ok(_) => {}
                Err(e) => log::warn!("cluster: shard `{key}`: {e}"),
            },
            "domain" if removed => {
                self.delete_domain(key);
            }
            "domain" => {
                if self.domains.entry(key).as_deref() != Some(value) {
                    if let Err(e) = self.put_domain(key, value) {
                        log::warn!("cluster: domain `{key}`: {e}");
                    }
                }
            }
            "deny" if value == "1" => {
                self.deny(key);
            }
            "deny" => {
                self.undeny(key);
            }
            "drain" if value == "1" => {
                self.drain(key);
            }
            "drain" => {
                if self.router.is_draining(key) {
                    self.mark_healthy(key);
                }
            }
            "region" if removed => {
                self.release_region(key);
            }
            "region" => {
                if let Err(e) = self.assign_region(key, value) {
                    log::warn!("cluster: region of `{key}`: {e}");
                }
            }
            "plan" => {
                let plan = (!removed).then_some(value);
                if let Err(e) = self.set_plan(key, plan) {
                    log::warn!("cluster: plan of `{key}`: {e}");
                }
            }
            _ => log::warn!("cluster: unknown state field `{field}`"),
        }
    }

    /// The runtime changes so far.
    pub fn diff(&self) -> RuntimeDiff {
        self.diff.lock().clone()
    }

    /// Replays runtime changes (from the state file) on top of the
    /// configuration. Changes that no longer apply (a shard whose host does
    /// not resolve, a domain entry the map refuses) are logged and skipped.
    pub fn apply_diff(&self, diff: &RuntimeDiff) {
        for id in &diff.shards_removed {
            self.remove_shard(id.as_str());
        }
        for shard in &diff.shards_added {
            if let Err(e) = self.add_shard(shard.clone()) {
                log::warn!("state: cannot re-add shard `{}`: {e}", shard.id);
            }
        }
        for host in &diff.domains_deleted {
            self.delete_domain(host);
        }
        for entry in &diff.domains_put {
            if let Err(e) = self.put_domain(&entry.host, &entry.tenant) {
                log::warn!("state: cannot restore domain `{}`: {e}", entry.host);
            }
        }
        for tenant in &diff.deny_removed {
            self.undeny(tenant);
        }
        for tenant in &diff.deny_added {
            self.deny(tenant);
        }
        for (tenant, plan) in &diff.plans {
            if let Err(e) = self.set_plan(tenant, Some(plan)) {
                log::warn!("state: cannot restore the plan of `{tenant}`: {e}");
            }
        }
    }

    /// Moves `tenant` to `plan` from its next request on, on every node;
    /// `None` drops the runtime change (the tenant follows `tenants`,
    /// then `default_plan`, then `limits` again). Refused: an unknown
    /// plan, an empty tenant, or a new tenant past [`MAX_PLAN_CHANGES`].
    pub fn set_plan(&self, tenant: &str, plan: Option<&str>) -> Result<(), PlanChangeError> {
        if tenant.is_empty() {
            return Err(PlanChangeError::NoTenant);
        }
        let plans = self.router.plans();
        let mut diff = self.diff.lock();
        match plan {
            Some(name) => {
                let index = (plans.index_of(name))
                    .ok_or_else(|| PlanChangeError::UnknownPlan(name.to_string()))?;
                if diff.plans.len() >= MAX_PLAN_CHANGES && !diff.plans.contains_key(tenant) {
                    return Err(PlanChangeError::Full);
                }
                plans.set(tenant, index);
                diff.plans.insert(tenant.to_string(), name.to_string());
            }
            None => {
                plans.unset(tenant);
                if diff.plans.remove(tenant).is_none() {
                    // Nothing was set: nothing to share (no entry kept).
                    return Ok(());
                }
            }
        }
        self.publish(|| {
            let value = plan.unwrap_or(REMOVED).to_string();
            (format!("plan:{tenant}"), value)
        });
        Ok(())
    }
}

/// Why a plan change was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanChangeError {
    UnknownPlan(String),
    NoTenant,
    /// [`MAX_PLAN_CHANGES`] tenants already have a runtime plan.
    Full,
}

impl std::fmt::Display for PlanChangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanChangeError::UnknownPlan(name) => write!(f, "unknown plan `{name}`"),
            PlanChangeError::NoTenant => f.write_str("tenant: required"),
            PlanChangeError::Full => write!(
                f,
                "at most {MAX_PLAN_CHANGES} tenants' plans are set at runtime: put the rest in `tenants`"
            ),
        }
    }
}

/// The most tenants whose plan the admin API sets (each kept in memory,
/// in the state file and, in cluster mode, in Redis).
pub const MAX_PLAN_CHANGES: usize = 1_000_000;

/// The shared-state value of a removed item.
const REMOVED: &str = "-";

fn domain_field(host: &str) -> String {
    format!("domain:{}", crate::routing::domain::normalize(host))
}

/// Runtime changes relative to the configuration (the admin API's; the
/// state file keeps them).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeDiff {
    /// Configured shards removed at runtime (applied before additions).
    pub shards_removed: Vec<ShardId>,
    pub shards_added: Vec<Shard>,
    /// Configured domain entries removed at runtime.
    pub domains_deleted: Vec<String>,
    pub domains_put: Vec<crate::routing::domain::DomainEntry>,
    /// Configured denials lifted at runtime.
    pub deny_removed: Vec<String>,
    pub deny_added: Vec<String>,
    /// Plans set at runtime: tenant → plan.
    pub plans: std::collections::BTreeMap<String, String>,
}

impl RuntimeDiff {
    pub fn shard_added(&mut self, shard: &Shard) {
        self.shards_added.retain(|s| s.id != shard.id);
        self.shards_added.push(shard.clone());
    }

    pub fn shard_removed(&mut self, id: &str, configured: bool) {
        self.shards_added.retain(|s| s.id.as_str() != id);
        if configured && !self.shards_removed.iter().any(|s| s.as_str() == id) {
            self.shards_removed.push(ShardId::new(id));
        }
    }

    pub fn domain_put(&mut self, host: &str, tenant: &str) {
        let key = crate::routing::domain::normalize(host).to_string();
        self.domains_put.retain(|e| e.host != key);
        self.domains_put.push(crate::routing::domain::DomainEntry {
            host: key,
            tenant: tenant.to_string(),
        });
    }

    pub fn domain_deleted(&mut self, host: &str, configured: bool) {
        let key = crate::routing::domain::normalize(host).to_string();
        self.domains_put.retain(|e| e.host != key);
        if configured && !self.domains_deleted.contains(&key) {
            self.domains_deleted.push(key);
        }
    }

    pub fn denied(&mut self, tenant: &str, configured: bool) {
        self.deny_removed.retain(|t| t != tenant);
        if !configured && !self.deny_added.iter().any(|t| t == tenant) {
            self.deny_added.push(tenant.to_string());
        }
    }

    pub fn undenied(&mut self, tenant: &str, configured: bool) {
        self.deny_added.retain(|t| t != tenant);
        if configured && !self.deny_removed.iter().any(|t| t == tenant) {
            self.deny_removed.push(tenant.to_string());
        }
    }
}
