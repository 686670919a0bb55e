//! shardgate: a multi-tenant edge gateway on Pingora.
//!
//! [`routing`] and [`limits`] are the pure decision core (usable without
//! Pingora). [`proxy::Gateway`] is the Pingora `ProxyHttp` built on them;
//! [`control::Control`] is the state it shares with the [`admin`] API, the
//! [`health`] checker, the [`state`] file and the other [`services`];
//! [`server::Shardgate`] puts them together from a [`config::Config`].
//!
//! Every `crate::` import points down these layers, or stays inside a
//! module (`scripts/imports.py` draws them, and fails on a circle or an
//! arrow up):
//!
//! ```text
//! main → server → admin
//!   → collector, services (cluster sync, DNS refresh), health, state
//!   → proxy
//!   → control → tls → cluster → dns, hooks
//!   → config
//!   → trace, metrics, access_log → summary
//!   → routing → limits
//!   → counters, capped, wire (pure rules every layer may use), alloc_counts,
//!     allocator
//! ```

pub mod access_log;
pub mod admin;
#[cfg(feature = "alloc-counts")]
pub mod alloc_counts;
pub mod allocator;
pub mod capped;
pub mod cluster;
pub mod collector;
pub mod config;
pub mod control;
pub mod counters;
pub mod dns;
pub mod health;
pub mod hooks;
pub mod limits;
pub mod metrics;
pub mod proxy;
pub mod routing;
pub mod server;
pub mod services;
pub mod state;
pub mod summary;
pub mod tls;
pub mod trace;
pub mod wire;
