//! Per-client limits (DESIGN §10): each client address has its own bucket
//! within its tenant, so one client cannot spend the tenant's allowance.
//! The router's rules with a hand-driven clock, then the gateway with
//! clients a balancer names in PROXY headers.

mod common;

use common::*;
use shardgate::limits::{Bucket, Limits, RateRule};
use shardgate::routing::{Decision, ManualClock, RouteRequest, Router, RouterOptions, Shard};
use std::net::IpAddr;
use std::sync::Arc;

fn router(limits: Limits) -> (Arc<ManualClock>, Router) {
    let clock = Arc::new(ManualClock::new(1_000.0));
    let router = Router::new(RouterOptions {
        shards: vec![Shard::new("s0", "http://127.0.0.1:3000")],
        limits,
        clock: clock.clone(),
        ..Default::default()
    });
    (clock, router)
}

/// Tenant bucket 10 tokens, each client's 3; neither refills.
fn ten_and_three() -> (Arc<ManualClock>, Router) {
    let limits = Limits::new(None, RateRule::new(10.0, 0.0), Vec::new())
        .with_per_client(RateRule::new(3.0, 0.0));
    router(limits)
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an address")
}

fn from(r: &Router, client: &str) -> (Decision, Option<String>) {
    let res = r.route(&RouteRequest::new("acme").client(ip(client)));
    (res.decision, res.bucket.map(|b| b.name().to_string()))
}

const ALLOW: (Decision, Option<String>) = (Decision::Allow, None);

fn limited(bucket: &str) -> (Decision, Option<String>) {
    (Decision::RateLimited, Some(bucket.to_string()))
}

#[test]
fn one_client_cannot_spend_its_tenants_allowance() {
    let (_, r) = ten_and_three();
    for _ in 0..3 {
        assert_eq!(from(&r, "192.0.2.1"), ALLOW);
    }
    for _ in 0..5 {
        assert_eq!(from(&r, "192.0.2.1"), limited("client"));
    }
    // Its refusals spent none of the tenant's seven tokens left.
    for client in [
        "192.0.2.2",
        "192.0.2.2",
        "192.0.2.3",
        "192.0.2.3",
        "192.0.2.4",
    ] {
        assert_eq!(from(&r, client), ALLOW);
    }
    assert_eq!(from(&r, "192.0.2.5"), ALLOW);
    assert_eq!(from(&r, "192.0.2.5"), ALLOW);
    // The tenant's bucket is empty now: its refusal names the tenant, and
    // spends no client's token (192.0.2.6 still has all three).
    assert_eq!(from(&r, "192.0.2.6"), limited("tenant"));
    let m = r.rate_limited_counts();
    assert_eq!(m, [("tenant", 1), ("route", 0), ("client", 5)]);
    // A request with no client address (an embedder's, a Unix socket's)
    // has no client bucket: the tenant's alone decides.
    assert_eq!(
        r.route(&RouteRequest::new("acme")).decision,
        Decision::RateLimited
    );
}

#[test]
fn a_tenant_refusing_spends_no_clients_token() {
    let limits = Limits::new(None, RateRule::new(1.0, 1.0), Vec::new())
        .with_per_client(RateRule::new(2.0, 0.0));
    let (clock, r) = router(limits);
    assert_eq!(from(&r, "192.0.2.1"), ALLOW);
    assert_eq!(from(&r, "192.0.2.1"), limited("tenant"));
    assert_eq!(from(&r, "192.0.2.1"), limited("tenant"));
    clock.advance(1_000.0);
    assert_eq!(from(&r, "192.0.2.1"), ALLOW, "its second token was kept");
    clock.advance(1_000.0);
    assert_eq!(from(&r, "192.0.2.1"), limited("client"));
}

#[test]
fn ipv6_clients_are_grouped_by_64() {
    let (_, r) = ten_and_three();
    for client in ["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:ffff::"] {
        assert_eq!(from(&r, client), ALLOW);
    }
    assert_eq!(from(&r, "2001:db8:1:2::99"), limited("client"));
    assert_eq!(from(&r, "2001:db8:1:3::1"), ALLOW, "another /64");
    // IPv4-mapped IPv6 is the IPv4 client.
    for _ in 0..3 {
        assert_eq!(from(&r, "198.51.100.1"), ALLOW);
    }
    assert_eq!(from(&r, "::ffff:198.51.100.1"), limited("client"));
}

#[test]
fn explaining_shows_the_clients_bucket_and_spends_nothing() {
    let (clock, r) = ten_and_three();
    let explain = |client: &str| {
        let res = r.explain(&RouteRequest::new("acme").client(ip(client)));
        (res.decision, res.bucket, res.retry_after_secs)
    };
    for _ in 0..5 {
        assert_eq!(explain("192.0.2.1"), (Decision::Allow, None, None));
    }
    for _ in 0..3 {
        assert_eq!(from(&r, "192.0.2.1"), ALLOW);
    }
    let refused = (Decision::RateLimited, Some(Bucket::Client), None);
    assert_eq!(explain("192.0.2.1"), refused, "never refills: no retry");
    clock.advance(10_000.0);
    assert_eq!(explain("192.0.2.2"), (Decision::Allow, None, None));
    assert_eq!(
        r.rate_limited_counts()[2],
        ("client", 0),
        "explaining counts nothing"
    );
}

#[test]
fn a_restart_hands_no_client_a_fresh_bucket() {
    let limits = || {
        Limits::new(None, RateRule::new(100.0, 0.0), Vec::new())
            .with_per_client(RateRule::new(2.0, 0.5))
    };
    let (_, r) = router(limits());
    for _ in 0..2 {
        assert_eq!(from(&r, "192.0.2.1"), ALLOW);
        assert_eq!(from(&r, "2001:db8::1"), ALLOW);
    }
    assert_eq!(from(&r, "192.0.2.2"), ALLOW);
    let snap = r.snapshot();
    let json = serde_json::to_string(&snap).expect("json");
    let back = serde_json::from_str(&json).expect("reads back");
    assert!(json.contains("\"client\":\"2001:db8::/64\""), "{json}");
    assert_eq!(snap.client_buckets.len(), 3);

    let (clock, restarted) = router(limits());
    restarted.restore(&back, true);
    assert_eq!(restarted.client_count(), 3);
    assert_eq!(from(&restarted, "192.0.2.1"), limited("client"));
    assert_eq!(from(&restarted, "2001:db8::2"), limited("client"));
    assert_eq!(from(&restarted, "192.0.2.2"), ALLOW);
    assert_eq!(from(&restarted, "192.0.2.2"), limited("client"));
    // Refilled buckets are as good as none: a snapshot leaves them out.
    clock.advance(4_000.0);
    assert!(restarted.snapshot().client_buckets.is_empty());
    // A plan without per_client any more: nothing to restore.
    let (_, unlimited) = router(Limits::new(None, RateRule::new(100.0, 0.0), Vec::new()));
    unlimited.restore(&back, true);
    assert_eq!(unlimited.client_count(), 0);
}

/// A GET for `host` from `client`, as a balancer's PROXY v1 header names it.
fn proxied_get(gw: &Gateway, client: &str, host: &str) -> Response {
    let (family, local) = match client.contains(':') {
        true => ("TCP6", "::1"),
        false => ("TCP4", "127.0.0.1"),
    };
    let raw = format!(
        "PROXY {family} {client} {local} 5555 80\r\n\
         GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    );
    send_raw(gw.port, raw.as_bytes())
}

/// The statuses of one GET each, in order, `(client, host)`.
fn statuses(gw: &Gateway, requests: &[(&str, &str)]) -> Vec<u16> {
    (requests.iter())
        .map(|(client, host)| proxied_get(gw, client, host).status)
        .collect()
}

#[test]
fn clients_behind_a_balancer_each_have_their_own_bucket() {
    let backend = Backend::start("a");
    let extra = "limits:\n  per_client: { rate: { tokens: 2, refill_per_second: 0.01 } }\n\
                 plans:\n  open: { per_client: null }\n  \
                 strict: { per_client: { rate: { tokens: 1, refill_per_second: 0.01 } } }\n\
                 tenants: { free: open, tight: strict }\n";
    let state = "{ path: \"{dir}/state.json\", interval_ms: 100 }";
    let mut gw = behind_balancer_with_state(&backend, "127.0.0.0/8", state, extra);
    let acme = "acme.localhost";
    let first = statuses(&gw, &[("192.0.2.1", acme), ("192.0.2.1", acme)]);
    assert_eq!(first, [200, 200]);
    let refused = proxied_get(&gw, "192.0.2.1", acme);
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.json(),
        serde_json::json!({"decision": "rate-limited", "bucket": "client"})
    );
    assert_eq!(refused.header("retry-after"), Some("100"));
    // Another client of the same tenant, and IPv6 clients by /64.
    let v6 = [
        "2001:db8::1",
        "2001:db8::2",
        "2001:db8::3",
        "2001:db8:0:1::1",
    ];
    let others = [
        ("192.0.2.2", acme),
        (v6[0], acme),
        (v6[1], acme),
        (v6[2], acme),
        (v6[3], acme),
    ];
    assert_eq!(statuses(&gw, &others), [200, 200, 200, 429, 200]);
    // Each plan its own rule: none, or a smaller one.
    assert_eq!(
        statuses(&gw, &[("192.0.2.1", "free.localhost"); 4]),
        [200; 4]
    );
    let tight = statuses(&gw, &[("192.0.2.1", "tight.localhost"); 2]);
    assert_eq!(tight, [200, 429]);

    let explain = |query: &str| gw.admin("GET", &format!("/v1/route?{query}"), None, None);
    let exhausted = explain("tenant=acme&client=192.0.2.1").json();
    assert_eq!(
        (exhausted["decision"].as_str(), exhausted["bucket"].as_str()),
        (Some("rate-limited"), Some("client"))
    );
    let fresh = explain("tenant=acme&client=192.0.2.9").json();
    assert_eq!(
        (fresh["decision"].as_str(), &fresh["bucket"]),
        (Some("allow"), &serde_json::Value::Null)
    );
    let grouped = explain("tenant=acme&client=2001:db8::/64").json();
    assert_eq!(grouped["bucket"].as_str(), Some("client"));
    assert_eq!(explain("tenant=acme&client=nobody").status, 400);
    let metrics = metrics_text(gw.admin_port);
    assert_eq!(
        metric_value(&metrics, "shardgate_rate_limited_total{bucket=\"client\"}"),
        3
    );
    assert_eq!(
        metric_value(&metrics, "shardgate_rate_limited_total{bucket=\"tenant\"}"),
        0
    );
    assert_eq!(metric_value(&metrics, "shardgate_clients_tracked"), 5);

    // A restart hands no client a fresh bucket.
    gw.signal("TERM");
    assert!(gw.wait_exit(std::time::Duration::from_secs(10)), "stopped");
    gw.restart();
    assert_eq!(proxied_get(&gw, "192.0.2.1", acme).status, 429);
    assert_eq!(proxied_get(&gw, "192.0.2.9", acme).status, 200);
}

#[test]
fn invented_client_addresses_stay_within_the_bound() {
    let backend = Backend::start("a");
    // Buckets that never refill: only the bound forgets them.
    let extra = "limits:\n  max_tracked_clients: 640\n  \
                 per_client: { rate: { tokens: 5, refill_per_second: 0 } }\n";
    let gw = behind_balancer_with_state(&backend, "127.0.0.0/8", "false", extra);
    for i in 0..2_000u32 {
        let [_, _, a, b] = i.to_be_bytes();
        let client = format!("10.9.{a}.{b}");
        assert_eq!(proxied_get(&gw, &client, "acme.localhost").status, 200);
    }
    let tracked = metric_value(&metrics_text(gw.admin_port), "shardgate_clients_tracked");
    assert!((100..=640).contains(&tracked), "{tracked} tracked");
    // A full table still limits: a client that spends its five is refused.
    let spent = statuses(&gw, &[("192.0.2.1", "acme.localhost"); 6]);
    assert_eq!(spent, [200, 200, 200, 200, 200, 429]);
}

#[test]
fn a_capped_tenant_spends_no_clients_token() {
    let limits = Limits::new(Some(1), RateRule::UNLIMITED, Vec::new())
        .with_per_client(RateRule::new(2.0, 0.0));
    let (_, r) = router(limits);
    let admit = || r.admit(&RouteRequest::new("acme").client(ip("192.0.2.1")));
    let held = admit();
    assert_eq!(held.decision, Decision::Allow);
    for _ in 0..3 {
        assert_eq!(admit().decision, Decision::Capped);
    }
    drop(held);
    let second = admit();
    assert_eq!(
        second.decision,
        Decision::Allow,
        "the refusals spent nothing"
    );
    drop(second);
    let third = admit();
    assert_eq!(
        (third.decision, third.bucket),
        (Decision::RateLimited, Some(Bucket::Client))
    );
}

#[test]
fn http2_streams_and_grpc_calls_spend_their_clients_bucket() {
    let backend = Backend::start("a");
    let extra = "limits:\n  per_client: { rate: { tokens: 2, refill_per_second: 0.01 } }\n";
    let gw = Gateway::start(&config_yaml(
        "listen: [{ addr: \"127.0.0.1:{port}\" }]\nadmin: { addr: \"127.0.0.1:{admin}\" }\nstate: false\n",
        &[("a", backend.url())],
        extra,
    ));
    // Three streams of one HTTP/2 connection (h2c), one after the other,
    // all 127.0.0.1's.
    let url = format!("http://127.0.0.1:{}/", gw.port);
    let out = std::process::Command::new("h2load")
        .args([
            "-n",
            "3",
            "-c",
            "1",
            "-m",
            "1",
            "-H",
            ":authority: t.localhost",
            &url,
        ])
        .output()
        .expect("h2load runs");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("status codes: 2 2xx, 0 3xx, 1 4xx, 0 5xx"),
        "{report}"
    );
    // A gRPC call from the same client gets the refusal's gRPC form.
    let grpc = std::process::Command::new("curl")
        .args([
            "-s",
            "--http2-prior-knowledge",
            "-D",
            "-",
            "-o",
            "/dev/null",
        ])
        .args([
            "-H",
            "Host: t.localhost",
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
        ])
        .args([
            "--data-binary",
            "@/dev/null",
            &format!("{url}test.Echo/Unary"),
        ])
        .output()
        .expect("curl runs");
    let head = String::from_utf8_lossy(&grpc.stdout).to_ascii_lowercase();
    assert!(head.starts_with("http/2 200"), "{head}");
    assert!(head.contains("grpc-status: 8"), "{head}");
    assert!(head.contains("grpc-message: rate-limited"), "{head}");
}
