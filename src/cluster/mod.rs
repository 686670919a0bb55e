//! Cluster mode (DESIGN §4): several gateways share their token buckets,
//! connection caps and runtime state through Redis (one server or a Redis
//! Cluster). Only built when the configuration has a `cluster` section.
//!
//! - `shared.rs`: what the request path and the admin API read; no Redis.
//!   It answers limits' [`crate::limits::Ledger`] (a tenant's lease
//!   bookkeeping, [`SharedSlot`], is limits' own).
//! - The background service that talks to Redis (settles, admissions,
//!   runtime state, region assignments, the bound on one-off allowances)
//!   acts on `Control`, so it lives above it, in `services::cluster`; it
//!   starts `heartbeat.rs` (liveness, on its own task) and talks through
//!   `link.rs` (a connection with backoff).
//! - `conn.rs`: one connection type over a single Redis and a Redis Cluster.
//! - `acme.rs`, `seal.rs`: ACME's shared orders and certificates, sealed.
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
pub(crate) mod conn;
pub(crate) mod heartbeat;
pub(crate) mod link;
mod seal;
mod shared;

pub use crate::limits::{Mode, SharedSlot};
pub(crate) use shared::Peers;
pub use shared::{NodeSeen, Shared, SharedRegions};

/// A node not heard from for this long is gone: its admissions and leases
/// stop counting.
pub const NODE_TTL_MS: u64 = 1500;
