//! Cluster mode (DESIGN §4): several gateways share their token buckets,
//! connection caps and runtime state through Redis (one server or a Redis
//! Cluster). Only built when the configuration has a `cluster` section.
//!
//! - `shared.rs`: what the request path and the admin API read; no Redis.
//! - `service.rs`: the background service that talks to Redis (settles,
//!   admissions, runtime state), with `regions.rs` (region assignments),
//!   `oneoff.rs` (the bound on one-off allowances) and `heartbeat.rs`
//!   (liveness, on its own task); `link.rs` a connection with backoff.
//! - `conn.rs`: one connection type over a single Redis and a Redis Cluster.
//!
//! Keys (every command or script touches one hash slot, so a Redis Cluster
//! needs no cross-slot command): `{prefix}t:{<tenant>}` a tenant's buckets
//! and leases (a hash), `{prefix}caps:{<node>}` a node's live admissions
//! per capped tenant, `{prefix}nodes` heartbeats, `{prefix}oneoff` the
//! tenants with buckets that never refill, `{prefix}{state}` and
//! `{prefix}{state}:v` the shared runtime state and its version,
//! `{prefix}{state}:lists` each node's region list, `{prefix}{state}:regions`
//! and `{prefix}{state}:assigned` region assignments while the lists
//! differ; `{prefix}acme:…` ACME's orders, challenges and certificates
//! (see [`acme`]).

pub mod acme;
mod conn;
mod heartbeat;
mod link;
mod oneoff;
mod regions;
mod seal;
mod service;
mod shared;

pub use crate::limits::{Mode, SharedSlot};
pub use service::ClusterService;
pub use shared::{NodeSeen, Shared, SharedRegions};

/// A node not heard from for this long is gone: its admissions and leases
/// stop counting.
pub const NODE_TTL_MS: u64 = 1500;

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::control::Control;
    use crate::hooks::DefaultHooks;
    use std::sync::Arc;
    use std::time::Instant;

    fn control(cluster: bool) -> Control {
        let section = if cluster {
            "cluster: { redis: \"redis://127.0.0.1:1\", node_id: gw-1 }\n"
        } else {
            ""
        };
        let yaml = format!(
            "listen: [{{ addr: \"127.0.0.1:1\" }}]\nstate: false\n\
             shards: [{{ id: a, url: \"http://127.0.0.1:2\" }}]\n\
             domains: {{ fallback_suffix: .localhost }}\n\
             limits: {{ max_tracked_tenants: 200000, rate: {{ tokens: 5, refill_per_second: 0.001 }} }}\n{section}"
        );
        let config = Config::parse(&yaml, Some("test.yaml")).expect("config");
        Control::new(config, Arc::new(DefaultHooks)).expect("control")
    }

    /// `n` invented tenants as a cluster node keeps them once idle: a
    /// lease given back, its buckets emptied until Redis says how full.
    fn invent(control: &Control, n: usize) {
        let router = &control.router;
        for i in 0..n {
            let tenant = format!("invented-{i}");
            drop(router.acquire(&tenant, None));
            router.with_tenant(&tenant, |_, state| {
                state.buckets.tenant.tokens = 0.0;
                let slot = state.shared.get_or_insert_with(Box::default);
                slot.dormant = Some((0.0, 0.0));
            });
        }
    }

    /// The state writer's pass (capture and encoding), its time per tick.
    fn write_time(control: &Control) -> (std::time::Duration, usize) {
        let started = Instant::now();
        let mut bytes = 0;
        for _ in 0..5 {
            let state = crate::state::capture(control);
            bytes = serde_json::to_vec(&state).map_or(0, |b| b.len());
        }
        (started.elapsed() / 5, bytes)
    }

    /// In cluster mode the state file holds no lease balance (a restore
    /// throws them away), and the writer does not look at idle tenants:
    /// its time does not grow with them.
    #[test]
    fn the_state_writer_keeps_no_lease_and_does_not_grow_with_idle_tenants() {
        let control = control(true);
        let (empty, _) = write_time(&control);
        invent(&control, 100_000);
        assert!(control.router.tenant_count() >= 100_000);
        let (full, bytes) = write_time(&control);
        eprintln!("state writer per tick, cluster: 0 tenants {empty:?}, 100 000 idle {full:?} ({bytes} bytes)");
        let state = crate::state::capture(&control);
        assert!(state.router.tenants.is_empty(), "lease balances saved");
        assert!(state.router.route_buckets.is_empty());
        assert!(full < empty * 20 + std::time::Duration::from_millis(20));
    }
}
