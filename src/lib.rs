//! shardgate: a multi-tenant edge gateway on Pingora.
//!
//! [`routing`] and [`limits`] are the pure decision core (usable without
//! Pingora); the gateway around them arrives with the proxy modules.

pub mod config;
pub mod control;
pub mod limits;
pub mod proxy;
pub mod routing;
pub mod server;
