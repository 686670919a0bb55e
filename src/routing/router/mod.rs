//! The router: one instance shared by every worker thread.
//!
//! Concurrency: the request path takes no global lock. Membership is read
//! from an immutable snapshot (`ArcSwap`), a tenant's state sits behind its
//! own small lock inside a sharded table, cursors in a sharded table, and
//! metrics in per-thread stripes. Different tenants therefore never wait on
//! each other; one tenant's requests serialise only on its own entry.

mod decide;
mod membership;
mod options;
mod report;

use super::balance::{Balance, Cursors};
use super::clock::Clock;
use super::decision::{RouteRequest, RouteResult};
use super::shard::{Membership, ShardSet};
use super::top::{TopRefused, TopTenant};
use crate::counters::{LastDuration, StripedCounter};
use crate::limits::{
    AdmissionGuard, ClientTable, DenyList, Limits, PlanSet, TenantEntry, TenantState, TenantTable,
};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use decide::Mode;
pub use options::{AllowHook, HashStrategy, Load, LoadHook, RouterOptions};
pub use report::RouterMetrics;

struct Counters {
    acquires: StripedCounter,
    /// Decisions by plan: slot 0 for tenants on no plan, slot i + 1 for
    /// plan i (bounded by the configuration).
    decisions: Vec<[StripedCounter; 7]>,
    last_route: LastDuration,
    /// `rate-limited` refusals by the kind of bucket: tenant, route,
    /// client.
    rate_limited: [StripedCounter; 3],
    /// The tenants refused most over the last minute (bounded).
    refused: TopRefused,
}

pub struct Router {
    shards: ArcSwap<ShardSet>,
    membership: Mutex<Membership>,
    tenants: TenantTable,
    /// Each client's bucket within its tenant (`per_client`).
    clients: ClientTable,
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
            clients: ClientTable::bounded(options.max_tracked_clients),
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
                rate_limited: std::array::from_fn(|_| StripedCounter::new()),
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
}
