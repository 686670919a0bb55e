//! Cluster mode (DESIGN §4): several gateways share their token buckets,
//! connection caps and runtime state through Redis (one server or a Redis
//! Cluster). Only built when the configuration has a `cluster` section.
//!
//! - `shared.rs`: what the request path and the admin API read; no Redis.
//! - `service.rs`: the background service that talks to Redis.
//! - `conn.rs`: one connection type over a single Redis and a Redis Cluster.
//!
//! Keys (every one a single key, so a Redis Cluster needs no cross-slot
//! command): `{prefix}t:{<tenant>}` a tenant's buckets and leases (a hash),
//! `{prefix}caps:{<node>}` a node's live admissions per capped tenant,
//! `{prefix}nodes` heartbeats, `{prefix}{state}` and `{prefix}{state}:v`
//! the shared runtime state and its version, `{prefix}{state}:regions`
//! region assignments; `{prefix}acme:…` ACME's orders, challenges and
//! certificates (see [`acme`]).

pub mod acme;
mod conn;
mod service;
mod shared;

pub use service::ClusterService;
pub use shared::{Mode, NodeSeen, Shared, SharedSlot};

/// A node not heard from for this long is gone: its admissions and leases
/// stop counting.
pub const NODE_TTL_MS: u64 = 1500;
