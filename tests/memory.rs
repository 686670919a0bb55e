//! Bounded tenant state: tenants that are idle with full buckets are
//! forgotten, which keeps the table bounded under invented tenant ids and
//! changes no decision; past `limits.max_tracked_tenants`, the least
//! recently seen idle tenants go too (buckets that never refill).

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

#[test]
fn buckets_that_never_refill_are_bounded_least_recently_seen_first() {
    // A one-off allowance: a spent bucket is never full again, so only the
    // bound forgets it.
    let clock = Arc::new(ManualClock::new(0.0));
    let router = Router::new(RouterOptions {
        shards: shards(),
        limits: Limits::new(None, RateRule::new(1.0, 0.0), []),
        clock: clock.clone(),
        max_tracked_tenants: 6_400,
        ..Default::default()
    });
    // A tenant that keeps coming back spends its one token, then is
    // refused: it stays the most recently seen.
    let regular = RouteRequest::new("regular");
    assert!(router.route(&regular).is_allowed());
    let mut peak = 0;
    for i in 0..200_000u32 {
        let tenant = format!("x{i:x}");
        assert!(router.route(&RouteRequest::new(&tenant)).is_allowed());
        clock.advance(1.0);
        if i % 100 == 0 {
            assert!(!router.route(&regular).is_allowed(), "a fresh allowance");
        }
        if i % 1_000 == 0 {
            peak = peak.max(router.tenant_count());
        }
    }
    peak = peak.max(router.tenant_count());
    eprintln!("peak tenant table: {peak} entries after 200 000 one-off tenants (bound 6 400)");
    // Each of the 64 table shards holds 100 at most, plus one before it
    // sweeps.
    assert!(peak <= 6_400 + 64, "tenant table grew to {peak}");
    assert!(peak >= 4_800, "the bound is not a floor: {peak}");
    // The least recently seen went first: the newest tenants are still
    // known (their token spent), the oldest were forgotten (a new
    // allowance, which is the bound's price).
    assert!(!router
        .route(&RouteRequest::new(&format!("x{:x}", 199_999)))
        .is_allowed());
    assert!(router.route(&RouteRequest::new("x0")).is_allowed());
}

#[test]
fn tenants_holding_admissions_are_never_forgotten_by_the_bound() {
    let clock = Arc::new(ManualClock::new(0.0));
    let router = Router::new(RouterOptions {
        shards: shards(),
        limits: Limits::new(Some(1), RateRule::new(1.0, 0.0), []),
        clock: clock.clone(),
        max_tracked_tenants: 64,
        ..Default::default()
    });
    let held = router.admit(&RouteRequest::new("held"));
    assert!(held.is_allowed());
    for i in 0..10_000u32 {
        let tenant = format!("x{i:x}");
        let _ = router.route(&RouteRequest::new(&tenant));
        clock.advance(1.0);
    }
    // Still capped: its admission (and its state) survived the bound.
    assert!(!router.admit(&RouteRequest::new("held")).is_allowed());
    drop(held);
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

mod common;

/// The resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn invented_tenants_with_long_names_are_refused_and_hold_no_memory() {
    use common::{exchange, Gateway, RawBackend};
    use std::time::Duration;
    let backend = RawBackend::start();
    // Buckets that never refill: a tenant, once seen, is never forgotten
    // as idle (only the table's bound would).
    let gw = Gateway::start(&format!(
        "listen: [{{ addr: \"127.0.0.1:{{port}}\" }}]\nadmin: {{ addr: \"127.0.0.1:{{admin}}\" }}\nstate: false\n\
         shards:\n  - {{ id: raw, url: \"{}\" }}\ndomains:\n  fallback_suffix: .localhost\n\
         limits: {{ rate: {{ tokens: 5, refill_per_second: 0 }} }}\nlog: {{ access: off }}\n",
        backend.url()
    ));
    // 4 000 bytes: one label, or labels of 63 (the first one the tenant).
    let name = |i: usize| {
        let id = format!("t{i:07}");
        match i % 2 {
            0 => format!("{id}{}", "a".repeat(4000 - id.len())),
            _ => {
                let label = format!("{id}{}", "b".repeat(63 - id.len()));
                let mut name = vec![label.as_str(); 4000 / 64].join(".");
                name.push_str(&".c".repeat((4000 - name.len()) / 2));
                name
            }
        }
    };
    let port = gw.port;
    let wave = |n: usize| {
        let threads: Vec<_> = (0..8)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
                    for i in (t..5_000).step_by(8) {
                        let raw = format!(
                            "GET / HTTP/1.1\r\nHost: {}.localhost\r\nConnection: close\r\n\r\n",
                            name(n * 5_000 + i)
                        );
                        let (got, _) = exchange(port, raw.as_bytes(), Duration::from_secs(2));
                        *statuses
                            .entry(got.first().copied().unwrap_or(0))
                            .or_default() += 1;
                    }
                    statuses
                })
            })
            .collect();
        let mut all = std::collections::BTreeMap::<u16, usize>::new();
        for t in threads {
            for (status, count) in t.join().expect("wave") {
                *all.entry(status).or_default() += count;
            }
        }
        all
    };
    let mut rss = Vec::new();
    for n in 0..4 {
        let statuses = wave(n);
        rss.push(rss_kib(gw.pid()));
        eprintln!("wave {n}: {statuses:?}, RSS {} KiB", rss[n]);
        assert_eq!(statuses.get(&400), Some(&5_000), "wave {n}: {statuses:?}");
    }
    assert!(backend.seen().is_empty());
    // From the first wave on (the allocator warm), flat.
    let grown = rss[3].saturating_sub(rss[0]);
    assert!(
        grown < 8 * 1024,
        "RSS grew {grown} KiB over 15 000 invented tenants"
    );
}

/// Silent connections (accepted, nothing sent yet) and idle keep-alive
/// ones (one request served, waiting for the next) hold no buffer and no
/// request's state: Pingora's accept loop held 8.8 KiB per connection in
/// its task, and the state of a request's service was held between
/// requests (13 and 22 KiB per socket, release build; 2.1 and 1.7 now).
#[test]
fn silent_and_idle_connections_hold_little_memory() {
    use common::{Gateway, RawBackend};
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;
    const SOCKETS: usize = 2_000;
    let backend = RawBackend::start();
    let gw = Gateway::start(&format!(
        "listen: [{{ addr: \"127.0.0.1:{{port}}\" }}]\nadmin: {{ addr: \"127.0.0.1:{{admin}}\" }}\nstate: false\n\
         shards:\n  - {{ id: raw, url: \"{}\" }}\ndomains:\n  fallback_suffix: .localhost\n\
         limits: {{ header_timeout_ms: 120000, keepalive_timeout_ms: 120000 }}\nlog: {{ access: off }}\n",
        backend.url()
    ));
    let request = b"GET / HTTP/1.1\r\nHost: t.localhost\r\n\r\n";
    // One answer, read whole (the raw backend's answers are short).
    let answered = |s: &mut TcpStream| {
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut chunk).expect("answer");
            assert!(n > 0, "closed before an answer");
            got.extend_from_slice(&chunk[..n]);
        }
        assert!(
            got.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&got)
        );
        // The body (Content-Length) with it or just after: let it land.
        std::thread::sleep(Duration::from_millis(1));
        let _ = s.set_nonblocking(true);
        let _ = s.read(&mut chunk);
        let _ = s.set_nonblocking(false);
    };
    // Warm: lazy state and the allocator's first pages in the baseline.
    let mut warm = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    warm.write_all(request).expect("send");
    answered(&mut warm);
    drop(warm);
    std::thread::sleep(Duration::from_millis(500));
    let per_socket = |idle: bool| {
        let before = rss_kib(gw.pid());
        let mut sockets = Vec::new();
        for _ in 0..SOCKETS {
            let mut s = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            if idle {
                s.write_all(request).expect("send");
                answered(&mut s);
            }
            sockets.push(s);
        }
        std::thread::sleep(Duration::from_secs(1));
        let after = rss_kib(gw.pid());
        // Still served: the gateway kept every one open.
        let last = sockets.last_mut().expect("a socket");
        last.write_all(request).expect("send");
        answered(last);
        after.saturating_sub(before) * 1024 / SOCKETS as u64
    };
    let silent = per_socket(false);
    let idle = per_socket(true);
    eprintln!("bytes per socket: silent {silent}, idle {idle}");
    // Debug build: futures and frames larger than release's.
    assert!(silent < 4 * 1024, "{silent} bytes per silent socket");
    assert!(idle < 4 * 1024, "{idle} bytes per idle socket");
}
