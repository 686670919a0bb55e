//! Cluster mode's background service (DESIGN §4): settles each tenant's
//! lease with Redis, shares admissions and runtime state, and keeps the
//! nodes' region assignments (`regions.rs`) and the bound on one-off
//! allowances (`oneoff.rs`). What it fills, and what the request path
//! reads, is `cluster::Shared`; the Redis keys are listed in `cluster`.

mod admissions;
mod oneoff;
mod outage;
mod regions;
mod runtime_state;
mod service;
mod settle;

pub use service::ClusterService;
