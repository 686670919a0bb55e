//! What an embedding server may decide for shardgate: whether a tenant may
//! be served, what happens when a shard fails, and the per-shard load fed to
//! `rendezvous`/`hrw`. Every method has the standalone binary's behaviour
//! as its default.

use crate::routing::{Router, ShardId};
use std::fmt;

/// How an upstream attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UpstreamFailure {
    /// The TCP (or TLS) connection could not be made.
    Connect,
    /// The connection broke before any response byte.
    Reset,
    /// No response headers within `upstream.headers_timeout_ms` (slow, not
    /// dead: the default hook leaves the shard alone).
    Timeout,
    /// A liveness probe found the shard gone while headers were awaited.
    Liveness,
}

impl UpstreamFailure {
    pub fn as_str(&self) -> &'static str {
        match self {
            UpstreamFailure::Connect => "connect",
            UpstreamFailure::Reset => "reset",
            UpstreamFailure::Timeout => "timeout",
            UpstreamFailure::Liveness => "liveness",
        }
    }

    /// Whether the failure means the shard cannot be reached (as opposed to
    /// being slow).
    pub fn is_unreachable(&self) -> bool {
        !matches!(self, UpstreamFailure::Timeout)
    }
}

impl fmt::Display for UpstreamFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

pub trait GatewayHooks: Send + Sync + 'static {
    /// Whether `tenant` may be served at all (after the deny list). Called
    /// only once shards for the request exist, as the reference does.
    fn allow(&self, _tenant: &str) -> bool {
        true
    }

    /// Called for every failed upstream attempt. The default marks an
    /// unreachable shard unhealthy at once (active health checks bring it
    /// back after `health.rise` good probes) and leaves a slow one alone.
    fn on_upstream_failure(&self, router: &Router, shard: &ShardId, failure: UpstreamFailure) {
        if failure.is_unreachable() {
            router.mark_unhealthy(shard.as_str());
        }
    }

    /// Whether [`GatewayHooks::load`] supplies loads (otherwise
    /// `routing.load` from the configuration applies).
    fn provides_load(&self) -> bool {
        false
    }

    /// A shard's current load for `rendezvous`/`hrw` (effective weight =
    /// weight / max(load, 0.0001)); read only if `provides_load`.
    fn load(&self, _shard: &ShardId) -> f64 {
        1.0
    }
}

/// The standalone binary's hooks: every default.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultHooks;

impl GatewayHooks for DefaultHooks {}
