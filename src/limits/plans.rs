//! Tenant plans (DESIGN §6): each tenant's limits follow its plan. Every
//! plan's [`Limits`] is built over the same route list (the union of all
//! route prefixes, unlimited where a plan has none), so a route index
//! means one route whichever plan a tenant is on, and its buckets survive
//! a move between plans.

#[cfg(test)]
use super::RateRule;
use super::{Limits, TenantState};
use compact_str::CompactString;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// The maps' hasher: tenants are looked up on every request.
type Hasher = foldhash::fast::RandomState;

/// A tenant's plan as last looked up, and under which generation of the
/// runtime changes, in one word (it sits in every tenant's state): the
/// generation + 1 above 16 bits, the plan + 1 below (0: no plan); 0
/// altogether: never looked up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanCache(u64);

impl PlanCache {
    fn new(generation: u64, plan: Option<u16>) -> Self {
        let slot = plan.map_or(0, |p| u64::from(p) + 1) & 0xffff;
        PlanCache((generation.wrapping_add(1) << 16) | slot)
    }

    /// The plan cached under `generation`, if that is the cache's.
    #[inline]
    fn at(self, generation: u64) -> Option<Option<u16>> {
        let same = self.0 >> 16 == (generation.wrapping_add(1) & (u64::MAX >> 16));
        (self.0 != 0 && same).then(|| self.plan_slot())
    }

    /// The plan last looked up, whatever the generation (`None`: never).
    pub fn plan(self) -> Option<Option<u16>> {
        (self.0 != 0).then(|| self.plan_slot())
    }

    fn plan_slot(self) -> Option<u16> {
        ((self.0 & 0xffff) as u16).checked_sub(1)
    }
}

/// The limits of every plan, and which plan each tenant is on.
pub struct PlanSet {
    /// `limits`: tenants on no plan.
    base: Limits,
    /// The plans, by index: name and limits.
    plans: Vec<(CompactString, Limits)>,
    /// Configured tenant → plan.
    tenants: HashMap<CompactString, u16, Hasher>,
    default_plan: Option<u16>,
    /// Runtime changes (admin API): tenant → plan. Read only when a
    /// tenant's cached plan is stale; written one change at a time (a
    /// restore of a million is linear).
    overrides: RwLock<HashMap<CompactString, u16, Hasher>>,
    /// Bumped after each runtime change: a plan cached with an older one
    /// is looked up again.
    generation: AtomicU64,
}

impl PlanSet {
    /// No plans: every tenant has `base`.
    pub fn single(base: Limits) -> Self {
        PlanSet::new(base, Vec::new(), HashMap::new(), None)
    }

    pub fn new(
        base: Limits,
        plans: Vec<(CompactString, Limits)>,
        tenants: HashMap<CompactString, u16>,
        default_plan: Option<u16>,
    ) -> Self {
        PlanSet {
            base,
            plans,
            tenants: tenants.into_iter().collect(),
            default_plan,
            overrides: RwLock::default(),
            generation: AtomicU64::new(0),
        }
    }

    /// `limits`' own rules.
    pub fn base(&self) -> &Limits {
        &self.base
    }

    /// The plan `tenant` is on (`None`: `limits`).
    pub fn plan_of(&self, tenant: &str) -> Option<u16> {
        if self.plans.is_empty() {
            return None;
        }
        let set = self.overrides.read().get(tenant).copied();
        set.or_else(|| self.tenants.get(tenant).copied())
            .or(self.default_plan)
    }

    /// The plan of `tenant`, from `cache` if it was looked up since the
    /// last runtime change (the tenant's state keeps it: one lookup per
    /// tenant and change, not per request).
    #[inline]
    pub fn plan_cached(&self, tenant: &str, cache: &mut PlanCache) -> Option<u16> {
        if self.plans.is_empty() {
            return None;
        }
        let generation = self.generation.load(Ordering::Acquire);
        match cache.at(generation) {
            Some(plan) => plan,
            None => {
                let plan = self.plan_of(tenant);
                *cache = PlanCache::new(generation, plan);
                plan
            }
        }
    }

    /// The plan of `tenant`, whose state is `state`: the cached one, or,
    /// after a runtime change, the new one, with the state brought along
    /// when the plan changed (see [`Limits::after_move`]). Every reader of
    /// a tenant's buckets goes through here, so none reads them under a
    /// plan they were not built for.
    #[inline]
    pub fn current(&self, tenant: &str, state: &mut TenantState, now: f64) -> Option<u16> {
        let before = state.plan.plan();
        let plan = self.plan_cached(tenant, &mut state.plan);
        if before.is_some_and(|before| before != plan) {
            self.limits_of(plan).after_move(state, now);
        }
        plan
    }

    /// The limits `tenant` is held to.
    #[inline]
    pub fn limits_for(&self, tenant: &str) -> &Limits {
        self.limits_of(self.plan_of(tenant))
    }

    /// The limits of a plan (`None`: `limits`).
    #[inline]
    pub fn limits_of(&self, plan: Option<u16>) -> &Limits {
        match plan {
            Some(index) => (self.plans.get(usize::from(index))).map_or(&self.base, |p| &p.1),
            None => &self.base,
        }
    }

    /// Whether any tenant may be held to a connection cap.
    pub fn any_cap(&self) -> bool {
        std::iter::once(&self.base)
            .chain(self.plans.iter().map(|p| &p.1))
            .any(|l| l.connection_cap().is_some())
    }

    /// A plan's name.
    pub fn name(&self, index: u16) -> Option<&str> {
        self.plans.get(usize::from(index)).map(|p| p.0.as_str())
    }

    pub fn index_of(&self, name: &str) -> Option<u16> {
        (self.plans.iter().position(|p| p.0 == name)).map(|i| i as u16)
    }

    /// Moves `tenant` to `plan` from its next request.
    pub fn set(&self, tenant: &str, plan: u16) {
        self.overrides
            .write()
            .insert(CompactString::from(tenant), plan);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Drops a runtime change: `tenant` follows the configuration again
    /// (`tenants`, then `default_plan`, then `limits`).
    pub fn unset(&self, tenant: &str) {
        self.overrides.write().remove(tenant);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// How many tenants' plans are set at runtime.
    pub fn changed(&self) -> usize {
        self.overrides.read().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(cap: u64) -> Limits {
        Limits::new(Some(cap), RateRule::UNLIMITED, Vec::new())
    }

    #[test]
    fn overrides_then_tenants_then_the_default_plan_then_limits() {
        let plans = vec![("free".into(), limits(1)), ("pro".into(), limits(2))];
        let tenants = HashMap::from([(CompactString::from("acme"), 1)]);
        let set = PlanSet::new(limits(9), plans, tenants, Some(0));
        assert_eq!(set.limits_for("acme").connection_cap(), Some(2));
        assert_eq!(set.limits_for("other").connection_cap(), Some(1));
        set.set("other", 1);
        assert_eq!(set.limits_for("other").connection_cap(), Some(2));
        set.set("acme", 0);
        assert_eq!(set.plan_of("acme"), Some(0));
        set.unset("acme");
        assert_eq!(set.plan_of("acme"), Some(1), "the configuration again");
        let single = PlanSet::single(limits(9));
        assert_eq!(single.limits_for("acme").connection_cap(), Some(9));
    }

    #[test]
    fn a_cached_plan_holds_for_its_generation_only() {
        assert_eq!(PlanCache::default().plan(), None, "never looked up");
        for plan in [None, Some(0), Some(255)] {
            let cache = PlanCache::new(7, plan);
            assert_eq!(cache.at(7), Some(plan));
            assert_eq!(cache.at(8), None);
            assert_eq!(cache.plan(), Some(plan));
        }
        assert_eq!(
            PlanCache::new(u64::MAX, Some(3)).at(u64::MAX),
            Some(Some(3))
        );
    }

    #[test]
    fn every_plan_holds_a_route_by_its_own_longest_prefix() {
        let union: Vec<String> = ["/api", "/api/export", "/b", "/api/export/x"]
            .map(String::from)
            .into();
        let rule = RateRule::new(5.0, 1.0);
        let only_api =
            Limits::over_union(None, RateRule::UNLIMITED, &[("/api".into(), rule)], &union);
        // Another plan's `/api/export` (and what lies under it) is still
        // this plan's `/api`: one bucket, index 0.
        for index in [0, 1, 3] {
            assert_eq!(only_api.bucket_route(Some(index), None), Some(0), "{index}");
        }
        assert_eq!(only_api.route_rule(1), Some(&rule));
        assert_eq!(
            only_api.bucket_route(Some(2), None),
            None,
            "`/b`: unlimited"
        );
        // A path read two ways: the longer prefix this plan has.
        assert_eq!(only_api.bucket_route(Some(2), Some(0)), Some(0));
        let both = [("/api".into(), rule), ("/api/export".into(), rule)];
        let both = Limits::over_union(None, RateRule::UNLIMITED, &both, &union);
        assert_eq!(both.bucket_route(Some(3), None), Some(1));
        assert_eq!(both.bucket_route(Some(0), Some(3)), Some(1));
        assert_eq!(both.bucket_route(Some(9), None), None, "unknown index");
    }

    #[test]
    fn a_plan_holds_a_route_spelled_in_another_case() {
        // The base limits name `/api/export`, a plan `/API/Export` and
        // `/Reports`: each is held by the plan's own prefix whatever the
        // case (on Express or IIS they are one endpoint).
        let union: Vec<String> = ["/api/export", "/API/Export", "/Reports", "/reports/x"]
            .map(String::from)
            .into();
        let rule = RateRule::new(5.0, 1.0);
        let plan = [("/API/Export".into(), rule), ("/Reports".into(), rule)];
        let plan = Limits::over_union(None, RateRule::UNLIMITED, &plan, &union);
        assert_eq!(plan.bucket_route(Some(0), None), Some(1));
        assert_eq!(plan.bucket_route(Some(3), None), Some(2));
        let base = [("/api/export".into(), rule)];
        let base = Limits::over_union(None, RateRule::UNLIMITED, &base, &union);
        assert_eq!(base.bucket_route(Some(1), None), Some(0));
        assert_eq!(
            base.bucket_route(Some(2), None),
            None,
            "`/Reports`: unlimited"
        );
    }
}
