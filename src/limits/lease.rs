//! A tenant's lease in cluster mode (DESIGN §4), as limits see it: the
//! bookkeeping each tenant entry keeps ([`SharedSlot`]), a node's share of
//! a bucket, and the [`Ledger`] limits ask on each admission — how limits
//! run right now, how many nodes share, what the others admitted. The
//! cluster's `Shared` answers it; limits never see Redis or the cluster.

use super::RateRule;
use std::time::Duration;

/// How limits run right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Shares settled with Redis (or, with `local-share` while Redis is
    /// down, refilled locally at `1/N` of the rule).
    Shared,
    /// Redis is down and `on_redis_down: allow`: limits are not enforced.
    Allow,
    /// Redis is down and `on_redis_down: deny`: limited requests are refused.
    Deny,
}

/// A tenant's cluster bookkeeping, behind its entry's lock: the tokens it
/// was given on credit (spent outside Redis' ledger, charged at the next
/// settle) and whether it is queued for that settle. `None` in the entry
/// means the node holds no lease for the tenant: the next request opens one.
#[derive(Clone, Debug, Default)]
pub struct SharedSlot {
    pub queued: bool,
    /// The lease went back while the shared bucket was not full: how full
    /// it was (the lowest fraction over the tenant's buckets) and when
    /// (clock ms). The next request reopens on credit no larger than what
    /// the bucket can hold by then.
    pub dormant: Option<(f64, f64)>,
    /// Credit on the tenant bucket.
    pub credit: f64,
    /// When the lease was last settled (clock ms), and below which balance
    /// each bucket needs the next top-up (half its lease then, at least
    /// one token; `None` = the tenant bucket). A lease with enough left is
    /// settled once a second, not every interval.
    pub settled_at: f64,
    pub low_water: smallvec::SmallVec<[(Option<u16>, f64); 2]>,
    /// Credit per route bucket (route index).
    pub route_credit: smallvec::SmallVec<[(u16, f64); 2]>,
}

impl SharedSlot {
    /// Gives the lease up to open a new one at the next request: a full
    /// share on credit, nothing owed or leased from before (a move between
    /// plans, or off an unlimited one).
    pub fn reopen(&mut self, now: f64) {
        self.dormant = Some((1.0, now));
        self.credit = 0.0;
        self.route_credit.clear();
        self.low_water.clear();
    }

    pub fn add_route_credit(&mut self, index: u16, amount: f64) {
        match self.route_credit.iter_mut().find(|(i, _)| *i == index) {
            Some((_, c)) => *c += amount,
            None => self.route_credit.push((index, amount)),
        }
    }

    /// The credit a reopened lease gets for a bucket: `1/n` of what it
    /// holds by `now` (all of it for a lease never given back), at least
    /// one token while it holds one ([`share_of`]).
    pub fn opening_share(&self, rule: &RateRule, n: f64, now: f64) -> f64 {
        let held = match self.dormant {
            None => rule.tokens,
            Some((fill, at)) => {
                let refilled =
                    fill * rule.tokens + (now - at).max(0.0) / 1000.0 * rule.refill_per_second;
                refilled.clamp(0.0, rule.tokens)
            }
        };
        share_of(held, n)
    }

    pub fn has_credit(&self) -> bool {
        self.credit > 0.0 || self.route_credit.iter().any(|(_, c)| *c > 0.0)
    }
}

/// A node's share of `tokens` among `n` nodes: `1/n` of them, but at
/// least one token while there is one. A share under one token could never
/// be spent (a first request refused while the bucket holds its token), so
/// a node borrows up to one token on credit, charged at its next settle:
/// all nodes together open at most `max(tokens, n)` (the README's slack).
pub fn share_of(tokens: f64, n: f64) -> f64 {
    (tokens / n).max(tokens.min(1.0))
}

/// What limits ask of cluster mode on each admission (the cluster's
/// `Shared` answers; nothing here waits on Redis).
pub trait Ledger: std::fmt::Debug + Send + Sync {
    /// How limits run right now.
    fn mode(&self) -> Mode;
    /// How often leases are settled: a refusal while Redis is down says to
    /// retry after it.
    fn sync_interval(&self) -> Duration;
    fn redis_up(&self) -> bool;
    /// The divisor of a share: nodes last seen alive (at least 1).
    fn nodes_alive(&self) -> f64;
    /// The tenant's live admissions on the other nodes, as last read.
    fn others_active(&self, tenant: &str) -> u64;
    /// Queues a tenant for the next settle (callers track `queued`).
    fn enqueue(&self, tenant: &str);
}
