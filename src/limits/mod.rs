//! Admission limits: the per-tenant connection cap, the tenant token bucket,
//! per-route buckets and the deny list. `Limits::check` is steps 7–10 of the
//! decision order (cap, tenant bucket, route bucket, commit); the router
//! calls it once the shard filters and the allow decision have passed.

mod admission;
mod bucket;
mod deny;
mod tenants;

pub use admission::AdmissionGuard;
pub use bucket::{RateRule, TokenBucket};
pub use deny::DenyList;
pub use tenants::{
    TenantBuckets, TenantEntry, TenantState, TenantTable, FORGETTABLE_BOUND, SWEEP_FLOOR,
};

use compact_str::CompactString;
use std::fmt;
use std::sync::atomic::Ordering;

/// Which bucket ran dry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bucket<'a> {
    Tenant,
    Route(&'a str),
}

impl Bucket<'_> {
    pub fn name(&self) -> &str {
        match self {
            Bucket::Tenant => "tenant",
            Bucket::Route(name) => name,
        }
    }
}

impl fmt::Display for Bucket<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The limits' answer for one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict<'a> {
    Admit,
    Capped,
    RateLimited {
        bucket: Bucket<'a>,
        /// Seconds until that bucket holds a token; `None` if it never will.
        retry_after_secs: Option<f64>,
    },
}

/// What an admitted check does to the tenant's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spend {
    /// Deduct the tokens (a plain `route()`).
    Tokens,
    /// Deduct the tokens and count a live admission, in one step.
    TokensAndAdmission,
    /// Change nothing (the explain endpoint).
    Nothing,
}

/// The configured limits.
#[derive(Clone, Debug)]
pub struct Limits {
    connection_cap: Option<u64>,
    rate: RateRule,
    routes: Vec<(CompactString, RateRule)>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits::new(None, RateRule::UNLIMITED, Vec::new())
    }
}

impl Limits {
    /// `routes` beyond 65 535 entries are ignored (a route index is a u16).
    pub fn new(
        connection_cap: Option<u64>,
        rate: RateRule,
        routes: impl IntoIterator<Item = (String, RateRule)>,
    ) -> Self {
        Limits {
            connection_cap,
            rate,
            routes: routes
                .into_iter()
                .take(usize::from(u16::MAX))
                .map(|(name, rule)| (CompactString::from(name), rule))
                .collect(),
        }
    }

    pub fn connection_cap(&self) -> Option<u64> {
        self.connection_cap
    }

    pub fn rate(&self) -> &RateRule {
        &self.rate
    }

    /// Route names with their rules, in configuration order.
    pub fn routes(&self) -> impl Iterator<Item = (&str, &RateRule)> {
        self.routes.iter().map(|(n, r)| (n.as_str(), r))
    }

    /// The index of a limited route; unknown names are unlimited.
    #[inline]
    pub fn route_index(&self, name: &str) -> Option<u16> {
        self.routes
            .iter()
            .position(|(n, _)| n.as_str() == name)
            .map(|i| i as u16)
    }

    pub fn route_name(&self, index: u16) -> Option<&str> {
        self.routes.get(usize::from(index)).map(|(n, _)| n.as_str())
    }

    pub fn route_rule(&self, index: u16) -> Option<&RateRule> {
        self.routes.get(usize::from(index)).map(|(_, r)| r)
    }

    /// A new tenant's buckets: full, no route bucket yet.
    pub fn fresh_buckets(&self, now: f64) -> TenantBuckets {
        TenantBuckets {
            tenant: TokenBucket::full(&self.rate, now),
            routes: Default::default(),
        }
    }

    /// A tenant that is idle and whose buckets are all full at `now` is
    /// indistinguishable from a new one: it may be forgotten.
    pub fn is_forgettable(&self, entry: &TenantEntry, state: &TenantState, now: f64) -> bool {
        let b = &state.buckets;
        entry.active() == 0
            && b.tenant.is_full_at(&self.rate, now)
            && b.routes.iter().all(|(i, bucket)| {
                self.route_rule(*i)
                    .is_none_or(|rule| bucket.is_full_at(rule, now))
            })
    }

    /// Cap, tenant bucket, route bucket, then commit. Callers hold the
    /// entry's lock, so the cap check and the admission count are one
    /// atomic step.
    pub fn check(
        &self,
        entry: &TenantEntry,
        state: &mut TenantState,
        route: Option<u16>,
        now: f64,
        spend: Spend,
    ) -> Verdict<'_> {
        let active = entry.active();
        if spend == Spend::Nothing {
            let mut copy = state.buckets.clone();
            return self.evaluate(&mut copy, active, route, now, spend);
        }
        let verdict = self.evaluate(&mut state.buckets, active, route, now, spend);
        if verdict == Verdict::Admit && spend == Spend::TokensAndAdmission {
            entry.active.fetch_add(1, Ordering::AcqRel);
        }
        verdict
    }

    /// The verdict for a tenant the table does not know (explain only).
    pub fn check_fresh(&self, route: Option<u16>, now: f64) -> Verdict<'_> {
        let mut buckets = self.fresh_buckets(now);
        self.evaluate(&mut buckets, 0, route, now, Spend::Nothing)
    }

    fn evaluate(
        &self,
        buckets: &mut TenantBuckets,
        active: u64,
        route: Option<u16>,
        now: f64,
        spend: Spend,
    ) -> Verdict<'_> {
        if self.connection_cap.is_some_and(|cap| active >= cap) {
            return Verdict::Capped;
        }
        buckets.tenant.refill(&self.rate, now);
        if !buckets.tenant.has_token() {
            return Verdict::RateLimited {
                bucket: Bucket::Tenant,
                retry_after_secs: buckets.tenant.seconds_until_token(&self.rate),
            };
        }
        let route = route.and_then(|i| Some((i, self.routes.get(usize::from(i))?)));
        if let Some((index, (name, rule))) = route {
            let pos = match buckets.routes.iter().position(|(i, _)| *i == index) {
                Some(pos) => pos,
                None => {
                    buckets.routes.push((index, TokenBucket::full(rule, now)));
                    buckets.routes.len() - 1
                }
            };
            let bucket = &mut buckets.routes[pos].1;
            bucket.refill(rule, now);
            if !bucket.has_token() {
                return Verdict::RateLimited {
                    bucket: Bucket::Route(name.as_str()),
                    retry_after_secs: bucket.seconds_until_token(rule),
                };
            }
            if spend != Spend::Nothing {
                bucket.take();
            }
        }
        if spend != Spend::Nothing {
            buckets.tenant.take();
        }
        Verdict::Admit
    }
}
