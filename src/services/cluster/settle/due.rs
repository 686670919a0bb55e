//! Which tenants a settle pass takes, in what order, and the job each
//! one's settle carries: a tenant's state decides whether it is due
//! (`track`), and a due one hands its lease and credit to the job.

use super::{Job, LeaseBucket, IDLE_RELEASE, SETTLE_BUDGET};
use crate::limits::TenantState;
use crate::services::cluster::service::Syncer;
use compact_str::CompactString;
use std::time::Instant;

impl Syncer {
    /// What to settle this pass: tenants that spent since the last settle,
    /// and idle ones whose lease goes back; forgets tenants with nothing
    /// left. At most [`SETTLE_BUDGET`] settles, in the order of
    /// [`Due`]: a flood of invented names costs one pass its budget, never
    /// a real tenant its top-up. What the budget leaves out is untouched
    /// (still due at the next pass).
    pub(super) fn jobs(&mut self, now: Instant) -> Vec<Job> {
        let router = &self.control.router;
        let now_ms = router.clock().now_ms();
        let mut due: Vec<(Due, Instant, CompactString)> = Vec::new();
        self.tracked.retain(|tenant, last| {
            let seen_now = *last == now;
            let idle = now.duration_since(*last) >= IDLE_RELEASE;
            let verdict = router.with_tenant(tenant, |entry, state| {
                let plans = router.plans();
                let limits = plans.limits_of(plans.current(tenant, state, now_ms));
                track(limits, entry.active() > 0, state, seen_now, idle, now_ms)
            });
            match verdict {
                // Forgotten by the table.
                None | Some(Track::Forget) => false,
                Some(Track::Keep) => true,
                Some(Track::Due(class)) => {
                    due.push((class, *last, tenant.clone()));
                    true
                }
            }
        });
        // Most recent traffic first within a class.
        due.sort_unstable_by(|a, b| (a.0, b.1).cmp(&(b.0, a.1)));
        due.truncate(SETTLE_BUDGET);
        let mut jobs = Vec::with_capacity(due.len());
        for (_, last, tenant) in due {
            let seen_now = last == now;
            let idle = now.duration_since(last) >= IDLE_RELEASE;
            let job = router.with_tenant(&tenant, |entry, state| {
                let plans = router.plans();
                let limits = plans.limits_of(plans.current(&tenant, state, now_ms));
                let live = entry.active() > 0;
                match track(limits, live, state, seen_now, idle, now_ms) {
                    Track::Due(class) => take_job(limits, state, &tenant, class, now_ms),
                    Track::Keep | Track::Forget => None,
                }
            });
            jobs.extend(job.flatten());
        }
        jobs
    }
}

/// A settle due, in the order they are served: real traffic first,
/// invented names last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Due {
    /// A top-up of a lease this node settled before: a tenant that came
    /// back.
    Topup,
    /// A lease's first settle: a new tenant, or an invented name.
    Opening,
    /// An idle lease goes back.
    Release,
}

/// What a settle does for a tracked tenant.
enum Track {
    /// Nothing to settle now.
    Keep,
    /// No lease and nothing live: stop tracking.
    Forget,
    /// A settle is due (the tenant stays tracked).
    Due(Due),
}

/// Whether a tracked tenant needs a settle now (`seen_now`: it spent since
/// the last pass; `idle`: not for [`IDLE_RELEASE`]). Changes nothing but
/// the `queued` mark of a tenant with nothing to settle.
fn track(
    limits: &crate::limits::Limits,
    live: bool,
    state: &mut TenantState,
    seen_now: bool,
    idle: bool,
    now_ms: f64,
) -> Track {
    let Some(slot) = state.shared.as_deref_mut() else {
        // No lease: tracked only while it holds admissions.
        return if live { Track::Keep } else { Track::Forget };
    };
    if slot.dormant.is_some() {
        // Its lease went back; the bucket was not full.
        return if seen_now || live {
            Track::Keep
        } else {
            Track::Forget
        };
    }
    // Untouched: nothing to settle, unless the lease has been idle long
    // enough to go back (credit is charged first). Still queued: it spent
    // while Redis was down, or its last settle failed or was left out; it
    // is settled now like a tenant seen now.
    let touched = seen_now || slot.queued || (!idle && slot.has_credit());
    if !touched && !idle {
        return Track::Keep;
    }
    let class = match (touched, slot.settled_at > 0.0) {
        (false, _) => Due::Release,
        (true, true) => Due::Topup,
        (true, false) => Due::Opening,
    };
    // A lease in use with enough left is not settled yet.
    if touched && !needs_topup(state, now_ms) {
        if let Some(slot) = state.shared.as_deref_mut() {
            slot.queued = false;
        }
        return Track::Keep;
    }
    if !holds_lease(limits, state) && class != Due::Release {
        // Nothing Redis holds (unlimited buckets only).
        if let Some(slot) = state.shared.as_deref_mut() {
            slot.queued = false;
        }
        return Track::Keep;
    }
    Track::Due(class)
}

/// Takes a due settle's job out of the tenant's state: its credit moves
/// into the job; a release empties the node's buckets until Redis says how
/// full they are.
fn take_job(
    limits: &crate::limits::Limits,
    state: &mut TenantState,
    tenant: &CompactString,
    class: Due,
    now_ms: f64,
) -> Option<Job> {
    let release = class == Due::Release;
    let buckets = lease_of(limits, state);
    if let Some(slot) = state.shared.as_deref_mut() {
        slot.queued = false;
        slot.credit = 0.0;
        slot.route_credit.clear();
    }
    if release {
        if buckets.is_empty() {
            state.shared = None;
        } else if let Some(slot) = state.shared.as_deref_mut() {
            // Until Redis says how full the bucket is, a request reopens
            // on no credit at all. The lease goes: a reopened one is not
            // Redis' yet.
            slot.dormant = Some((0.0, now_ms));
            slot.low_water.clear();
        }
        if !limits.rate().is_unlimited() {
            state.buckets.tenant.tokens = 0.0;
        }
        state.buckets.routes.clear();
    }
    (!buckets.is_empty()).then(|| Job {
        tenant: tenant.clone(),
        class,
        release,
        buckets,
    })
}

/// Whether a lease in use needs a settle now: credit to charge, a bucket
/// below its low-water mark, or a second since the last one.
fn needs_topup(state: &TenantState, now_ms: f64) -> bool {
    let Some(slot) = state.shared.as_deref() else {
        return false;
    };
    if slot.has_credit() || now_ms - slot.settled_at >= 1000.0 || slot.low_water.is_empty() {
        return true;
    }
    slot.low_water.iter().any(|(index, low)| match index {
        None => state.buckets.tenant.tokens < *low,
        Some(i) => state
            .buckets
            .routes
            .iter()
            .find(|(r, _)| r == i)
            .is_none_or(|(_, b)| b.tokens < *low),
    })
}

/// Whether [`lease_of`] has a bucket (without building it: every pass
/// asks this of every tenant due).
fn holds_lease(limits: &crate::limits::Limits, state: &TenantState) -> bool {
    state.shared.is_some()
        && (!limits.rate().is_unlimited()
            || (state.buckets.routes.iter())
                .any(|(i, _)| limits.route_name(*i).is_some() && limits.holds(*i).is_some()))
}

/// The tenant's buckets as this node holds them, with the credit on each.
fn lease_of(limits: &crate::limits::Limits, state: &TenantState) -> Vec<LeaseBucket> {
    let Some(slot) = state.shared.as_deref() else {
        return Vec::new();
    };
    // The last grant's buckets are the ones Redis holds a lease for.
    let leased = |index: Option<u16>| slot.low_water.iter().any(|(i, _)| *i == index);
    let mut buckets = Vec::new();
    let rule = limits.rate();
    if !rule.is_unlimited() {
        buckets.push(LeaseBucket {
            index: None,
            name: "t".to_string(),
            cap: rule.tokens,
            rate: rule.refill_per_second,
            // Never infinite: a bucket an unlimited plan left reopens
            // before it is settled (`Limits::after_move`).
            held: state.buckets.tenant.tokens.clamp(0.0, rule.tokens),
            credit: slot.credit,
            leased: leased(None),
        });
    }
    for (index, bucket) in &state.buckets.routes {
        // Only the plan's own limited buckets (not one another plan left).
        let (Some(name), Some(rule)) = (limits.route_name(*index), limits.holds(*index)) else {
            continue;
        };
        let credit = slot
            .route_credit
            .iter()
            .find(|(i, _)| i == index)
            .map_or(0.0, |(_, c)| *c);
        buckets.push(LeaseBucket {
            index: Some(*index),
            name: format!("r:{name}"),
            cap: rule.tokens,
            rate: rule.refill_per_second,
            held: bucket.tokens.clamp(0.0, rule.tokens),
            credit,
            leased: leased(Some(*index)),
        });
    }
    buckets
}
