//! shardgate: a multi-tenant edge gateway on Pingora.
//!
//! [`routing`] and [`limits`] are the pure decision core (usable without
//! Pingora). [`proxy::Gateway`] is the Pingora `ProxyHttp` built on them;
//! [`control::Control`] is the state it shares with the [`admin`] API, the
//! [`health`] checker and the [`state`] file; [`server::Shardgate`] puts
//! them together from a [`config::Config`].

pub mod access_log;
pub mod admin;
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
