//! Operating shardgate over real sockets: health probes, the admin API,
//! Prometheus, the state file across restarts (graceful and `kill -9`),
//! graceful shutdown and upgrade.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const TOKEN: &str = "s3cret-admin-token";

/// A config in a scratch folder, with state and an admin token.
fn config(shards: &[(&str, String)], extra: &str) -> String {
    config_yaml(
        "server: { pid_file: \"{dir}/gw.pid\", upgrade_sock: \"{dir}/upgrade.sock\", grace_period_seconds: 1, graceful_shutdown_timeout_seconds: 5 }\n\
         listen: [{ addr: \"127.0.0.1:{port}\" }]\n\
         admin: { addr: \"127.0.0.1:{admin}\", token_env: SHARDGATE_TEST_TOKEN }\n\
         state: { path: \"{dir}/state.json\", interval_ms: 100 }\n",
        shards,
        extra,
    )
}

fn start(shards: &[(&str, String)], extra: &str) -> Gateway {
    std::env::set_var("SHARDGATE_TEST_TOKEN", TOKEN);
    Gateway::start(&config(shards, extra))
}

fn admin(gw: &Gateway, method: &str, path: &str, body: Option<&str>) -> Response {
    gw.admin(method, path, body, Some(TOKEN))
}

fn shard_state(gw: &Gateway, id: &str) -> serde_json::Value {
    let shards = admin(gw, "GET", "/v1/shards", None).json();
    shards
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

/// `name{labels}` → value, from Prometheus text; panics on a malformed line.
fn parse_prometheus(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            assert!(
                line.is_empty() || line.starts_with("# HELP ") || line.starts_with("# TYPE "),
                "bad comment line {line:?}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        assert!(series.starts_with("shardgate_"), "{series}");
        out.insert(series.to_string(), value);
    }
    out
}

#[test]
fn probes_mark_a_stopped_shard_down_after_fall_and_up_after_rise() {
    let a = Backend::start("a");
    let port = a.port();
    let gw = start(
        &[("a", a.url())],
        "health: { interval_ms: 100, timeout_ms: 100, fall: 3, rise: 2 }\n",
    );
    assert_eq!(shard_state(&gw, "a")["healthy"], true);
    // Clocks start before the change: a probe may already see it during
    // `stop` or right after the bind.
    let down = Instant::now();
    a.stop();
    assert!(eventually(Duration::from_secs(5), || shard_state(&gw, "a")
        ["healthy"]
        == false));
    // fall = 3 probes at 100 ms: not before ~200 ms.
    assert!(
        down.elapsed() >= Duration::from_millis(170),
        "{:?}",
        down.elapsed()
    );
    let up = Instant::now();
    let _b = Backend::on("a again", port, |_| Reply::ok("back"));
    assert!(eventually(Duration::from_secs(5), || shard_state(&gw, "a")
        ["healthy"]
        == true));
    assert!(
        up.elapsed() >= Duration::from_millis(85),
        "{:?}",
        up.elapsed()
    );
    assert_eq!(gw.get("t.localhost", "/").text(), "back");
}

#[test]
fn probes_bring_back_a_shard_the_failure_hook_or_an_admin_marked_down_but_never_end_a_drain() {
    let a = Backend::start("a");
    let gw = start(&[("a", a.url())], "health: { interval_ms: 100, rise: 2 }\n");
    assert_eq!(
        admin(&gw, "POST", "/v1/shards/a/unhealthy", None).status,
        200
    );
    assert_eq!(shard_state(&gw, "a")["healthy"], false);
    assert!(eventually(Duration::from_secs(5), || shard_state(&gw, "a")
        ["healthy"]
        == true));
    assert_eq!(admin(&gw, "POST", "/v1/shards/a/drain", None).status, 200);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        shard_state(&gw, "a")["draining"],
        true,
        "probes never cancel a drain"
    );
    assert_eq!(admin(&gw, "POST", "/v1/shards/a/healthy", None).status, 200);
    assert_eq!(
        shard_state(&gw, "a")["draining"],
        false,
        "mark healthy ends the drain"
    );
}

#[test]
fn drain_stops_new_routing_while_an_in_flight_stream_completes() {
    let s0 = Backend::with("s0", |seen| {
        if seen.uri == "/stream" {
            Reply::Stream {
                chunks: vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()],
                gap: Duration::from_millis(300),
            }
        } else {
            Reply::ok("{\"shard\":\"s0\"}")
        }
    });
    let s1 = Backend::start("s1");
    let gw = start(
        &[("s0", s0.url()), ("s1", s1.url())],
        "routing: { balance: round-robin }\n",
    );
    // Round-robin: the first pick of a new key is s1, the second s0.
    assert_eq!(gw.get("t.localhost", "/").json()["shard"], "s1");
    let port = gw.port;
    let stream = std::thread::spawn(move || {
        send_raw(
            port,
            b"GET /stream HTTP/1.1\r\nHost: t.localhost\r\nConnection: close\r\n\r\n",
        )
    });
    assert!(eventually(Duration::from_secs(5), || s0.count() == 1));
    assert_eq!(admin(&gw, "POST", "/v1/shards/s0/drain", None).status, 200);
    for _ in 0..4 {
        assert_eq!(
            gw.get("t.localhost", "/").json()["shard"],
            "s1",
            "no new routes to a draining shard"
        );
    }
    assert_eq!(
        stream.join().unwrap().text(),
        "abc",
        "the in-flight stream completed"
    );
    // The admission is released when the request finishes, just after its
    // last byte went out.
    assert!(eventually(Duration::from_secs(5), || shard_state(
        &gw, "s0"
    )["active"]
        == 0));
}

#[test]
fn admin_api_endpoints_answer_as_designed() {
    let a = Backend::start("a");
    let b = Backend::start("b");
    let gw = start(
        &[("a", a.url())],
        "regions: [{ id: us }, { id: eu }]\nlimits:\n  rate: { tokens: 3, refill_per_second: 0 }\n  routes:\n    /api/export: { tokens: 1, refill_per_second: 0 }\n",
    );
    // Open endpoints; everything under /v1/ needs the token.
    assert_eq!(gw.admin("GET", "/healthz", None, None).status, 200);
    assert_eq!(gw.admin("GET", "/metrics", None, None).status, 200);
    let r = gw.admin("GET", "/v1/shards", None, None);
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    assert_eq!(
        gw.admin("GET", "/v1/shards", None, Some("wrong")).status,
        401
    );
    assert_eq!(
        gw.admin("GET", "/v1/shards", None, Some(&format!("{TOKEN}x")))
            .status,
        401
    );

    // Shards.
    let shards = admin(&gw, "GET", "/v1/shards", None).json();
    assert_eq!(shards[0]["id"], "a");
    assert_eq!(shards[0]["region"], serde_json::Value::Null);
    assert_eq!(shards[0]["tenants"], serde_json::Value::Null);
    let body = format!(
        "{{\"id\":\"b\",\"url\":\"{}\",\"region\":\"eu\",\"tenants\":[\"acme\"]}}",
        b.url()
    );
    assert_eq!(admin(&gw, "POST", "/v1/shards", Some(&body)).status, 201);
    assert_eq!(admin(&gw, "POST", "/v1/shards", Some(&body)).status, 409);
    assert_eq!(
        admin(&gw, "POST", "/v1/shards", Some("{\"id\":\"c\"}")).status,
        400,
        "missing url"
    );
    assert_eq!(
        admin(
            &gw,
            "POST",
            "/v1/shards",
            Some("{\"id\":\"c\",\"url\":\"ftp://x:1\"}")
        )
        .status,
        400
    );
    assert_eq!(
        admin(
            &gw,
            "POST",
            "/v1/shards",
            Some("{\"id\":\"c\",\"url\":\"http://127.0.0.1:1\",\"color\":\"red\"}")
        )
        .status,
        400,
        "unknown field"
    );
    assert_eq!(
        admin(&gw, "POST", "/v1/shards", Some("{not json")).status,
        400
    );
    assert_eq!(
        admin(
            &gw,
            "POST",
            "/v1/shards",
            Some("{\"id\":\"c\",\"url\":\"http://127.0.0.1:1\",\"region\":\"mars\"}")
        )
        .status,
        400
    );
    assert!(shard_state(&gw, "c").is_null(), "nothing half-applied");
    assert_eq!(shard_state(&gw, "b")["tenants"][0], "acme");
    assert_eq!(
        admin(&gw, "POST", "/v1/shards/nope/drain", None).status,
        404
    );
    assert_eq!(admin(&gw, "POST", "/v1/shards/b/explode", None).status, 404);
    assert_eq!(admin(&gw, "DELETE", "/v1/shards/nope", None).status, 404);

    // Domains.
    assert_eq!(
        admin(
            &gw,
            "PUT",
            "/v1/domains/shop.example",
            Some("{\"tenant\":\"acme\"}")
        )
        .status,
        200
    );
    assert_eq!(
        gw.get("shop.example", "/").json()["tenant"],
        "acme",
        "takes effect for the next request"
    );
    assert_eq!(
        admin(
            &gw,
            "PUT",
            "/v1/domains/a.*.com",
            Some("{\"tenant\":\"x\"}")
        )
        .status,
        400
    );
    assert_eq!(
        admin(
            &gw,
            "PUT",
            "/v1/domains/x.example",
            Some("{\"tenant\":\"\"}")
        )
        .status,
        400
    );
    assert_eq!(
        admin(&gw, "PUT", "/v1/domains/x.example", Some("{\"tenant\":1}")).status,
        400
    );
    let domains = admin(&gw, "GET", "/v1/domains", None).json();
    assert_eq!(domains.as_array().unwrap().len(), 1);
    assert_eq!(
        admin(&gw, "DELETE", "/v1/domains/shop.example", None).status,
        200
    );
    assert_eq!(
        admin(&gw, "DELETE", "/v1/domains/shop.example", None).status,
        404
    );
    assert_eq!(gw.get("shop.example", "/").status, 404);

    // Region overrides.
    assert_eq!(
        admin(
            &gw,
            "PUT",
            "/v1/tenants/acme/region",
            Some("{\"region\":\"mars\"}")
        )
        .status,
        400
    );
    assert_eq!(
        admin(
            &gw,
            "PUT",
            "/v1/tenants/acme/region",
            Some("{\"region\":\"eu\"}")
        )
        .status,
        200
    );
    let explained = admin(&gw, "GET", "/v1/route?tenant=acme", None).json();
    assert_eq!(explained["region"], "eu");
    assert_eq!(
        admin(&gw, "DELETE", "/v1/tenants/acme/region", None).status,
        200
    );
    assert_eq!(
        admin(&gw, "DELETE", "/v1/tenants/acme/region", None).status,
        404
    );

    // Deny list.
    assert_eq!(admin(&gw, "PUT", "/v1/tenants/bad/deny", None).status, 200);
    assert_eq!(gw.get("bad.localhost", "/").status, 403);
    assert_eq!(
        admin(&gw, "DELETE", "/v1/tenants/bad/deny", None).status,
        200
    );
    assert_eq!(
        admin(&gw, "DELETE", "/v1/tenants/bad/deny", None).status,
        404
    );

    // Snapshot and restore round-trip; metrics as JSON.
    let snapshot = admin(&gw, "GET", "/v1/snapshot", None);
    assert_eq!(snapshot.status, 200);
    let r = admin(
        &gw,
        "POST",
        "/v1/restore?reset_connections=true",
        Some(&snapshot.text()),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        admin(&gw, "POST", "/v1/restore", Some("{\"version\":1}")).status,
        400
    );
    let metrics = admin(&gw, "GET", "/v1/metrics", None).json();
    assert!(metrics["router"]["routes"].as_u64().unwrap() >= 2);
    assert!(metrics["domains"]["resolves"].as_u64().unwrap() >= 3);
    assert!(metrics["regions"]["assignments"].is_u64());
    assert_eq!(admin(&gw, "GET", "/v1/nothing", None).status, 404);

    // Removing a shard.
    assert_eq!(admin(&gw, "DELETE", "/v1/shards/b", None).status, 200);
    assert!(shard_state(&gw, "b").is_null());
}

#[test]
fn explain_answers_without_consuming_anything() {
    let a = Backend::start("a");
    let gw = start(
        &[("a", a.url())],
        "routing: { balance: round-robin }\nlimits:\n  rate: { tokens: 1, refill_per_second: 0 }\n  routes:\n    /api/export: { tokens: 1, refill_per_second: 0 }\n",
    );
    for _ in 0..5 {
        let e = admin(&gw, "GET", "/v1/route?tenant=t&path=/api/export/x", None).json();
        assert_eq!(e["decision"], "allow");
        assert_eq!(e["shard"], "a");
        assert_eq!(e["region"], serde_json::Value::Null);
        assert_eq!(e["bucket"], serde_json::Value::Null);
    }
    let m = admin(&gw, "GET", "/v1/metrics", None).json();
    assert_eq!(m["router"]["routes"], 0, "explain counts in no metric");
    assert_eq!(
        gw.get("t.localhost", "/api/export").status,
        200,
        "the token is still there"
    );
    let e = admin(&gw, "GET", "/v1/route?tenant=t&path=/", None).json();
    assert_eq!(e["decision"], "rate-limited");
    assert_eq!(e["bucket"], "tenant");
    assert_eq!(
        admin(&gw, "GET", "/v1/route", None).status,
        400,
        "tenant is required"
    );
}

#[test]
fn metrics_parse_as_prometheus_text_and_count_what_happened() {
    let a = Backend::start("a");
    let dead = free_port();
    let gw = start(
        &[("a", a.url()), ("dead", format!("http://127.0.0.1:{dead}"))],
        "health: { interval_ms: 60000 }\nlimits: { deny: [nope] }\ndomains:\n  map: { shop.example: acme }\n  fallback_suffix: .localhost\n",
    );
    let fresh = parse_prometheus(&gw.admin("GET", "/metrics", None, None).text());
    for d in [
        "allow",
        "rate-limited",
        "capped",
        "denied",
        "no-shards",
        "no-tenant-shards",
        "no-region-shards",
    ] {
        assert_eq!(
            fresh[&format!("shardgate_decisions_total{{decision=\"{d}\",plan=\"none\"}}")],
            0.0,
            "{d} exported from the start"
        );
    }
    let mut allowed = 0;
    for t in 0..20 {
        if gw.get(&format!("t{t}.localhost"), "/").status == 200 {
            allowed += 1;
        }
    }
    gw.get("shop.example", "/");
    gw.get("nope.localhost", "/");
    gw.get("unknown.org", "/");
    // A request's duration is observed when it finishes, just after its
    // response went out: the client can scrape before the last one lands.
    let mut m = BTreeMap::new();
    eventually(Duration::from_secs(5), || {
        m = parse_prometheus(&gw.admin("GET", "/metrics", None, None).text());
        m.get("shardgate_request_duration_seconds_count") >= Some(&23.0)
    });
    assert_eq!(allowed, 20, "the dead shard's tenants were retried on a");
    assert_eq!(
        m["shardgate_decisions_total{decision=\"denied\",plan=\"none\"}"],
        1.0
    );
    assert_eq!(m["shardgate_domain_resolves_total{result=\"exact\"}"], 1.0);
    assert_eq!(
        m["shardgate_domain_resolves_total{result=\"fallback\"}"],
        21.0
    );
    assert_eq!(m["shardgate_domain_resolves_total{result=\"miss\"}"], 1.0);
    assert_eq!(m["shardgate_shard_healthy{shard=\"a\"}"], 1.0);
    assert_eq!(m["shardgate_shard_healthy{shard=\"dead\"}"], 0.0);
    assert_eq!(
        m["shardgate_upstream_failures_total{shard=\"dead\",kind=\"connect\"}"], 1.0,
        "marked down at once"
    );
    assert_eq!(m["shardgate_retries_total"], 1.0);
    assert_eq!(m["shardgate_request_duration_seconds_count"], 23.0);
    assert_eq!(
        m["shardgate_routes_total"],
        m["shardgate_decisions_total{decision=\"allow\",plan=\"none\"}"] + 1.0
    );
    let routed_a = m["shardgate_shard_routes_total{shard=\"a\"}"];
    assert_eq!(routed_a, 21.0, "20 tenants + shop.example");
    assert!(
        !gw.admin("GET", "/metrics", None, None)
            .text()
            .contains("tenant="),
        "no tenant label"
    );
}

#[test]
fn state_survives_a_graceful_restart_and_a_kill_9() {
    let a = Backend::start("a");
    let mut gw = start(
        &[("a", a.url())],
        "limits:\n  rate: { tokens: 3, refill_per_second: 0.01 }\n",
    );
    for _ in 0..3 {
        assert_eq!(gw.get("t.localhost", "/").status, 200);
    }
    assert_eq!(gw.get("t.localhost", "/").status, 429);
    // Graceful: SIGTERM writes the state at shutdown.
    gw.signal("TERM");
    assert!(
        gw.wait_exit(Duration::from_secs(15)),
        "exited within the grace periods"
    );
    gw.restart();
    assert_eq!(
        gw.get("t.localhost", "/").status,
        429,
        "still drained after a graceful restart"
    );
    assert_eq!(gw.get("u.localhost", "/").status, 200);
    // kill -9: the periodic write (every 100 ms) holds u's spent token
    // (full buckets are left out of the file).
    let state = gw.dir.path().join("state.json");
    assert!(eventually(Duration::from_secs(5), || {
        std::fs::read(&state)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["router"]["tenants"].as_array().cloned())
            .is_some_and(|ts| ts.iter().any(|t| t["tenant"] == "u"))
    }));
    gw.kill9();
    gw.restart();
    assert_eq!(
        gw.get("t.localhost", "/").status,
        429,
        "still drained after kill -9"
    );
    let u: Vec<u16> = (0..3).map(|_| gw.get("u.localhost", "/").status).collect();
    assert_eq!(u, [200, 200, 429], "u had 2 tokens left");
}

/// A gateway whose state writes (of `dir/state.json`) crawl: 256 bytes
/// every 60 ms (a debug-build knob), so a periodic write is in flight when
/// a signal lands.
fn start_with_slow_state(dir: &std::path::Path, shards: &[(&str, String)]) -> Gateway {
    let state = dir.join("state.json").display().to_string();
    std::env::set_var("SHARDGATE_TEST_SLOW_STATE_WRITE", format!("60:{state}"));
    std::env::set_var("SHARDGATE_TEST_TOKEN", TOKEN);
    Gateway::start(&config(shards, "").replace("{dir}/state.json", &state))
}

#[test]
fn a_signal_during_a_state_write_leaves_a_whole_file_with_the_last_changes() {
    let a = Backend::start("a");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let names: Vec<String> = (0..12)
        .map(|i| format!("a-rather-long-domain-name-number-{i}.example"))
        .collect();
    for (round, sig) in ["INT", "TERM", "INT", "TERM"].into_iter().enumerate() {
        let mut gw = start_with_slow_state(dir.path(), &[("a", a.url())]);
        for name in &names {
            let put = admin(
                &gw,
                "PUT",
                &format!("/v1/domains/{name}"),
                Some("{\"tenant\":\"t\"}"),
            );
            assert_eq!(put.status, 200);
        }
        // A write that holds them all (slow: some 400 ms) is under way…
        assert!(eventually(Duration::from_secs(20), || {
            std::fs::read_to_string(&state).is_ok_and(|s| names.iter().all(|n| s.contains(n)))
        }));
        // …when they are deleted (the last write is shorter than the one in
        // flight) and the signal lands.
        for name in &names {
            let deleted = admin(&gw, "DELETE", &format!("/v1/domains/{name}"), None);
            assert_eq!(deleted.status, 200);
        }
        let marker = format!("round-{round}.example");
        let put = admin(
            &gw,
            "PUT",
            &format!("/v1/domains/{marker}"),
            Some("{\"tenant\":\"t\"}"),
        );
        assert_eq!(put.status, 200);
        gw.signal(sig);
        assert!(gw.wait_exit(Duration::from_secs(30)), "SIG{sig}: exited");
        let text = std::fs::read_to_string(&state).unwrap();
        let parsed: Result<serde_json::Value, _> = serde_json::from_str(&text);
        assert!(parsed.is_ok(), "SIG{sig}: a whole file, not {text:?}");
        assert!(text.contains(&marker), "SIG{sig}: the last change kept");
        assert!(
            !names.iter().any(|n| text.contains(n)),
            "SIG{sig}: the deletions kept"
        );
        let others: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.') || n.contains("corrupt"))
            .collect();
        assert!(
            others.is_empty(),
            "SIG{sig}: nothing left beside it: {others:?}"
        );
    }
}

#[test]
fn a_corrupt_state_file_is_moved_aside_and_the_gateway_starts() {
    let a = Backend::start("a");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    std::fs::write(&state, b"{ this is not json").unwrap();
    std::env::set_var("SHARDGATE_TEST_TOKEN", TOKEN);
    let yaml =
        config(&[("a", a.url())], "").replace("{dir}/state.json", &state.display().to_string());
    let gw = Gateway::start(&yaml);
    assert_eq!(gw.get("t.localhost", "/").status, 200);
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("state.json.corrupt-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "moved aside");
    assert_eq!(
        std::fs::read(aside[0].path()).unwrap(),
        b"{ this is not json"
    );
    assert!(gw.log().contains("moved to"), "{}", gw.log());
}

#[test]
fn runtime_shard_domain_and_deny_changes_survive_a_restart() {
    let a = Backend::start("a");
    let b = Backend::start("b");
    let mut gw = start(
        &[("a", a.url())],
        "domains:\n  map: { old.example: old }\n  fallback_suffix: .localhost\nlimits: { deny: [blocked] }\n",
    );
    let body = format!(
        "{{\"id\":\"b\",\"url\":\"{}\",\"tenants\":[\"vip\"]}}",
        b.url()
    );
    assert_eq!(admin(&gw, "POST", "/v1/shards", Some(&body)).status, 201);
    assert_eq!(admin(&gw, "DELETE", "/v1/shards/a", None).status, 200);
    assert_eq!(
        admin(
            &gw,
            "PUT",
            "/v1/domains/new.example",
            Some("{\"tenant\":\"vip\"}")
        )
        .status,
        200
    );
    assert_eq!(
        admin(&gw, "DELETE", "/v1/domains/old.example", None).status,
        200
    );
    assert_eq!(
        admin(&gw, "DELETE", "/v1/tenants/blocked/deny", None).status,
        200
    );
    assert_eq!(admin(&gw, "PUT", "/v1/tenants/vip2/deny", None).status, 200);
    // The state file is written in the background (every 100 ms here, with
    // an fsync): the kill comes once it holds the last change.
    let state = gw.dir.path().join("state.json");
    assert!(eventually(Duration::from_secs(5), || {
        std::fs::read_to_string(&state).is_ok_and(|s| s.contains("vip2"))
    }));
    gw.kill9();
    gw.restart();
    let shards = admin(&gw, "GET", "/v1/shards", None).json();
    let ids: Vec<&str> = shards
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["b"]);
    assert_eq!(gw.get("new.example", "/").json()["shard"], "b");
    assert_eq!(gw.get("old.example", "/").status, 404);
    let denied = admin(&gw, "GET", "/v1/snapshot", None).json();
    assert_eq!(denied["changes"]["deny_removed"][0], "blocked");
    assert_eq!(denied["changes"]["deny_added"][0], "vip2");
}

#[test]
fn sigterm_lets_in_flight_requests_finish() {
    let a = Backend::with("a", |_| Reply::Stream {
        chunks: vec![b"1".to_vec(), b"2".to_vec(), b"3".to_vec()],
        gap: Duration::from_millis(300),
    });
    let mut gw = start(&[("a", a.url())], "");
    let port = gw.port;
    let inflight = std::thread::spawn(move || {
        send_raw(
            port,
            b"GET / HTTP/1.1\r\nHost: t.localhost\r\nConnection: close\r\n\r\n",
        )
    });
    assert!(eventually(Duration::from_secs(5), || a.count() == 1));
    let stopped = Instant::now();
    gw.signal("TERM");
    assert_eq!(inflight.join().unwrap().text(), "123");
    assert!(gw.wait_exit(Duration::from_secs(15)));
    // grace_period_seconds 1 + graceful_shutdown_timeout_seconds 5.
    assert!(
        stopped.elapsed() < Duration::from_secs(8),
        "{:?}",
        stopped.elapsed()
    );
}

#[test]
fn sigterm_closes_idle_keep_alive_connections_at_once() {
    use std::io::{Read, Write};
    let a = Backend::start("a");
    let mut gw = start(&[("a", a.url())], "");
    let mut idle = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nHost: t.localhost\r\n\r\n")
        .unwrap();
    let mut reader = std::io::BufReader::new(idle.try_clone().unwrap());
    assert_eq!(read_response(&mut reader).unwrap().status, 200);
    // Now idle between requests, as keep-alive clients mostly are.
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let stopped = Instant::now();
    gw.signal("TERM");
    let mut byte = [0u8; 1];
    let closed = matches!(reader.read(&mut byte), Ok(0));
    let took = stopped.elapsed();
    assert!(closed, "the idle connection was not closed");
    // Not at the runtime's end (grace 1 s + shutdown timeout 5 s).
    assert!(took < Duration::from_secs(2), "closed after {took:?}");
    assert!(gw.wait_exit(Duration::from_secs(15)));
}

#[test]
fn sigquit_hands_the_listeners_to_a_new_process_without_refusing_connections() {
    let a = Backend::start("a");
    let mut old = start(&[("a", a.url())], "");
    let (port, admin_port) = (old.port, old.admin_port);
    // The new process, started with -u, waits for the old one's sockets.
    let log = std::fs::File::create(old.dir.path().join("new.log")).unwrap();
    let mut new = std::process::Command::new(env!("CARGO_BIN_EXE_shardgate"))
        .args(["-u", "-c"])
        .arg(&old.config_path)
        .env("SHARDGATE_TEST_TOKEN", TOKEN)
        .env("RUST_LOG", "info")
        .stderr(log)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = std::sync::Arc::clone(&stop);
    let client = std::thread::spawn(move || {
        let mut failures = 0;
        let mut done = 0;
        while !s.load(std::sync::atomic::Ordering::SeqCst) {
            match std::net::TcpStream::connect(("127.0.0.1", port)) {
                Ok(mut c) => {
                    use std::io::Write;
                    let _ = c.write_all(
                        b"GET / HTTP/1.1\r\nHost: t.localhost\r\nConnection: close\r\n\r\n",
                    );
                    let mut reader = std::io::BufReader::new(c);
                    match read_response(&mut reader) {
                        Ok(r) if r.status == 200 => done += 1,
                        _ => failures += 1,
                    }
                }
                Err(_) => failures += 1,
            }
        }
        (done, failures)
    });
    std::thread::sleep(Duration::from_millis(300));
    old.signal("QUIT");
    assert!(
        old.wait_exit(Duration::from_secs(15)),
        "the old process exits after handing over"
    );
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (done, failures) = client.join().unwrap();
    assert!(done > 10);
    assert_eq!(
        failures, 0,
        "no refused or failed request during the upgrade"
    );
    // The new process serves both the proxy and the admin listener.
    assert_eq!(
        send_raw(
            port,
            b"GET / HTTP/1.1\r\nHost: t.localhost\r\nConnection: close\r\n\r\n"
        )
        .status,
        200
    );
    let health = send_raw(
        admin_port,
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(health.status, 200);
    let _ = new.kill();
    let _ = new.wait();
}

#[test]
fn the_access_log_has_one_line_per_request() {
    let a = Backend::start("a");
    std::env::set_var("SHARDGATE_TEST_LOG", "warn,shardgate::access=info");
    let gw = start(
        &[("a", a.url())],
        "log: { access: info }\nlimits: { deny: [nope] }\n",
    );
    gw.get("acme.localhost", "/x");
    gw.get("nope.localhost", "/y");
    assert!(eventually(Duration::from_secs(3), || gw
        .log()
        .matches("shardgate::access")
        .count()
        >= 2));
    let log = gw.log();
    assert!(
        log.contains("tenant=acme shard=a decision=allow status=200"),
        "{log}"
    );
    assert!(
        log.contains("tenant=nope shard=- decision=denied status=403"),
        "{log}"
    );
}

#[test]
fn a_tokenless_admin_on_a_public_address_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        "listen: [{ addr: \"127.0.0.1:1\" }]\nadmin: { addr: \"0.0.0.0:9999\" }\nshards: []\ndomains: {}\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardgate"))
        .arg("-c")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("admin.addr"));
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws_open(port: u16) -> Ws {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://127.0.0.1:{port}/socket")
        .into_client_request()
        .expect("request");
    req.headers_mut()
        .insert("host", "t.localhost".parse().expect("host"));
    let (ws, resp) = tokio_tungstenite::connect_async(req)
        .await
        .expect("websocket handshake");
    assert_eq!(resp.status(), 101);
    ws
}

/// Whether `ws` still echoes (the backend answers `ws:` + the message).
async fn ws_echoes(ws: &mut Ws, text: &str) -> bool {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    if ws.send(Message::Text(text.into())).await.is_err() {
        return false;
    }
    matches!(
        tokio::time::timeout(Duration::from_secs(2), ws.next()).await,
        Ok(Some(Ok(Message::Text(t)))) if t == format!("ws:{text}")
    )
}

/// How long until `ws` ends (closed or failed), if within `within`.
async fn ws_ends_within(ws: &mut Ws, within: Duration) -> Option<Duration> {
    use futures_util::StreamExt;
    let started = Instant::now();
    let ended =
        tokio::time::timeout(within, async { while let Some(Ok(_)) = ws.next().await {} }).await;
    ended.ok().map(|()| started.elapsed())
}

#[test]
fn sigterm_leaves_open_websockets_working_through_the_grace_period_then_closes_them() {
    let backend = WsBackend::start("ws");
    let mut gw = start(&[("ws", backend.url())], "");
    let mut ws = runtime().block_on(ws_open(gw.port));
    assert!(runtime().block_on(ws_echoes(&mut ws, "before")));
    // Taken before the signal goes out: the gateway cannot count its
    // grace period from earlier than this.
    let signalled = Instant::now();
    gw.signal("TERM");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        runtime().block_on(ws_echoes(&mut ws, "during")),
        "the tunnel still works in the grace period"
    );
    // Closed when the runtime ends (grace 1 s + shutdown timeout 5 s),
    // not when the signal came.
    let ended = runtime().block_on(ws_ends_within(&mut ws, Duration::from_secs(15)));
    assert!(ended.is_some(), "the tunnel was never closed");
    assert!(
        signalled.elapsed() >= Duration::from_secs(1),
        "closed {:?} after SIGTERM, inside the grace period",
        signalled.elapsed()
    );
    assert!(gw.wait_exit(Duration::from_secs(15)));
}

#[test]
fn an_upgrade_leaves_old_websockets_to_the_old_process_until_it_exits() {
    let backend = WsBackend::start("ws");
    let mut old = start(&[("ws", backend.url())], "");
    let port = old.port;
    let mut before = runtime().block_on(ws_open(port));
    let log = std::fs::File::create(old.dir.path().join("new.log")).expect("log");
    let new = std::process::Command::new(env!("CARGO_BIN_EXE_shardgate"))
        .args(["-u", "-c"])
        .arg(&old.config_path)
        .env("SHARDGATE_TEST_TOKEN", TOKEN)
        .stderr(log)
        .spawn()
        .expect("new process");
    // Killed however the test ends.
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _new = Reap(new);
    std::thread::sleep(Duration::from_millis(500));
    // Taken before the signal goes out: the gateway cannot count its
    // grace period from earlier than this.
    let signalled = Instant::now();
    old.signal("QUIT");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        runtime().block_on(ws_echoes(&mut before, "old")),
        "the old process's tunnel still works after the handover"
    );
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        runtime().block_on(ws_echoes(&mut before, "still old")),
        "the old process's tunnel still works a second after the handover"
    );
    // Closed when the old process ends (Pingora's 5 s close timeout after
    // the handover, then grace 1 s + shutdown timeout 5 s): not before
    // the grace period.
    assert!(runtime()
        .block_on(ws_ends_within(&mut before, Duration::from_secs(20)))
        .is_some());
    assert!(signalled.elapsed() >= Duration::from_secs(1));
    assert!(old.wait_exit(Duration::from_secs(15)));
    // The new process took the listener: new sockets work.
    let mut after = runtime().block_on(ws_open(port));
    assert!(runtime().block_on(ws_echoes(&mut after, "new")));
}

/// Tenant plans through the admin API (DESIGN §6): the plans, a tenant's
/// plan and effective limits, a move that takes effect on the next
/// request and survives a restart; an unknown plan is 400.
#[test]
fn a_tenants_plan_is_set_at_runtime_and_survives_a_restart() {
    let a = Backend::start("a");
    let mut gw = start(
        &[("a", a.url())],
        "limits: { rate: { tokens: 9, refill_per_second: 0 } }\n\
         plans:\n  free: { rate: { tokens: 2, refill_per_second: 0 }, connection_cap: 5,\n    \
         routes: { /api: { tokens: 1, refill_per_second: 0 } } }\n  \
         pro: { rate: null, max_body_bytes: null, routes: { /api/export: { tokens: 1, refill_per_second: 0 },\n    \
         /internal: { tokens: 1, refill_per_second: 0 } } }\n  big: { rate: { tokens: 20, refill_per_second: 0 } }\n  \
         tiny: { max_body_bytes: 10 }\n\
         tenants: { acme: pro, big1: big, small: tiny }\ndefault_plan: free\n",
    );
    let plans = admin(&gw, "GET", "/v1/plans", None).json();
    assert_eq!(plans["free"]["rate"]["tokens"], 2.0, "{plans}");
    assert_eq!(plans["pro"]["rate"], serde_json::Value::Null, "{plans}");
    let acme = admin(&gw, "GET", "/v1/tenants/acme", None).json();
    assert_eq!(acme["plan"], "pro", "{acme}");
    assert_eq!(acme["limits"]["rate"], serde_json::Value::Null);
    let other = admin(&gw, "GET", "/v1/tenants/other", None).json();
    assert_eq!(other["plan"], "free", "{other}");
    // Each tenant's own body limit: a length over it, or chunks past it.
    let post = |host: &str, fields: &str, body: &str| {
        gw.send(&format!(
            "POST / HTTP/1.1\r\nHost: {host}.localhost\r\n{fields}\r\nConnection: close\r\n\r\n{body}"
        ))
        .status
    };
    assert_eq!(post("small", "Content-Length: 11", "01234567890"), 413);
    // One length said twice is still over it.
    let twice = post("small", "Content-Length: 11, 11", "01234567890");
    assert!([400, 413].contains(&twice), "{twice}");
    assert_eq!(post("small", "Content-Length: 10", "0123456789"), 200);
    let chunks = "b\r\n01234567890\r\n0\r\n\r\n";
    assert_eq!(post("small", "Transfer-Encoding: chunked", chunks), 413);
    assert_eq!(post("acme", "Content-Length: 11", "01234567890"), 200);
    assert_eq!(post("acme", "Transfer-Encoding: chunked", chunks), 200);
    // A route only pro names stays under free's `/api`, however spelled.
    let route = |tenant: &str, path: &str| gw.get(&format!("{tenant}.localhost"), path).status;
    assert_eq!(route("someone", "/api/export/x"), 200);
    assert_eq!(
        route("someone", "/internal/../api/x"),
        429,
        "free's /api, drained"
    );
    let explained = admin(
        &gw,
        "GET",
        "/v1/route?tenant=someone&path=/api/export",
        None,
    )
    .json();
    assert_eq!(explained["bucket"], "/api", "{explained}");
    let explained = admin(&gw, "GET", "/v1/route?tenant=acme", None).json();
    assert_eq!(explained["plan"], "pro", "{explained}");
    assert_eq!(other["limits"]["connection_cap"], 5);
    let statuses = |gw: &Gateway, tenant: &str, n: usize| -> Vec<u16> {
        (0..n)
            .map(|_| gw.get(&format!("{tenant}.localhost"), "/").status)
            .collect()
    };
    assert_eq!(
        statuses(&gw, "other", 3),
        vec![200, 200, 429],
        "free: 2 tokens"
    );
    assert_eq!(statuses(&gw, "acme", 12), vec![200; 12], "pro: unlimited");
    let set_acme = |gw: &Gateway, plan: &str| {
        let body = format!("{{\"plan\":\"{plan}\"}}");
        admin(gw, "PUT", "/v1/tenants/acme/plan", Some(&body))
    };
    let moved = set_acme(&gw, "free");
    assert_eq!(moved.status, 200, "{}", moved.text());
    assert_eq!(moved.json()["plan"], "free");
    assert_eq!(
        statuses(&gw, "acme", 3),
        vec![200, 200, 429],
        "on free from the next request"
    );
    // Decisions by plan, every plan exported (and `none`): other's 429,
    // someone's route 429 and acme's since its move count under free,
    // acme's 14 before under pro.
    let m = parse_prometheus(&gw.admin("GET", "/metrics", None, None).text());
    let count = |d: &str, plan: &str| {
        m[&format!("shardgate_decisions_total{{decision=\"{d}\",plan=\"{plan}\"}}")]
    };
    assert_eq!(count("rate-limited", "free"), 3.0);
    assert_eq!(count("allow", "pro"), 14.0);
    assert_eq!(count("allow", "none"), 0.0);
    assert_eq!(count("capped", "big"), 0.0);
    let unknown = set_acme(&gw, "gold");
    assert_eq!(unknown.status, 400, "{}", unknown.text());
    let nobody = admin(&gw, "PUT", "/v1/tenants//plan", Some("{\"plan\":\"pro\"}"));
    assert_eq!(nobody.status, 400, "{}", nobody.text());
    // DELETE drops a runtime change: a tenant never set follows the
    // default plan still, and leaves nothing in the state file.
    let cleared = admin(&gw, "DELETE", "/v1/tenants/bigco/plan", None);
    assert_eq!(cleared.json()["plan"], "free", "no plan: the default one");
    // A bucket judged by its own plan: 15 of big's 20 left is not full,
    // though it is more than `limits`' 9.
    assert_eq!(statuses(&gw, "big1", 5), vec![200; 5]);
    let state = gw.dir.path().join("state.json");
    // Wait for a write made after all five: one taken during them would
    // hand big1 back the tokens spent after it.
    let big1_tokens = |s: &str| -> Option<f64> {
        let v: serde_json::Value = serde_json::from_str(s).ok()?;
        let tenants = v["router"]["tenants"].as_array()?;
        let big1 = tenants.iter().find(|t| t["tenant"] == "big1")?;
        big1["tokens"].as_f64()
    };
    assert!(eventually(Duration::from_secs(5), || {
        std::fs::read_to_string(&state)
            .is_ok_and(|s| s.contains("\"acme\"") && big1_tokens(&s) == Some(15.0))
    }));
    assert!(!std::fs::read_to_string(&state)
        .unwrap_or_default()
        .contains("bigco"));
    gw.kill9();
    gw.restart();
    let acme = admin(&gw, "GET", "/v1/tenants/acme", None).json();
    assert_eq!(acme["plan"], "free", "after a restart: {acme}");
    let after = statuses(&gw, "big1", 16);
    assert_eq!(after.iter().filter(|s| **s == 200).count(), 15, "{after:?}");
    // DELETE of acme's change: back to `tenants`' pro, after a restart too.
    let restored = admin(&gw, "DELETE", "/v1/tenants/acme/plan", None);
    assert_eq!(restored.json()["plan"], "pro", "{}", restored.text());
    let changed = |s: &str| s.contains("\"acme\": \"free\"") || s.contains("\"acme\":\"free\"");
    assert!(eventually(Duration::from_secs(5), || {
        std::fs::read_to_string(&state).is_ok_and(|s| !changed(&s))
    }));
    gw.kill9();
    gw.restart();
    let acme = admin(&gw, "GET", "/v1/tenants/acme", None).json();
    assert_eq!(acme["plan"], "pro", "after a restart: {acme}");
}

/// Route prefixes ignore ASCII case (Express, ASP.NET and IIS route
/// `/API/Export` to `/api/export`'s handler), in the limits and in plans.
#[test]
fn a_route_bucket_holds_whatever_the_case_of_the_path() {
    let a = Backend::start("a");
    let gw = start(
        &[("a", a.url())],
        "limits:\n  routes:\n    /api/export: { tokens: 2, refill_per_second: 0.001 }\n\
         plans:\n  pro: { routes: { /Reports: { tokens: 1, refill_per_second: 0.001 } } }\n\
         tenants: { acme: pro }\n",
    );
    let get = |tenant: &str, path: &str| gw.get(&format!("{tenant}.localhost"), path);
    for (tenant, path, status, bucket) in [
        ("t", "/api/export", 200, ""),
        ("t", "/API/Export", 200, ""),
        ("t", "/Api/EXPORT/x", 429, "/api/export"),
        ("t", "/api/exporter", 200, ""),
        ("acme", "/reports/x", 200, ""),
        ("acme", "/REPORTS", 429, "/Reports"),
    ] {
        let r = get(tenant, path);
        assert_eq!(r.status, status, "{tenant} {path}: {}", r.text());
        if status == 429 {
            assert_eq!(r.json()["bucket"], bucket, "{path}");
        }
    }
    let explained = admin(&gw, "GET", "/v1/route?tenant=acme&path=/rePorts/y", None).json();
    assert_eq!(explained["bucket"], "/Reports", "{explained}");
}

/// `/metrics` answers a Host that is an IP address or `localhost` (or the
/// bearer token): a page whose name an attacker's DNS re-pointed at the
/// admin listener (DNS rebinding) reads nothing. A token file others can
/// read is reported at start.
#[test]
fn metrics_refuse_a_host_name_and_a_readable_token_file_is_reported() {
    use std::os::unix::fs::PermissionsExt;
    let a = Backend::start("a");
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("admin.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let yaml = config(&[("a", a.url())], "").replace(
        "token_env: SHARDGATE_TEST_TOKEN",
        &format!("token_file: \"{}\"", token_file.display()),
    );
    let gw = Gateway::start(&yaml);
    let scrape = |host: &str, auth: &str| {
        let raw =
            format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n");
        send_raw(gw.admin_port, raw.as_bytes()).status
    };
    let bearer = format!("Authorization: Bearer {TOKEN}\r\n");
    assert_eq!(scrape("127.0.0.1", ""), 200);
    assert_eq!(scrape("[::1]:9901", ""), 200);
    assert_eq!(scrape("localhost", ""), 200);
    assert_eq!(scrape("rebound.evil.example", ""), 403);
    assert_eq!(
        scrape(
            "rebound.evil.example",
            "Authorization: Bearer wrong-but-long-enough\r\n"
        ),
        403
    );
    assert_eq!(scrape("gateway.internal:9901", &bearer), 200);
    assert_eq!(
        admin(&gw, "GET", "/v1/shards", None).status,
        200,
        "the file's token"
    );
    let log = gw.log();
    assert!(
        log.contains("admin.token_file") && log.contains("chmod 600"),
        "{log}"
    );
    // Mode 600: nothing to report.
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let quiet = Gateway::start(&yaml);
    assert!(!quiet.log().contains("chmod 600"), "{}", quiet.log());
}
