//! Routing-core micro-benchmarks (targets from the routing-core issue):
//! - route(), jump, 16 shards, cap and buckets on, 1 000 tenants: ≤ 75 ns;
//!   the same with 10 plans and 100 000 tenants mapped: within 5 % of it
//! - route(), rendezvous and hrw, 64 shards with a load hook: ≤ 1 µs
//! - domain resolve, exact / wildcard / fallback, 10 000 entries: ≤ 60 ns
//! - admit + release, 2 threads on distinct tenants: ≥ 1.8× one thread
//! - route() with a client address, per-client limits off and on (issue
//!   38: off costs nothing), and the memory 100 000 invented client
//!   addresses take (printed)

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use shardgate::limits::{Limits, RateRule};
use shardgate::routing::{
    DomainMap, Fallback, HashStrategy, Load, RouteRequest, Router, RouterOptions, Shard, ShardId,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn tenants(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("tenant-{i}")).collect()
}

fn shards(n: usize) -> Vec<Shard> {
    (0..n)
        .map(|i| {
            Shard::new(format!("shard-{i:02}"), format!("http://10.0.0.{i}:3000"))
                .with_weight(1.0 + (i % 4) as f64)
        })
        .collect()
}

/// Limits that are on but never run dry at benchmark rates.
fn limits() -> Limits {
    Limits::new(
        Some(1_000),
        RateRule::new(1e12, 1e12),
        [("/api/export".to_string(), RateRule::new(1e12, 1e12))],
    )
}

fn bench_jump(c: &mut Criterion) {
    let router = Router::new(RouterOptions {
        shards: shards(16),
        limits: limits(),
        ..Default::default()
    });
    let tenants = tenants(1_000);
    let mut i = 0;
    let mut g = c.benchmark_group("route");
    g.throughput(Throughput::Elements(1));
    g.bench_function("jump_16_shards_limits_on_1000_tenants", |b| {
        b.iter(|| {
            i = (i + 1) % tenants.len();
            let r = router.route(&RouteRequest::new(&tenants[i]));
            black_box(r.decision);
        })
    });
    // The same with tenant plans (DESIGN §6): 10 plans, 100 000 tenants
    // mapped to them (the routed ones among them), the rest on none.
    let plans = Router::new(RouterOptions {
        shards: shards(16),
        limits: limits(),
        plans: (0..10)
            .map(|p| (format!("plan-{p}").into(), limits()))
            .collect(),
        plan_tenants: (tenants
            .iter()
            .cloned()
            .chain((1_000..100_000).map(|i| format!("mapped-{i}"))))
        .enumerate()
        .map(|(n, t)| (t.into(), (n % 10) as u16))
        .collect(),
        ..Default::default()
    });
    g.bench_function(
        "jump_16_shards_limits_on_1000_tenants_10_plans_100000_mapped",
        |b| {
            b.iter(|| {
                i = (i + 1) % tenants.len();
                let r = plans.route(&RouteRequest::new(&tenants[i]));
                black_box(r.decision);
            })
        },
    );
    g.finish();
}

fn bench_rendezvous(c: &mut Criterion) {
    let tenants = tenants(1_000);
    let mut g = c.benchmark_group("route");
    g.throughput(Throughput::Elements(1));
    for (name, hash) in [
        ("rendezvous", HashStrategy::Rendezvous),
        ("hrw", HashStrategy::Hrw),
    ] {
        let loads: Arc<Vec<f64>> = Arc::new((0..64).map(|i| 1.0 + (i % 7) as f64).collect());
        let hook = move |id: &ShardId| {
            let n: usize = id.as_str()[6..].parse().unwrap_or(0);
            loads[n % loads.len()]
        };
        let router = Router::new(RouterOptions {
            shards: shards(64),
            limits: limits(),
            hash,
            load: Load::Hook(Arc::new(hook)),
            ..Default::default()
        });
        let mut i = 0;
        g.bench_function(format!("{name}_64_shards_load_hook"), |b| {
            b.iter(|| {
                i = (i + 1) % tenants.len();
                let r = router.route(&RouteRequest::new(&tenants[i]));
                black_box(r.decision);
            })
        });
    }
    g.finish();
}

fn bench_domains(c: &mut Criterion) {
    let mut entries: Vec<(String, String)> = (0..9_000)
        .map(|i| (format!("app{i}.customer{i}.com"), format!("tenant-{i}")))
        .collect();
    entries.extend((0..1_000).map(|i| (format!("*.wild{i}.net"), format!("wild-{i}"))));
    let map = DomainMap::from_entries(entries, Fallback::suffix(".apps.example.com")).unwrap();
    let exact: Vec<String> = (0..1_000)
        .map(|i| format!("app{}.customer{}.com", i * 9, i * 9))
        .collect();
    let wildcard: Vec<String> = (0..1_000).map(|i| format!("www.wild{i}.net")).collect();
    let fallback: Vec<String> = (0..1_000)
        .map(|i| format!("t{i}.apps.example.com"))
        .collect();
    let mut g = c.benchmark_group("domain_resolve_10k");
    g.throughput(Throughput::Elements(1));
    for (name, hosts) in [
        ("exact", &exact),
        ("wildcard", &wildcard),
        ("fallback", &fallback),
    ] {
        let mut i = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) % hosts.len();
                black_box(map.resolve(&hosts[i]).map(|r| r.matched))
            })
        });
    }
    g.finish();
}

/// Long-lived worker threads (as Pingora's are), each with its own tenants,
/// doing admit + release on command.
struct Workers {
    orders: Vec<std::sync::mpsc::Sender<u64>>,
    done: std::sync::mpsc::Receiver<()>,
}

impl Workers {
    fn start(router: &Arc<Router>, threads: usize) -> Workers {
        let (done_tx, done) = std::sync::mpsc::channel();
        let orders = (0..threads)
            .map(|t| {
                let (tx, rx) = std::sync::mpsc::channel::<u64>();
                let router = Arc::clone(router);
                let done_tx = done_tx.clone();
                std::thread::spawn(move || {
                    let tenants: Vec<String> = (0..500).map(|i| format!("t{t}-{i}")).collect();
                    let mut next = 0;
                    while let Ok(n) = rx.recv() {
                        for _ in 0..n {
                            next = (next + 1) % tenants.len();
                            let r = router.admit(&RouteRequest::new(&tenants[next]));
                            black_box(r.shard_id());
                        }
                        if done_tx.send(()).is_err() {
                            return;
                        }
                    }
                });
                tx
            })
            .collect();
        Workers { orders, done }
    }

    /// Runs `iters` operations split over the workers; wall time for all.
    fn run(&self, iters: u64) -> Duration {
        let per_thread = iters.div_ceil(self.orders.len() as u64);
        let start = Instant::now();
        for o in &self.orders {
            o.send(per_thread).expect("worker alive");
        }
        for _ in &self.orders {
            self.done.recv().expect("worker alive");
        }
        start.elapsed()
    }
}

fn bench_scaling(c: &mut Criterion) {
    let router = Arc::new(Router::new(RouterOptions {
        shards: shards(16),
        limits: limits(),
        ..Default::default()
    }));
    let mut g = c.benchmark_group("admit_release");
    g.throughput(Throughput::Elements(1));
    for threads in [1, 2] {
        let workers = Workers::start(&router, threads);
        g.bench_function(format!("{threads}_threads"), |b| {
            b.iter_custom(|iters| workers.run(iters))
        });
    }
    g.finish();
}

/// One client address of 10 000 (IPv4) per call.
fn client_of(i: usize) -> std::net::IpAddr {
    std::net::Ipv4Addr::from(0x0a00_0000 + (i % 10_000) as u32).into()
}

fn bench_per_client(c: &mut Criterion) {
    let tenants = tenants(1_000);
    let mut g = c.benchmark_group("route");
    g.throughput(Throughput::Elements(1));
    for (name, per_client) in [("off", None), ("on", Some(RateRule::new(1e12, 1e12)))] {
        let limits = per_client.map_or_else(limits, |rule| limits().with_per_client(rule));
        let router = Router::new(RouterOptions {
            shards: shards(16),
            limits,
            ..Default::default()
        });
        let mut i = 0;
        g.bench_function(
            format!("jump_1000_tenants_10000_clients_per_client_{name}"),
            |b| {
                b.iter(|| {
                    i += 1;
                    let request = RouteRequest::new(&tenants[i % 1_000]).client(client_of(i));
                    black_box(router.route(&request).decision);
                })
            },
        );
    }
    // Only when chosen: what 100 000 invented addresses hold (printed),
    // then what finding one among them costs.
    g.bench_function("per_client_memory_100000_invented", |b| {
        static MEMORY: std::sync::OnceLock<Router> = std::sync::OnceLock::new();
        let router = MEMORY.get_or_init(report_client_memory);
        let mut i = 0u32;
        b.iter(|| {
            i = (i + 1) % 100_000;
            let client = std::net::Ipv4Addr::from(0x0b00_0000 + i).into();
            black_box(
                router
                    .explain(&RouteRequest::new("acme").client(client))
                    .decision,
            );
        })
    });
    g.finish();
}

/// Resident memory of this process (KiB), from /proc.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (status.lines())
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Prints what 100 000 invented client addresses of one tenant hold:
/// buckets that never refill, so none may be forgotten below the bound.
fn report_client_memory() -> Router {
    let router = Router::new(RouterOptions {
        shards: shards(16),
        limits: Limits::default().with_per_client(RateRule::new(5.0, 0.0)),
        ..Default::default()
    });
    let before = rss_kib();
    for i in 0..100_000u32 {
        let client = std::net::Ipv4Addr::from(0x0b00_0000 + i).into();
        black_box(
            router
                .route(&RouteRequest::new("acme").client(client))
                .decision,
        );
    }
    let grown = rss_kib().saturating_sub(before) * 1024;
    let tracked = router.client_count();
    eprintln!(
        "per_client: {tracked} clients tracked, RSS +{} KiB, {} bytes per client (slot {} bytes)",
        grown / 1024,
        grown / tracked.max(1) as u64,
        shardgate::limits::SLOT_BYTES,
    );
    router
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench_jump, bench_rendezvous, bench_domains, bench_scaling, bench_per_client
}
criterion_main!(benches);
