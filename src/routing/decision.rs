//! What goes into a routing decision and what comes out of it.

use super::balance::Balance;
use super::shard::{Shard, ShardEntry, ShardId, ShardSet};
use crate::limits::{AdmissionGuard, Bucket};
use arc_swap::Guard;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// The outcome of `route()`. Every variant but `Allow` is a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    Allow,
    RateLimited,
    Capped,
    Denied,
    NoShards,
    NoTenantShards,
    NoRegionShards,
}

impl Decision {
    /// Every decision, `allow` first (metrics export all of them from the start).
    pub const ALL: [Decision; 7] = [
        Decision::Allow,
        Decision::RateLimited,
        Decision::Capped,
        Decision::Denied,
        Decision::NoShards,
        Decision::NoTenantShards,
        Decision::NoRegionShards,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::RateLimited => "rate-limited",
            Decision::Capped => "capped",
            Decision::Denied => "denied",
            Decision::NoShards => "no-shards",
            Decision::NoTenantShards => "no-tenant-shards",
            Decision::NoRegionShards => "no-region-shards",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One request to place. The routing key is `tenant`, or `tenant:channel`
/// when a channel is given (an empty channel counts).
#[derive(Clone, Copy, Debug, Default)]
pub struct RouteRequest<'a> {
    pub tenant: &'a str,
    pub channel: Option<&'a str>,
    /// A route name with its own bucket (unknown names are unlimited).
    pub route: Option<&'a str>,
    /// A second route the same request falls under when its path reads
    /// two ways (`/a/../b`); each tenant is held to the longer of its
    /// plan's prefixes covering either.
    pub route_also: Option<&'a str>,
    /// Keep shards of this region or of none.
    pub region: Option<&'a str>,
    /// Overrides the router's balance strategy for this call.
    pub balance: Option<Balance>,
    /// Shards not to pick (e.g. those that just failed).
    pub exclude: &'a [ShardId],
    /// The client's address: its own bucket within the tenant's
    /// (`per_client`), if the tenant's limits have one.
    pub client: Option<std::net::IpAddr>,
}

impl<'a> RouteRequest<'a> {
    pub fn new(tenant: &'a str) -> Self {
        RouteRequest {
            tenant,
            ..Default::default()
        }
    }

    pub fn channel(mut self, channel: &'a str) -> Self {
        self.channel = Some(channel);
        self
    }

    pub fn route(mut self, route: &'a str) -> Self {
        self.route = Some(route);
        self
    }

    pub fn region(mut self, region: &'a str) -> Self {
        self.region = Some(region);
        self
    }

    pub fn balance(mut self, balance: Balance) -> Self {
        self.balance = Some(balance);
        self
    }

    pub fn exclude(mut self, shards: &'a [ShardId]) -> Self {
        self.exclude = shards;
        self
    }

    pub fn client(mut self, address: std::net::IpAddr) -> Self {
        self.client = Some(address);
        self
    }
}

/// The answer to a route request. On `allow` it names the shard (borrowed
/// from the membership snapshot the decision was made on) and, from
/// `Router::admit`, carries the admission.
pub struct RouteResult<'r> {
    pub decision: Decision,
    /// The bucket that ran dry (`rate-limited` only).
    pub bucket: Option<Bucket<'r>>,
    /// Seconds until that bucket holds a token; `None` when it never refills.
    pub retry_after_secs: Option<f64>,
    /// The live admission (`Router::admit` on `allow` only).
    pub admission: Option<AdmissionGuard>,
    pub(crate) pick: Option<(Guard<Arc<ShardSet>>, usize)>,
    /// The tenant's plan, if the decision looked it up (`None`: not yet).
    pub(crate) plan: Option<Option<u16>>,
}

impl<'r> RouteResult<'r> {
    pub(crate) fn refused(decision: Decision) -> Self {
        RouteResult {
            decision,
            bucket: None,
            retry_after_secs: None,
            admission: None,
            pick: None,
            plan: None,
        }
    }

    pub fn is_allowed(&self) -> bool {
        self.decision == Decision::Allow
    }

    /// The chosen shard (`allow` only).
    pub fn shard(&self) -> Option<&Shard> {
        self.shard_entry().map(|e| &*e.shard)
    }

    /// The chosen shard with its live state (`allow` only).
    pub fn shard_entry(&self) -> Option<&Arc<ShardEntry>> {
        self.pick.as_ref().and_then(|(set, i)| set.all.get(*i))
    }

    pub fn shard_id(&self) -> Option<&ShardId> {
        self.shard().map(|s| &s.id)
    }
}

impl fmt::Debug for RouteResult<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteResult")
            .field("decision", &self.decision)
            .field("shard", &self.shard_id())
            .field("bucket", &self.bucket)
            .field("retry_after_secs", &self.retry_after_secs)
            .field("admission", &self.admission)
            .finish()
    }
}
