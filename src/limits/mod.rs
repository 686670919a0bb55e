//! Admission limits: the per-tenant connection cap, the tenant token bucket,
//! per-route buckets and the deny list. `Limits::check` is steps 7–10 of the
//! decision order (cap, tenant bucket, route bucket, commit); the router
//! calls it once the shard filters and the allow decision have passed.

mod admission;
mod bucket;
mod clients;
mod deny;
mod lease;
mod lease_check;
pub mod plans;
mod tenants;

pub use admission::AdmissionGuard;
pub use bucket::{RateRule, TokenBucket};
pub use clients::{
    ClientCheck, ClientKey, ClientTable, TrackedClient, DEFAULT_MAX_TRACKED_CLIENTS, SLOT_BYTES,
};
pub use deny::DenyList;
pub use lease::{share_of, Ledger, Mode, SharedSlot};
pub use plans::PlanSet;
pub use tenants::{
    TenantBuckets, TenantEntry, TenantState, TenantTable, DEFAULT_MAX_TRACKED, FORGETTABLE_BOUND,
    SWEEP_FLOOR,
};

use compact_str::CompactString;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Which bucket ran dry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bucket<'a> {
    Tenant,
    Route(&'a str),
    /// The client's own, within its tenant (`per_client`).
    Client,
}

impl Bucket<'_> {
    /// The kinds of bucket, as the metrics name them.
    pub const KINDS: [&'static str; 3] = ["tenant", "route", "client"];

    /// This bucket's kind, as an index in [`Bucket::KINDS`].
    pub fn kind_index(&self) -> usize {
        match self {
            Bucket::Tenant => 0,
            Bucket::Route(_) => 1,
            Bucket::Client => 2,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Bucket::Tenant => "tenant",
            Bucket::Route(name) => name,
            Bucket::Client => "client",
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

/// Whether the route prefix `prefix` covers `path`, on path-segment
/// boundaries: `/api/export` covers `/api/export` and `/api/export/x`,
/// not `/api/exporter`; `/api/` covers everything under `/api/`. ASCII
/// case is ignored: Express, ASP.NET and IIS route `/API/Export` to
/// `/api/export`'s handler, so it must spend that bucket.
pub fn prefix_covers(prefix: &str, path: &str) -> bool {
    let (prefix, path) = (prefix.as_bytes(), path.as_bytes());
    match path.get(..prefix.len()) {
        Some(head) if head.eq_ignore_ascii_case(prefix) => {
            let rest = &path[prefix.len()..];
            prefix.ends_with(b"/") || rest.is_empty() || rest.starts_with(b"/")
        }
        _ => false,
    }
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
    /// For each route, the route whose bucket holds it: itself, or (a
    /// plan's limits over every plan's routes) the plan's own longest
    /// prefix covering it; `None`: no bucket, unlimited.
    held_by: Vec<Option<u16>>,
    /// Each client's bucket within a tenant (`per_client`).
    per_client: RateRule,
    /// Cluster mode: buckets and caps shared through Redis.
    shared: Option<Arc<dyn Ledger>>,
}

/// The client a request comes from, and the table of client buckets.
#[derive(Clone, Copy)]
pub struct Client<'a> {
    pub table: &'a ClientTable,
    pub key: ClientKey,
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
        let routes: Vec<(CompactString, RateRule)> = (routes.into_iter())
            .take(usize::from(u16::MAX))
            .map(|(name, rule)| (CompactString::from(name), rule))
            .collect();
        Limits {
            connection_cap,
            rate,
            held_by: (0..routes.len()).map(|i| Some(i as u16)).collect(),
            routes,
            per_client: RateRule::UNLIMITED,
            shared: None,
        }
    }

    /// The same limits with a bucket per client address (`per_client`).
    pub fn with_per_client(mut self, rule: RateRule) -> Self {
        self.per_client = rule;
        self
    }

    pub fn per_client(&self) -> &RateRule {
        &self.per_client
    }

    /// One plan's limits over `union`, every route prefix any plan names
    /// (so a route index means one route whichever plan a tenant is on):
    /// each prefix is held by the plan's own longest prefix covering it,
    /// or by none (unlimited). A tenant whose plan limits `/api` is held
    /// to it under `/api/export` too, though another plan gives
    /// `/api/export` a bucket of its own.
    pub fn over_union(
        connection_cap: Option<u64>,
        rate: RateRule,
        own: &[(String, RateRule)],
        union: &[String],
    ) -> Self {
        let union = &union[..union.len().min(usize::from(u16::MAX))];
        let index_of = |prefix: &str| union.iter().position(|p| p == prefix);
        let held_by: Vec<Option<u16>> = (union.iter())
            .map(|prefix| {
                let covering = own.iter().filter(|(p, _)| prefix_covers(p, prefix));
                let longest = covering.max_by_key(|(p, _)| p.len())?;
                index_of(&longest.0).map(|i| i as u16)
            })
            .collect();
        let routes = (union.iter().zip(&held_by))
            .map(|(prefix, held)| {
                let rule = held.and_then(|i| own.iter().find(|(p, _)| *p == union[usize::from(i)]));
                let rule = rule.map_or(RateRule::UNLIMITED, |(_, r)| *r);
                (CompactString::from(prefix.as_str()), rule)
            })
            .collect();
        Limits {
            connection_cap,
            rate,
            routes,
            held_by,
            per_client: RateRule::UNLIMITED,
            shared: None,
        }
    }

    /// The same limits, enforced across the cluster (DESIGN §4).
    pub fn with_shared(mut self, shared: Arc<dyn Ledger>) -> Self {
        self.shared = Some(shared);
        self
    }

    pub fn shared(&self) -> Option<&Arc<dyn Ledger>> {
        self.shared.as_ref()
    }

    /// Whether any limit Redis keeps in cluster mode applies (cap, tenant
    /// or route bucket). Client buckets are each node's own: Redis being
    /// down changes nothing for them.
    pub fn any(&self) -> bool {
        self.connection_cap.is_some()
            || !self.rate.is_unlimited()
            || self.routes.iter().any(|(_, rule)| !rule.is_unlimited())
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

    /// The route whose bucket a request falls under: `route`'s holder, or
    /// `also`'s (the same path read another way) when its prefix is
    /// longer.
    #[inline]
    pub fn bucket_route(&self, route: Option<u16>, also: Option<u16>) -> Option<u16> {
        let held = |r: Option<u16>| self.held_by.get(usize::from(r?)).copied().flatten();
        let length = |i: u16| self.route_name(i).map_or(0, str::len);
        match (held(route), held(also)) {
            (Some(a), Some(b)) if length(b) > length(a) => Some(b),
            (a, b) => a.or(b),
        }
    }

    /// The rule of a route this plan gives a bucket of its own: not one
    /// held by a covering prefix, not an unlimited one. A bucket under any
    /// other index is another plan's, left from before a move.
    pub fn holds(&self, index: u16) -> Option<&RateRule> {
        let own = self.held_by.get(usize::from(index)).copied().flatten() == Some(index);
        (self.route_rule(index)).filter(|rule| own && !rule.is_unlimited())
    }

    /// A tenant just moved to these limits from another plan (`now`:
    /// clock ms). On one node its buckets stay: a route both plans name
    /// keeps its bucket, the next check cuts tokens to the new capacity,
    /// and a bucket only the old plan held is ignored (see
    /// [`Limits::holds`]). In cluster mode the node's lease starts again:
    /// its buckets go, and the next request opens this node's share of the
    /// new capacity on credit, as a new lease does (Redis' balance is the
    /// tenant's whatever its plan; leases it still counts for the old
    /// buckets lapse within 10 s).
    pub fn after_move(&self, state: &mut TenantState, now: f64) {
        if self.shared.is_none() {
            return;
        }
        if let Some(slot) = state.shared.as_deref_mut() {
            slot.reopen(now);
        }
        state.buckets = self.fresh_buckets(now);
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
        if self.shared.is_some() {
            // Redis keeps the buckets; a node without a lease knows nothing
            // a new entry would not, nor does one whose returned lease
            // left a bucket that has refilled since.
            let refilled = |slot: &SharedSlot| {
                slot.dormant.is_some()
                    && std::iter::once(&self.rate)
                        .chain((0..self.routes.len()).filter_map(|i| self.holds(i as u16)))
                        .all(|rule| {
                            rule.is_unlimited() || slot.opening_share(rule, 1.0, now) >= rule.tokens
                        })
            };
            return entry.active() == 0 && state.shared.as_deref().is_none_or(refilled);
        }
        let b = &state.buckets;
        entry.active() == 0
            && b.tenant.is_full_at(&self.rate, now)
            && b.routes.iter().all(|(i, bucket)| {
                // Another plan's bucket (left from a move) counts for nothing.
                self.holds(*i)
                    .is_none_or(|rule| bucket.is_full_at(rule, now))
            })
    }

    /// The client's bucket (`per_client`), cap, tenant bucket, route
    /// bucket, then commit. Callers hold the entry's lock, so the cap
    /// check and the admission count are one atomic step, and so are the
    /// client's bucket and the tenant's.
    #[inline]
    pub fn check(
        &self,
        entry: &TenantEntry,
        state: &mut TenantState,
        route: Option<u16>,
        client: Option<Client<'_>>,
        now: f64,
        spend: Spend,
    ) -> Verdict<'_> {
        match client {
            Some(client) if !self.per_client.is_unlimited() => {
                self.client_first(entry.id(), Some(client), now, spend, || {
                    self.check_tenant(entry, state, route, now, spend)
                })
            }
            // Per-client limits off (the common case): nothing else runs.
            _ => self.check_tenant(entry, state, route, now, spend),
        }
    }

    /// Runs `rest` (the tenant's checks) if the client's bucket holds a
    /// token, and spends that token if `rest` admits and `spend` says so;
    /// an empty client bucket refuses first, spending nothing. One abusive
    /// client is refused by its own bucket before it empties its tenant's.
    #[inline(never)]
    fn client_first<'l>(
        &'l self,
        tenant: &str,
        client: Option<Client<'_>>,
        now: f64,
        spend: Spend,
        rest: impl FnOnce() -> Verdict<'l>,
    ) -> Verdict<'l> {
        let rule = &self.per_client;
        let Some(client) = client.filter(|_| !rule.is_unlimited()) else {
            return rest();
        };
        let refused = |retry_after_secs| Verdict::RateLimited {
            bucket: Bucket::Client,
            retry_after_secs,
        };
        if spend == Spend::Nothing {
            return match client.table.peek(tenant, client.key, rule, now) {
                ClientCheck::Has => rest(),
                ClientCheck::Empty(retry) => refused(retry),
            };
        }
        let checked = client.table.check(tenant, client.key, rule, now, || {
            let verdict = rest();
            (verdict, verdict == Verdict::Admit)
        });
        checked.unwrap_or_else(refused)
    }

    /// Cap, tenant bucket, route bucket, then commit.
    #[inline]
    fn check_tenant(
        &self,
        entry: &TenantEntry,
        state: &mut TenantState,
        route: Option<u16>,
        now: f64,
        spend: Spend,
    ) -> Verdict<'_> {
        if let Some(shared) = &self.shared {
            return self.check_shared(shared.as_ref(), entry, state, route, now, spend);
        }
        let active = entry.active();
        if spend == Spend::Nothing {
            let mut copy = state.buckets.clone();
            return self.evaluate(&mut copy, active, route, now, spend, true);
        }
        let verdict = self.evaluate(&mut state.buckets, active, route, now, spend, true);
        count_admission(entry, verdict, spend);
        verdict
    }

    /// The verdict for a tenant the table does not know (explain only).
    pub fn check_fresh(
        &self,
        tenant: &str,
        route: Option<u16>,
        client: Option<Client<'_>>,
        now: f64,
    ) -> Verdict<'_> {
        self.client_first(tenant, client, now, Spend::Nothing, || {
            self.check_unknown(tenant, route, now)
        })
    }

    fn check_unknown(&self, tenant: &str, route: Option<u16>, now: f64) -> Verdict<'_> {
        let mut buckets = self.fresh_buckets(now);
        // In cluster mode the tenant may hold admissions on other nodes.
        let active = match (&self.shared, self.connection_cap) {
            (Some(shared), Some(_)) => shared.others_active(tenant),
            _ => 0,
        };
        self.evaluate(&mut buckets, active, route, now, Spend::Nothing, true)
    }

    fn evaluate(
        &self,
        buckets: &mut TenantBuckets,
        active: u64,
        route: Option<u16>,
        now: f64,
        spend: Spend,
        refill: bool,
    ) -> Verdict<'_> {
        if self.connection_cap.is_some_and(|cap| active >= cap) {
            return Verdict::Capped;
        }
        if refill {
            buckets.tenant.refill(&self.rate, now);
        }
        // A tenant moved to a smaller plan: its tokens cut to the new
        // capacity (refill only caps a bucket that refills).
        if buckets.tenant.tokens > self.rate.tokens || self.rate.is_unlimited() {
            buckets.tenant.tokens = moved(buckets.tenant.tokens, &self.rate);
        }
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
            if refill {
                bucket.refill(rule, now);
            }
            bucket.tokens = moved(bucket.tokens, rule);
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

/// A bucket's tokens under `rule`, which may be a new plan's: cut to a
/// smaller capacity; an unlimited rule (which never refills) holds an
/// unlimited bucket.
#[inline]
fn moved(tokens: f64, rule: &RateRule) -> f64 {
    match rule.is_unlimited() {
        true => f64::INFINITY,
        false => tokens.min(rule.tokens),
    }
}

/// Counts a live admission when the verdict admits and the spend says so
/// (under the entry's lock, so a cap check and its count are one step).
fn count_admission(entry: &TenantEntry, verdict: Verdict<'_>, spend: Spend) {
    if verdict == Verdict::Admit && spend == Spend::TokensAndAdmission {
        entry.active.fetch_add(1, Ordering::AcqRel);
    }
}
