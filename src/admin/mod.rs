//! The admin API (DESIGN §2): JSON over HTTP on `admin.addr`. `/healthz`
//! is open, `/metrics` too for a `Host` that is an IP address or
//! `localhost` (else it needs the token: DNS rebinding); everything under
//! `/v1/` needs `Authorization: Bearer <token>` (compared digest to
//! digest, in constant time) unless no token is configured, which
//! validation allows only on loopback. Bad JSON,
//! unknown fields or ids answer 400/404 with a message, and nothing is half
//! applied: each request is validated whole before it changes anything.
//!
//! `serve` takes a session from the listener, `access` says who may call,
//! `router` sends a `/v1/` path to the handlers of its resource (`shards`,
//! `domains`, `tenants`, `plans`, `cluster`, `certs`, `explain`,
//! `snapshot`, `metrics`); `page` is the operator's page.

mod access;
mod certs;
mod cluster;
mod domains;
mod explain;
mod metrics;
mod page;
mod plans;
mod reply;
mod router;
mod serve;
mod shards;
mod snapshot;
mod tenants;
mod uri;

use crate::control::Control;
use crate::proxy::pipeline::routes::RoutePrefixes;
use std::sync::Arc;

/// Largest request body the admin API reads.
pub const MAX_BODY: usize = 1024 * 1024;

pub struct AdminApi {
    control: Arc<Control>,
    routes: RoutePrefixes,
    registry: prometheus::Registry,
}

impl AdminApi {
    pub fn new(control: Arc<Control>) -> Self {
        let registry = prometheus::Registry::new();
        if let Err(e) = registry.register(Box::new(crate::collector::ShardgateCollector::new(
            &control,
        ))) {
            log::error!("cannot register metrics: {e}");
        }
        AdminApi {
            routes: RoutePrefixes::new(control.config.route_prefixes()),
            control,
            registry,
        }
    }
}

impl std::fmt::Debug for AdminApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminApi")
    }
}
