//! When a failed attempt may be tried again: a method listed in
//! `retry.methods`, attempts left, a body that can be replayed — and, once
//! any byte went to the shard, an idempotent method (a POST is never sent
//! twice). Retries also draw on a budget, Envoy-style, so that a fleet-wide
//! outage does not multiply the load: retries in flight stay under
//! `budget_percent` of requests in flight, with a floor of
//! `budget_min_per_second` retries per second.

use crate::config::RetryConfig;
use crate::counters::{Gauge, GaugeTicket};
use http::Method;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub struct RetryPolicy {
    config: RetryConfig,
    /// Requests in flight that are on a retry.
    retries: Gauge,
    /// `(second, retries started in it)`, packed: second in the high half.
    window: AtomicU64,
    epoch: Instant,
}

/// Why a retry was not allowed (or `Allowed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryVerdict {
    Allowed,
    MethodNotRetried,
    AttemptsUsed,
    /// Bytes went out and the method is not idempotent, or the body is too
    /// large to replay.
    NotReplayable,
    BudgetExhausted,
}

impl RetryPolicy {
    pub fn new(config: RetryConfig) -> Self {
        RetryPolicy {
            config,
            retries: Gauge::new(),
            window: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    pub fn attempts(&self) -> u32 {
        self.config.attempts
    }

    /// Whether the attempt that just failed may be followed by another.
    /// `sent` = some of the request already went to the shard;
    /// `body_replayable` = Pingora still holds the whole body.
    pub fn check(
        &self,
        method: &Method,
        attempts_made: u32,
        sent: bool,
        body_replayable: bool,
    ) -> RetryVerdict {
        if !self.config.methods.contains(method) {
            return RetryVerdict::MethodNotRetried;
        }
        if attempts_made >= self.config.attempts {
            return RetryVerdict::AttemptsUsed;
        }
        if !body_replayable || (sent && !method.is_idempotent()) {
            return RetryVerdict::NotReplayable;
        }
        RetryVerdict::Allowed
    }

    /// Takes a place in the retry budget, given the requests in flight now;
    /// the ticket counts the retry in flight until it drops. `None` when the
    /// budget is spent.
    pub fn admit_retry(&self, requests_in_flight: u64) -> Option<GaugeTicket> {
        let in_flight = requests_in_flight.max(1) as f64;
        let allowed_by_share =
            (self.retries.get() as f64) < in_flight * self.config.budget_percent / 100.0;
        if allowed_by_share || self.take_from_floor() {
            Some(self.retries.ticket())
        } else {
            None
        }
    }

    /// One of this second's `budget_min_per_second` retries, if any is left.
    fn take_from_floor(&self) -> bool {
        let floor = u64::from(self.config.budget_min_per_second);
        if floor == 0 {
            return false;
        }
        let second = self.epoch.elapsed().as_secs();
        let mut current = self.window.load(Ordering::Relaxed);
        loop {
            let (s, n) = (current >> 32, current & 0xffff_ffff);
            let next = if s == second {
                if n >= floor {
                    return false;
                }
                (s << 32) | (n + 1)
            } else {
                (second << 32) | 1
            };
            match self.window.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(percent: f64, floor: u32) -> RetryPolicy {
        RetryPolicy::new(RetryConfig {
            attempts: 3,
            methods: vec![Method::GET, Method::POST],
            budget_percent: percent,
            budget_min_per_second: floor,
        })
    }

    #[test]
    fn a_post_is_never_replayed_once_sent() {
        let p = policy(20.0, 10);
        assert_eq!(
            p.check(&Method::POST, 1, false, true),
            RetryVerdict::Allowed
        );
        assert_eq!(
            p.check(&Method::POST, 1, true, true),
            RetryVerdict::NotReplayable
        );
        assert_eq!(p.check(&Method::GET, 1, true, true), RetryVerdict::Allowed);
        assert_eq!(
            p.check(&Method::GET, 1, true, false),
            RetryVerdict::NotReplayable
        );
        assert_eq!(
            p.check(&Method::GET, 3, false, true),
            RetryVerdict::AttemptsUsed
        );
        assert_eq!(
            p.check(&Method::PUT, 1, false, true),
            RetryVerdict::MethodNotRetried
        );
    }

    #[test]
    fn budget_is_a_share_of_requests_in_flight_with_a_floor() {
        let p = policy(20.0, 2);
        // 20 % of 10 in flight = 2 by share, then 2 more from this
        // second's floor.
        let retries: Vec<_> = (0..4)
            .map(|_| p.admit_retry(10).expect("within budget"))
            .collect();
        assert!(p.admit_retry(10).is_none());
        drop(retries);
        assert!(p.admit_retry(10).is_some());
    }
}
