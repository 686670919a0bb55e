//! Shards and the membership the router routes over. Writers (admin, health
//! probes, failure hooks) edit [`Membership`] under a lock and publish an
//! immutable [`ShardSet`]; the request path only ever reads the published
//! set, so health flaps never block routing.

use super::hash::hrw_shard_hash;
use crate::counters::{Gauge, StripedCounter};
use crate::limits::DenyList;
use serde::{Deserialize, Serialize};
use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// A shard id: cheap to clone, compares as a string.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ShardId(Arc<str>);

impl ShardId {
    pub fn new(id: impl AsRef<str>) -> Self {
        ShardId(Arc::from(id.as_ref()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for ShardId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for ShardId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for ShardId {
    fn from(s: &str) -> Self {
        ShardId::new(s)
    }
}

fn default_weight() -> f64 {
    1.0
}

/// How a shard is spoken to (DESIGN §8). Not a routing matter: it travels
/// with the shard (configuration, admin API, state file, cluster) so that
/// every place that reaches the shard agrees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardProtocol {
    /// HTTP/1.1 (the default).
    #[default]
    Http1,
    /// HTTP/2: cleartext with prior knowledge for `http`, ALPN `h2`
    /// required for `https`.
    H2,
    /// `https` only: the shard picks through ALPN (h2 or http/1.1).
    Auto,
}

impl ShardProtocol {
    /// The name the configuration and the admin API use.
    pub fn as_str(self) -> &'static str {
        match self {
            ShardProtocol::Http1 => "http1",
            ShardProtocol::H2 => "h2",
            ShardProtocol::Auto => "auto",
        }
    }

    /// Parses a configured name (one of [`ShardProtocol::as_str`]'s).
    pub fn parse(name: &str) -> Option<ShardProtocol> {
        [ShardProtocol::Http1, ShardProtocol::H2, ShardProtocol::Auto]
            .into_iter()
            .find(|p| p.as_str() == name)
    }

    /// Whether the shard may be spoken to in HTTP/2.
    pub fn may_be_h2(self) -> bool {
        self != ShardProtocol::Http1
    }

    fn is_http1(&self) -> bool {
        *self == ShardProtocol::Http1
    }
}

/// A backend shard. `tenants` present makes it dedicated (an empty list is
/// eligible for nobody); `region` absent makes it a candidate in every
/// region; `weight` only matters to `rendezvous` and `hrw`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Shard {
    pub id: ShardId,
    pub url: String,
    #[serde(default = "default_weight")]
    pub weight: f64,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
    /// Left out of a snapshot when `http1`: a snapshot of HTTP/1.1 shards
    /// keeps the reference's shape.
    #[serde(default, skip_serializing_if = "ShardProtocol::is_http1")]
    pub protocol: ShardProtocol,
    /// Each connection to the shard opens with a PROXY protocol v2
    /// header naming the client (DESIGN §10); left out of a snapshot
    /// when off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub proxy_protocol: bool,
}

impl Shard {
    pub fn new(id: impl AsRef<str>, url: impl Into<String>) -> Self {
        Shard {
            id: ShardId::new(id),
            url: url.into(),
            weight: 1.0,
            region: None,
            tenants: None,
            protocol: ShardProtocol::Http1,
            proxy_protocol: false,
        }
    }

    pub fn with_protocol(mut self, protocol: ShardProtocol) -> Self {
        self.protocol = protocol;
        self
    }

    pub fn with_weight(mut self, weight: f64) -> Self {
        self.weight = weight;
        self
    }

    pub fn with_region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    pub fn with_tenants<I, S>(mut self, tenants: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tenants = Some(tenants.into_iter().map(Into::into).collect());
        self
    }
}

/// Health as the router sees it. Draining is the operator's state and only
/// `mark_healthy` (or removal) ends it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardStatus {
    pub healthy: bool,
    pub draining: bool,
}

impl ShardStatus {
    pub fn is_live(&self) -> bool {
        self.healthy && !self.draining
    }
}

/// A registered shard as the request path sees it.
pub struct ShardEntry {
    pub shard: Arc<Shard>,
    pub status: ShardStatus,
    /// Live tagged admissions on this shard.
    pub(crate) active: Arc<Gauge>,
    /// Cumulative allows; survives the shard's removal.
    pub(crate) routed: Arc<StripedCounter>,
    pub(crate) hrw_hash: u64,
    /// Index in [`ShardSet::all`].
    pub(crate) pos: usize,
    allowlist: Option<hashbrown::HashSet<String, foldhash::fast::RandomState>>,
}

impl ShardEntry {
    pub fn id(&self) -> &ShardId {
        &self.shard.id
    }

    /// Live tagged admissions on this shard.
    pub fn active(&self) -> i64 {
        self.active.get()
    }

    /// Whether `tenant` may be placed here (its allowlist is absent or
    /// names it).
    #[inline]
    pub fn admits_tenant(&self, tenant: &str) -> bool {
        match &self.allowlist {
            None => true,
            Some(set) => set.contains(tenant),
        }
    }

    /// Whether this shard serves `region` (region-agnostic shards serve all).
    #[inline]
    pub fn serves_region(&self, region: &str) -> bool {
        self.shard.region.as_deref().is_none_or(|r| r == region)
    }
}

/// The published, immutable view of membership.
#[derive(Default)]
pub struct ShardSet {
    /// Unique per published set: memos keyed by it are valid while it is
    /// current.
    pub(crate) generation: u64,
    /// Every registered shard, in registration order.
    pub all: Vec<Arc<ShardEntry>>,
    /// Healthy and not draining, in registration order.
    pub live: Vec<Arc<ShardEntry>>,
    /// Whether some live shard has an allowlist (else the tenant filter is
    /// skipped).
    pub(crate) live_dedicated: bool,
    /// Whether some live shard has a region (else the region filter keeps
    /// every shard and is skipped).
    pub(crate) live_regional: bool,
    /// Gauges of ids acquired but not registered (the reference counts them).
    pub(crate) unregistered: HashMap<ShardId, Arc<Gauge>>,
    /// Tenants refused with `denied`.
    pub(crate) denied: Arc<DenyList>,
}

impl ShardSet {
    pub fn get(&self, id: &str) -> Option<&Arc<ShardEntry>> {
        self.all.iter().find(|e| e.shard.id.as_str() == id)
    }

    /// The gauge counting tagged admissions for `id`, registered or not.
    pub(crate) fn gauge(&self, id: &str) -> Option<&Arc<Gauge>> {
        match self.get(id) {
            Some(e) => Some(&e.active),
            None => self.unregistered.get(id),
        }
    }
}

/// The writable side: registration order, health, counters.
#[derive(Default)]
pub(crate) struct Membership {
    pub(crate) shards: Vec<Arc<Shard>>,
    /// "Known" ids: registered ones, and ids a restore gave a health state.
    pub(crate) status: HashMap<ShardId, ShardStatus>,
    /// Live counters per shard id, including unregistered ids; an id
    /// appears in metrics once acquired.
    pub(crate) gauges: HashMap<ShardId, Arc<Gauge>>,
    pub(crate) routed: HashMap<ShardId, Arc<StripedCounter>>,
    pub(crate) denied: Arc<DenyList>,
}

impl Membership {
    pub fn new(shards: impl IntoIterator<Item = Shard>) -> Self {
        let mut m = Membership::default();
        for s in shards {
            m.add(s);
        }
        m
    }

    /// Appends and marks healthy; `false` (and no change) if the id exists.
    pub fn add(&mut self, shard: Shard) -> bool {
        if self.shards.iter().any(|s| s.id == shard.id) {
            return false;
        }
        self.status.insert(
            shard.id.clone(),
            ShardStatus {
                healthy: true,
                draining: false,
            },
        );
        self.shards.push(Arc::new(shard));
        true
    }

    /// Removes the shard and forgets its health, draining flag and live
    /// counter; its cumulative allow count is kept.
    pub fn remove(&mut self, id: &str) -> bool {
        let before = self.shards.len();
        self.shards.retain(|s| s.id.as_str() != id);
        self.status.remove(id);
        self.gauges.remove(id);
        self.shards.len() != before
    }

    pub fn status(&self, id: &str) -> Option<ShardStatus> {
        self.status.get(id).copied()
    }

    pub fn status_mut(&mut self, id: &str) -> Option<&mut ShardStatus> {
        self.status.get_mut(id)
    }

    /// The gauge for `id`, created on first use.
    pub(crate) fn gauge(&mut self, id: &str) -> Arc<Gauge> {
        if let Some(g) = self.gauges.get(id) {
            return Arc::clone(g);
        }
        let g = Arc::new(Gauge::new());
        self.gauges.insert(ShardId::new(id), Arc::clone(&g));
        g
    }

    /// Builds the view the request path reads.
    pub(crate) fn publish(&mut self) -> ShardSet {
        static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let mut set = ShardSet {
            generation: GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            denied: Arc::clone(&self.denied),
            ..ShardSet::default()
        };
        let shards = self.shards.clone();
        for shard in &shards {
            let status = self.status.get(&shard.id).copied().unwrap_or_default();
            let active = self.gauge(shard.id.as_str());
            let routed = Arc::clone(
                self.routed
                    .entry(shard.id.clone())
                    .or_insert_with(|| Arc::new(StripedCounter::new())),
            );
            let entry = Arc::new(ShardEntry {
                status,
                active,
                routed,
                hrw_hash: hrw_shard_hash(shard.id.as_str()),
                pos: set.all.len(),
                allowlist: shard.tenants.as_ref().map(|t| t.iter().cloned().collect()),
                shard: Arc::clone(shard),
            });
            if status.is_live() {
                set.live_dedicated |= entry.allowlist.is_some();
                set.live_regional |= entry.shard.region.is_some();
                set.live.push(Arc::clone(&entry));
            }
            set.all.push(entry);
        }
        for (id, gauge) in &self.gauges {
            if !self.shards.iter().any(|s| &s.id == id) {
                set.unregistered.insert(id.clone(), Arc::clone(gauge));
            }
        }
        set
    }
}
