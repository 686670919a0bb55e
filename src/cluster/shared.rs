//! What the request path and the admin API see of cluster mode, without any
//! Redis: the mode limits run in, the number of nodes a share is divided
//! by, the other nodes' admissions, the tenants to settle, and the state
//! changes waiting to be published. The cluster service
//! (`services/cluster/`) fills it from Redis in the background; nothing here ever waits on it.

use crate::config::{ClusterConfig, OnRedisDown};
use crate::limits::{Ledger, Mode};
use crate::routing::region::{AssignHook, RegionList};
use arc_swap::ArcSwap;
use compact_str::CompactString;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// One node as the last heartbeat saw it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct NodeSeen {
    pub id: String,
    /// Milliseconds since the epoch, by Redis' clock, of its last heartbeat.
    pub last_seen_ms: u64,
}

/// What this node knows of the other alive nodes' region lists. While
/// they all equal its own, every node computes the same default pick, and
/// no assignment needs to be shared.
#[derive(Clone, Debug)]
pub(crate) struct Peers {
    /// An alive node whose list has not been read yet (it just started,
    /// or it is a version that does not publish one).
    pub unknown: bool,
    /// The alive nodes' lists that differ from this node's.
    pub lists: Vec<RegionList>,
    /// The nodes these were read for: one alive since is not known yet.
    pub known: Vec<String>,
}

/// The region directory's hook in cluster mode. A tenant another node
/// assigned first takes that region. A new assignment is queued to be
/// offered to the others only while their region lists differ from this
/// node's: otherwise each computes the same pick, and Redis holds nothing
/// for the tenant (an invented name costs no Redis write).
pub struct SharedRegions(pub Arc<Shared>);

impl AssignHook for SharedRegions {
    fn assign(&self, tenant: &str) -> Option<String> {
        if !self.0.regions_agree() {
            self.0.assigned(tenant);
        }
        self.0.shared_region(tenant)
    }

    /// The answer is the shared assignment or the default pick, the same
    /// each time: the directory may sweep what equals the default.
    fn rederivable(&self) -> bool {
        true
    }
}

/// The nodes of the last heartbeat, and Redis' time then (with when it
/// was read).
type Heartbeat = (Vec<NodeSeen>, Option<(u64, std::time::Instant)>);

/// The [`Mode`] (as stored) with Redis up or down.
fn mode_of(up: bool, down: OnRedisDown) -> u8 {
    match (up, down) {
        (true, _) | (false, OnRedisDown::LocalShare) => 0,
        (false, OnRedisDown::Allow) => 1,
        (false, OnRedisDown::Deny) => 2,
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("node_id", &self.config.node_id)
            .field("mode", &self.mode())
            .field("redis_up", &self.redis_up())
            .finish()
    }
}

/// What limits ask of cluster mode on each admission, answered from what
/// the cluster service last read (no Redis on the request path).
impl Ledger for Shared {
    fn mode(&self) -> Mode {
        Shared::mode(self)
    }

    fn sync_interval(&self) -> std::time::Duration {
        self.config.sync_interval
    }

    fn redis_up(&self) -> bool {
        Shared::redis_up(self)
    }

    fn nodes_alive(&self) -> f64 {
        Shared::nodes_alive(self)
    }

    fn others_active(&self, tenant: &str) -> u64 {
        Shared::others_active(self, tenant)
    }

    fn enqueue(&self, tenant: &str) {
        Shared::enqueue(self, tenant)
    }
}

pub struct Shared {
    pub config: ClusterConfig,
    /// This process's identity among the nodes: `node_id#pid`.
    identity: String,
    mode: AtomicU8,
    /// Nodes last seen alive (this one included), at least 1.
    alive: AtomicU32,
    redis_up: AtomicBool,
    /// Bumped each time Redis comes back: it may have come back empty.
    reconnects: AtomicU64,
    sync_errors: AtomicU64,
    /// Tenants that spent since their last settle.
    queue: Mutex<Vec<CompactString>>,
    /// Live admissions per tenant on the other nodes.
    others: ArcSwap<HashMap<CompactString, u64>>,
    nodes: Mutex<Heartbeat>,
    alive_ids: ArcSwap<Vec<String>>,
    /// The heartbeat found this node's admissions hash gone (it expired,
    /// or Redis restarted): the settle loop writes every count again.
    caps_lost: AtomicBool,
    /// The other nodes' region lists.
    pub(crate) peers: ArcSwap<Peers>,
    /// Shared runtime state as last read or written: field → value.
    known: Mutex<HashMap<String, String>>,
    /// Changes made here, not yet in Redis.
    pending: Mutex<Vec<(String, String)>>,
    /// Region assignments made here, to share (first one wins).
    assigned: Mutex<Vec<CompactString>>,
    /// Region assignments read from Redis (only those that differ from
    /// some node's default pick are there).
    regions: Mutex<HashMap<CompactString, String>>,
}

impl Shared {
    /// Until the heartbeat first reaches Redis, the node runs as with
    /// Redis down: `on_redis_down` applies from the first request.
    pub fn new(config: ClusterConfig) -> Arc<Shared> {
        let mode = mode_of(false, config.on_redis_down);
        let identity = format!("{}#{}", config.node_id, std::process::id());
        Arc::new(Shared {
            config,
            identity,
            mode: AtomicU8::new(mode),
            alive: AtomicU32::new(1),
            redis_up: AtomicBool::new(false),
            reconnects: AtomicU64::new(0),
            sync_errors: AtomicU64::new(0),
            queue: Mutex::new(Vec::new()),
            others: ArcSwap::from_pointee(HashMap::new()),
            nodes: Mutex::new((Vec::new(), None)),
            alive_ids: ArcSwap::from_pointee(Vec::new()),
            caps_lost: AtomicBool::new(false),
            peers: ArcSwap::from_pointee(Peers {
                unknown: true,
                lists: Vec::new(),
                known: Vec::new(),
            }),
            known: Mutex::new(HashMap::new()),
            pending: Mutex::new(Vec::new()),
            assigned: Mutex::new(Vec::new()),
            regions: Mutex::new(HashMap::new()),
        })
    }

    /// This process's identity among the nodes (its heartbeat, its
    /// leases, its admissions, its region list): the configured `node_id`
    /// and the process id. The old and the new process of a graceful
    /// upgrade run side by side under one `node_id`; each is a node of its
    /// own, so neither overwrites the other's leases or admissions.
    pub fn node_id(&self) -> &str {
        &self.identity
    }

    #[inline]
    pub fn mode(&self) -> Mode {
        match self.mode.load(Ordering::Relaxed) {
            1 => Mode::Allow,
            2 => Mode::Deny,
            _ => Mode::Shared,
        }
    }

    /// The divisor of a share: nodes last seen alive.
    #[inline]
    pub fn nodes_alive(&self) -> f64 {
        f64::from(self.alive.load(Ordering::Relaxed).max(1))
    }

    /// The tenant's live admissions on the other nodes, as last read.
    #[inline]
    pub fn others_active(&self, tenant: &str) -> u64 {
        let others = self.others.load();
        if others.is_empty() {
            return 0;
        }
        others.get(tenant).copied().unwrap_or(0)
    }

    /// Queues a tenant for the next settle (callers track `queued`).
    pub fn enqueue(&self, tenant: &str) {
        self.queue.lock().push(CompactString::from(tenant));
    }

    pub(crate) fn take_queue(&self) -> Vec<CompactString> {
        std::mem::take(&mut *self.queue.lock())
    }

    pub fn redis_up(&self) -> bool {
        self.redis_up.load(Ordering::Relaxed)
    }

    /// Records whether Redis answers; while it does not, limits follow
    /// `on_redis_down`.
    pub(crate) fn set_redis_up(&self, up: bool) {
        if self.redis_up.swap(up, Ordering::Relaxed) != up && up {
            self.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        let mode = mode_of(up, self.config.on_redis_down);
        self.mode.store(mode, Ordering::Relaxed);
    }

    /// Whether every alive node's region list is known and equal to this
    /// node's.
    pub(crate) fn regions_agree(&self) -> bool {
        !self.region_lists_unknown() && self.peers.load().lists.is_empty()
    }

    /// Some alive node's region list has not been read.
    pub(crate) fn region_lists_unknown(&self) -> bool {
        let peers = self.peers.load();
        peers.unknown || !(self.alive_ids.load().iter()).all(|id| peers.known.contains(id))
    }

    /// `agree`, `differ` or `unknown`: how the alive nodes' region lists
    /// compare with this node's (`GET /v1/cluster`).
    pub fn region_lists(&self) -> &'static str {
        if !self.peers.load().lists.is_empty() {
            "differ"
        } else if self.region_lists_unknown() {
            "unknown"
        } else {
            "agree"
        }
    }

    /// How many times Redis came back since the start.
    pub(crate) fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    pub fn sync_errors(&self) -> u64 {
        self.sync_errors.load(Ordering::Relaxed)
    }

    pub(crate) fn sync_error(&self, what: &str, e: &dyn std::fmt::Display) {
        let n = self.sync_errors.fetch_add(1, Ordering::Relaxed);
        // Every error counts; the log gets the first and then one in 100.
        if n % 100 == 0 {
            log::warn!("cluster: {what}: {e}");
        }
    }

    pub fn nodes(&self) -> Vec<NodeSeen> {
        self.nodes.lock().0.clone()
    }

    /// The last heartbeat's view: every node, those alive, and Redis' time.
    pub(crate) fn set_nodes(&self, nodes: Vec<NodeSeen>, alive: Vec<String>, redis_ms: u64) {
        self.alive.store(
            alive.len().clamp(1, u32::MAX as usize) as u32,
            Ordering::Relaxed,
        );
        self.alive_ids.store(Arc::new(alive));
        let mut seen = self.nodes.lock();
        seen.0 = nodes;
        seen.1 = Some((redis_ms, std::time::Instant::now()));
    }

    /// The ids of the nodes last seen alive (this one included).
    pub fn alive_ids(&self) -> Arc<Vec<String>> {
        self.alive_ids.load_full()
    }

    /// Redis' time now, as the last heartbeat read it plus the time since
    /// (0 before any heartbeat).
    pub fn redis_now_ms(&self) -> u64 {
        self.nodes.lock().1.map_or(0, |(ms, at)| {
            ms.saturating_add(at.elapsed().as_millis() as u64)
        })
    }

    pub(crate) fn lose_caps(&self) {
        self.caps_lost.store(true, Ordering::Relaxed);
    }

    pub(crate) fn take_caps_lost(&self) -> bool {
        self.caps_lost.swap(false, Ordering::Relaxed)
    }

    pub(crate) fn set_others(&self, others: HashMap<CompactString, u64>) {
        self.others.store(Arc::new(others));
    }

    /// Records a runtime change made on this node, to be shared. A value
    /// already known (it came from Redis) is not sent back.
    pub fn publish(&self, field: String, value: String) {
        let mut known = self.known.lock();
        if known.get(&field) == Some(&value) {
            return;
        }
        known.insert(field.clone(), value.clone());
        self.pending.lock().push((field, value));
    }

    /// Queues every known field again (Redis lost the shared state).
    pub(crate) fn republish_known(&self) {
        let known = self.known.lock();
        let mut pending = self.pending.lock();
        // A set of what is queued: one pass, not one scan per field.
        let queued: std::collections::HashSet<String> =
            pending.iter().map(|(f, _)| f.clone()).collect();
        for (f, v) in known.iter() {
            if !queued.contains(f) {
                pending.push((f.clone(), v.clone()));
            }
        }
    }

    pub(crate) fn take_pending(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.pending.lock())
    }

    /// Puts changes that could not be written back in front of newer ones.
    pub(crate) fn requeue_pending(&self, mut failed: Vec<(String, String)>) {
        let mut pending = self.pending.lock();
        failed.append(&mut pending);
        *pending = failed;
    }

    /// Fields of the Redis state whose value differs from what this node
    /// knows; they become known.
    pub(crate) fn news(&self, remote: HashMap<String, String>) -> Vec<(String, String)> {
        let mut known = self.known.lock();
        let mut news: Vec<(String, String)> = remote
            .into_iter()
            .filter(|(f, v)| known.get(f) != Some(v))
            .collect();
        // Shards before what refers to them (a drain of a shard added in
        // the same read).
        let rank = |f: &str| match f.split(':').next() {
            Some("shard") => 0,
            Some("drain") => 2,
            _ => 1,
        };
        news.sort_by(|a, b| (rank(&a.0), &a.0).cmp(&(rank(&b.0), &b.0)));
        for (f, v) in &news {
            known.insert(f.clone(), v.clone());
        }
        news
    }

    /// A new region assignment made here (the directory's hook).
    pub(crate) fn assigned(&self, tenant: &str) {
        let mut assigned = self.assigned.lock();
        // Bounded while Redis is down; the rest keep their local pick.
        if assigned.len() < 100_000 {
            assigned.push(CompactString::from(tenant));
        }
    }

    /// Forgets changes replayed from the state file at start: Redis holds
    /// the newer shared state, which the node loads as it connects.
    pub fn forget_local_replay(&self) {
        self.pending.lock().clear();
        self.known.lock().clear();
    }

    pub(crate) fn take_assigned(&self) -> Vec<CompactString> {
        std::mem::take(&mut *self.assigned.lock())
    }

    pub(crate) fn shared_region(&self, tenant: &str) -> Option<String> {
        self.regions.lock().get(tenant).cloned()
    }

    pub(crate) fn set_regions(&self, regions: HashMap<CompactString, String>) {
        *self.regions.lock() = regions;
    }

    pub(crate) fn add_region_entry(&self, tenant: &str, region: &str) {
        self.regions
            .lock()
            .insert(CompactString::from(tenant), region.to_string());
    }

    /// Keeps the shared assignments `keep` says yes to.
    pub(crate) fn retain_regions(&self, mut keep: impl FnMut(&str, &str) -> bool) {
        self.regions.lock().retain(|t, r| keep(t, r));
    }
}
