//! While Redis is down the node runs on what it holds: under `local-share`
//! its leases refill at its share, and idle tenants whose buckets are full
//! again are swept from the tracked set, as a release would with Redis up.

use super::service::Syncer;
use super::settle::IDLE_RELEASE;
use crate::limits::{share_of, TenantState};
use std::time::{Duration, Instant};

impl Syncer {
    /// Redis is down and `local-share` applies: each lease refills at
    /// `1/N` of its rule up to its share of the capacity ([`share_of`]).
    pub(super) fn refill_locally(&mut self, elapsed: Duration) {
        if self.shared().mode() != crate::cluster::Mode::Shared {
            return;
        }
        let n = self.shared().nodes_alive();
        let secs = elapsed.as_secs_f64();
        let router = &self.control.router;
        let now_ms = router.clock().now_ms();
        for tenant in self.tracked.keys() {
            router.with_tenant(tenant, |_, state| {
                let plans = router.plans();
                let limits = plans.limits_of(plans.current(tenant, state, now_ms));
                if state.shared.is_none() {
                    return;
                }
                let topup = |tokens: &mut f64, cap: f64, rate: f64| {
                    let room = (share_of(cap, n) - *tokens).max(0.0);
                    let add = (rate / n * secs).min(room);
                    *tokens += add;
                    add
                };
                // Not credit: Redis' own clock refills the shared bucket for
                // the same time, so charging these too would double them.
                let rule = limits.rate();
                if !rule.is_unlimited() {
                    topup(
                        &mut state.buckets.tenant.tokens,
                        rule.tokens,
                        rule.refill_per_second,
                    );
                }
                for (index, bucket) in state.buckets.routes.iter_mut() {
                    if let Some(rule) = limits.holds(*index) {
                        topup(&mut bucket.tokens, rule.tokens, rule.refill_per_second);
                    }
                }
            });
        }
    }

    /// Redis is down: a tenant idle for a second, holding no admission,
    /// whose buckets are full again at this node's share, is forgotten, as
    /// it would be with Redis up once its lease went back (its lease in
    /// Redis is dropped by the next settle of another node once its stamp
    /// is stale). Without this, every tenant that arrived during an outage
    /// would stay until Redis came back. A tenant kept is unqueued, so its
    /// next request queues it again and marks it seen.
    pub(super) fn forget_idle_while_down(&mut self, now: Instant) {
        let router = &self.control.router;
        let n = self.shared().nodes_alive();
        let now_ms = router.clock().now_ms();
        let full = |tokens: f64, rule: &crate::limits::RateRule| {
            rule.is_unlimited() || tokens >= share_of(rule.tokens, n) - 1e-9
        };
        self.tracked.retain(|tenant, last| {
            let idle = now.duration_since(*last) >= IDLE_RELEASE;
            let kept = router.with_tenant(tenant, |entry, state: &mut TenantState| {
                let plans = router.plans();
                let limits = plans.limits_of(plans.current(tenant, state, now_ms));
                if let Some(slot) = state.shared.as_deref_mut() {
                    slot.queued = false;
                }
                if entry.active() > 0 || !idle {
                    return true;
                }
                let b = &state.buckets;
                let refilled = full(b.tenant.tokens, limits.rate())
                    && b.routes.iter().all(|(i, bucket)| {
                        limits
                            .holds(*i)
                            .is_none_or(|rule| full(bucket.tokens, rule))
                    });
                if refilled {
                    state.shared = None;
                    state.buckets = limits.fresh_buckets(now_ms);
                }
                !refilled
            });
            kept.unwrap_or(false)
        });
    }
}
