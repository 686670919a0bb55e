//! The router's bookkeeping: counters, metrics, decision counts, and the
//! snapshot it saves and restores (the state file, the cluster).

use super::Router;
use crate::limits::{
    ClientKey, TenantBuckets, TenantEntry, TenantState, TokenBucket, TrackedClient,
};
use crate::routing::clock::Clock;
use crate::routing::decision::Decision;
use crate::routing::shard::{Shard, ShardStatus};
use crate::routing::snapshot::{
    ClientBucketSnapshot, RouteBucketSnapshot, RouterSnapshot, ShardSnapshot, TenantSnapshot,
    Tokens,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The most client buckets a snapshot keeps (the state file is written
/// every interval: its size is bounded whatever clients do).
const MAX_SAVED_CLIENTS: usize = 100_000;

/// How many of each decision.
pub type DecisionCounts = [(Decision, u64); 7];

/// The router's counters (the reference's `metrics()` plus allows).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RouterMetrics {
    pub routes: u64,
    pub acquires: u64,
    pub allows: u64,
    /// All six refusals, from zero.
    pub rejects_by_decision: BTreeMap<String, u64>,
    /// Cumulative allows per shard id ever chosen.
    pub shard_load_distribution: BTreeMap<String, u64>,
    /// Live tagged admissions per shard id ever acquired.
    pub shard_active_connections: BTreeMap<String, i64>,
    /// How long a recent route took (each thread measures one route in 16).
    pub last_route_ms: f64,
    /// Tenants currently remembered (see `limits::FORGETTABLE_BOUND`).
    pub tenants: usize,
}

pub type TenantFilter<'a> = dyn Fn(&TenantEntry, &TenantState) -> bool + 'a;

impl Router {
    /// Tenants currently remembered.
    pub fn tenant_count(&self) -> usize {
        self.tenants.len()
    }

    /// Client buckets currently remembered (`per_client`).
    pub fn client_count(&self) -> usize {
        self.clients.len()
    }

    /// `rate-limited` refusals by the kind of bucket that ran dry.
    pub fn rate_limited_counts(&self) -> [(&'static str, u64); 3] {
        let counts = &self.counters.rate_limited;
        std::array::from_fn(|i| (crate::limits::Bucket::KINDS[i], counts[i].get()))
    }

    /// Live admissions of a tenant (0 for one the router does not know).
    pub fn tenant_active(&self, tenant: &str) -> u64 {
        self.tenants
            .with_existing(tenant, |e, _| e.active())
            .unwrap_or(0)
    }

    pub fn metrics(&self) -> RouterMetrics {
        let c = &self.counters;
        let counts = self.decision_counts();
        let mut m = RouterMetrics {
            routes: counts.iter().map(|(_, n)| n).sum(),
            acquires: c.acquires.get(),
            allows: counts[Decision::Allow.index()].1,
            last_route_ms: c.last_route.get(),
            tenants: self.tenants.len(),
            ..Default::default()
        };
        for d in &Decision::ALL[1..] {
            m.rejects_by_decision
                .insert(d.as_str().to_string(), counts[d.index()].1);
        }
        let membership = self.membership.lock();
        for (id, routed) in &membership.routed {
            let n = routed.get();
            if n > 0 {
                m.shard_load_distribution.insert(id.to_string(), n);
            }
        }
        for (id, gauge) in &membership.gauges {
            if gauge.is_touched() {
                m.shard_active_connections
                    .insert(id.to_string(), gauge.get());
            }
        }
        m
    }

    /// Decisions counted so far, for every decision (all plans).
    pub fn decision_counts(&self) -> [(Decision, u64); 7] {
        let all = &self.counters.decisions;
        Decision::ALL.map(|d| (d, all.iter().map(|c| c[d.index()].get()).sum()))
    }

    /// Decisions counted so far by plan (`None`: tenants on no plan), for
    /// every decision.
    pub fn decision_counts_by_plan(&self) -> Vec<(Option<&str>, DecisionCounts)> {
        (self.counters.decisions.iter().enumerate())
            .map(|(slot, counts)| {
                let plan = slot.checked_sub(1).and_then(|i| self.plans.name(i as u16));
                (plan, Decision::ALL.map(|d| (d, counts[d.index()].get())))
            })
            .collect()
    }

    pub fn snapshot(&self) -> RouterSnapshot {
        self.snapshot_of(Some(&|_, _| true))
    }

    /// [`Router::snapshot`] with only the tenants `keep` says yes to
    /// (`None`: no tenant, and no pass over the table).
    pub fn snapshot_of(&self, keep: Option<&TenantFilter<'_>>) -> RouterSnapshot {
        let mut tenants = Vec::new();
        let mut route_buckets = Vec::new();
        let each = |e: &TenantEntry, state: &TenantState| {
            if !keep.is_some_and(|keep| keep(e, state)) {
                return;
            }
            let b = &state.buckets;
            tenants.push(TenantSnapshot {
                active: e.active(),
                last_refill_at: b.tenant.last_refill_at,
                tenant: e.id().to_string(),
                tokens: Tokens(b.tenant.tokens),
            });
            for (index, bucket) in &b.routes {
                if let Some(route) = self.plans.base().route_name(*index) {
                    route_buckets.push(RouteBucketSnapshot {
                        last_refill_at: bucket.last_refill_at,
                        route: route.to_string(),
                        tenant: e.id().to_string(),
                        tokens: Tokens(bucket.tokens),
                    });
                }
            }
        };
        if keep.is_some() {
            self.tenants.for_each(each);
        }
        tenants.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        route_buckets.sort_by(|a, b| (&a.tenant, &a.route).cmp(&(&b.tenant, &b.route)));
        let shards = self
            .shards
            .load()
            .all
            .iter()
            .map(|e| ShardSnapshot {
                shard: Shard::clone(&e.shard),
                active: e.active(),
                draining: e.status.draining,
                healthy: e.status.healthy,
            })
            .collect();
        let now = self.clock.now_ms();
        // Client buckets are this node's own, in cluster mode too.
        let mut client_buckets: Vec<ClientBucketSnapshot> = (self.clients.unrefilled(now))
            .into_iter()
            .map(|c| ClientBucketSnapshot {
                client: c.client.to_string(),
                last_refill_at: c.bucket.last_refill_at,
                tenant: c.tenant.to_string(),
                tokens: Tokens(c.bucket.tokens),
            })
            .collect();
        // The emptiest first past the bound: those a restart must not
        // hand a fresh allowance.
        if client_buckets.len() > MAX_SAVED_CLIENTS {
            let emptiest = |a: &ClientBucketSnapshot, b: &ClientBucketSnapshot| {
                a.tokens.0.total_cmp(&b.tokens.0)
            };
            client_buckets.select_nth_unstable_by(MAX_SAVED_CLIENTS, emptiest);
            client_buckets.truncate(MAX_SAVED_CLIENTS);
        }
        client_buckets.sort_by(|a, b| (&a.tenant, &a.client).cmp(&(&b.tenant, &b.client)));
        RouterSnapshot {
            at: now,
            client_buckets,
            route_buckets,
            shards,
            tenants,
            version: 1,
        }
    }

    /// Replaces the client buckets with the snapshot's, each under its
    /// tenant's plan now (none if the plan has no `per_client` any more).
    fn restore_clients(&self, buckets: &[ClientBucketSnapshot], now: f64) {
        self.clients.clear();
        for c in buckets {
            let rule = self.plans.limits_for(&c.tenant).per_client();
            let Some(client) = ClientKey::parse(&c.client) else {
                continue;
            };
            if rule.is_unlimited() {
                continue;
            }
            let tracked = TrackedClient {
                tenant: c.tenant.as_str().into(),
                client,
                bucket: TokenBucket::restored(rule, c.tokens.0, c.last_refill_at, now),
            };
            self.clients.put(tracked, rule, now);
        }
    }

    /// Replaces tenant state, health and draining with the snapshot's.
    /// Membership is not changed; a snapshot shard that is not registered
    /// becomes known (it has a health state) but is not routable.
    ///
    /// With `reset_connections`, live counts start from zero and guards
    /// taken before the restore no longer count anywhere. Without it, the
    /// snapshot's counts are kept and older guards release against them,
    /// as the reference does. Token balances above a bucket's current
    /// capacity are lowered to it; an unlimited rule stays unlimited.
    pub fn restore(&self, snapshot: &RouterSnapshot, reset_connections: bool) {
        let now = self.clock.now_ms();
        let plans = &self.plans;
        let mut restored: BTreeMap<&str, (u64, TenantBuckets)> = BTreeMap::new();
        for t in &snapshot.tenants {
            let limits = plans.limits_for(&t.tenant);
            let buckets = TenantBuckets {
                tenant: TokenBucket::restored(limits.rate(), t.tokens.0, t.last_refill_at, now),
                routes: Default::default(),
            };
            let active = if reset_connections { 0 } else { t.active };
            restored.insert(t.tenant.as_str(), (active, buckets));
        }
        for r in &snapshot.route_buckets {
            let limits = plans.limits_for(&r.tenant);
            // Only a bucket of the tenant's own plan (the plan may have
            // changed while the state file waited).
            let Some(index) = limits.route_index(&r.route) else {
                continue;
            };
            let Some(rule) = limits.holds(index) else {
                continue;
            };
            let entry = restored
                .entry(r.tenant.as_str())
                .or_insert_with(|| (0, limits.fresh_buckets(now)));
            let bucket = TokenBucket::restored(rule, r.tokens.0, r.last_refill_at, now);
            entry.1.routes.retain(|(i, _)| *i != index);
            entry.1.routes.push((index, bucket));
        }
        if reset_connections {
            self.tenants.clear();
        } else {
            self.tenants.retain(|e| restored.contains_key(e.id()));
        }
        self.restore_clients(&snapshot.client_buckets, now);
        for (tenant, (active, buckets)) in restored {
            self.tenants.put(tenant, active, buckets);
        }
        self.edit_membership(|m| {
            for status in m.status.values_mut() {
                status.draining = false;
            }
            let restored_active: BTreeMap<&str, i64> = snapshot
                .shards
                .iter()
                .filter(|s| !reset_connections && s.active > 0)
                .map(|s| (s.shard.id.as_str(), s.active))
                .collect();
            // A counter is kept (and set) only where the snapshot has live
            // connections for it; every other one starts afresh, detached
            // from guards taken before.
            m.gauges
                .retain(|id, _| restored_active.contains_key(id.as_str()));
            for (id, active) in restored_active {
                m.gauge(id).set(active);
            }
            for s in &snapshot.shards {
                m.status.insert(
                    s.shard.id.clone(),
                    ShardStatus {
                        healthy: s.healthy,
                        draining: s.draining,
                    },
                );
            }
        });
    }
}
