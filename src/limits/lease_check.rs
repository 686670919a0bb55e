//! [`Limits::check`] in cluster mode: the mode Redis' reachability sets
//! decides first, the cap counts the other nodes' admissions, and the
//! buckets spend this node's lease, opened on credit when it holds none.
//! The cluster service refills them; nothing here waits on Redis.

use super::{
    count_admission, Bucket, Ledger, Limits, Mode, SharedSlot, Spend, TenantBuckets, TenantEntry,
    TenantState, TokenBucket, Verdict,
};

impl Limits {
    /// [`Limits::check`] in cluster mode. The cap counts the other nodes'
    /// admissions as last read; the buckets hold this node's lease and are
    /// refilled by the cluster service, never here. A tenant the node holds
    /// no lease for opens one on credit: `1/N` of each bucket (N = nodes
    /// alive), charged to the shared bucket at the next settle.
    pub(super) fn check_shared(
        &self,
        shared: &dyn Ledger,
        entry: &TenantEntry,
        state: &mut TenantState,
        route: Option<u16>,
        now: f64,
        spend: Spend,
    ) -> Verdict<'_> {
        if let Some(verdict) = self.redis_down_verdict(shared, entry, spend) {
            return verdict;
        }
        let active = self.cluster_active(shared, entry);
        let n = shared.nodes_alive();
        let opening = self.lease_opens(state, now);
        if spend == Spend::Nothing {
            return self.preview_shared(state, active, route, n, opening, now);
        }
        if state.shared.is_none() {
            state.buckets = self.fresh_buckets(now);
        }
        let slot = state.shared.get_or_insert_with(Box::default);
        if opening {
            self.open_lease(slot, &mut state.buckets, n, now);
        }
        let route = route.filter(|i| usize::from(*i) < self.routes.len());
        if let Some(index) = route {
            self.open_route_share(slot, &mut state.buckets, index, n, now);
        }
        slot.dormant = None;
        let verdict = self.evaluate(&mut state.buckets, active, route, now, spend, false);
        count_admission(entry, verdict, spend);
        queue_for_settle(shared, entry, state);
        verdict
    }

    /// What `on_redis_down` decides before any bucket: `allow` admits
    /// (and counts the admission), `deny` refuses a tenant with limits for
    /// a sync interval; `None` when the buckets decide.
    fn redis_down_verdict(
        &self,
        shared: &dyn Ledger,
        entry: &TenantEntry,
        spend: Spend,
    ) -> Option<Verdict<'_>> {
        match shared.mode() {
            Mode::Allow => {
                count_admission(entry, Verdict::Admit, spend);
                Some(Verdict::Admit)
            }
            Mode::Deny if self.any() => Some(Verdict::RateLimited {
                bucket: Bucket::Tenant,
                retry_after_secs: Some(shared.sync_interval().as_secs_f64().max(1.0)),
            }),
            Mode::Deny | Mode::Shared => None,
        }
    }

    /// The admissions the cap is checked against: this node's plus the
    /// other nodes' as last read.
    fn cluster_active(&self, shared: &dyn Ledger, entry: &TenantEntry) -> u64 {
        match self.connection_cap {
            None => entry.active(),
            // Redis down (local-share): the cap divided by the nodes last
            // seen alive, i.e. this node's admissions counted N times.
            Some(_) if !shared.redis_up() => entry.active() * shared.nodes_alive() as u64,
            Some(_) => entry
                .active()
                .saturating_add(shared.others_active(entry.id())),
        }
    }

    /// Whether this request opens a lease on credit.
    fn lease_opens(&self, state: &mut TenantState, now: f64) -> bool {
        // No lease yet, or one given back: the next request opens one. So
        // does a tenant moved here from an unlimited plan (its bucket holds
        // unlimited tokens): its share on credit, not the whole capacity.
        if !self.rate.is_unlimited() && state.buckets.tenant.tokens.is_infinite() {
            if let Some(slot) = state.shared.as_deref_mut() {
                slot.reopen(now);
            }
        }
        state.shared.as_ref().is_none_or(|s| s.dormant.is_some())
    }

    /// The verdict without spending (the explain endpoint): on a copy of
    /// the lease, opened as this request would open it.
    fn preview_shared(
        &self,
        state: &TenantState,
        active: u64,
        route: Option<u16>,
        n: f64,
        opening: bool,
        now: f64,
    ) -> Verdict<'_> {
        let (mut copy, mut slot) = match &state.shared {
            Some(slot) => (state.buckets.clone(), SharedSlot::clone(slot)),
            None => (self.fresh_buckets(now), SharedSlot::default()),
        };
        if opening {
            self.open_lease(&mut slot, &mut copy, n, now);
        }
        self.evaluate(&mut copy, active, route, now, Spend::Nothing, false)
    }

    /// Opens a lease on credit: the tenant bucket holds the slot's opening
    /// share (`1/N` of the rule, or of what a given-back bucket holds by
    /// now), which the slot owes until the next settle.
    fn open_lease(&self, slot: &mut SharedSlot, buckets: &mut TenantBuckets, n: f64, now: f64) {
        if self.rate.is_unlimited() {
            return;
        }
        let share = slot.opening_share(&self.rate, n, now);
        buckets.tenant.tokens = share;
        slot.credit += share;
    }

    /// A route bucket the lease does not hold yet opens with its share on
    /// credit, as the tenant bucket does (`index` is a route of these
    /// limits).
    fn open_route_share(
        &self,
        slot: &mut SharedSlot,
        buckets: &mut TenantBuckets,
        index: u16,
        n: f64,
        now: f64,
    ) {
        let rule = &self.routes[usize::from(index)].1;
        // A route bucket an unlimited plan left opens a share too.
        buckets
            .routes
            .retain(|(i, b)| *i != index || rule.is_unlimited() || b.tokens.is_finite());
        if !buckets.routes.iter().any(|(i, _)| *i == index) {
            let share = slot.opening_share(rule, n, now);
            buckets.routes.push((index, TokenBucket::full(rule, now)));
            if let Some((_, b)) = buckets.routes.last_mut() {
                b.tokens = share;
            }
            slot.add_route_credit(index, share);
        }
    }
}

/// Refused requests queue the tenant too: a node whose lease ran dry is
/// topped up at the next settle.
fn queue_for_settle(shared: &dyn Ledger, entry: &TenantEntry, state: &mut TenantState) {
    if let Some(slot) = &mut state.shared {
        if !slot.queued {
            slot.queued = true;
            shared.enqueue(entry.id());
        }
    }
}
