//! `hash: hrw` spreads tenants in proportion to weight and moves only a
//! removed shard's tenants; the reference-compatible `rendezvous` is shown
//! beside it (run with `--nocapture` to see both spreads).

use shardgate::routing::{HashStrategy, RouteRequest, Router, RouterOptions, Shard};
use std::collections::BTreeMap;

const TENANTS: usize = 100_000;

fn router(shards: &[(&str, f64)], hash: HashStrategy) -> Router {
    Router::new(RouterOptions {
        shards: shards
            .iter()
            .map(|(id, w)| Shard::new(*id, "http://h:1").with_weight(*w))
            .collect(),
        hash,
        ..Default::default()
    })
}

fn placements(r: &Router) -> Vec<String> {
    (0..TENANTS)
        .map(|i| {
            let t = format!("tenant-{i}");
            r.route(&RouteRequest::new(&t))
                .shard_id()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn shares(p: &[String]) -> BTreeMap<String, f64> {
    let mut counts: BTreeMap<String, f64> = BTreeMap::new();
    for s in p {
        *counts.entry(s.clone()).or_default() += 1.0;
    }
    counts.values_mut().for_each(|c| *c /= p.len() as f64);
    counts
}

fn spread_report(name: &str, shards: &[(&str, f64)]) -> BTreeMap<String, f64> {
    let hrw = shares(&placements(&router(shards, HashStrategy::Hrw)));
    let rdv = shares(&placements(&router(shards, HashStrategy::Rendezvous)));
    let total: f64 = shards.iter().map(|(_, w)| w.max(0.0)).sum();
    eprintln!("{name}: shard weight-share hrw rendezvous");
    for (id, w) in shards {
        eprintln!(
            "  {id:>4} {:>6.2}% {:>6.2}% {:>6.2}%",
            100.0 * w / total,
            100.0 * hrw.get(*id).unwrap_or(&0.0),
            100.0 * rdv.get(*id).unwrap_or(&0.0)
        );
    }
    hrw
}

fn assert_within_2_percent(shards: &[(&str, f64)], got: &BTreeMap<String, f64>) {
    let total: f64 = shards.iter().map(|(_, w)| w).sum();
    for (id, w) in shards {
        let want = w / total;
        let have = got.get(*id).copied().unwrap_or(0.0);
        assert!(
            (have - want).abs() <= 0.02 * want,
            "{id}: share {have:.4} vs weight share {want:.4} (more than ±2 %)"
        );
    }
}

#[test]
fn hrw_shares_follow_equal_weights_within_2_percent() {
    let shards: Vec<(&str, f64)> = ["s0", "s1", "s2", "s3", "s4"]
        .iter()
        .map(|s| (*s, 1.0))
        .collect();
    let got = spread_report("5 equal shards", &shards);
    assert_within_2_percent(&shards, &got);
}

#[test]
fn hrw_shares_follow_unequal_weights_within_2_percent() {
    let shards = [("a", 1.0), ("b", 2.0), ("c", 5.0), ("d", 0.5)];
    let got = spread_report("weights 1:2:5:0.5", &shards);
    assert_within_2_percent(&shards, &got);
}

#[test]
fn removing_a_shard_moves_only_its_tenants() {
    let all = [("a", 1.0), ("b", 2.0), ("c", 1.0), ("d", 3.0), ("e", 1.0)];
    let before = placements(&router(&all, HashStrategy::Hrw));
    let without_c: Vec<(&str, f64)> = all.iter().copied().filter(|(id, _)| *id != "c").collect();
    let after = placements(&router(&without_c, HashStrategy::Hrw));
    let mut moved = 0;
    for (b, a) in before.iter().zip(&after) {
        if b == "c" {
            moved += 1;
            assert_ne!(a, "c");
        } else {
            assert_eq!(a, b, "a tenant not on the removed shard moved");
        }
    }
    assert!(moved > 0);
    // And the removed shard's tenants spread over the others by weight.
    let moved_to: Vec<String> = before
        .iter()
        .zip(&after)
        .filter(|(b, _)| *b == "c")
        .map(|(_, a)| a.clone())
        .collect();
    let s = shares(&moved_to);
    assert!(s["d"] > s["b"] && s["b"] > s["a"], "{s:?}");
}
