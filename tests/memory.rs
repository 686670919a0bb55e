//! Bounded tenant state: tenants that are idle with full buckets are
//! forgotten, which keeps the table bounded under invented tenant ids and
//! changes no decision.

use shardgate::limits::{Limits, RateRule, FORGETTABLE_BOUND};
use shardgate::routing::{Balance, ManualClock, RouteRequest, Router, RouterOptions, Shard};
use std::sync::Arc;

fn shards() -> Vec<Shard> {
    (0..8)
        .map(|i| Shard::new(format!("s{i}"), "http://h:1"))
        .collect()
}

fn limits() -> Limits {
    Limits::new(
        Some(2),
        RateRule::new(3.0, 1000.0),
        [("/api".to_string(), RateRule::new(2.0, 500.0))],
    )
}

#[test]
fn a_million_distinct_tenants_keep_the_table_bounded() {
    let clock = Arc::new(ManualClock::new(0.0));
    let router = Router::new(RouterOptions {
        shards: shards(),
        limits: limits(),
        clock: clock.clone(),
        ..Default::default()
    });
    let mut peak = 0;
    for i in 0..1_000_000u32 {
        let tenant = format!("x{i:x}");
        let r = router.route(&RouteRequest::new(&tenant).route("/api"));
        assert!(r.is_allowed());
        clock.advance(0.01); // buckets refill in a few ms
        if i % 50_000 == 0 {
            peak = peak.max(router.tenant_count());
        }
    }
    peak = peak.max(router.tenant_count());
    eprintln!("peak tenant table: {peak} entries after 1 000 000 tenants");
    // The documented bound: 64 table shards × 256 entries, plus twice the
    // tenants that still carry state (here: those routed in the last few
    // milliseconds).
    assert!(
        peak <= FORGETTABLE_BOUND + 2 * 1_000,
        "tenant table grew to {peak} (bound {FORGETTABLE_BOUND})"
    );
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn forgetting_changes_no_decision() {
    for balance in [Balance::Sticky, Balance::LeastConnections] {
        let clock = Arc::new(ManualClock::new(0.0));
        let make = |forget: bool| {
            Router::new(RouterOptions {
                shards: shards(),
                limits: limits(),
                balance,
                clock: clock.clone(),
                forget_idle_tenants: forget,
                ..Default::default()
            })
        };
        let forgetful = make(true);
        let faithful = make(false);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut held = Vec::new();
        for step in 0..120_000u32 {
            // Mostly fresh tenants (to trigger sweeps), some hot ones that
            // run dry, some held connections.
            let tenant = match rng.below(10) {
                0..=5 => format!("fresh-{step}"),
                6..=8 => format!("hot-{}", rng.below(50)),
                _ => format!("warm-{}", rng.below(5_000)),
            };
            let route = (rng.below(3) == 0).then_some("/api");
            let mut req = RouteRequest::new(&tenant);
            req.route = route;
            let a = forgetful.admit(&req);
            let b = faithful.admit(&req);
            assert_eq!(a.decision, b.decision, "step {step} tenant {tenant}");
            assert_eq!(a.shard_id(), b.shard_id(), "step {step} tenant {tenant}");
            assert_eq!(a.bucket, b.bucket, "step {step}");
            assert_eq!(a.retry_after_secs, b.retry_after_secs, "step {step}");
            if rng.below(4) == 0 {
                held.push((a.admission, b.admission));
            }
            if !held.is_empty() && rng.below(3) == 0 {
                let i = rng.below(held.len() as u64) as usize;
                held.swap_remove(i);
            }
            clock.advance(rng.below(3) as f64 * 0.5);
        }
        assert!(
            forgetful.tenant_count() < faithful.tenant_count() / 2,
            "the test must actually forget ({} vs {})",
            forgetful.tenant_count(),
            faithful.tenant_count()
        );
    }
}
