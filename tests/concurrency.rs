//! One router shared by many threads: the cap holds exactly under
//! contention, and every admission is released.

use shardgate::limits::{Limits, RateRule};
use shardgate::routing::{Decision, RouteRequest, Router, RouterOptions, Shard};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

fn router(cap: u64) -> Arc<Router> {
    Arc::new(Router::new(RouterOptions {
        shards: (0..4)
            .map(|i| Shard::new(format!("s{i}"), "http://h:1"))
            .collect(),
        limits: Limits::new(Some(cap), RateRule::UNLIMITED, []),
        ..Default::default()
    }))
}

#[test]
fn eight_threads_on_one_tenant_never_exceed_the_cap() {
    const CAP: u64 = 3;
    const THREADS: usize = 8;
    const ROUNDS: usize = 20_000;
    let router = router(CAP);
    let inside = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(AtomicUsize::new(0));
    let capped = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (router, inside, peak, admitted, capped, start) = (
                router.clone(),
                inside.clone(),
                peak.clone(),
                admitted.clone(),
                capped.clone(),
                start.clone(),
            );
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..ROUNDS {
                    let r = router.admit(&RouteRequest::new("hot"));
                    match r.decision {
                        Decision::Allow => {
                            // Counted strictly inside the guard's lifetime.
                            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            peak.fetch_max(now, Ordering::SeqCst);
                            admitted.fetch_add(1, Ordering::Relaxed);
                            for _ in 0..50 {
                                std::hint::spin_loop();
                            }
                            std::thread::yield_now();
                            inside.fetch_sub(1, Ordering::SeqCst);
                            drop(r);
                        }
                        Decision::Capped => {
                            capped.fetch_add(1, Ordering::Relaxed);
                        }
                        other => panic!("unexpected {other}"),
                    }
                }
            })
        })
        .collect();
    workers.into_iter().for_each(|w| w.join().unwrap());
    let peak = peak.load(Ordering::SeqCst);
    assert!(
        peak <= CAP as usize,
        "{peak} concurrent admissions with cap {CAP}"
    );
    assert!(admitted.load(Ordering::Relaxed) > 0);
    assert!(
        capped.load(Ordering::Relaxed) > 0,
        "the test produced no contention"
    );
    assert_eq!(router.tenant_active("hot"), 0);
    let m = router.metrics();
    assert!(m.shard_active_connections.values().all(|&a| a == 0));
    assert_eq!(m.routes, (THREADS * ROUNDS) as u64);
}

#[test]
fn distinct_tenants_on_many_threads_all_release() {
    let router = router(1);
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let router = router.clone();
            std::thread::spawn(move || {
                for i in 0..5_000 {
                    let tenant = format!("t{t}-{}", i % 97);
                    let r = router.admit(&RouteRequest::new(&tenant));
                    assert_eq!(r.decision, Decision::Allow, "cap 1, held by nobody else");
                }
            })
        })
        .collect();
    workers.into_iter().for_each(|w| w.join().unwrap());
    let m = router.metrics();
    assert!(m.shard_active_connections.values().all(|&a| a == 0));
    assert_eq!(m.allows, 20_000);
}
