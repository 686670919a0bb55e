//! Laws that hold for every input: stickiness, minimal movement, caps, and
//! the token arithmetic against a direct model of the reference.

use proptest::prelude::*;
use shardgate::limits::{Limits, RateRule};
use shardgate::routing::{
    Decision, HashStrategy, ManualClock, RouteRequest, Router, RouterOptions, Shard,
};
use std::sync::Arc;

fn shards(n: usize) -> Vec<Shard> {
    (0..n)
        .map(|i| Shard::new(format!("s{i}"), "http://h:1").with_weight(1.0 + (i % 3) as f64))
        .collect()
}

fn pick(r: &Router, tenant: &str) -> String {
    r.route(&RouteRequest::new(tenant))
        .shard_id()
        .unwrap()
        .to_string()
}

fn strategies() -> [HashStrategy; 3] {
    [
        HashStrategy::Jump,
        HashStrategy::Rendezvous,
        HashStrategy::Hrw,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn sticky_routing_is_stable(tenant in "\\PC{0,24}", n in 1usize..20) {
        for hash in strategies() {
            let r = Router::new(RouterOptions { shards: shards(n), hash, ..Default::default() });
            let first = pick(&r, &tenant);
            for _ in 0..3 {
                prop_assert_eq!(pick(&r, &tenant), first.clone());
            }
        }
    }

    #[test]
    fn adding_a_shard_moves_tenants_only_onto_it(n in 1usize..16, tenants in prop::collection::vec("[a-z0-9-]{1,12}", 1..60)) {
        for hash in [HashStrategy::Jump, HashStrategy::Hrw] {
            let before = Router::new(RouterOptions { shards: shards(n), hash: hash.clone(), ..Default::default() });
            let after = Router::new(RouterOptions { shards: shards(n + 1), hash, ..Default::default() });
            let new_id = format!("s{n}");
            for t in &tenants {
                let (b, a) = (pick(&before, t), pick(&after, t));
                prop_assert!(a == b || a == new_id, "{} moved {} -> {}", t, b, a);
            }
        }
    }

    #[test]
    fn health_flap_restores_the_original_mapping(n in 2usize..12, down in 0usize..12, tenants in prop::collection::vec("[a-z]{1,8}", 1..40)) {
        let down = format!("s{}", down % n);
        for hash in strategies() {
            let r = Router::new(RouterOptions { shards: shards(n), hash, ..Default::default() });
            let before: Vec<String> = tenants.iter().map(|t| pick(&r, t)).collect();
            r.mark_unhealthy(&down);
            for t in &tenants {
                prop_assert_ne!(pick(&r, t), down.clone());
            }
            r.mark_healthy(&down);
            let after: Vec<String> = tenants.iter().map(|t| pick(&r, t)).collect();
            prop_assert_eq!(before, after);
        }
    }

    #[test]
    fn admissions_never_exceed_the_cap(cap in 0u64..5, ops in prop::collection::vec(any::<bool>(), 1..200)) {
        let r = Router::new(RouterOptions {
            shards: shards(3),
            limits: Limits::new(Some(cap), RateRule::UNLIMITED, []),
            ..Default::default()
        });
        let mut held = Vec::new();
        for admit in ops {
            if admit {
                let res = r.admit(&RouteRequest::new("t"));
                let expect = if (held.len() as u64) < cap { Decision::Allow } else { Decision::Capped };
                prop_assert_eq!(res.decision, expect);
                if let Some(g) = res.admission { held.push(g); }
            } else {
                held.pop();
            }
            prop_assert!(r.tenant_active("t") <= cap);
            prop_assert_eq!(r.tenant_active("t"), held.len() as u64);
        }
    }

    #[test]
    fn token_arithmetic_matches_the_reference_model(
        tokens in 0.0f64..6.0,
        refill in 0.0f64..4.0,
        steps in prop::collection::vec(0.0f64..1500.0, 1..80),
    ) {
        let clock = Arc::new(ManualClock::new(0.0));
        let r = Router::new(RouterOptions {
            shards: shards(1),
            limits: Limits::new(None, RateRule::new(tokens, refill), []),
            clock: clock.clone(),
            ..Default::default()
        });
        // The reference's bucket, written out directly.
        let (mut bal, mut last, mut now) = (tokens, 0.0f64, 0.0f64);
        for dt in steps {
            now += dt;
            clock.set(now);
            if refill > 0.0 && now - last > 0.0 {
                bal = tokens.min(bal + (now - last) / 1000.0 * refill);
                last = now;
            }
            let expect = if bal >= 1.0 { bal -= 1.0; Decision::Allow } else { Decision::RateLimited };
            prop_assert_eq!(r.route(&RouteRequest::new("t")).decision, expect);
        }
    }
}
