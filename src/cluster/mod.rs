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

pub use service::ClusterService;
pub use shared::{Mode, NodeSeen, Shared, SharedRegions, SharedSlot};

/// A node not heard from for this long is gone: its admissions and leases
/// stop counting.
pub const NODE_TTL_MS: u64 = 1500;
