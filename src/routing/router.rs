//! The router: one instance shared by every worker thread.
//!
//! Concurrency: the request path takes no global lock. Membership is read
//! from an immutable snapshot (`ArcSwap`), a tenant's state sits behind its
//! own small lock inside a sharded table, cursors in a sharded table, and
//! metrics in per-thread stripes. Different tenants therefore never wait on
//! each other; one tenant's requests serialise only on its own entry.

use super::balance::{least_connections, round_robin, Balance, Cursors};
use super::clock::{Clock, MonotonicClock};
use super::counters::{LastDuration, StripedCounter};
use super::decision::{Decision, RouteRequest, RouteResult};
use super::hash::{
    clamp_index, clamp_load, hrw_key_hash, hrw_score, jump_hash, jump_key, rendezvous_pick,
    Contestant, CustomHash, RoutingKey,
};
use super::shard::{Membership, Shard, ShardEntry, ShardId, ShardSet, ShardStatus};
use super::snapshot::{RouteBucketSnapshot, RouterSnapshot, ShardSnapshot, TenantSnapshot, Tokens};
use crate::limits::{
    AdmissionGuard, DenyList, Limits, Spend, TenantBuckets, TenantTable, TokenBucket, Verdict,
};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
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

pub struct RouterOptions {
    pub shards: Vec<Shard>,
    pub hash: HashStrategy,
    pub balance: Balance,
    pub limits: Limits,
    /// Tenants refused with `denied` (editable at runtime).
    pub deny: Vec<String>,
    pub allow: Option<Arc<dyn AllowHook>>,
    pub load: Load,
    pub clock: Arc<dyn Clock>,
}

impl Default for RouterOptions {
    fn default() -> Self {
        RouterOptions {
            shards: Vec::new(),
            hash: HashStrategy::default(),
            balance: Balance::default(),
            limits: Limits::default(),
            deny: Vec::new(),
            allow: None,
            load: Load::None,
            clock: Arc::new(MonotonicClock::new()),
        }
    }
}

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
    /// How long the most recent route took.
    pub last_route_ms: f64,
    /// Tenants currently remembered (see `limits::FORGETTABLE_BOUND`).
    pub tenants: usize,
}

struct Counters {
    routes: StripedCounter,
    acquires: StripedCounter,
    decisions: [StripedCounter; 7],
    last_route: LastDuration,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Route,
    Admit,
    Explain,
}

type Candidates<'s> = SmallVec<[&'s ShardEntry; 32]>;

pub struct Router {
    shards: ArcSwap<ShardSet>,
    membership: Mutex<Membership>,
    tenants: TenantTable,
    cursors: Cursors,
    limits: Limits,
    deny: DenyList,
    allow: Option<Arc<dyn AllowHook>>,
    hash: HashStrategy,
    balance: Balance,
    load: Load,
    clock: Arc<dyn Clock>,
    disposed: AtomicBool,
    counters: Counters,
}

impl Router {
    pub fn new(options: RouterOptions) -> Self {
        let mut membership = Membership::new(options.shards);
        let set = membership.publish();
        Router {
            shards: ArcSwap::from_pointee(set),
            membership: Mutex::new(membership),
            tenants: TenantTable::new(),
            cursors: Cursors::new(),
            limits: options.limits,
            deny: DenyList::new(options.deny),
            allow: options.allow,
            hash: options.hash,
            balance: options.balance,
            load: options.load,
            clock: options.clock,
            disposed: AtomicBool::new(false),
            counters: Counters {
                routes: StripedCounter::new(),
                acquires: StripedCounter::new(),
                decisions: std::array::from_fn(|_| StripedCounter::new()),
                last_route: LastDuration::new(),
            },
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn deny_list(&self) -> &DenyList {
        &self.deny
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Decides a request and, on `allow`, spends its tokens. Does not count
    /// an admission: pair with [`Router::acquire`], or use
    /// [`Router::admit`], which does both atomically.
    pub fn route<'r>(&'r self, request: &RouteRequest<'_>) -> RouteResult<'r> {
        self.decide(request, Mode::Route)
    }

    /// Decides a request and, on `allow`, counts the admission (tagged with
    /// the chosen shard) in the same step as the cap check.
    ///
    /// Route and acquire stay consistent because the cap check, the token
    /// spend and the `active` increment all happen under the tenant entry's
    /// lock: N concurrent callers for a tenant with cap N serialise on that
    /// lock, and the (N+1)th sees `active == N`. Releases only decrement, so
    /// they can only make a later check more permissive, never stale-admit.
    pub fn admit<'r>(&'r self, request: &RouteRequest<'_>) -> RouteResult<'r> {
        self.decide(request, Mode::Admit)
    }

    /// The decision `route()` would make now, changing nothing: no token,
    /// no cursor, no metric, no tenant state.
    pub fn explain<'r>(&'r self, request: &RouteRequest<'_>) -> RouteResult<'r> {
        self.decide(request, Mode::Explain)
    }

    fn decide<'r>(&'r self, request: &RouteRequest<'_>, mode: Mode) -> RouteResult<'r> {
        let start = self.clock.now_ms();
        let result = self.decide_at(request, start, mode);
        if mode != Mode::Explain {
            self.counters.routes.incr();
            self.counters.decisions[result.decision.index()].incr();
            let end = self.clock.now_ms();
            self.counters.last_route.record(end, end - start);
        }
        result
    }

    fn decide_at<'r>(&'r self, req: &RouteRequest<'_>, now: f64, mode: Mode) -> RouteResult<'r> {
        if self.disposed.load(Ordering::Acquire) {
            return RouteResult::refused(Decision::NoShards);
        }
        let set = self.shards.load();
        let chosen = {
            let candidates = match self.candidates(&set, req) {
                Ok(c) => c,
                Err(decision) => return RouteResult::refused(decision),
            };
            if !self.is_allowed(req.tenant) {
                return RouteResult::refused(Decision::Denied);
            }
            let (verdict, tenant) = self.check_limits(req, now, mode);
            match verdict {
                Verdict::Admit => {}
                Verdict::Capped => return RouteResult::refused(Decision::Capped),
                Verdict::RateLimited {
                    bucket,
                    retry_after_secs,
                } => {
                    return RouteResult {
                        bucket: Some(bucket),
                        retry_after_secs,
                        ..RouteResult::refused(Decision::RateLimited)
                    }
                }
            }
            let entry = candidates[self.select(req, &candidates, mode)];
            if mode != Mode::Explain {
                entry.routed.incr();
            }
            let admission = tenant.map(|t| AdmissionGuard::new(t, Some(entry.active.acquire())));
            (entry.pos, admission)
        };
        RouteResult {
            admission: chosen.1,
            pick: Some((set, chosen.0)),
            ..RouteResult::refused(Decision::Allow)
        }
    }

    /// Steps 2–5: live shards, tenant allowlists, region, exclusions.
    fn candidates<'s>(
        &self,
        set: &'s ShardSet,
        req: &RouteRequest<'_>,
    ) -> Result<Candidates<'s>, Decision> {
        if set.live.is_empty() {
            return Err(Decision::NoShards);
        }
        let mut c: Candidates<'s> = if set.live_dedicated {
            set.live
                .iter()
                .filter(|e| e.admits_tenant(req.tenant))
                .map(|e| &**e)
                .collect()
        } else {
            set.live.iter().map(|e| &**e).collect()
        };
        if c.is_empty() {
            return Err(Decision::NoTenantShards);
        }
        if let Some(region) = req.region {
            c.retain(|e| e.serves_region(region));
            if c.is_empty() {
                return Err(Decision::NoRegionShards);
            }
        }
        if !req.exclude.is_empty() {
            c.retain(|e| !req.exclude.contains(e.id()));
            if c.is_empty() {
                return Err(Decision::NoShards);
            }
        }
        Ok(c)
    }

    fn is_allowed(&self, tenant: &str) -> bool {
        !self.deny.contains(tenant) && self.allow.as_ref().is_none_or(|hook| hook.allow(tenant))
    }

    /// Steps 7–10 against the tenant's entry; in `Admit` mode also returns
    /// the entry the admission counts on.
    fn check_limits(
        &self,
        req: &RouteRequest<'_>,
        now: f64,
        mode: Mode,
    ) -> (Verdict<'_>, Option<Arc<crate::limits::TenantEntry>>) {
        let limits = &self.limits;
        let route = req.route.and_then(|r| limits.route_index(r));
        let fresh = || limits.fresh_buckets(now);
        let forgettable = |e: &crate::limits::TenantEntry| limits.is_forgettable(e, now);
        match mode {
            Mode::Explain => {
                let verdict = self
                    .tenants
                    .with_existing(req.tenant, |e| limits.check(e, route, now, Spend::Nothing))
                    .unwrap_or_else(|| limits.check_fresh(route, now));
                (verdict, None)
            }
            Mode::Route => {
                let verdict = self
                    .tenants
                    .with_entry(req.tenant, fresh, forgettable, |e| {
                        limits.check(e, route, now, Spend::Tokens)
                    });
                (verdict, None)
            }
            Mode::Admit => self
                .tenants
                .with_entry(req.tenant, fresh, forgettable, |e| {
                    let verdict = limits.check(e, route, now, Spend::TokensAndAdmission);
                    let entry = (verdict == Verdict::Admit).then(|| Arc::clone(e));
                    (verdict, entry)
                }),
        }
    }

    /// Step 11: pick among the candidates.
    fn select(&self, req: &RouteRequest<'_>, candidates: &[&ShardEntry], mode: Mode) -> usize {
        let key = RoutingKey::new(req.tenant, req.channel);
        let len = candidates.len();
        let cursor = || {
            if mode == Mode::Explain {
                self.cursors.peek(&key)
            } else {
                self.cursors.advance(&key)
            }
        };
        match req.balance.unwrap_or(self.balance) {
            Balance::Sticky => self.sticky(&key, candidates),
            Balance::RoundRobin => round_robin(cursor(), len),
            Balance::LeastConnections => {
                least_connections(cursor(), len, |i| candidates[i].active.get())
            }
        }
    }

    fn sticky(&self, key: &RoutingKey<'_>, candidates: &[&ShardEntry]) -> usize {
        let len = candidates.len();
        match &self.hash {
            HashStrategy::Jump => jump_hash(jump_key(key), len).unwrap_or(0),
            HashStrategy::Rendezvous => rendezvous_pick(
                key,
                candidates.iter().map(|e| Contestant {
                    id: e.id().as_str(),
                    effective_weight: self.effective_weight(e),
                }),
            ),
            HashStrategy::Hrw => {
                let key_hash = hrw_key_hash(key);
                let mut best = 0;
                let mut best_score = f64::NEG_INFINITY;
                for (i, e) in candidates.iter().enumerate() {
                    if let Some(w) = self.effective_weight(e) {
                        let score = hrw_score(key_hash, e.hrw_hash, w);
                        if score > best_score {
                            best = i;
                            best_score = score;
                        }
                    }
                }
                best
            }
            HashStrategy::Custom(strategy) => {
                let shards: SmallVec<[&Shard; 32]> = candidates.iter().map(|e| &*e.shard).collect();
                clamp_index(strategy.pick(&key.to_joined(), &shards), len)
            }
        }
    }

    /// `weight / max(load, 0.0001)`, or `None` for a weight ≤ 0 (skipped).
    #[inline]
    fn effective_weight(&self, e: &ShardEntry) -> Option<f64> {
        let w = e.shard.weight;
        if w <= 0.0 {
            return None;
        }
        let load = match &self.load {
            Load::None => return Some(w),
            Load::ActiveConnections => 1.0 + e.active.get() as f64,
            Load::Hook(hook) => hook.load(e.id()),
        };
        Some(w / clamp_load(load))
    }

    /// Counts a live connection for the tenant (and the shard, when given)
    /// without checking the cap, as the reference's `acquire` does.
    pub fn acquire(&self, tenant: &str, shard: Option<&str>) -> AdmissionGuard {
        let now = self.clock.now_ms();
        let limits = &self.limits;
        let entry = self.tenants.with_entry(
            tenant,
            || limits.fresh_buckets(now),
            |e| limits.is_forgettable(e, now),
            |e| {
                e.active.fetch_add(1, Ordering::AcqRel);
                Arc::clone(e)
            },
        );
        let cell = shard.map(|id| {
            let set = self.shards.load();
            match set.gauge(id) {
                Some(gauge) => gauge.acquire(),
                None => {
                    let mut m = self.membership.lock();
                    let gauge = m.gauge(id);
                    let cell = gauge.acquire();
                    self.shards.store(Arc::new(m.publish()));
                    cell
                }
            }
        });
        self.counters.acquires.incr();
        AdmissionGuard::new(entry, cell)
    }

    /// Edits membership under its lock and publishes the result.
    fn edit_membership<R>(&self, f: impl FnOnce(&mut Membership) -> R) -> R {
        let mut m = self.membership.lock();
        let r = f(&mut m);
        self.shards.store(Arc::new(m.publish()));
        r
    }

    fn edit_status(&self, id: &str, f: impl FnOnce(&mut ShardStatus)) -> bool {
        self.edit_membership(|m| match m.status_mut(id) {
            Some(status) => {
                f(status);
                true
            }
            None => false,
        })
    }

    /// Healthy again; also ends draining. `false` for an unknown id.
    pub fn mark_healthy(&self, id: &str) -> bool {
        self.edit_status(id, |s| {
            *s = ShardStatus {
                healthy: true,
                draining: false,
            }
        })
    }

    /// Unhealthy; draining is left as it is. `false` for an unknown id.
    pub fn mark_unhealthy(&self, id: &str) -> bool {
        self.edit_status(id, |s| s.healthy = false)
    }

    /// Healthy from a probe's point of view: draining (the operator's
    /// decision) is kept.
    pub fn set_probed_health(&self, id: &str, healthy: bool) -> bool {
        self.edit_status(id, |s| s.healthy = healthy)
    }

    /// No new routes to the shard; in-flight ones finish. `false` for an
    /// unknown id.
    pub fn drain(&self, id: &str) -> bool {
        self.edit_status(id, |s| s.draining = true)
    }

    /// Appends a shard, healthy; `false` (and no change) if the id exists.
    pub fn add_shard(&self, shard: Shard) -> bool {
        self.edit_membership(|m| m.add(shard))
    }

    /// `false` if no such shard was registered.
    pub fn remove_shard(&self, id: &str) -> bool {
        self.edit_membership(|m| m.remove(id))
    }

    /// Registered shards in registration order, with their status.
    pub fn shards(&self) -> Vec<(Shard, ShardStatus, i64)> {
        self.shards
            .load()
            .all
            .iter()
            .map(|e| (Shard::clone(&e.shard), e.status, e.active()))
            .collect()
    }

    /// The current membership snapshot (what the next request routes over).
    pub fn shard_set(&self) -> Arc<ShardSet> {
        self.shards.load_full()
    }

    pub fn shard_status(&self, id: &str) -> Option<ShardStatus> {
        self.membership.lock().status(id)
    }

    pub fn is_healthy(&self, id: &str) -> bool {
        self.shard_status(id).is_some_and(|s| s.healthy)
    }

    pub fn is_draining(&self, id: &str) -> bool {
        self.shard_status(id).is_some_and(|s| s.draining)
    }

    /// Ends routing for good: every later route is `no-shards`. Counters are
    /// kept; acquire still works.
    pub fn dispose(&self) {
        self.disposed.store(true, Ordering::Release);
        self.edit_membership(|m| {
            m.shards.clear();
            m.status.clear();
            m.gauges.clear();
        });
        self.tenants.clear();
        self.cursors.clear();
    }

    pub fn is_disposed(&self) -> bool {
        self.disposed.load(Ordering::Acquire)
    }

    /// Tenants currently remembered.
    pub fn tenant_count(&self) -> usize {
        self.tenants.len()
    }

    /// Live admissions of a tenant (0 for one the router does not know).
    pub fn tenant_active(&self, tenant: &str) -> u64 {
        self.tenants
            .with_existing(tenant, |e| e.active())
            .unwrap_or(0)
    }

    pub fn metrics(&self) -> RouterMetrics {
        let c = &self.counters;
        let mut m = RouterMetrics {
            routes: c.routes.get(),
            acquires: c.acquires.get(),
            allows: c.decisions[Decision::Allow.index()].get(),
            last_route_ms: c.last_route.get(),
            tenants: self.tenants.len(),
            ..Default::default()
        };
        for d in &Decision::ALL[1..] {
            m.rejects_by_decision
                .insert(d.as_str().to_string(), c.decisions[d.index()].get());
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

    /// Decisions counted so far, for every decision.
    pub fn decision_counts(&self) -> [(Decision, u64); 7] {
        Decision::ALL.map(|d| (d, self.counters.decisions[d.index()].get()))
    }

    pub fn snapshot(&self) -> RouterSnapshot {
        let mut tenants = Vec::new();
        let mut route_buckets = Vec::new();
        self.tenants.for_each(|e| {
            let b = e.buckets.lock();
            tenants.push(TenantSnapshot {
                active: e.active(),
                last_refill_at: b.tenant.last_refill_at,
                tenant: e.id().to_string(),
                tokens: Tokens(b.tenant.tokens),
            });
            for (index, bucket) in &b.routes {
                if let Some(route) = self.limits.route_name(*index) {
                    route_buckets.push(RouteBucketSnapshot {
                        last_refill_at: bucket.last_refill_at,
                        route: route.to_string(),
                        tenant: e.id().to_string(),
                        tokens: Tokens(bucket.tokens),
                    });
                }
            }
        });
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
        RouterSnapshot {
            at: self.clock.now_ms(),
            route_buckets,
            shards,
            tenants,
            version: 1,
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
        let limits = &self.limits;
        let mut restored: BTreeMap<&str, (u64, TenantBuckets)> = BTreeMap::new();
        for t in &snapshot.tenants {
            let buckets = TenantBuckets {
                tenant: TokenBucket::restored(limits.rate(), t.tokens.0, t.last_refill_at),
                routes: Default::default(),
            };
            let active = if reset_connections { 0 } else { t.active };
            restored.insert(t.tenant.as_str(), (active, buckets));
        }
        for r in &snapshot.route_buckets {
            let Some(index) = limits.route_index(&r.route) else {
                continue;
            };
            let Some(rule) = limits.route_rule(index) else {
                continue;
            };
            let entry = restored
                .entry(r.tenant.as_str())
                .or_insert_with(|| (0, limits.fresh_buckets(now)));
            let bucket = TokenBucket::restored(rule, r.tokens.0, r.last_refill_at);
            entry.1.routes.retain(|(i, _)| *i != index);
            entry.1.routes.push((index, bucket));
        }
        if reset_connections {
            self.tenants.clear();
        } else {
            self.tenants.retain(|e| restored.contains_key(e.id()));
        }
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
