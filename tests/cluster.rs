//! Cluster mode (DESIGN §4) with real processes: a Redis (or a three-master
//! Redis Cluster) started on free loopback ports, and three gateway
//! processes sharing the same shards.

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "cluster-admin-token";

/// Three masters, no replicas, slots spread by `redis-cli --cluster create`.
struct RedisCluster {
    nodes: Vec<Redis>,
}

impl RedisCluster {
    fn start() -> RedisCluster {
        let nodes: Vec<Redis> = (0..3)
            .map(|_| {
                Redis::cluster_node(&["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let status = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .arg("--cluster-yes")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli");
        assert!(status.success(), "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = nodes.iter().all(|n| {
                Command::new("redis-cli")
                    .arg("-p")
                    .arg(n.port.to_string())
                    .arg("cluster")
                    .arg("info")
                    .output()
                    .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
            });
            if ok {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the Redis Cluster did not become ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        RedisCluster { nodes }
    }

    fn yaml(&self) -> String {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("\"{}\"", n.url()))
            .collect();
        format!("[{}]", urls.join(", "))
    }
}

/// A gateway node of the cluster on `redis` (a quoted URL or a list).
fn node(redis: &str, id: &str, shards: &[(&str, String)], extra: &str) -> Gateway {
    std::env::set_var("SHARDGATE_TEST_TOKEN", TOKEN);
    Gateway::start(&config_yaml(
        &format!(
            "listen: [{{ addr: \"127.0.0.1:{{port}}\" }}]\n\
             admin: {{ addr: \"127.0.0.1:{{admin}}\", token_env: SHARDGATE_TEST_TOKEN }}\n\
             cluster: {{ redis: {redis}, node_id: {id}, key_prefix: \"t{}:\", sync_interval_ms: 50 }}\n",
            std::process::id()
        ),
        shards,
        extra,
    ))
}

fn three(redis: &str, shards: &[(&str, String)], extra: &str) -> Vec<Gateway> {
    let nodes: Vec<Gateway> = ["gw-1", "gw-2", "gw-3"]
        .iter()
        .map(|id| node(redis, id, shards, extra))
        .collect();
    for n in &nodes {
        wait_for(Duration::from_secs(5), "three nodes alive", || {
            cluster(n)["nodes_alive"] == 3.0
        });
    }
    nodes
}

fn cluster(gw: &Gateway) -> serde_json::Value {
    gw.admin("GET", "/v1/cluster", None, Some(TOKEN)).json()
}

/// The identity among the nodes of `gw`'s process (configured with
/// `node_id`): the node_id and the process id, as its heartbeat shows.
fn identity(gw: &Gateway, node_id: &str) -> String {
    let mine = format!("{node_id}#{}", gw.pid());
    let nodes = cluster(gw)["nodes"].clone();
    let listed = (nodes.as_array().into_iter().flatten()).any(|n| n["id"] == mine.as_str());
    assert!(listed, "{mine} not among {nodes}");
    mine
}

fn wait_for(within: Duration, what: &str, mut ok: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !ok() {
        assert!(started.elapsed() < within, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

/// Sends one tenant's requests round-robin over the nodes for `secs`
/// seconds, one every `every`; returns (admitted, refused, elapsed secs).
fn spread(nodes: &[Gateway], host: &str, secs: f64, every: Duration) -> (u32, u32, f64) {
    let started = Instant::now();
    let (mut admitted, mut refused) = (0, 0);
    let mut i = 0;
    while started.elapsed().as_secs_f64() < secs {
        let sent = Instant::now();
        let r = nodes[i % nodes.len()].get(host, "/");
        match r.status {
            200 => admitted += 1,
            429 => refused += 1,
            other => panic!("unexpected status {other}: {}", r.text()),
        }
        i += 1;
        if let Some(rest) = every.checked_sub(sent.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    (admitted, refused, started.elapsed().as_secs_f64())
}

/// The slack the README states for `n` nodes: one bucket's capacity
/// (credit opened by nodes without a lease) plus one refill interval per
/// node.
fn slack(tokens: f64, refill: f64, n: f64) -> f64 {
    tokens + n * refill * 0.05
}

fn assert_one_bucket(nodes: &[Gateway], tokens: f64, refill: f64) {
    let (admitted, refused, secs) = spread(nodes, "busy.localhost", 3.0, Duration::from_millis(5));
    let ideal = tokens + refill * secs;
    let admitted = f64::from(admitted);
    eprintln!("admitted {admitted} refused {refused} in {secs:.2}s; one bucket: {ideal:.1}");
    assert!(refused > 0, "the bucket was never exhausted");
    assert!(
        admitted <= ideal + slack(tokens, refill, 3.0),
        "admitted {admitted} > one bucket's {ideal:.1} + slack"
    );
    // Three separate buckets would admit about three times as much; a
    // starved node (no lease top-up) would admit far less.
    assert!(
        admitted >= 0.8 * ideal,
        "admitted {admitted}, far below one bucket's {ideal:.1}"
    );
}

const BUCKET: &str = "limits:\n  rate: { tokens: 20, refill_per_second: 10 }\n";

#[test]
fn one_tenant_spread_over_three_nodes_is_admitted_as_one_bucket() {
    let redis = Redis::start();
    let a = Backend::start("a");
    let nodes = three(&format!("\"{}\"", redis.url()), &[("a", a.url())], BUCKET);
    assert_one_bucket(&nodes, 20.0, 10.0);
}

#[test]
fn the_same_bucket_holds_on_a_three_master_redis_cluster() {
    let redis = RedisCluster::start();
    let a = Backend::start("a");
    let nodes = three(&redis.yaml(), &[("a", a.url())], BUCKET);
    assert_one_bucket(&nodes, 20.0, 10.0);
    assert_eq!(cluster(&nodes[0])["redis"]["up"], true);
}

#[test]
fn a_cap_held_on_one_node_refuses_on_another_and_a_dead_node_frees_it() {
    let redis = Redis::start();
    let slow = Backend::with("slow", |_| {
        Reply::After(Duration::from_secs(4), Box::new(Reply::ok("{}")))
    });
    let mut nodes = three(
        &format!("\"{}\"", redis.url()),
        &[("slow", slow.url())],
        "limits:\n  connection_cap: 4\n",
    );
    let port = nodes[0].port;
    // Held open on node 1 (which is killed under them: no answer needed).
    let held: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
                let _ = s.write_all(
                    b"GET / HTTP/1.1\r\nHost: capped.localhost\r\nConnection: close\r\n\r\n",
                );
                let _ = s.read_to_end(&mut Vec::new());
            })
        })
        .collect();
    wait_for(Duration::from_secs(2), "four admissions on node 1", || {
        slow.count() == 4
    });
    // Nodes 2 and 3 each learn node 1's admissions within a settle or
    // two, on their own clocks (the explain endpoint spends nothing).
    for node in &nodes[1..] {
        wait_for(
            Duration::from_secs(2),
            "nodes 2 and 3 see node 1's admissions",
            || {
                node.admin("GET", "/v1/route?tenant=capped", None, Some(TOKEN))
                    .json()["decision"]
                    == "capped"
            },
        );
    }
    assert_eq!(
        nodes[1].get("capped.localhost", "/").status,
        429,
        "the fifth, on node 2"
    );
    assert_eq!(
        nodes[2].get("capped.localhost", "/").status,
        429,
        "the fifth, on node 3"
    );
    nodes[0].kill9();
    let freed = wait_for(
        Duration::from_secs(3),
        "node 2 admits after node 1 died",
        || {
            let port = nodes[1].port;
            // A request that does not wait for the slow shard to answer: a
            // refusal comes at once, an admission is seen by the shard.
            let before = slow.count();
            let t = std::thread::spawn(move || {
                send_raw(
                    port,
                    b"GET / HTTP/1.1\r\nHost: capped.localhost\r\nConnection: close\r\n\r\n",
                )
                .status
            });
            std::thread::sleep(Duration::from_millis(100));
            let admitted = slow.count() > before;
            if !admitted {
                let _ = t.join();
            }
            admitted
        },
    );
    eprintln!("freed after {freed:?}");
    assert!(
        freed <= Duration::from_millis(2500),
        "node 1's admissions freed in {freed:?}"
    );
    for h in held {
        let _ = h.join();
    }
}

#[test]
fn admin_changes_on_one_node_reach_the_others_within_a_second() {
    let redis = Redis::start();
    let (a, b) = (Backend::start("a"), Backend::start("b"));
    let nodes = three(
        &format!("\"{}\"", redis.url()),
        &[("a", a.url()), ("b", b.url())],
        "",
    );
    let draining = |gw: &Gateway| {
        gw.admin("GET", "/v1/shards", None, Some(TOKEN))
            .json()
            .as_array()
            .is_some_and(|all| all.iter().any(|s| s["id"] == "a" && s["draining"] == true))
    };
    assert!(!draining(&nodes[1]));
    assert_eq!(
        nodes[0]
            .admin("POST", "/v1/shards/a/drain", None, Some(TOKEN))
            .status,
        200
    );
    let took = wait_for(
        Duration::from_secs(1),
        "drain seen on nodes 2 and 3",
        || draining(&nodes[1]) && draining(&nodes[2]),
    );
    eprintln!("drain shared in {took:?}");
    let put = nodes[2].admin(
        "PUT",
        "/v1/domains/shop.example.com",
        Some("{\"tenant\":\"shop\"}"),
        Some(TOKEN),
    );
    assert_eq!(put.status, 200);
    let took = wait_for(
        Duration::from_secs(1),
        "domain seen on nodes 1 and 2",
        || {
            nodes[..2].iter().all(|n| {
                let r = n.get("shop.example.com", "/");
                r.status == 200 && r.text().contains("\"tenant\":\"shop\"")
            })
        },
    );
    eprintln!("domain shared in {took:?}");
    assert_eq!(
        nodes[1]
            .admin("PUT", "/v1/tenants/bad/deny", None, Some(TOKEN))
            .status,
        200
    );
    wait_for(Duration::from_secs(1), "deny seen on node 3", || {
        nodes[2].get("bad.localhost", "/").status == 403
    });
}

#[test]
fn the_first_region_assignment_is_the_one_every_node_uses() {
    let redis = Redis::start();
    let (eu, us) = (Backend::start("eu"), Backend::start("us"));
    let shards = "shards:\n  - { id: eu, url: \"EU\", region: eu }\n  - { id: us, url: \"US\", region: us }\n";
    // Each node's own pick would differ (weights say so): node 1 puts new
    // tenants in eu, node 2 in us.
    let start = |id: &str, eu_weight: u32| {
        std::env::set_var("SHARDGATE_TEST_TOKEN", TOKEN);
        Gateway::start(&format!(
            "listen: [{{ addr: \"127.0.0.1:{{port}}\" }}]\n\
                 admin: {{ addr: \"127.0.0.1:{{admin}}\", token_env: SHARDGATE_TEST_TOKEN }}\n\
                 cluster: {{ redis: \"{}\", node_id: {id}, key_prefix: \"r{}:\" }}\n\
                 regions:\n  - {{ id: eu, weight: {eu_weight} }}\n  - {{ id: us, weight: {} }}\n\
                 {}domains:\n  fallback_suffix: .localhost\n",
            redis.url(),
            std::process::id(),
            1 - eu_weight,
            shards.replace("EU", &eu.url()).replace("US", &us.url()),
        ))
    };
    let one = start("gw-1", 1);
    let two = start("gw-2", 0);
    // Each node knows the other's list differs: a node that has not seen
    // the other yet shares nothing (README: the price of a node joining).
    wait_for(
        Duration::from_secs(5),
        "both nodes see the lists differ",
        || cluster(&one)["region_lists"] == "differ" && cluster(&two)["region_lists"] == "differ",
    );
    assert!(one
        .get("t1.localhost", "/")
        .text()
        .contains("\"shard\":\"eu\""));
    let region = |gw: &Gateway, t: &str| {
        gw.admin("GET", &format!("/v1/route?tenant={t}"), None, Some(TOKEN))
            .json()["region"]
            .clone()
    };
    wait_for(Duration::from_secs(2), "node 2 knows t1's region", || {
        region(&two, "t1") == "eu"
    });
    let r = two.get("t1.localhost", "/");
    assert!(
        r.text().contains("\"shard\":\"eu\""),
        "node 2 routes to the first assignment: {}",
        r.text()
    );
    // And the other way round: node 2 first.
    assert!(two
        .get("t2.localhost", "/")
        .text()
        .contains("\"shard\":\"us\""));
    wait_for(Duration::from_secs(2), "node 1 knows t2's region", || {
        region(&one, "t2") == "us"
    });
    assert!(one
        .get("t2.localhost", "/")
        .text()
        .contains("\"shard\":\"us\""));
}

#[test]
fn redis_down_under_load_delays_nothing_and_redis_back_is_settled() {
    let mut redis = Redis::start();
    let a = Backend::start("a");
    let nodes = three(
        &format!("\"{}\"", redis.url()),
        &[("a", a.url())],
        "limits:\n  rate: { tokens: 30, refill_per_second: 30 }\n",
    );
    let metric = |gw: &Gateway, name: &str| -> f64 {
        let text = gw.admin("GET", "/metrics", None, None).text();
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1.0)
    };
    assert_eq!(metric(&nodes[0], "shardgate_cluster_redis_up"), 1.0);
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut slowest = Duration::ZERO;
            let mut statuses = std::collections::BTreeMap::<u16, u32>::new();
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let sent = Instant::now();
                let r = send_raw(
                    ports[i % 3],
                    format!(
                        "GET / HTTP/1.1\r\nHost: t{}.localhost\r\nConnection: close\r\n\r\n",
                        i % 5
                    )
                    .as_bytes(),
                );
                slowest = slowest.max(sent.elapsed());
                *statuses.entry(r.status).or_default() += 1;
                i += 1;
                // Steady load, short of exhausting loopback's ephemeral
                // ports (each request is a new connection).
                std::thread::sleep(Duration::from_micros(500));
            }
            (slowest, statuses)
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    redis.kill9();
    wait_for(
        Duration::from_secs(3),
        "the gauge says Redis is down",
        || {
            nodes
                .iter()
                .all(|n| metric(n, "shardgate_cluster_redis_up") == 0.0)
        },
    );
    assert_eq!(
        cluster(&nodes[1])["mode"],
        "shared",
        "local-share keeps limits on"
    );
    std::thread::sleep(Duration::from_millis(1000));
    // Local share: a tenant gets 1/3 of its bucket on each node.
    let (admitted, _, secs) = spread(&nodes[..1], "solo.localhost", 1.0, Duration::from_millis(5));
    let share = (30.0 + 30.0 * secs) / 3.0;
    assert!(
        f64::from(admitted) <= share + 2.0,
        "one node alone admitted {admitted}, its local share is {share:.1}"
    );
    redis.restart();
    wait_for(
        Duration::from_secs(5),
        "the gauge says Redis is back",
        || {
            nodes
                .iter()
                .all(|n| metric(n, "shardgate_cluster_redis_up") == 1.0)
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (slowest, statuses) = load.join().expect("load thread");
    eprintln!("slowest {slowest:?}, statuses {statuses:?}");
    assert!(
        statuses.keys().all(|s| *s == 200 || *s == 429),
        "every request answered 200 or 429: {statuses:?}"
    );
    // A request that waited on Redis would take its 1 s timeout; below
    // that, the margin is for this machine's scheduling.
    assert!(
        slowest < Duration::from_millis(800),
        "a request waited {slowest:?}"
    );
    assert!(metric(&nodes[0], "shardgate_cluster_sync_errors_total") > 0.0);
    // Settled again: the spread tenant is back to one bucket, and a tenant
    // that spent while Redis was down is not left starving.
    assert_one_bucket(&nodes, 30.0, 30.0);
    let solo = (0..20)
        .filter(|_| {
            std::thread::sleep(Duration::from_millis(25));
            nodes[0].get("solo.localhost", "/").status == 200
        })
        .count();
    assert!(
        solo >= 5,
        "solo admitted {solo} of 20 after Redis came back"
    );
}

#[test]
fn a_malformed_cluster_section_names_the_field() {
    let out = Command::new(env!("CARGO_BIN_EXE_shardgate"))
        .arg("-t")
        .arg("-c")
        .arg({
            let dir = std::env::temp_dir().join(format!("sg-cluster-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("dir");
            let path = dir.join("bad.yaml");
            std::fs::write(
                &path,
                "listen: [{ addr: \"127.0.0.1:1\" }]\nshards: [{ id: a, url: \"http://127.0.0.1:2\" }]\ndomains: { fallback_suffix: .localhost }\ncluster: { redis: \"http://x\", on_redis_down: maybe, sync_interval_ms: 0 }\n",
            )
            .expect("write");
            path
        })
        .output()
        .expect("run shardgate -t");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for field in [
        "cluster.redis",
        "cluster.on_redis_down",
        "cluster.sync_interval_ms",
    ] {
        assert!(err.contains(field), "`{field}` named in: {err}");
    }
}

/// `redis-cli` against `redis`; its output, trimmed.
fn redis_cli(redis: &Redis, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(redis.port.to_string())
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn redis_count(redis: &Redis, args: &[&str]) -> u64 {
    redis_cli(redis, args).parse().unwrap_or(u64::MAX)
}

/// One request for each of `n` invented tenants `<prefix><i>.localhost`,
/// pipelined 500 to a connection; the statuses.
fn invent(port: u16, prefix: &str, n: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for start in (0..n).step_by(500) {
        let end = (start + 500).min(n);
        let mut raw = String::new();
        for i in start..end {
            let close = if i + 1 == end {
                "Connection: close\r\n"
            } else {
                ""
            };
            raw.push_str(&format!(
                "GET / HTTP/1.1\r\nHost: {prefix}{i}.localhost\r\n{close}\r\n"
            ));
        }
        statuses.extend(exchange(port, raw.as_bytes(), Duration::from_secs(20)).0);
    }
    statuses
}

/// A cluster node with two regions of equal weight.
fn regional(redis: &Redis, id: &str, eu: &Backend, us: &Backend, extra: &str) -> Gateway {
    regional_weighted(redis, id, eu, us, "1", extra)
}

/// A cluster node with regions eu (weight 1) and us (`us_weight`).
fn regional_weighted(
    redis: &Redis,
    id: &str,
    eu: &Backend,
    us: &Backend,
    us_weight: &str,
    extra: &str,
) -> Gateway {
    std::env::set_var("SHARDGATE_TEST_TOKEN", TOKEN);
    Gateway::start(&format!(
        "listen: [{{ addr: \"127.0.0.1:{{port}}\" }}]\n\
         admin: {{ addr: \"127.0.0.1:{{admin}}\", token_env: SHARDGATE_TEST_TOKEN }}\n\
         cluster: {{ redis: \"{}\", node_id: {id}, key_prefix: \"b{}:\" }}\n\
         regions:\n  - {{ id: eu }}\n  - {{ id: us, weight: {us_weight} }}\n\
         shards:\n  - {{ id: eu, url: \"{}\", region: eu }}\n  - {{ id: us, url: \"{}\", region: us }}\n\
         domains:\n  fallback_suffix: .localhost\n{extra}",
        redis.url(),
        std::process::id(),
        eu.url(),
        us.url(),
    ))
}

#[test]
fn invented_tenants_cost_redis_nothing_while_the_nodes_agree_on_regions() {
    let redis = Redis::start();
    let (eu, us) = (Backend::start("eu"), Backend::start("us"));
    let limits =
        "limits:\n  max_tracked_tenants: 640\n  rate: { tokens: 5, refill_per_second: 50 }\n";
    let one = regional(&redis, "gw-1", &eu, &us, limits);
    let two = regional(&redis, "gw-2", &eu, &us, limits);
    // The nodes read each other's region lists (once a second).
    wait_for(
        Duration::from_secs(5),
        "both nodes see the lists agree",
        || cluster(&one)["region_lists"] == "agree" && cluster(&two)["region_lists"] == "agree",
    );
    let prefix = format!("b{}:", std::process::id());
    // A few invented tenants, within the table's bound: once idle their
    // buckets go back full, and their keys go with their leases.
    assert!(invent(one.port, "few-", 150).iter().all(|s| *s == 200));
    wait_for(
        Duration::from_secs(5),
        "the invented tenants' keys gone",
        || redis_cli(&redis, &["--scan", "--pattern", &format!("{prefix}t:*")]).is_empty(),
    );
    // Many more, through a small bound.
    let statuses = invent(one.port, "made-up-", 6000);
    assert_eq!(statuses.len(), 6000);
    assert!(
        statuses.iter().all(|s| *s == 200),
        "every invented tenant is served"
    );
    let regions = format!("{prefix}{{state}}:regions");
    let log = format!("{prefix}{{state}}:assigned");
    assert_eq!(
        redis_count(&redis, &["HLEN", &regions]),
        0,
        "no assignment in Redis"
    );
    assert_eq!(
        redis_count(&redis, &["XLEN", &log]),
        0,
        "no assignment logged"
    );
    // Both nodes route a tenant to the same region without Redis' help.
    for t in ["made-up-17", "made-up-4242", "someone-new"] {
        let region = |gw: &Gateway| {
            gw.admin("GET", &format!("/v1/route?tenant={t}"), None, Some(TOKEN))
                .json()["region"]
                .clone()
        };
        assert_eq!(region(&one), region(&two), "{t}");
    }
    // Memory: the directory and the tenant table keep to their bounds.
    let metrics = one.admin("GET", "/v1/metrics", None, Some(TOKEN)).json();
    let assignments = metrics["regions"]["assignments"]
        .as_u64()
        .unwrap_or(u64::MAX);
    assert!(
        assignments <= 640 * 2,
        "region assignments kept: {assignments}"
    );
    let tracked = metric_value(&metrics_text(one.admin_port), "shardgate_tenants_tracked");
    assert!(tracked <= 640 * 2, "tenants tracked: {tracked}");
}

#[test]
fn differing_region_lists_share_assignments_within_a_bound_and_prune_them_once_agreed() {
    let redis = Redis::start();
    let (eu, us) = (Backend::start("eu"), Backend::start("us"));
    // The node's lists differ (a rolling change of the regions): node 2
    // weighs us so little that it puts every tenant in eu, so whatever
    // node 1 puts in us must be shared.
    let limits = "limits:\n  max_tracked_tenants: 640\n";
    let one = regional(&redis, "gw-1", &eu, &us, limits);
    let mut two = regional_weighted(&redis, "gw-2", &eu, &us, "0.000001", limits);
    wait_for(
        Duration::from_secs(5),
        "both nodes see the lists differ",
        || cluster(&one)["region_lists"] == "differ" && cluster(&two)["region_lists"] == "differ",
    );
    let prefix = format!("b{}:", std::process::id());
    let regions = format!("{prefix}{{state}}:regions");
    let statuses = invent(one.port, "shared-", 2000);
    assert!(statuses.iter().all(|s| *s == 200));
    // Only the assignments node 2 would make otherwise (us), and no more
    // than the bound.
    wait_for(
        Duration::from_secs(5),
        "node 1's us assignments shared",
        || redis_count(&redis, &["HLEN", &regions]) > 0,
    );
    std::thread::sleep(Duration::from_millis(500));
    let shared = redis_count(&redis, &["HLEN", &regions]);
    assert!(shared <= 640, "at most the bound: {shared}");
    let values = redis_cli(&redis, &["HVALS", &regions]);
    assert!(
        values.lines().all(|r| r == "us"),
        "only what node 2 would pick differently: {values}"
    );
    // Node 2 follows them: a tenant node 1 placed in us goes to us there.
    let placed = redis_cli(&redis, &["HKEYS", &regions]);
    let tenant = placed.lines().next().unwrap_or_default().to_string();
    wait_for(
        Duration::from_secs(2),
        "node 2 follows the shared assignment",
        || {
            two.admin(
                "GET",
                &format!("/v1/route?tenant={tenant}"),
                None,
                Some(TOKEN),
            )
            .json()["region"]
                == "us"
        },
    );
    let r = two.get(&format!("{tenant}.localhost"), "/");
    assert!(r.text().contains("\"shard\":\"us\""), "{}", r.text());
    // Node 2 leaves; node 1 is alone, so its list is the cluster's: what
    // equals its own pick is pruned.
    two.kill9();
    wait_for(Duration::from_secs(10), "shared assignments pruned", || {
        redis_count(&redis, &["HLEN", &regions]) == 0
    });
}

#[test]
fn redis_down_forgets_idle_tenants_and_the_bound_holds() {
    let mut redis = Redis::start();
    let shard = Backend::start("a");
    let gw = node(
        &format!("\"{}\"", redis.url()),
        "gw-1",
        &[("a", shard.url())],
        "limits:\n  max_tracked_tenants: 640\n  rate: { tokens: 5, refill_per_second: 50 }\n",
    );
    wait_for(Duration::from_secs(5), "Redis up", || {
        cluster(&gw)["redis"]["up"] == true
    });
    redis.kill9();
    wait_for(Duration::from_secs(5), "Redis seen down", || {
        cluster(&gw)["redis"]["up"] == false
    });
    let statuses = invent(gw.port, "outage-", 3000);
    assert!(
        statuses.iter().all(|s| *s == 200),
        "served while Redis is down"
    );
    let tracked = || metric_value(&metrics_text(gw.admin_port), "shardgate_tenants_tracked");
    assert!(tracked() <= 640, "the table's bound holds: {}", tracked());
    // Idle for a second with full buckets, they are forgotten with Redis
    // still down: the next new tenants sweep them all out, where only the
    // least recently seen quarter would go if they still held leases.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(invent(gw.port, "later-", 200).iter().all(|s| *s == 200));
    assert!(
        tracked() < 400,
        "idle tenants forgotten: {} left",
        tracked()
    );
    // A tenant that spent is not: its bucket is refused until it refills.
    let statuses = exchange(
        gw.port,
        "GET / HTTP/1.1\r\nHost: busy.localhost\r\n\r\n"
            .repeat(40)
            .as_bytes(),
        Duration::from_millis(500),
    )
    .0;
    assert!(statuses.contains(&429), "the share is spent: {statuses:?}");
}

/// libfaketime, which `scripts/prereqs.sh` installs with `faketime`.
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

#[test]
fn a_node_whose_clock_is_off_is_alive_to_the_others_and_its_admissions_count() {
    assert!(
        std::path::Path::new(FAKETIME).exists(),
        "libfaketime missing: run scripts/prereqs.sh"
    );
    let redis = Redis::start();
    let slow = Backend::with("slow", |_| {
        Reply::After(Duration::from_secs(4), Box::new(Reply::ok("{}")))
    });
    let extra = "limits:\n  connection_cap: 2\n";
    let one = node(
        &format!("\"{}\"", redis.url()),
        "gw-1",
        &[("slow", slow.url())],
        extra,
    );
    // Node 2's clock is 3 s behind (the binary, through a wrapper that
    // keeps its pid, under libfaketime): judged on its own clock, its
    // heartbeats would look 3 s old, twice the time a node is given.
    let dir = tempfile::tempdir().expect("temp dir");
    let wrapper = dir.path().join("shardgate-behind");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nLD_PRELOAD={FAKETIME} FAKETIME=-3s FAKETIME_DONT_FAKE_MONOTONIC=1 exec {} \"$@\"\n",
            env!("CARGO_BIN_EXE_shardgate")
        ),
    )
    .expect("wrapper");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::env::set_var("SHARDGATE_TEST_TOKEN", TOKEN);
    let two = Gateway::start_program(
        &wrapper,
        &config_yaml(
            &format!(
                "listen: [{{ addr: \"127.0.0.1:{{port}}\" }}]\n\
                 admin: {{ addr: \"127.0.0.1:{{admin}}\", token_env: SHARDGATE_TEST_TOKEN }}\n\
                 cluster: {{ redis: \"{}\", node_id: gw-2, key_prefix: \"t{}:\", sync_interval_ms: 50 }}\n",
                redis.url(),
                std::process::id()
            ),
            &[("slow", slow.url())],
            extra,
        ),
    );
    // The skew is real: node 2's own answers are dated 3 s back.
    let date = two
        .get("nobody.invalid", "/")
        .header("date")
        .map(str::to_string);
    let date = date.and_then(|d| httpdate::parse_http_date(&d).ok());
    let behind = date.and_then(|d| std::time::SystemTime::now().duration_since(d).ok());
    assert!(
        behind.is_some_and(|b| b >= Duration::from_secs(2)),
        "node 2's clock is behind: {behind:?}"
    );
    wait_for(Duration::from_secs(5), "each node sees two alive", || {
        cluster(&one)["nodes_alive"] == 2.0 && cluster(&two)["nodes_alive"] == 2.0
    });
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            cluster(&one)["nodes_alive"],
            2.0,
            "node 1 keeps node 2 alive"
        );
        assert_eq!(
            cluster(&two)["nodes_alive"],
            2.0,
            "node 2 keeps node 1 alive"
        );
    }
    // Admissions held on the node whose clock is off count on the other.
    let port = two.port;
    let held: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                send_raw(
                    port,
                    b"GET / HTTP/1.1\r\nHost: capped.localhost\r\nConnection: close\r\n\r\n",
                )
                .status
            })
        })
        .collect();
    wait_for(Duration::from_secs(2), "two admissions on node 2", || {
        slow.count() == 2
    });
    wait_for(Duration::from_secs(2), "node 1 sees them", || {
        one.admin("GET", "/v1/route?tenant=capped", None, Some(TOKEN))
            .json()["decision"]
            == "capped"
    });
    assert_eq!(one.get("capped.localhost", "/").status, 429);
    for h in held {
        assert_eq!(h.join().ok(), Some(200));
    }
}

#[test]
fn one_off_allowances_keep_redis_bounded_least_recently_settled_first() {
    let redis = Redis::start();
    let shard = Backend::start("a");
    let gw = node(
        &format!("\"{}\"", redis.url()),
        "gw-1",
        &[("a", shard.url())],
        "limits:\n  max_tracked_tenants: 640\n  rate: { tokens: 3, refill_per_second: 0 }\n",
    );
    wait_for(Duration::from_secs(5), "Redis up", || {
        cluster(&gw)["redis"]["up"] == true
    });
    let regular = || {
        exchange(
            gw.port,
            b"GET / HTTP/1.1\r\nHost: regular.localhost\r\nConnection: close\r\n\r\n",
            Duration::from_secs(2),
        )
        .0
    };
    for _ in 0..3 {
        assert_eq!(regular(), [200]);
    }
    assert_eq!(regular(), [429], "the allowance is spent");
    // 2 000 invented tenants, each spending from its own allowance; the
    // regular tenant keeps coming back between them.
    for wave in 0..20 {
        assert!(invent(gw.port, &format!("once-{wave}-"), 100)
            .iter()
            .all(|s| *s == 200));
        assert_eq!(
            regular(),
            [429],
            "a tenant seen often keeps its spent allowance"
        );
    }
    let prefix = format!("t{}:", std::process::id());
    let set = format!("{prefix}oneoff");
    // Once the last leases went back and the set was trimmed (a second
    // each), Redis holds a key for at most as many tenants as the bound.
    std::thread::sleep(Duration::from_millis(3000));
    let tracked = redis_count(&redis, &["ZCARD", &set]);
    assert!(tracked <= 640, "one-off tenants in Redis: {tracked}");
    let keys = redis_cli(&redis, &["--scan", "--pattern", &format!("{prefix}t:*")]);
    assert!(
        keys.lines().count() <= 640,
        "bucket keys: {}",
        keys.lines().count()
    );
    assert_eq!(regular(), [429], "still spent");
}

/// A lease its node has not settled for 10 s (the node forgot the tenant,
/// or lost Redis while the others still see it alive) stops counting as
/// leased: another node's share refills into it. One settled just now
/// keeps counting. Node 2, alive, holds the whole bucket of two tenants it
/// never serves: one lease stamped now, one 11 s ago (written into Redis
/// as node 2 would have).
#[test]
fn a_lease_unsettled_for_ten_seconds_is_reclaimed_and_a_fresh_one_is_not() {
    let redis = Redis::start();
    let shard = Backend::start("a");
    let url = format!("\"{}\"", redis.url());
    let extra = "limits:\n  rate: { tokens: 20, refill_per_second: 20 }\n";
    let one = node(&url, "gw-1", &[("a", shard.url())], extra);
    let _two = node(&url, "gw-2", &[("a", shard.url())], extra);
    wait_for(Duration::from_secs(5), "two nodes alive", || {
        cluster(&one)["nodes_alive"] == 2.0
    });
    let time = redis_cli(&redis, &["TIME"]);
    let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap_or(0));
    let now_ms = parts.next().unwrap_or(0) * 1000 + parts.next().unwrap_or(0) / 1000;
    assert!(now_ms > 0, "Redis TIME: {time}");
    let key = |tenant: &str| format!("t{}:t:{{{tenant}}}", std::process::id());
    // Node 2 as it names itself among the nodes (its process's identity).
    let two = identity(&_two, "gw-2");
    let (lease, settled) = (format!("t|l|{two}"), format!("t|a|{two}"));
    for (tenant, stamp) in [("fresh", now_ms), ("stale", now_ms - 11_000)] {
        let (stamp, now) = (stamp.to_string(), now_ms.to_string());
        let set = [
            "HSET",
            &key(tenant),
            "t|g",
            "0",
            "t|s",
            &now,
            &lease,
            "20",
            &settled,
            &stamp,
        ];
        assert_eq!(redis_cli(&redis, &set), "4");
    }
    let nodes = std::slice::from_ref(&one);
    let (fresh, _, _) = spread(nodes, "fresh.localhost", 3.0, Duration::from_millis(5));
    let (stale, _, secs) = spread(nodes, "stale.localhost", 3.0, Duration::from_millis(5));
    eprintln!("admitted on node 1 in 3 s: fresh lease {fresh}, stale lease {stale}");
    // Fresh: the whole bucket is node 2's; node 1 has at most the credit a
    // node opens before its first settle (one bucket).
    assert!(fresh <= 25, "a fresh lease was reclaimed: {fresh} admitted");
    let held = redis_cli(&redis, &["HEXISTS", &key("fresh"), &lease]);
    assert_eq!(held, "1", "node 2's fresh lease is kept");
    // Stale: the bucket refills at 20/s from the first settle.
    assert!(
        f64::from(stale) >= 20.0 + 20.0 * secs * 0.6,
        "a stale lease still counted: {stale} admitted in {secs:.1} s"
    );
    let held = redis_cli(&redis, &["HEXISTS", &key("stale"), &lease]);
    assert_eq!(held, "0", "node 2's stale lease is dropped");
}

/// Tenant plans in cluster mode (DESIGN §6): a tenant's global bucket is
/// its plan's on every node (`busy` is on pro: 20 tokens, 10/s, where
/// `limits` has 2), and a plan set on one node reaches the others within
/// a second.
#[test]
fn plans_hold_across_nodes_and_a_change_reaches_them_within_a_second() {
    let redis = Redis::start();
    let a = Backend::start("a");
    let nodes = three(
        &format!("\"{}\"", redis.url()),
        &[("a", a.url())],
        "limits:\n  rate: { tokens: 2, refill_per_second: 1 }\n\
         plans:\n  pro: { rate: { tokens: 20, refill_per_second: 10 } }\n  \
         free: { rate: { tokens: 6, refill_per_second: 3 } }\n\
         \x20 open: { rate: null }\n\
         tenants: { busy: pro }\n",
    );
    assert_one_bucket(&nodes, 20.0, 10.0);
    let plan_on = |n: &Gateway, tenant: &str| {
        let path = format!("/v1/tenants/{tenant}");
        n.admin("GET", &path, None, Some(TOKEN)).json()["plan"].clone()
    };
    let set = |n: &Gateway, tenant: &str, plan: &str| {
        let path = format!("/v1/tenants/{tenant}/plan");
        let body = format!("{{\"plan\":\"{plan}\"}}");
        let put = n.admin("PUT", &path, Some(&body), Some(TOKEN));
        assert_eq!(put.status, 200, "{}", put.text());
    };
    assert_eq!(plan_on(&nodes[2], "acme"), serde_json::Value::Null);
    set(&nodes[0], "acme", "pro");
    let took = wait_for(
        Duration::from_secs(1),
        "the plan seen on nodes 2 and 3",
        || nodes[1..].iter().all(|n| plan_on(n, "acme") == "pro"),
    );
    eprintln!("plan shared in {took:?}");
    let gone = nodes[1].admin("DELETE", "/v1/tenants/acme/plan", None, Some(TOKEN));
    assert_eq!(gone.status, 200);
    wait_for(Duration::from_secs(1), "no plan on nodes 1 and 3", || {
        [&nodes[0], &nodes[2]]
            .iter()
            .all(|n| plan_on(n, "acme").is_null())
    });
    // Moved to an unlimited plan and back: each node's unlimited bucket
    // opens its share of pro's on credit, not pro's whole capacity (three
    // buckets' worth in all).
    set(&nodes[0], "busy", "open");
    wait_for(Duration::from_secs(1), "busy on `open` everywhere", || {
        nodes.iter().all(|n| plan_on(n, "busy") == "open")
    });
    let (_, refused, _) = spread(&nodes, "busy.localhost", 0.3, Duration::from_millis(5));
    assert_eq!(refused, 0, "unlimited");
    let configured = nodes[2].admin("DELETE", "/v1/tenants/busy/plan", None, Some(TOKEN));
    assert_eq!(configured.json()["plan"], "pro", "back to `tenants`");
    wait_for(
        Duration::from_secs(1),
        "busy back on pro everywhere",
        || nodes.iter().all(|n| plan_on(n, "busy") == "pro"),
    );
    // At most one bucket (leases left while unlimited count against the
    // refill until they expire, so fewer may be admitted for a while).
    let (admitted, _, secs) = spread(&nodes, "busy.localhost", 2.0, Duration::from_millis(5));
    let most = 20.0 + 10.0 * secs + slack(20.0, 10.0, 3.0);
    eprintln!("after the move back: admitted {admitted} in {secs:.2}s, at most {most:.1}");
    assert!(
        f64::from(admitted) <= most,
        "{admitted} > one bucket's {most:.1}"
    );
    // Moved down to free (6 tokens, 3 a second) with pro's bucket full
    // again: Redis' balance and every node's lease are cut to free's one
    // bucket.
    std::thread::sleep(Duration::from_millis(2500));
    set(&nodes[1], "busy", "free");
    wait_for(Duration::from_secs(1), "busy on free everywhere", || {
        nodes.iter().all(|n| plan_on(n, "busy") == "free")
    });
    let (admitted, _, secs) = spread(&nodes, "busy.localhost", 2.0, Duration::from_millis(5));
    let most = 6.0 + 3.0 * secs + slack(6.0, 3.0, 3.0);
    eprintln!("after the move down: admitted {admitted} in {secs:.2}s, at most {most:.1}");
    assert!(
        f64::from(admitted) <= most,
        "{admitted} > free's one bucket {most:.1}"
    );
    assert!(admitted >= 1, "free still admits");
}

/// Keeps a node that is no gateway (`ghost`) alive in the nodes set of
/// `prefix`, stamped on Redis' clock every 200 ms, until dropped.
struct Ghost {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    beat: Option<std::thread::JoinHandle<()>>,
}

impl Ghost {
    fn start(port: u16, prefix: &str, ghost: &str) -> Ghost {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (nodes, ghost) = (format!("{prefix}nodes"), ghost.to_string());
        let beat = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = Command::new("redis-cli")
                        .arg("-p")
                        .arg(port.to_string())
                        .args([
                            "EVAL",
                            "local t = redis.call('TIME') \
                             return redis.call('ZADD', KEYS[1], t[1] * 1000 + math.floor(t[2] / 1000), ARGV[1])",
                            "1",
                            &nodes,
                            &ghost,
                        ])
                        .output();
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        Ghost {
            stop,
            beat: Some(beat),
        }
    }
}

impl Drop for Ghost {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(beat) = self.beat.take() {
            let _ = beat.join();
        }
    }
}

/// How many of `nodes` admit (200) one request each for `host`, and how
/// many refuse (429), one after the other.
fn admitted_by(nodes: &[&Gateway], host: &str) -> (u32, u32) {
    let (mut admitted, mut refused) = (0, 0);
    for gw in nodes {
        match gw.get(host, "/").status {
            200 => admitted += 1,
            429 => refused += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    (admitted, refused)
}

/// Values no node wrote, in every key a node reads (an alive node whose
/// region list is `[]`, its admissions hash, a tenant's buckets, the
/// shared state, its version, the assignment log and hash): each is
/// skipped, and the node keeps serving and settling.
#[test]
fn garbage_in_redis_stops_neither_serving_nor_settling() {
    let redis = Redis::start();
    let (eu, us) = (Backend::start("eu"), Backend::start("us"));
    let limits = "limits:\n  rate: { tokens: 5, refill_per_second: 20 }\n";
    let gw = regional(&redis, "gw-1", &eu, &us, limits);
    wait_for(Duration::from_secs(5), "Redis up", || {
        cluster(&gw)["redis"]["up"] == true
    });
    let prefix = format!("b{}:", std::process::id());
    let _ghost = Ghost::start(redis.port, &prefix, "ghost");
    let key = |suffix: &str| format!("{prefix}{suffix}");
    // Seen first: a node drops the lists of nodes it does not see.
    wait_for(Duration::from_secs(5), "the ghost seen alive", || {
        cluster(&gw)["nodes_alive"] == 2.0
    });
    redis_cli(&redis, &["HSET", &key("{state}:lists"), "ghost", "[]"]);
    // The ghost's list is read (once a second): skipped as no list, or
    // (before) taken for one that differs.
    let mut last = serde_json::Value::Null;
    let read = Instant::now();
    while !(last["sync_errors"].as_u64().unwrap_or(0) > 0 || last["region_lists"] == "differ") {
        assert!(
            read.elapsed() < Duration::from_secs(20),
            "the ghost's list not read: {last}"
        );
        std::thread::sleep(Duration::from_millis(50));
        last = cluster(&gw);
    }
    for command in [
        vec!["HSET", &key("caps:{ghost}"), "a", "many", "b", "-1"],
        vec!["HSET", &key("caps:{ghost}"), "c", "18446744073709551615"],
        vec![
            "HSET",
            &key("t:{damaged}"),
            "t|g",
            "nan",
            "t|s",
            "soon",
            "t|l|ghost",
            "lots",
            "t|a|ghost",
            "inf",
        ],
        vec!["SET", &key("t:{wrongtype}"), "a string"],
        vec!["SET", &key("{state}:v"), "not a number"],
        vec![
            "HSET",
            &key("{state}"),
            "shard:evil",
            "{not json",
            "nonsense",
            "x",
        ],
        vec![
            "HSET",
            &key("{state}"),
            "plan:p",
            "no-such-plan",
            "region:r",
            "mars",
        ],
        vec!["XADD", &key("{state}:assigned"), "*", "someone", "mars"],
        vec!["HSET", &key("{state}:regions"), "weird", "mars"],
    ] {
        redis_cli(&redis, &command);
    }
    // New tenants are assigned regions, and offered while a list differs.
    let started = Instant::now();
    let mut served = 0;
    while started.elapsed() < Duration::from_secs(2) {
        served += invent(gw.port, &format!("new-{}-", served), 20)
            .iter()
            .filter(|s| **s == 200)
            .count();
    }
    assert!(served > 0, "no new tenant served");
    // Still settling: a tenant spending on this node is topped up at
    // 20/s; without settles it would have its opening share (5 of 2
    // nodes) and nothing more.
    for host in [
        "steady.localhost",
        "damaged.localhost",
        "wrongtype.localhost",
    ] {
        let (admitted, _, secs) = spread(
            std::slice::from_ref(&gw),
            host,
            2.0,
            Duration::from_millis(10),
        );
        eprintln!("{host}: admitted {admitted} in {secs:.1} s");
        assert!(
            f64::from(admitted) >= 20.0 * secs * 0.4,
            "{host}: admitted {admitted} in {secs:.1} s: not settled"
        );
    }
    assert_eq!(cluster(&gw)["nodes_alive"], 2.0, "the ghost is seen alive");
}

/// A bucket with fewer tokens than there are nodes (2 among 3): each
/// node's share is under a token, yet a tenant's first request is admitted
/// on any node (it borrows one token on credit), and all nodes together
/// stay within the bucket plus the slack the README states:
/// `max(tokens, N)` opened on credit at once.
#[test]
fn a_share_under_one_token_admits_a_first_request_on_every_node_within_the_slack() {
    let redis = Redis::start();
    let a = Backend::start("a");
    let nodes = three(
        &format!("\"{}\"", redis.url()),
        &[("a", a.url())],
        "limits:\n  rate: { tokens: 2, refill_per_second: 0.01 }\n",
    );
    let all: Vec<&Gateway> = nodes.iter().collect();
    // A first request for each tenant on each node in turn.
    for (i, first) in all.iter().enumerate() {
        let host = format!("first-on-{i}.localhost");
        assert_eq!(first.get(&host, "/").status, 200, "{host}: first request");
    }
    // One tenant over all three nodes, again and again.
    let started = Instant::now();
    let (mut admitted, mut refused) = (0, 0);
    for _ in 0..10 {
        let (a, r) = admitted_by(&all, "spread.localhost");
        admitted += a;
        refused += r;
        std::thread::sleep(Duration::from_millis(100));
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!("spread: admitted {admitted}, refused {refused} in {secs:.1} s");
    assert!(
        admitted >= 2,
        "the bucket's own tokens: {admitted} admitted"
    );
    let bound = 2.0 + 0.01 * secs + (2.0_f64).max(3.0) + 3.0 * 0.01 * 0.05;
    assert!(
        f64::from(admitted) <= bound,
        "admitted {admitted} > one bucket + slack ({bound:.2})"
    );
}

/// A flood of 20 000 invented names (one request each) on a node does not
/// delay a real tenant's top-ups: its tokens keep refilling at its rate.
/// Redis hears each chunk a node sends 100 ms late (through a relay): a
/// settle pass costs the node a tenth of a second per batch of scripts.
#[test]
fn a_flood_of_invented_names_does_not_delay_a_real_tenants_refill() {
    let redis = Redis::start();
    let relay = Relay::start(redis.port, Duration::from_millis(100));
    let a = Backend::start("a");
    let gw = node_via(
        &relay,
        &a,
        "limits:\n  rate: { tokens: 20, refill_per_second: 20 }\n",
    );
    // The real tenant is known: it spent its bucket and was settled.
    let nodes = std::slice::from_ref(&gw);
    spread(nodes, "real.localhost", 1.0, Duration::from_millis(10));
    let port = gw.port;
    // Four connections at once: the names arrive as fast as the node
    // answers them.
    let started = Instant::now();
    let flood: Vec<_> = (0..4)
        .map(|i| std::thread::spawn(move || invent(port, &format!("flood-{i}-"), 5_000).len()))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (admitted, refused, secs) = spread(nodes, "real.localhost", 4.0, Duration::from_millis(10));
    let answered: usize = flood.into_iter().map(|f| f.join().expect("flood")).sum();
    let took = started.elapsed();
    eprintln!(
        "real: admitted {admitted}, refused {refused} in {secs:.1} s; flood of {answered} in {took:?}"
    );
    assert_eq!(answered, 20_000, "every invented name answered");
    // 20/s over the window; a settle pass held up by the flood tops the
    // real tenant up late, and its refill falls far behind.
    let expected = 20.0 * secs;
    assert!(
        f64::from(admitted) >= 0.6 * expected,
        "admitted {admitted} of about {expected:.0}: refill delayed by the flood"
    );
}

/// A TCP relay in front of Redis. Each chunk a node sends waits `delay`
/// (a slow or distant Redis); once `armed`, the connection carrying the
/// next `DEL` of a single key is cut (a Redis lost in the middle of a
/// one-off trim), and the relay goes on faithfully.
struct Relay {
    port: u16,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Relay {
    fn start(redis: u16, delay: Duration) -> Relay {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let armed = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(AtomicBool::new(false));
        let (armed2, cut2) = (Arc::clone(&armed), Arc::clone(&cut));
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", redis)) else {
                    continue;
                };
                let (mut from_server, mut to_client) =
                    match (server.try_clone(), client.try_clone()) {
                        (Ok(s), Ok(c)) => (s, c),
                        _ => continue,
                    };
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_server, &mut to_client);
                    let _ = to_client.shutdown(std::net::Shutdown::Both);
                });
                let (armed, cut) = (Arc::clone(&armed2), Arc::clone(&cut2));
                std::thread::spawn(move || {
                    use std::io::{Read, Write};
                    let (mut client, mut server) = (client, server);
                    let mut buf = vec![0u8; 65536];
                    loop {
                        let n = match client.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let chunk = &buf[..n];
                        let del = chunk.windows(13).any(|w| w == b"*2\r\n$3\r\nDEL\r\n");
                        if del && armed.swap(false, Ordering::SeqCst) {
                            cut.store(true, Ordering::SeqCst);
                            break;
                        }
                        std::thread::sleep(delay);
                        if server.write_all(chunk).is_err() {
                            break;
                        }
                    }
                    let _ = server.shutdown(std::net::Shutdown::Both);
                    let _ = client.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Relay { port, armed, cut }
    }
}

/// Node gw-1 on Redis through `relay`, with shard `a`, once it reached
/// Redis.
fn node_via(relay: &Relay, a: &Backend, extra: &str) -> Gateway {
    let url = format!("\"redis://127.0.0.1:{}\"", relay.port);
    let gw = node(&url, "gw-1", &[("a", a.url())], extra);
    wait_for(Duration::from_secs(5), "Redis up", || {
        cluster(&gw)["redis"]["up"] == true
    });
    gw
}

/// A one-off trim cut off by a lost Redis between taking tenants out of
/// the bounded set and deleting their keys never leaves a key outside the
/// set (such a key, never refilling, would never expire): the tenants it
/// took stay claimed in the set until their keys are gone.
#[test]
fn a_trim_cut_off_midway_orphans_no_key() {
    let redis = Redis::start();
    let relay = Relay::start(redis.port, Duration::ZERO);
    let shard = Backend::start("a");
    relay.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let gw = node_via(
        &relay,
        &shard,
        "limits:\n  max_tracked_tenants: 640\n  rate: { tokens: 3, refill_per_second: 0 }\n",
    );
    for wave in 0..4 {
        assert!(invent(gw.port, &format!("once-{wave}-"), 400)
            .iter()
            .all(|s| *s == 200));
    }
    wait_for(Duration::from_secs(10), "a trim cut off", || {
        relay.cut.load(std::sync::atomic::Ordering::SeqCst)
    });
    let prefix = format!("t{}:", std::process::id());
    let set = format!("{prefix}oneoff");
    // Tenant keys whose tenant is not in the set.
    let orphans = || {
        redis_count(
            &redis,
            &[
                "EVAL",
                "local n = 0 \
                 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
                   local t = string.match(k, ':t:{(.*)}$') \
                   if t and not redis.call('ZSCORE', KEYS[1], t) then n = n + 1 end \
                 end \
                 return n",
                "1",
                &set,
                &format!("{prefix}t:*"),
            ],
        )
    };
    // Claims left by the cut are taken again once stale (10 s).
    std::thread::sleep(Duration::from_secs(14));
    let keys = redis_cli(&redis, &["--scan", "--pattern", &format!("{prefix}t:*")]);
    assert_eq!(orphans(), 0, "keys outside the set");
    assert!(
        keys.lines().count() <= 640,
        "bucket keys: {}",
        keys.lines().count()
    );
}

/// Starts a node whose Redis accepts connections and never answers (the
/// first heartbeat takes its full timeout); `on_redis_down` applies to its
/// first requests all the same.
fn node_before_redis(policy: &str, limits: &str) -> (Gateway, std::net::TcpListener, Backend) {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "\"redis://127.0.0.1:{}\"",
        silent.local_addr().expect("addr").port()
    );
    let a = Backend::start("a");
    std::env::set_var("SHARDGATE_TEST_TOKEN", TOKEN);
    let gw = Gateway::start(&config_yaml(
        &format!(
            "listen: [{{ addr: \"127.0.0.1:{{port}}\" }}]\n\
             admin: {{ addr: \"127.0.0.1:{{admin}}\", token_env: SHARDGATE_TEST_TOKEN }}\n\
             cluster: {{ redis: {url}, node_id: gw-1, on_redis_down: {policy} }}\n"
        ),
        &[("a", a.url())],
        limits,
    ));
    (gw, silent, a)
}

#[test]
fn on_redis_down_applies_from_the_first_request() {
    let (deny, _silent, _a) = node_before_redis(
        "deny",
        "limits:\n  rate: { tokens: 100, refill_per_second: 100 }\n",
    );
    assert_eq!(
        deny.get("first.localhost", "/").status,
        429,
        "deny: refused before Redis was ever reached"
    );
    let (allow, _silent2, _b) = node_before_redis(
        "allow",
        "limits:\n  rate: { tokens: 1, refill_per_second: 0.01 }\n",
    );
    let (admitted, refused) = admitted_by(&[&allow, &allow, &allow, &allow], "first.localhost");
    assert_eq!((admitted, refused), (4, 0), "allow: no limit applies");
    assert_eq!(cluster(&allow)["mode"], "allow");
}

/// The old and the new process of a graceful upgrade run side by side
/// under one `node_id`: each is a node of its own (its own heartbeat,
/// leases and admissions), so the cluster counts two.
#[test]
fn two_processes_under_one_node_id_are_two_nodes() {
    let redis = Redis::start();
    let a = Backend::start("a");
    let url = format!("\"{}\"", redis.url());
    let old = node(&url, "gw-1", &[("a", a.url())], "");
    let new = node(&url, "gw-1", &[("a", a.url())], "");
    for gw in [&old, &new] {
        wait_for(Duration::from_secs(5), "two nodes alive", || {
            cluster(gw)["nodes_alive"] == 2.0
        });
    }
    assert_ne!(identity(&old, "gw-1"), identity(&new, "gw-1"));
    assert_eq!(cluster(&new)["node_id"], "gw-1", "the configured node_id");
}
