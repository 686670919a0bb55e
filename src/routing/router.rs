//! The router: one instance shared by every worker thread.
//!
//! Concurrency: the request path takes no global lock. Membership is read
//! from an immutable snapshot (`ArcSwap`), a tenant's state sits behind its
//! own small lock inside a sharded table, cursors in a sharded table, and
//! metrics in per-thread stripes. Different tenants therefore never wait on
//! each other; one tenant's requests serialise only on its own entry.

use super::balance::{least_connections, round_robin, Balance, Cursors};
use super::clock::{Clock, MonotonicClock};
use super::decision::{Decision, RouteRequest, RouteResult};
use super::hash::{
    clamp_index, clamp_load, hrw_pick, jump_hash, jump_key, rendezvous_pick, Contestant,
    CustomHash, RoutingKey,
};
use super::shard::{Membership, Shard, ShardEntry, ShardId, ShardSet, ShardStatus};
use super::snapshot::{RouteBucketSnapshot, RouterSnapshot, ShardSnapshot, TenantSnapshot, Tokens};
use super::top::{TopRefused, TopTenant};
use crate::counters::{LastDuration, StripedCounter};
use crate::limits::{
    AdmissionGuard, DenyList, Limits, PlanSet, Spend, TenantBuckets, TenantEntry, TenantState,
    TenantTable, TokenBucket, Verdict,
};
use arc_swap::ArcSwap;
use compact_str::CompactString;
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

/// Which tenants a snapshot keeps ([`Router::snapshot_of`]).
pub type TenantFilter<'a> = dyn Fn(&TenantEntry, &TenantState) -> bool + 'a;

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
        }
    }
}

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

struct Counters {
    acquires: StripedCounter,
    /// Decisions by plan: slot 0 for tenants on no plan, slot i + 1 for
    /// plan i (bounded by the configuration).
    decisions: Vec<[StripedCounter; 7]>,
    last_route: LastDuration,
    /// The tenants refused most over the last minute (bounded).
    refused: TopRefused,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Route,
    Admit,
    Explain,
}

/// The shards a request may go to: the live list itself when no filter
/// applies (the common case, no copy), else a filtered subset kept in a
/// buffer on the caller's stack.
enum Candidates<'s> {
    All(&'s [Arc<ShardEntry>]),
    Filtered(&'s [&'s ShardEntry]),
}

type Scratch<'s> = SmallVec<[&'s ShardEntry; 16]>;

impl<'s> Candidates<'s> {
    #[inline]
    fn len(&self) -> usize {
        match self {
            Candidates::All(all) => all.len(),
            Candidates::Filtered(some) => some.len(),
        }
    }

    #[inline]
    fn get(&self, i: usize) -> &'s ShardEntry {
        match self {
            Candidates::All(all) => &all[i],
            Candidates::Filtered(some) => some[i],
        }
    }

    fn iter(&self) -> impl Iterator<Item = &'s ShardEntry> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
}

pub struct Router {
    shards: ArcSwap<ShardSet>,
    membership: Mutex<Membership>,
    tenants: TenantTable,
    cursors: Cursors,
    plans: PlanSet,
    allow: Option<Arc<dyn AllowHook>>,
    hash: HashStrategy,
    balance: Balance,
    load: Load,
    clock: Arc<dyn Clock>,
    forget_idle_tenants: bool,
    disposed: AtomicBool,
    counters: Counters,
}

impl Router {
    pub fn new(options: RouterOptions) -> Self {
        let plan_slots = options.plans.len() + 1;
        let mut membership = Membership::new(options.shards);
        membership.denied = Arc::new(DenyList::new(options.deny));
        let set = membership.publish();
        Router {
            shards: ArcSwap::from_pointee(set),
            membership: Mutex::new(membership),
            tenants: TenantTable::bounded(options.max_tracked_tenants),
            cursors: Cursors::new(),
            plans: PlanSet::new(
                options.limits,
                options.plans,
                options.plan_tenants,
                options.default_plan,
            ),
            allow: options.allow,
            hash: options.hash,
            balance: options.balance,
            load: options.load,
            clock: options.clock,
            forget_idle_tenants: options.forget_idle_tenants,
            disposed: AtomicBool::new(false),
            counters: Counters {
                acquires: StripedCounter::new(),
                decisions: (0..plan_slots)
                    .map(|_| std::array::from_fn(|_| StripedCounter::new()))
                    .collect(),
                last_route: LastDuration::new(),
                refused: TopRefused::default(),
            },
        }
    }

    /// `limits`' own rules (those of tenants on no plan; every plan's
    /// limits share their route list).
    pub fn limits(&self) -> &Limits {
        self.plans.base()
    }

    /// The plans, and which tenant is on which.
    pub fn plans(&self) -> &PlanSet {
        &self.plans
    }

    /// Refuses a tenant with `denied` from the next request on; returns
    /// whether it was newly denied.
    pub fn deny(&self, tenant: &str) -> bool {
        self.edit_membership(|m| Arc::make_mut(&mut m.denied).deny(tenant))
    }

    /// Lifts a denial; returns whether the tenant was denied.
    pub fn undeny(&self, tenant: &str) -> bool {
        self.edit_membership(|m| Arc::make_mut(&mut m.denied).allow(tenant))
    }

    /// The `n` tenants refused (rate-limited or capped) most over the last
    /// minute, most refused first.
    pub fn top_refused(&self, n: usize) -> Vec<TopTenant> {
        self.counters.refused.top(n, self.clock.now_ms())
    }

    /// The denied tenants, sorted.
    pub fn denied(&self) -> Vec<String> {
        self.shards.load().denied.list()
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
        let counted = mode != Mode::Explain;
        let timed = counted && self.counters.last_route.sample();
        let started = if timed { self.clock.precise_ms() } else { 0.0 };
        let now = self.clock.now_ms();
        let result = self.decide_at(request, now, mode);
        if counted {
            // The plan the limits used (kept in the tenant's state), else
            // looked up for a decision made before them.
            let decisions = &self.counters.decisions;
            let slot = match decisions.len() {
                1 => 0,
                _ => (result.plan)
                    .unwrap_or_else(|| self.plans.plan_of(request.tenant))
                    .map_or(0, |i| usize::from(i) + 1),
            };
            if let Some(counts) = decisions.get(slot) {
                counts[result.decision.index()].incr();
            }
            self.counters
                .refused
                .record(request.tenant, result.decision, now);
        }
        if timed {
            let ended = self.clock.precise_ms();
            self.counters.last_route.record(ended, ended - started);
        }
        result
    }

    fn decide_at<'r>(&'r self, req: &RouteRequest<'_>, now: f64, mode: Mode) -> RouteResult<'r> {
        if self.disposed.load(Ordering::Acquire) {
            return RouteResult::refused(Decision::NoShards);
        }
        let set = self.shards.load();
        let chosen = {
            let mut scratch = Scratch::new();
            let candidates = match self.candidates(&set, req, &mut scratch) {
                Ok(c) => c,
                Err(decision) => return RouteResult::refused(decision),
            };
            if !self.is_allowed(&set, req.tenant) {
                return RouteResult::refused(Decision::Denied);
            }
            let memo = self.placement_memo(req, &set, &candidates);
            let (verdict, tenant, pick, plan) = self.check_limits(req, now, mode, memo, || {
                self.sticky(&RoutingKey::new(req.tenant, None), &candidates)
            });
            match verdict {
                Verdict::Admit => {}
                Verdict::Capped => {
                    return RouteResult {
                        plan: Some(plan),
                        ..RouteResult::refused(Decision::Capped)
                    }
                }
                Verdict::RateLimited {
                    bucket,
                    retry_after_secs,
                } => {
                    return RouteResult {
                        bucket: Some(bucket),
                        retry_after_secs,
                        plan: Some(plan),
                        ..RouteResult::refused(Decision::RateLimited)
                    }
                }
            }
            let pick = pick.unwrap_or_else(|| self.select(req, &candidates, mode));
            let entry = candidates.get(pick);
            if mode != Mode::Explain {
                entry.routed.incr();
            }
            let admission = tenant.map(|t| AdmissionGuard::new(t, Some(entry.active.acquire())));
            (entry.pos, admission, plan)
        };
        RouteResult {
            admission: chosen.1,
            pick: Some((set, chosen.0)),
            plan: Some(chosen.2),
            ..RouteResult::refused(Decision::Allow)
        }
    }

    /// Steps 2–5: live shards, tenant allowlists, region, exclusions.
    fn candidates<'s: 'a, 'a>(
        &self,
        set: &'s ShardSet,
        req: &RouteRequest<'_>,
        scratch: &'a mut Scratch<'s>,
    ) -> Result<Candidates<'a>, Decision> {
        if set.live.is_empty() {
            return Err(Decision::NoShards);
        }
        let filter_tenant = set.live_dedicated;
        let filter_region = req.region.is_some() && set.live_regional;
        if !filter_tenant && !filter_region && req.exclude.is_empty() {
            return Ok(Candidates::All(&set.live));
        }
        scratch.extend(set.live.iter().map(|e| &**e));
        if filter_tenant {
            scratch.retain(|e| e.admits_tenant(req.tenant));
            if scratch.is_empty() {
                return Err(Decision::NoTenantShards);
            }
        }
        if let Some(region) = req.region.filter(|_| filter_region) {
            scratch.retain(|e| e.serves_region(region));
            if scratch.is_empty() {
                return Err(Decision::NoRegionShards);
            }
        }
        if !req.exclude.is_empty() {
            scratch.retain(|e| !req.exclude.contains(e.id()));
            if scratch.is_empty() {
                return Err(Decision::NoShards);
            }
        }
        Ok(Candidates::Filtered(scratch))
    }

    fn is_allowed(&self, set: &ShardSet, tenant: &str) -> bool {
        !set.denied.contains(tenant) && self.allow.as_ref().is_none_or(|hook| hook.allow(tenant))
    }

    /// The membership generation under which this request's sticky pick
    /// may be memoised in the tenant's slot: the pick must depend on nothing
    /// but the tenant id and the unfiltered live list (no channel, no
    /// filter, sticky balance, and a hash that reads no load and runs no
    /// user code).
    fn placement_memo(
        &self,
        req: &RouteRequest<'_>,
        set: &ShardSet,
        c: &Candidates<'_>,
    ) -> Option<u64> {
        let deterministic = match self.hash {
            HashStrategy::Jump => true,
            HashStrategy::Rendezvous | HashStrategy::Hrw => matches!(self.load, Load::None),
            HashStrategy::Custom(_) => false,
        };
        let sticky = req.balance.unwrap_or(self.balance) == Balance::Sticky;
        (deterministic && sticky && req.channel.is_none() && matches!(c, Candidates::All(_)))
            .then_some(set.generation)
    }

    /// Steps 7–10 against the tenant's slot, under its table shard's lock.
    /// In `Admit` mode also returns the entry the admission counts on; with
    /// a memo generation, also the sticky pick (memoised in the slot).
    fn check_limits(
        &self,
        req: &RouteRequest<'_>,
        now: f64,
        mode: Mode,
        memo: Option<u64>,
        pick: impl FnOnce() -> usize,
    ) -> (
        Verdict<'_>,
        Option<Arc<TenantEntry>>,
        Option<usize>,
        Option<u16>,
    ) {
        let plans = &self.plans;
        // Every plan's limits share one route list; each holds a request
        // to the bucket of its own longest prefix covering it.
        let index = |name: Option<&str>| name.and_then(|r| plans.base().route_index(r));
        let (route, also) = (index(req.route), index(req.route_also));
        let route = |limits: &Limits| limits.bucket_route(route, also);
        let spend = match mode {
            Mode::Explain => {
                let existing = self.tenants.with_existing(req.tenant, |e, s| {
                    // A copy of the cache: explaining moves nothing.
                    let mut cache = s.plan;
                    let plan = plans.plan_cached(req.tenant, &mut cache);
                    let limits = plans.limits_of(plan);
                    let verdict = limits.check(e, s, route(limits), now, Spend::Nothing);
                    (verdict, plan)
                });
                let (verdict, plan) = existing.unwrap_or_else(|| {
                    let plan = plans.plan_of(req.tenant);
                    (
                        plans.limits_of(plan).check_fresh(
                            req.tenant,
                            route(plans.limits_of(plan)),
                            now,
                        ),
                        plan,
                    )
                });
                return (verdict, None, None, plan);
            }
            Mode::Route => Spend::Tokens,
            Mode::Admit => Spend::TokensAndAdmission,
        };
        let forget = self.forget_idle_tenants;
        self.tenants.with_entry(
            req.tenant,
            now as u64,
            || plans.limits_for(req.tenant).fresh_buckets(now),
            // Other tenants may be swept here: each judged by its own plan.
            |e, s| forget && plans.limits_for(e.id()).is_forgettable(e, s, now),
            |entry, state| {
                let plan = plans.current(req.tenant, state, now);
                let limits = plans.limits_of(plan);
                let verdict = limits.check(entry, state, route(limits), now, spend);
                if verdict != Verdict::Admit {
                    return (verdict, None, None, plan);
                }
                let entry = (mode == Mode::Admit).then(|| Arc::clone(entry));
                let pick = memo.map(|generation| match state.placement {
                    Some((g, pos)) if g == generation => pos as usize,
                    _ => {
                        let pos = pick();
                        state.placement = Some((generation, pos as u32));
                        pos
                    }
                });
                (verdict, entry, pick, plan)
            },
        )
    }

    /// Step 11: pick among the candidates.
    fn select(&self, req: &RouteRequest<'_>, candidates: &Candidates<'_>, mode: Mode) -> usize {
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
                least_connections(cursor(), len, |i| candidates.get(i).active.get())
            }
        }
    }

    fn sticky(&self, key: &RoutingKey<'_>, candidates: &Candidates<'_>) -> usize {
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
            HashStrategy::Hrw => hrw_pick(
                key,
                candidates
                    .iter()
                    .map(|e| (e.hrw_hash, self.effective_weight(e))),
            ),
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

    /// Runs `f` on a known tenant's entry and locked state (the cluster
    /// service settling its lease).
    pub fn with_tenant<R>(
        &self,
        tenant: &str,
        f: impl FnOnce(&TenantEntry, &mut TenantState) -> R,
    ) -> Option<R> {
        self.tenants.with_existing(tenant, |e, s| f(e, s))
    }

    /// Counts a live connection for the tenant (and the shard, when given)
    /// without checking the cap, as the reference's `acquire` does.
    pub fn acquire(&self, tenant: &str, shard: Option<&str>) -> AdmissionGuard {
        let now = self.clock.now_ms();
        let limits = self.plans.limits_for(tenant);
        let forget = self.forget_idle_tenants;
        let plans = &self.plans;
        let entry = self.tenants.with_entry(
            tenant,
            now as u64,
            || limits.fresh_buckets(now),
            // Other tenants may be swept here: each judged by its own plan.
            |e, s| forget && plans.limits_for(e.id()).is_forgettable(e, s, now),
            |entry, _| {
                entry.active.fetch_add(1, Ordering::AcqRel);
                Arc::clone(entry)
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
