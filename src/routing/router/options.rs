//! What a router is built from: its options, and the hooks an embedder
//! can give it (who is allowed, a shard's load, the sticky strategy).

use crate::limits::Limits;
use crate::routing::balance::Balance;
use crate::routing::clock::{Clock, MonotonicClock};
use crate::routing::hash::CustomHash;
use crate::routing::shard::{Shard, ShardId};
use compact_str::CompactString;
use std::fmt;
use std::sync::Arc;

/// Decides whether a tenant may be served at all (called only once the
/// shard filters passed, as in the reference).
pub trait AllowHook: Send + Sync {
    fn allow(&self, tenant: &str) -> bool;
}

impl<F: Fn(&str) -> bool + Send + Sync> AllowHook for F {
    fn allow(&self, tenant: &str) -> bool {
        self(tenant)
    }
}

/// A shard's load for `rendezvous`/`hrw`: effective weight = weight /
/// max(load, 0.0001).
pub trait LoadHook: Send + Sync {
    fn load(&self, shard: &ShardId) -> f64;
}

impl<F: Fn(&ShardId) -> f64 + Send + Sync> LoadHook for F {
    fn load(&self, shard: &ShardId) -> f64 {
        self(shard)
    }
}

/// The sticky strategy.
#[derive(Clone, Default)]
pub enum HashStrategy {
    /// Jump consistent hash (reference-compatible).
    #[default]
    Jump,
    /// The reference's weighted rendezvous (compatible, poorly spread).
    Rendezvous,
    /// Textbook weighted rendezvous on a well-mixed 64-bit hash.
    Hrw,
    Custom(Arc<dyn CustomHash>),
}

impl fmt::Debug for HashStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HashStrategy::Jump => "jump",
            HashStrategy::Rendezvous => "rendezvous",
            HashStrategy::Hrw => "hrw",
            HashStrategy::Custom(_) => "custom",
        })
    }
}

/// Where `rendezvous`/`hrw` get a shard's load from.
#[derive(Clone, Default)]
pub enum Load {
    /// Every shard has load 1.
    #[default]
    None,
    /// 1 + the shard's live tagged admissions.
    ActiveConnections,
    Hook(Arc<dyn LoadHook>),
}

/// Which tenants a snapshot keeps ([`Router::snapshot_of`]).
pub struct RouterOptions {
    pub shards: Vec<Shard>,
    pub hash: HashStrategy,
    pub balance: Balance,
    /// `limits`: the limits of tenants on no plan.
    pub limits: Limits,
    /// Tenant plans (DESIGN §6): name and limits, each over the same
    /// route list as `limits` (see [`crate::limits::plans`]).
    pub plans: Vec<(CompactString, Limits)>,
    /// Configured tenant → plan index.
    pub plan_tenants: std::collections::HashMap<CompactString, u16>,
    /// The plan of a tenant `plan_tenants` does not name.
    pub default_plan: Option<u16>,
    /// Tenants refused with `denied` (editable at runtime).
    pub deny: Vec<String>,
    pub allow: Option<Arc<dyn AllowHook>>,
    pub load: Load,
    pub clock: Arc<dyn Clock>,
    /// Forget tenants that are idle with full buckets once the table grows
    /// (default). Such a tenant is indistinguishable from a new one, so no
    /// decision changes; turning it off only costs memory, up to
    /// `max_tracked_tenants` (which holds either way).
    pub forget_idle_tenants: bool,
    /// The tenant table's bound (`limits.max_tracked_tenants`): past it the
    /// least recently seen idle tenants are forgotten even if their
    /// buckets are not full (a bucket that never refills otherwise stays
    /// for ever).
    pub max_tracked_tenants: usize,
    /// The per-client table's bound (`limits.max_tracked_clients`): past
    /// it the least recently seen clients' buckets are forgotten.
    pub max_tracked_clients: usize,
}

impl Default for RouterOptions {
    fn default() -> Self {
        RouterOptions {
            shards: Vec::new(),
            hash: HashStrategy::default(),
            balance: Balance::default(),
            limits: Limits::default(),
            plans: Vec::new(),
            plan_tenants: Default::default(),
            default_plan: None,
            deny: Vec::new(),
            allow: None,
            load: Load::None,
            clock: Arc::new(MonotonicClock::new()),
            forget_idle_tenants: true,
            max_tracked_tenants: crate::limits::DEFAULT_MAX_TRACKED,
            max_tracked_clients: crate::limits::DEFAULT_MAX_TRACKED_CLIENTS,
        }
    }
}
