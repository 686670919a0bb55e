//! The decision: from a request to a verdict and a shard. Candidates are
//! filtered, the tenant's limits checked, and a shard selected by the
//! sticky hash or the balance; `explain` runs the same steps changing
//! nothing.

use super::{HashStrategy, Load, Router};
use crate::limits::{AdmissionGuard, Client, ClientKey, Limits, Spend, TenantEntry, Verdict};
use crate::routing::balance::{least_connections, round_robin, Balance};
use crate::routing::clock::Clock;
use crate::routing::decision::{Decision, RouteRequest, RouteResult};
use crate::routing::hash::{
    clamp_index, clamp_load, hrw_pick, jump_hash, jump_key, rendezvous_pick, Contestant, RoutingKey,
};
use crate::routing::shard::{Shard, ShardEntry, ShardSet};
use smallvec::SmallVec;
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
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

impl Router {
    pub(super) fn decide<'r>(&'r self, request: &RouteRequest<'_>, mode: Mode) -> RouteResult<'r> {
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
            if let Some(bucket) = &result.bucket {
                self.counters.rate_limited[bucket.kind_index()].incr();
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
        let client = req.client.map(|address| Client {
            table: &self.clients,
            key: ClientKey::of(address),
        });
        let spend = match mode {
            Mode::Explain => {
                let existing = self.tenants.with_existing(req.tenant, |e, s| {
                    // A copy of the cache: explaining moves nothing.
                    let mut cache = s.plan;
                    let plan = plans.plan_cached(req.tenant, &mut cache);
                    let limits = plans.limits_of(plan);
                    let verdict = limits.check(e, s, route(limits), client, now, Spend::Nothing);
                    (verdict, plan)
                });
                let (verdict, plan) = existing.unwrap_or_else(|| {
                    let plan = plans.plan_of(req.tenant);
                    (
                        plans.limits_of(plan).check_fresh(
                            req.tenant,
                            route(plans.limits_of(plan)),
                            client,
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
                let verdict = limits.check(entry, state, route(limits), client, now, spend);
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
}
