//! Token buckets with the reference's arithmetic: capacity = starting
//! balance, lazy continuous refill computed at the moment of the check,
//! fractional balances, and a clock that goes backwards refills nothing.

use serde::{Deserialize, Serialize};

/// A rate limit: `tokens` is both the capacity and the starting balance.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateRule {
    pub tokens: f64,
    pub refill_per_second: f64,
}

impl RateRule {
    /// Infinite tokens: never rejects, and stays so through snapshots.
    pub const UNLIMITED: RateRule = RateRule {
        tokens: f64::INFINITY,
        refill_per_second: 0.0,
    };

    pub fn new(tokens: f64, refill_per_second: f64) -> Self {
        RateRule {
            tokens,
            refill_per_second,
        }
    }

    pub fn is_unlimited(&self) -> bool {
        self.tokens == f64::INFINITY
    }
}

/// A balance and the moment it was last refilled (clock milliseconds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenBucket {
    pub tokens: f64,
    pub last_refill_at: f64,
}

impl TokenBucket {
    /// A bucket as a new tenant gets it: full.
    pub fn full(rule: &RateRule, now: f64) -> Self {
        TokenBucket {
            tokens: rule.tokens,
            last_refill_at: now,
        }
    }

    /// A bucket read back from a snapshot: never more than the current
    /// capacity (a restart must not hand out more than the rule allows), and
    /// an unlimited rule stays unlimited whatever the snapshot held. A
    /// refill time after `now` (the wall clock stepped back between save
    /// and start, or a restore's odd `written_at_ms`) is read as `now`:
    /// kept, it would stop the bucket refilling for as long as the step.
    pub fn restored(rule: &RateRule, tokens: f64, last_refill_at: f64, now: f64) -> Self {
        let tokens = if rule.is_unlimited() {
            f64::INFINITY
        } else if tokens.is_nan() {
            0.0
        } else {
            tokens.min(rule.tokens)
        };
        TokenBucket {
            tokens,
            last_refill_at: last_refill_at.min(now),
        }
    }

    /// Balance after refilling up to `now`, without storing it.
    #[inline]
    pub fn peek(&self, rule: &RateRule, now: f64) -> f64 {
        let mut b = *self;
        b.refill(rule, now);
        b.tokens
    }

    /// Lazy continuous refill. A rule that never refills, or a clock that did
    /// not move forward, leaves the bucket (and its timestamp) untouched.
    #[inline]
    pub fn refill(&mut self, rule: &RateRule, now: f64) {
        if rule.refill_per_second <= 0.0 {
            return;
        }
        let elapsed = now - self.last_refill_at;
        if elapsed > 0.0 {
            self.tokens = rule
                .tokens
                .min(self.tokens + elapsed / 1000.0 * rule.refill_per_second);
            self.last_refill_at = now;
        }
    }

    /// Whether one token is available (after a refill).
    #[inline]
    pub fn has_token(&self) -> bool {
        self.tokens >= 1.0
    }

    /// Spends one token; callers check [`TokenBucket::has_token`] first.
    #[inline]
    pub fn take(&mut self) {
        self.tokens -= 1.0;
    }

    /// Refill, then take a token if one is there.
    pub fn try_take(&mut self, rule: &RateRule, now: f64) -> bool {
        self.refill(rule, now);
        if self.has_token() {
            self.take();
            true
        } else {
            false
        }
    }

    /// Full at `now` = indistinguishable from a bucket created at `now`.
    #[inline]
    pub fn is_full_at(&self, rule: &RateRule, now: f64) -> bool {
        self.peek(rule, now) >= rule.tokens
    }

    /// Seconds until the bucket holds one token, or `None` when it never
    /// will (no refill, or a capacity below one token).
    pub fn seconds_until_token(&self, rule: &RateRule) -> Option<f64> {
        if self.tokens >= 1.0 {
            return Some(0.0);
        }
        if rule.refill_per_second <= 0.0 || rule.tokens < 1.0 {
            return None;
        }
        Some((1.0 - self.tokens) / rule.refill_per_second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractional_balances_persist_as_in_the_reference() {
        // capacity 2, refill 0.5/s: allow, allow, reject at t=0; reject at
        // t=1000 (0.5); allow at t=2000 (1.0 → 0); reject at t=3500 (0.75).
        let rule = RateRule::new(2.0, 0.5);
        let mut b = TokenBucket::full(&rule, 0.0);
        assert!(b.try_take(&rule, 0.0));
        assert!(b.try_take(&rule, 0.0));
        assert!(!b.try_take(&rule, 0.0));
        assert!(!b.try_take(&rule, 1000.0));
        assert_eq!(b.tokens, 0.5);
        assert!(b.try_take(&rule, 2000.0));
        assert_eq!(b.tokens, 0.0);
        assert!(!b.try_take(&rule, 3500.0));
        assert_eq!(b.tokens, 0.75);
        assert_eq!(b.last_refill_at, 3500.0);
    }

    #[test]
    fn backwards_clock_refills_nothing_and_keeps_the_stamp() {
        let rule = RateRule::new(5.0, 10.0);
        let mut b = TokenBucket {
            tokens: 1.0,
            last_refill_at: 10_000.0,
        };
        b.refill(&rule, 5_000.0);
        assert_eq!(b.tokens, 1.0);
        assert_eq!(b.last_refill_at, 10_000.0);
    }

    #[test]
    fn no_refill_never_restamps() {
        let rule = RateRule::new(3.0, 0.0);
        let mut b = TokenBucket::full(&rule, 7.0);
        assert!(b.try_take(&rule, 100.0));
        assert_eq!(b.last_refill_at, 7.0);
    }

    #[test]
    fn refill_is_capped_at_capacity() {
        let rule = RateRule::new(3.0, 100.0);
        let mut b = TokenBucket {
            tokens: 0.0,
            last_refill_at: 0.0,
        };
        b.refill(&rule, 1_000_000.0);
        assert_eq!(b.tokens, 3.0);
    }

    #[test]
    fn unlimited_never_runs_out() {
        let rule = RateRule::UNLIMITED;
        let mut b = TokenBucket::full(&rule, 0.0);
        for _ in 0..1000 {
            assert!(b.try_take(&rule, 0.0));
        }
        assert!(b.tokens.is_infinite());
    }

    #[test]
    fn zero_capacity_rejects_every_call() {
        let rule = RateRule::new(0.0, 5.0);
        let mut b = TokenBucket::full(&rule, 0.0);
        assert!(!b.try_take(&rule, 10_000.0));
        assert_eq!(b.seconds_until_token(&rule), None);
    }

    #[test]
    fn restored_buckets_never_exceed_the_rule() {
        let rule = RateRule::new(10.0, 1.0);
        assert_eq!(TokenBucket::restored(&rule, 50.0, 0.0, 0.0).tokens, 10.0);
        assert_eq!(
            TokenBucket::restored(&rule, f64::INFINITY, 0.0, 0.0).tokens,
            10.0
        );
        assert_eq!(TokenBucket::restored(&rule, 3.5, 0.0, 0.0).tokens, 3.5);
        let unlimited = RateRule::UNLIMITED;
        assert!(TokenBucket::restored(&unlimited, 2.0, 0.0, 0.0)
            .tokens
            .is_infinite());
    }

    #[test]
    fn a_restored_refill_time_in_the_future_is_read_as_now() {
        // Saved at t = 1 000 000 ms; the clock stepped back to 1 000 ms.
        let rule = RateRule::new(10.0, 1.0);
        let mut b = TokenBucket::restored(&rule, 0.0, 1_000_000.0, 1_000.0);
        assert!(
            b.try_take(&rule, 2_000.0),
            "a second after the start, one token"
        );
    }

    #[test]
    fn seconds_until_token_counts_the_deficit() {
        let rule = RateRule::new(5.0, 2.0);
        let b = TokenBucket {
            tokens: 0.25,
            last_refill_at: 0.0,
        };
        assert_eq!(b.seconds_until_token(&rule), Some(0.375));
    }
}
