//! Placement compatibility: every entry of the reference router's recorded
//! outputs (`tests/vectors/`, produced by `@absolutejs/router` 0.6.1 under
//! Bun) must come out of shardgate bit for bit.

use serde_json::Value;
use shardgate::limits::AdmissionGuard;
use shardgate::routing::hash::{fnv1a32, jump_hash, jump_key, rendezvous_score, RoutingKey};
use shardgate::routing::{
    Balance, Decision, HashStrategy, Load, Region, RegionDirectory, RouteRequest, Router,
    RouterOptions, Shard, ShardId,
};
use std::collections::BTreeMap;
use std::sync::Arc;

fn load(name: &str) -> Value {
    let path = format!("{}/tests/vectors/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert!(v["description"].is_string(), "{name} describes itself");
    v
}

fn cases(v: &Value) -> &Vec<Value> {
    v["cases"].as_array().expect("cases")
}

fn s(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, got {v}"))
}

fn shard_of(v: &Value) -> Shard {
    let mut shard = Shard::new(s(&v["id"]), "http://127.0.0.1:1");
    if let Some(w) = v["weight"].as_f64() {
        shard.weight = w;
    }
    if let Some(r) = v["region"].as_str() {
        shard.region = Some(r.to_string());
    }
    if let Some(t) = v["tenants"].as_array() {
        shard.tenants = Some(t.iter().map(|x| s(x).to_string()).collect());
    }
    shard
}

fn shards_of(case: &Value) -> Vec<Shard> {
    case["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(shard_of)
        .collect()
}

fn hex_bits(v: &Value) -> u64 {
    u64::from_str_radix(s(v), 16).expect("hex bits")
}

/// Applies a membership step shared by sticky.json, rendezvous.json and
/// balance.json; returns false for an op it does not know.
fn apply_membership(router: &Router, step: &Value) -> bool {
    let id = step["shard"].as_str();
    match s(&step["op"]) {
        "mark_unhealthy" => assert!(router.mark_unhealthy(id.unwrap())),
        "mark_healthy" => assert!(router.mark_healthy(id.unwrap())),
        "drain" => assert!(router.drain(id.unwrap())),
        "remove_shard" => assert!(router.remove_shard(id.unwrap())),
        "add_shard" => assert!(router.add_shard(shard_of(&step["shard"]))),
        _ => return false,
    }
    true
}

/// Applies a case's `setup` and checks the resulting live order against its
/// `candidate_order`.
fn set_up(router: &Router, case: &Value) {
    let name = s(&case["name"]);
    for step in case["setup"].as_array().unwrap() {
        assert!(apply_membership(router, step), "{name}: op {step}");
    }
    let order: Vec<String> = case["candidate_order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| s(x).to_string())
        .collect();
    assert_eq!(live_ids(router), order, "{name}: candidate order");
}

fn live_ids(router: &Router) -> Vec<String> {
    router
        .shard_set()
        .live
        .iter()
        .map(|e| e.id().to_string())
        .collect()
}

fn picked(router: &Router, req: &RouteRequest<'_>) -> String {
    let r = router.route(req);
    assert_eq!(r.decision, Decision::Allow, "{req:?}");
    r.shard_id().unwrap().to_string()
}

#[test]
fn fnv1a32_every_case() {
    let v = load("fnv1a32.json");
    for case in cases(&v) {
        let input = s(&case["input"]);
        assert_eq!(
            u64::from(fnv1a32(input)),
            case["hash"].as_u64().unwrap(),
            "FNV of {input:?}"
        );
        assert_eq!(
            input.encode_utf16().count() as u64,
            case["utf16_len"].as_u64().unwrap()
        );
        assert_eq!(format!("{:08x}", fnv1a32(input)), s(&case["hash_hex"]));
        if let Some(units) = case["utf16"].as_array() {
            let ours: Vec<String> = input.encode_utf16().map(|u| format!("{u:04x}")).collect();
            let theirs: Vec<&str> = units.iter().map(s).collect();
            assert_eq!(ours, theirs);
        }
    }
}

#[test]
fn jump_every_key_and_bucket_count() {
    let v = load("jump.json");
    let ns: Vec<usize> = v["n_values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap() as usize)
        .collect();
    // Routers over s0..s{n-1}, to check the router path too.
    let routers: BTreeMap<usize, Router> = ns
        .iter()
        .filter(|&&n| n <= 1000)
        .map(|&n| {
            let shards = (0..n)
                .map(|i| Shard::new(format!("s{i}"), "http://h:1"))
                .collect();
            (
                n,
                Router::new(RouterOptions {
                    shards,
                    ..Default::default()
                }),
            )
        })
        .collect();
    for case in cases(&v) {
        let key_str = s(&case["key"]);
        let key = RoutingKey::new(key_str, None);
        assert_eq!(
            u64::from(fnv1a32(key_str)),
            case["fnv_lo"].as_u64().unwrap()
        );
        assert_eq!(
            u64::from(fnv1a32(&format!("{key_str}#hi"))),
            case["fnv_hi"].as_u64().unwrap()
        );
        let key64: u64 = s(&case["key64"]).parse().unwrap();
        assert_eq!(jump_key(&key), key64, "key64 of {key_str:?}");
        for (n, bucket) in ns.iter().zip(case["buckets"].as_array().unwrap()) {
            let expected = bucket.as_u64().unwrap() as usize;
            assert_eq!(
                jump_hash(key64, *n),
                Some(expected),
                "jump({key_str:?}, {n})"
            );
            if let Some(router) = routers.get(n) {
                assert_eq!(
                    picked(router, &RouteRequest::new(key_str)),
                    format!("s{expected}")
                );
            }
        }
    }
}

#[test]
fn sticky_every_case() {
    let v = load("sticky.json");
    for case in cases(&v) {
        let name = s(&case["name"]);
        let router = Router::new(RouterOptions {
            shards: shards_of(case),
            ..Default::default()
        });
        set_up(&router, case);
        for r in case["requests"].as_array().unwrap() {
            let mut req = RouteRequest::new(s(&r["tenant"]));
            req.channel = r["channel"].as_str();
            req.region = r["region"].as_str();
            assert_eq!(picked(&router, &req), s(&r["shard"]), "{name}: {r}");
        }
    }
}

#[test]
fn rendezvous_every_case_and_score_bits() {
    let v = load("rendezvous.json");
    for case in cases(&v) {
        let name = s(&case["name"]);
        let load = match case["load"].as_object() {
            Some(map) => {
                let map: BTreeMap<String, f64> = map
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
                    .collect();
                let hook = move |id: &ShardId| map.get(id.as_str()).copied().unwrap_or(1.0);
                Load::Hook(Arc::new(hook))
            }
            None => Load::None,
        };
        let router = Router::new(RouterOptions {
            shards: shards_of(case),
            hash: HashStrategy::Rendezvous,
            load,
            ..Default::default()
        });
        set_up(&router, case);
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        for r in case["requests"].as_array().unwrap() {
            let shard = picked(&router, &RouteRequest::new(s(&r["tenant"])));
            assert_eq!(shard, s(&r["shard"]), "{name}: {r}");
            *counts.entry(shard).or_default() += 1;
        }
        for (id, n) in case["counts"].as_object().unwrap() {
            assert_eq!(
                counts.get(id).copied().unwrap_or(0),
                n.as_u64().unwrap(),
                "{name}: {id}"
            );
        }
        for detail in case["score_detail"].as_array().into_iter().flatten() {
            let key = s(&detail["key"]);
            for sc in detail["scores"].as_array().unwrap() {
                if sc["skipped"].is_string() {
                    let id = s(&sc["id"]);
                    let w = case["shards"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|x| x["id"] == id)
                        .unwrap()["weight"]
                        .as_f64()
                        .unwrap();
                    assert!(w <= 0.0, "{name}: only weights <= 0 are skipped");
                    continue;
                }
                assert_eq!(s(&sc["hashed"]), format!("{key}|{}", s(&sc["id"])));
                let seed = fnv1a32(s(&sc["hashed"]));
                assert_eq!(u64::from(seed), sc["seed"].as_u64().unwrap());
                let u = (f64::from(seed) + 1.0) / 4_294_967_296.0;
                assert_eq!(u.to_bits(), sc["u"].as_f64().unwrap().to_bits());
                assert_eq!(
                    (-u.ln()).to_bits(),
                    hex_bits(&sc["neg_ln_u_bits"]),
                    "{name}: {sc}"
                );
                let eff = sc["effective_weight"].as_f64().unwrap();
                let score = rendezvous_score(seed, eff);
                assert_eq!(score.to_bits(), hex_bits(&sc["score_bits"]), "{name}: {sc}");
            }
        }
    }
}

#[test]
fn regions_every_case_and_score_bits() {
    let v = load("regions.json");
    for case in cases(&v) {
        let name = s(&case["name"]);
        let regions: Vec<Region> = case["regions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let mut region = Region::new(s(&r["id"]));
                if let Some(w) = r["weight"].as_f64() {
                    region.weight = w;
                }
                region
            })
            .collect();
        let dir = RegionDirectory::new(regions).unwrap();
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        for a in case["assignments"].as_array().unwrap() {
            let got = dir.region_for(s(&a["tenant"]));
            assert_eq!(got, s(&a["region"]), "{name}: {a}");
            *counts.entry(got).or_default() += 1;
        }
        for (id, n) in case["counts"].as_object().unwrap() {
            assert_eq!(
                counts.get(id).copied().unwrap_or(0),
                n.as_u64().unwrap(),
                "{name}: {id}"
            );
        }
        let weights: BTreeMap<String, f64> = dir
            .regions()
            .into_iter()
            .map(|r| (r.id, r.weight))
            .collect();
        for detail in case["score_detail"].as_array().into_iter().flatten() {
            for sc in detail["scores"].as_array().unwrap() {
                let seed = fnv1a32(s(&sc["hashed"]));
                assert_eq!(u64::from(seed), sc["seed"].as_u64().unwrap());
                let u = (f64::from(seed) + 1.0) / 4_294_967_296.0;
                assert_eq!((-u.ln()).to_bits(), hex_bits(&sc["neg_ln_u_bits"]));
                let score = rendezvous_score(seed, weights[s(&sc["id"])]);
                assert_eq!(score.to_bits(), hex_bits(&sc["score_bits"]), "{name}: {sc}");
            }
        }
    }
}

#[test]
fn balance_every_step() {
    let v = load("balance.json");
    for case in cases(&v) {
        let name = s(&case["name"]);
        let balance: Balance = s(&case["balance"]).parse().unwrap();
        let router = Router::new(RouterOptions {
            shards: shards_of(case),
            balance,
            ..Default::default()
        });
        let mut handles: Vec<Option<AdmissionGuard>> = Vec::new();
        let mut routes = 0;
        for step in case["steps"].as_array().unwrap() {
            match s(&step["op"]) {
                "route" => {
                    routes += 1;
                    let mut req = RouteRequest::new(s(&step["tenant"]));
                    req.channel = step["channel"].as_str();
                    req.balance = step["balance"].as_str().map(|b| b.parse().unwrap());
                    let r = router.route(&req);
                    assert_eq!(r.decision.as_str(), s(&step["decision"]), "{name}: {step}");
                    assert_eq!(
                        r.shard_id().map(|i| i.to_string()),
                        step["shard"].as_str().map(str::to_string),
                        "{name}: {step}"
                    );
                }
                "acquire" => {
                    let guard = router.acquire(s(&step["tenant"]), step["shard"].as_str());
                    assert_eq!(handles.len() as u64, step["handle"].as_u64().unwrap());
                    assert_eq!(
                        guard.tenant_active(),
                        step["active"].as_u64().unwrap(),
                        "{name}: {step}"
                    );
                    handles.push(Some(guard));
                }
                "release" => {
                    // A second release of the same handle is a no-op: the
                    // guard was consumed by the first.
                    let h = step["handle"].as_u64().unwrap() as usize;
                    if let Some(guard) = handles[h].take() {
                        guard.release();
                    }
                }
                _ => assert!(apply_membership(&router, step), "{name}: op {step}"),
            }
        }
        if let Some(n) = case["route_count"].as_u64() {
            assert_eq!(routes, n, "{name}: route count");
        }
        let expected: BTreeMap<String, i64> = case["final_shard_active"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_i64().unwrap()))
            .collect();
        assert_eq!(
            router.metrics().shard_active_connections,
            expected,
            "{name}"
        );
    }
}

#[test]
fn reference_readme_vectors() {
    // REFERENCE.md §5.5: sticky/jump and rendezvous over s0..s3.
    let shards = |n: usize| {
        (0..n)
            .map(|i| Shard::new(format!("s{i}"), "http://h:1"))
            .collect()
    };
    let jump4 = Router::new(RouterOptions {
        shards: shards(4),
        ..Default::default()
    });
    let rdv4 = Router::new(RouterOptions {
        shards: shards(4),
        hash: HashStrategy::Rendezvous,
        ..Default::default()
    });
    let picks = |r: &Router| -> Vec<String> {
        (0..12)
            .map(|i| picked(r, &RouteRequest::new(&format!("tenant-{i}"))))
            .collect()
    };
    assert_eq!(
        picks(&jump4),
        ["s2", "s3", "s3", "s1", "s0", "s1", "s1", "s0", "s3", "s0", "s0", "s3"]
    );
    assert_eq!(
        picks(&rdv4),
        ["s1", "s2", "s3", "s0", "s1", "s2", "s3", "s0", "s1", "s2", "s0", "s3"]
    );
    // 1000 tenants over 4 shards: s0 238, s1 263, s2 257, s3 242; 3 → 4
    // shards moves 242.
    let jump3 = Router::new(RouterOptions {
        shards: shards(3),
        ..Default::default()
    });
    let mut counts = [0; 4];
    let mut moved = 0;
    for i in 0..1000 {
        let t = format!("tenant-{i}");
        let a = picked(&jump4, &RouteRequest::new(&t));
        counts[a[1..].parse::<usize>().unwrap()] += 1;
        moved += usize::from(a != picked(&jump3, &RouteRequest::new(&t)));
    }
    assert_eq!(counts, [238, 263, 257, 242]);
    assert_eq!(moved, 242);
}
