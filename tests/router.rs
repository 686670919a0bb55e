//! The rules of DESIGN §1 and REFERENCE.md, one test per rule, driven
//! through the public API with a hand-driven clock.

use shardgate::limits::{Limits, RateRule};
use shardgate::routing::{
    Balance, Decision, HashStrategy, ManualClock, RouteRequest, Router, RouterOptions,
    RouterSnapshot, Shard, ShardId,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn shards(n: usize) -> Vec<Shard> {
    (0..n)
        .map(|i| Shard::new(format!("s{i}"), format!("http://127.0.0.1:{}", 3000 + i)))
        .collect()
}

struct Fixture {
    clock: Arc<ManualClock>,
    router: Router,
}

fn router_with(
    shards: Vec<Shard>,
    limits: Limits,
    tweak: impl FnOnce(&mut RouterOptions),
) -> Fixture {
    let clock = Arc::new(ManualClock::new(1_000.0));
    let mut options = RouterOptions {
        shards,
        limits,
        clock: clock.clone(),
        ..Default::default()
    };
    tweak(&mut options);
    Fixture {
        clock,
        router: Router::new(options),
    }
}

fn plain(n: usize) -> Fixture {
    router_with(shards(n), Limits::default(), |_| {})
}

fn decide(r: &Router, req: RouteRequest<'_>) -> (Decision, Option<String>) {
    let res = r.route(&req);
    (res.decision, res.shard_id().map(|s| s.to_string()))
}

#[test]
fn disposed_router_answers_no_shards_and_still_counts() {
    let f = plain(3);
    f.router.dispose();
    assert_eq!(
        decide(&f.router, RouteRequest::new("acme")).0,
        Decision::NoShards
    );
    assert!(f.router.add_shard(Shard::new("late", "http://h:1")));
    assert_eq!(
        decide(&f.router, RouteRequest::new("acme")).0,
        Decision::NoShards
    );
    let m = f.router.metrics();
    assert_eq!(m.routes, 2);
    assert_eq!(m.rejects_by_decision["no-shards"], 2);
    // acquire still works after dispose.
    assert_eq!(f.router.acquire("acme", None).tenant_active(), 1);
}

#[test]
fn no_live_shards_is_no_shards_even_for_a_denied_tenant() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let f = router_with(shards(2), Limits::default(), |o| {
        o.allow = Some(Arc::new(move |_t: &str| {
            seen.fetch_add(1, Ordering::SeqCst);
            false
        }));
    });
    f.router.mark_unhealthy("s0");
    f.router.drain("s1");
    assert_eq!(
        decide(&f.router, RouteRequest::new("x")).0,
        Decision::NoShards
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "allow hook not called when 1–5 reject"
    );
    f.router.mark_healthy("s1");
    assert_eq!(
        decide(&f.router, RouteRequest::new("x")).0,
        Decision::Denied
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn dedicated_shards_and_empty_allowlists() {
    let f = router_with(
        vec![
            Shard::new("vip", "http://h:1").with_tenants(["acme"]),
            Shard::new("nobody", "http://h:2").with_tenants(Vec::<String>::new()),
        ],
        Limits::default(),
        |_| {},
    );
    assert_eq!(
        decide(&f.router, RouteRequest::new("acme")),
        (Decision::Allow, Some("vip".into()))
    );
    assert_eq!(
        decide(&f.router, RouteRequest::new("beta")).0,
        Decision::NoTenantShards
    );
}

#[test]
fn region_filter_keeps_the_region_and_region_agnostic_shards() {
    let f = router_with(
        vec![
            Shard::new("us", "http://h:1").with_region("us-east"),
            Shard::new("eu", "http://h:2").with_region("eu-west"),
        ],
        Limits::default(),
        |_| {},
    );
    assert_eq!(
        decide(&f.router, RouteRequest::new("t").region("eu-west")),
        (Decision::Allow, Some("eu".into()))
    );
    assert_eq!(
        decide(&f.router, RouteRequest::new("t").region("ap-south")).0,
        Decision::NoRegionShards
    );
    // An empty region is a region.
    assert_eq!(
        decide(&f.router, RouteRequest::new("t").region("")).0,
        Decision::NoRegionShards
    );
    f.router.add_shard(Shard::new("any", "http://h:3"));
    assert_eq!(
        decide(&f.router, RouteRequest::new("t").region("ap-south")),
        (Decision::Allow, Some("any".into()))
    );
}

#[test]
fn exclusions_remove_shards_and_an_empty_rest_is_no_shards() {
    let f = plain(2);
    let (_, first) = decide(&f.router, RouteRequest::new("acme"));
    let first = first.unwrap();
    let failed = [ShardId::new(&first)];
    let (d, second) = decide(&f.router, RouteRequest::new("acme").exclude(&failed));
    assert_eq!(d, Decision::Allow);
    assert_ne!(second.unwrap(), first);
    let all = [ShardId::new("s0"), ShardId::new("s1")];
    assert_eq!(
        decide(&f.router, RouteRequest::new("acme").exclude(&all)).0,
        Decision::NoShards
    );
}

#[test]
fn cap_rejects_and_keeps_tokens() {
    let f = router_with(
        shards(1),
        Limits::new(Some(1), RateRule::new(3.0, 0.0), []),
        |_| {},
    );
    let guard = f.router.acquire("acme", Some("s0"));
    assert_eq!(
        decide(&f.router, RouteRequest::new("acme")).0,
        Decision::Capped
    );
    drop(guard);
    // Capped spent nothing: three allows remain.
    for _ in 0..3 {
        assert_eq!(
            decide(&f.router, RouteRequest::new("acme")).0,
            Decision::Allow
        );
    }
    assert_eq!(
        decide(&f.router, RouteRequest::new("acme")).0,
        Decision::RateLimited
    );
}

#[test]
fn tenant_bucket_refills_continuously_and_reports_retry_after() {
    let f = router_with(
        shards(1),
        Limits::new(None, RateRule::new(2.0, 0.5), []),
        |_| {},
    );
    let r = &f.router;
    assert_eq!(decide(r, RouteRequest::new("a")).0, Decision::Allow);
    assert_eq!(decide(r, RouteRequest::new("a")).0, Decision::Allow);
    let res = r.route(&RouteRequest::new("a"));
    assert_eq!(res.decision, Decision::RateLimited);
    assert_eq!(res.bucket.map(|b| b.to_string()), Some("tenant".into()));
    assert_eq!(res.retry_after_secs, Some(2.0));
    drop(res);
    f.clock.advance(1_000.0); // 0.5 tokens
    let res = r.route(&RouteRequest::new("a"));
    assert_eq!(res.decision, Decision::RateLimited);
    assert_eq!(res.retry_after_secs, Some(1.0));
    drop(res);
    f.clock.advance(1_000.0); // 1.0
    assert_eq!(decide(r, RouteRequest::new("a")).0, Decision::Allow);
}

#[test]
fn a_failed_route_bucket_costs_the_tenant_nothing() {
    let limits = Limits::new(
        None,
        RateRule::new(3.0, 0.0),
        [("/api/export".to_string(), RateRule::new(1.0, 0.0))],
    );
    let f = router_with(shards(1), limits, |_| {});
    let r = &f.router;
    let export = || RouteRequest::new("a").route("/api/export");
    assert_eq!(decide(r, export()).0, Decision::Allow); // tenant 2, route 0
    let res = r.route(&export());
    assert_eq!(res.decision, Decision::RateLimited);
    assert_eq!(
        res.bucket.map(|b| b.to_string()),
        Some("/api/export".into())
    );
    assert_eq!(
        res.retry_after_secs, None,
        "a bucket that never refills has no Retry-After"
    );
    drop(res);
    // The tenant still has its 2 tokens.
    assert_eq!(decide(r, RouteRequest::new("a")).0, Decision::Allow);
    assert_eq!(decide(r, RouteRequest::new("a")).0, Decision::Allow);
    assert_eq!(decide(r, RouteRequest::new("a")).0, Decision::RateLimited);
    // Unknown route names are unlimited (the tenant bucket still applies).
    assert_eq!(
        r.route(&RouteRequest::new("b").route("/other")).decision,
        Decision::Allow
    );
}

#[test]
fn a_tenant_bucket_rejection_never_creates_the_route_bucket() {
    let limits = Limits::new(
        None,
        RateRule::new(0.0, 0.0),
        [("/r".to_string(), RateRule::new(1.0, 0.0))],
    );
    let f = router_with(shards(1), limits, |_| {});
    assert_eq!(
        decide(&f.router, RouteRequest::new("a").route("/r")).0,
        Decision::RateLimited
    );
    let snap = f.router.snapshot();
    assert_eq!(snap.tenants.len(), 1, "rate-limited creates tenant state");
    assert!(snap.route_buckets.is_empty());
}

#[test]
fn a_clock_going_backwards_refills_nothing() {
    let f = router_with(
        shards(1),
        Limits::new(None, RateRule::new(1.0, 1.0), []),
        |_| {},
    );
    assert_eq!(decide(&f.router, RouteRequest::new("a")).0, Decision::Allow);
    f.clock.set(0.0);
    assert_eq!(
        decide(&f.router, RouteRequest::new("a")).0,
        Decision::RateLimited
    );
    f.clock.set(999.0);
    assert_eq!(
        decide(&f.router, RouteRequest::new("a")).0,
        Decision::RateLimited
    );
    f.clock.set(2_000.0);
    assert_eq!(decide(&f.router, RouteRequest::new("a")).0, Decision::Allow);
}

#[test]
fn unlimited_stays_unlimited_through_a_json_snapshot() {
    let f = plain(1);
    for _ in 0..5 {
        decide(&f.router, RouteRequest::new("a"));
    }
    let json = serde_json::to_string(&f.router.snapshot()).unwrap();
    assert!(json.contains("\"Infinity\""), "{json}");
    let snap: RouterSnapshot = serde_json::from_str(&json).unwrap();
    let g = plain(1);
    g.router.restore(&snap, true);
    for _ in 0..100 {
        assert_eq!(decide(&g.router, RouteRequest::new("a")).0, Decision::Allow);
    }
    // A reference snapshot wrote ∞ as null: it reads back unlimited.
    let reference = json.replace("\"Infinity\"", "null");
    let snap: RouterSnapshot = serde_json::from_str(&reference).unwrap();
    g.router.restore(&snap, true);
    assert_eq!(decide(&g.router, RouteRequest::new("a")).0, Decision::Allow);
}

#[test]
fn snapshot_restore_keeps_balances_health_and_optionally_connections() {
    let limits = Limits::new(
        Some(5),
        RateRule::new(4.0, 0.0),
        [("/x".to_string(), RateRule::new(2.0, 0.0))],
    );
    let f = router_with(shards(3), limits.clone(), |_| {});
    decide(&f.router, RouteRequest::new("a").route("/x"));
    decide(&f.router, RouteRequest::new("a"));
    let held = f.router.admit(&RouteRequest::new("b"));
    f.router.drain("s1");
    f.router.mark_unhealthy("s2");
    let snap = f.router.snapshot();
    assert_eq!(snap.version, 1);

    let g = router_with(shards(3), limits.clone(), |_| {});
    g.router.restore(&snap, false);
    assert_eq!(g.router.tenant_active("b"), 1);
    assert!(g.router.is_draining("s1"));
    assert!(!g.router.is_healthy("s2"));
    // a: tenant 2 left, route 1 left.
    assert_eq!(
        decide(&g.router, RouteRequest::new("a").route("/x")).0,
        Decision::Allow
    );
    assert_eq!(
        decide(&g.router, RouteRequest::new("a").route("/x")).0,
        Decision::RateLimited
    );
    assert_eq!(decide(&g.router, RouteRequest::new("a")).0, Decision::Allow);
    assert_eq!(
        decide(&g.router, RouteRequest::new("a")).0,
        Decision::RateLimited
    );

    let h = router_with(shards(3), limits, |_| {});
    h.router.restore(&snap, true);
    assert_eq!(h.router.tenant_active("b"), 0, "reset_connections");
    assert!(h.router.metrics().shard_active_connections.is_empty());
    drop(held);
    assert_eq!(f.router.tenant_active("b"), 0);
}

#[test]
fn restore_reset_detaches_guards_taken_before() {
    let f = router_with(
        shards(1),
        Limits::new(Some(1), RateRule::UNLIMITED, []),
        |_| {},
    );
    let old = f.router.admit(&RouteRequest::new("a"));
    assert!(old.is_allowed());
    let snap = f.router.snapshot();
    f.router.restore(&snap, true);
    let new = f.router.admit(&RouteRequest::new("a"));
    assert!(new.is_allowed());
    drop(old); // must not free the new admission's slot
    assert_eq!(f.router.tenant_active("a"), 1);
    assert_eq!(
        f.router.admit(&RouteRequest::new("a")).decision,
        Decision::Capped
    );
}

/// A tenant forgotten while this thread's cache still holds its entry is
/// looked up in the table (it used to spin forever on the dead entry).
#[test]
fn a_forgotten_tenant_is_read_from_the_table_not_a_dead_cached_entry() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let f = router_with(
            shards(1),
            Limits::new(Some(3), RateRule::new(5.0, 0.0), []),
            |_| {},
        );
        let held = f.router.admit(&RouteRequest::new("t"));
        assert!(held.is_allowed());
        let mut snap = f.router.snapshot();
        // Forgotten and put back (a restore), then forgotten for good.
        f.router.restore(&snap, true);
        let after_restore = f.router.tenant_active("t");
        drop(held);
        let explained = f.router.explain(&RouteRequest::new("t")).decision;
        snap.tenants.clear();
        f.router.restore(&snap, true);
        let forgotten = f.router.tenant_active("t");
        let settled = f.router.with_tenant("t", |_, _| ());
        let _ = done.send((after_restore, explained, forgotten, settled));
    });
    let (after_restore, explained, forgotten, settled) = finished
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("returns (does not spin on a dead cached entry)");
    assert_eq!(after_restore, 0, "the restored entry's count");
    assert_eq!(explained, Decision::Allow);
    assert_eq!(forgotten, 0);
    assert_eq!(settled, None);
}

#[test]
fn restore_makes_unknown_ids_known_but_not_routable() {
    let f = plain(1);
    let mut snap = f.router.snapshot();
    snap.shards[0].shard.id = ShardId::new("ghost");
    f.router.restore(&snap, true);
    assert!(f.router.is_healthy("ghost"));
    assert!(f.router.mark_unhealthy("ghost"));
    assert_eq!(f.router.shards().len(), 1);
}

#[test]
fn acquire_guards_release_exactly_once_and_never_below_zero() {
    let f = plain(2);
    let a = f.router.acquire("t", Some("s0"));
    let b = f.router.acquire("t", Some("s0"));
    let c = f.router.acquire("t", None);
    assert_eq!(c.tenant_active(), 3);
    assert_eq!(f.router.metrics().shard_active_connections["s0"], 2);
    drop(a);
    b.release();
    drop(c);
    assert_eq!(f.router.tenant_active("t"), 0);
    let m = f.router.metrics();
    assert_eq!(
        m.shard_active_connections["s0"], 0,
        "zero entries stay listed"
    );
    assert_eq!(m.acquires, 3);
    // Unregistered ids are counted too.
    let g = f.router.acquire("t", Some("elsewhere"));
    assert_eq!(f.router.metrics().shard_active_connections["elsewhere"], 1);
    drop(g);
    // A removed shard forgets its counter; its late release is harmless.
    let late = f.router.acquire("t", Some("s1"));
    f.router.remove_shard("s1");
    drop(late);
    assert!(!f
        .router
        .metrics()
        .shard_active_connections
        .contains_key("s1"));
}

#[test]
fn membership_add_is_a_no_op_for_existing_ids_and_health_rules_hold() {
    let f = plain(2);
    assert!(!f.router.add_shard(Shard::new("s0", "http://changed:9")));
    assert_eq!(f.router.shards()[0].0.url, "http://127.0.0.1:3000");
    assert!(f.router.drain("s0"));
    assert!(f.router.mark_unhealthy("s0"));
    assert!(f.router.is_draining("s0"), "mark_unhealthy leaves draining");
    assert!(f.router.mark_healthy("s0"));
    assert!(!f.router.is_draining("s0"), "mark_healthy cancels draining");
    assert!(!f.router.mark_healthy("nope"));
    assert!(!f.router.drain("nope"));
    assert!(f.router.remove_shard("s0"));
    assert!(!f.router.remove_shard("s0"));
    assert!(!f.router.is_healthy("s0"));
    // set_probed_health never cancels draining.
    f.router.drain("s1");
    f.router.set_probed_health("s1", true);
    assert!(f.router.is_draining("s1"));
}

#[test]
fn metrics_start_with_all_six_refusals_and_count_allows_per_shard() {
    let f = plain(2);
    let m = f.router.metrics();
    assert_eq!(m.rejects_by_decision.len(), 6);
    assert!(m.rejects_by_decision.values().all(|&n| n == 0));
    assert!(m.shard_load_distribution.is_empty());
    assert_eq!(m.last_route_ms, 0.0);
    for i in 0..10 {
        decide(&f.router, RouteRequest::new(&format!("t{i}")));
    }
    let m = f.router.metrics();
    assert_eq!(m.routes, 10);
    assert_eq!(m.allows, 10);
    assert_eq!(m.shard_load_distribution.values().sum::<u64>(), 10);
    // Distribution survives removal.
    let before = m.shard_load_distribution.clone();
    f.router.remove_shard("s0");
    assert_eq!(f.router.metrics().shard_load_distribution, before);
}

#[test]
fn explain_consumes_no_token_moves_no_cursor_counts_nothing() {
    let f = router_with(
        shards(3),
        Limits::new(Some(1), RateRule::new(1.0, 0.0), []),
        |o| {
            o.balance = Balance::RoundRobin;
        },
    );
    let r = &f.router;
    for _ in 0..3 {
        let e = r.explain(&RouteRequest::new("a"));
        assert_eq!(e.decision, Decision::Allow);
        assert_eq!(e.shard_id().unwrap().as_str(), "s1");
    }
    assert_eq!(r.metrics().routes, 0);
    assert_eq!(r.tenant_count(), 0, "explain creates no tenant state");
    assert_eq!(
        decide(r, RouteRequest::new("a")),
        (Decision::Allow, Some("s1".into()))
    );
    let e = r.explain(&RouteRequest::new("a"));
    assert_eq!(e.decision, Decision::RateLimited);
    assert_eq!(r.snapshot().tenants[0].tokens.0, 0.0);
}

#[test]
fn custom_strategy_index_is_clamped() {
    let f = router_with(shards(3), Limits::default(), |o| {
        o.hash = HashStrategy::Custom(Arc::new(|key: &str, c: &[&Shard]| {
            assert_eq!(c.len(), 3);
            match key {
                "low" => -7,
                "high" => 99,
                _ => 1,
            }
        }));
    });
    assert_eq!(decide(&f.router, RouteRequest::new("low")).1.unwrap(), "s0");
    assert_eq!(
        decide(&f.router, RouteRequest::new("high")).1.unwrap(),
        "s2"
    );
    assert_eq!(
        decide(&f.router, RouteRequest::new("mid").channel("c"))
            .1
            .unwrap(),
        "s1"
    );
}

#[test]
fn admit_counts_the_admission_on_the_chosen_shard() {
    let f = router_with(
        shards(3),
        Limits::new(Some(2), RateRule::UNLIMITED, []),
        |_| {},
    );
    let a = f.router.admit(&RouteRequest::new("t"));
    let shard = a.shard_id().unwrap().to_string();
    assert!(a.admission.as_ref().unwrap().is_tagged());
    assert_eq!(f.router.metrics().shard_active_connections[&shard], 1);
    let b = f.router.admit(&RouteRequest::new("t"));
    assert!(b.is_allowed());
    let c = f.router.admit(&RouteRequest::new("t"));
    assert_eq!(c.decision, Decision::Capped);
    assert!(c.admission.is_none());
    drop(a);
    assert!(f.router.admit(&RouteRequest::new("t")).is_allowed());
}

#[test]
fn channel_keys_include_the_empty_channel() {
    let f = router_with(shards(3), Limits::default(), |o| {
        o.balance = Balance::RoundRobin
    });
    let r = &f.router;
    // Separate cursors: every key's first pick is s1.
    assert_eq!(decide(r, RouteRequest::new("acme")).1.unwrap(), "s1");
    assert_eq!(
        decide(r, RouteRequest::new("acme").channel("")).1.unwrap(),
        "s1"
    );
    assert_eq!(
        decide(r, RouteRequest::new("acme").channel("x")).1.unwrap(),
        "s1"
    );
    assert_eq!(decide(r, RouteRequest::new("acme")).1.unwrap(), "s2");
}

#[test]
fn hrw_and_rendezvous_never_pick_weight_zero_while_others_can() {
    for hash in [HashStrategy::Rendezvous, HashStrategy::Hrw] {
        let f = router_with(
            vec![
                Shard::new("zero", "http://h:1").with_weight(0.0),
                Shard::new("one", "http://h:2"),
            ],
            Limits::default(),
            |o| o.hash = hash.clone(),
        );
        for i in 0..200 {
            assert_eq!(
                decide(&f.router, RouteRequest::new(&format!("t{i}")))
                    .1
                    .unwrap(),
                "one"
            );
        }
    }
}

#[test]
fn deny_list_edits_take_effect_for_the_next_route() {
    let f = router_with(shards(2), Limits::default(), |o| {
        o.deny = vec!["suspended".into()]
    });
    assert_eq!(
        decide(&f.router, RouteRequest::new("suspended")).0,
        Decision::Denied
    );
    assert!(f.router.deny("acme"));
    assert!(!f.router.deny("acme"));
    assert_eq!(
        decide(&f.router, RouteRequest::new("acme")).0,
        Decision::Denied
    );
    assert!(f.router.undeny("suspended"));
    assert_eq!(
        decide(&f.router, RouteRequest::new("suspended")).0,
        Decision::Allow
    );
    assert_eq!(f.router.denied(), vec!["acme".to_string()]);
    assert_eq!(f.router.metrics().rejects_by_decision["denied"], 2);
}

/// Tenant plans (DESIGN §6): each tenant's bucket follows its plan, the
/// default plan holds for the rest, and a move takes effect on the next
/// request — down, tokens cut to the new capacity; up, tokens kept and
/// the new capacity gained.
#[test]
fn each_tenants_limits_follow_its_plan() {
    let never = |tokens| RateRule::new(tokens, 0.0);
    let f = router_with(shards(2), Limits::new(None, never(1.0), Vec::new()), |o| {
        o.plans = vec![
            ("free".into(), Limits::new(None, never(2.0), Vec::new())),
            ("pro".into(), Limits::new(None, never(5.0), Vec::new())),
            (
                "unlimited".into(),
                Limits::new(None, RateRule::UNLIMITED, Vec::new()),
            ),
        ];
        o.plan_tenants = [("acme".into(), 1)].into_iter().collect();
        o.default_plan = Some(0);
    });
    let admitted = |tenant: &str, n: usize| {
        (0..n)
            .filter(|_| decide(&f.router, RouteRequest::new(tenant)).0 == Decision::Allow)
            .count()
    };
    assert_eq!(admitted("acme", 3), 3, "pro: 5 tokens");
    assert_eq!(admitted("someone", 3), 2, "the default plan: 2 tokens");
    // acme holds 2 of pro's 5: moved to free (2), it keeps 2, spends them.
    f.router.plans().set("acme", 0);
    assert_eq!(admitted("acme", 3), 2);
    // Back on pro, a bucket that never refills stays as it was (0).
    f.router.plans().unset("acme");
    assert_eq!(admitted("acme", 1), 0);
    // A drained tenant moved to a plan without a rate limit is admitted.
    f.router.plans().set("acme", 2);
    assert_eq!(admitted("acme", 3), 3, "unlimited");
    // A tenant moved down has its 5 cut to 2.
    f.router.plans().set("bigco", 1);
    assert_eq!(admitted("bigco", 1), 1, "4 of pro's 5 left");
    f.router.plans().set("bigco", 0);
    assert_eq!(admitted("bigco", 5), 2, "cut to free's 2");
    let _ = &f.clock;
}

/// A route another plan limits on its own stays under this plan's
/// covering prefix: a free tenant cannot leave `/api` through the
/// `/api/export` that only pro names, nor through a path read two ways.
#[test]
fn a_route_only_another_plan_names_is_held_by_the_tenants_own_prefix() {
    let never = |tokens| RateRule::new(tokens, 0.0);
    let union: Vec<String> = vec!["/api".into(), "/api/export".into(), "/internal".into()];
    let own = |routes: &[(&str, f64)]| -> Vec<(String, RateRule)> {
        (routes.iter())
            .map(|(p, t)| (p.to_string(), never(*t)))
            .collect()
    };
    let base = Limits::over_union(None, RateRule::UNLIMITED, &own(&[("/api", 2.0)]), &union);
    let pro = own(&[("/api/export", 3.0), ("/internal", 1.0)]);
    let f = router_with(shards(2), base, |o| {
        o.plans = vec![(
            "pro".into(),
            Limits::over_union(None, RateRule::UNLIMITED, &pro, &union),
        )];
        o.plan_tenants = [("acme".into(), 0)].into_iter().collect();
    });
    let admitted = |tenant: &str, route: &str, also: Option<&str>, n: usize| {
        (0..n)
            .filter(|_| {
                let mut request = RouteRequest::new(tenant).route(route);
                request.route_also = also;
                decide(&f.router, request).0 == Decision::Allow
            })
            .count()
    };
    // No plan: `/api/export` spends `/api`'s two tokens.
    assert_eq!(admitted("free", "/api/export", None, 1), 1);
    assert_eq!(admitted("free", "/api", None, 3), 1, "one bucket for both");
    // `/internal/../api/x`: the longest is pro's `/internal`, the other
    // reading `/api`, which this tenant is held to (drained).
    assert_eq!(admitted("free", "/internal", Some("/api"), 1), 0);
    assert_eq!(admitted("other", "/internal", Some("/api"), 3), 2);
    // Pro: `/api/export` has its own three, `/api` is unlimited.
    assert_eq!(admitted("acme", "/api/export", None, 4), 3);
    assert_eq!(admitted("acme", "/api", None, 4), 4);
    assert_eq!(admitted("acme", "/internal", Some("/api"), 2), 1);
}
