//! The gateway: one request pipeline ([`pipeline`]) and two transports
//! that move its bytes — shardgate's own forwarding ([`fast`]), which
//! carries every request of the binary, and Pingora's proxy (`Gateway` as
//! a [`pingora_proxy::ProxyHttp`], in `pingora/`) for
//! `server.fast_path: false` and for embedders who wrap `Gateway` in
//! their own `ProxyHttp`. [`frontend::Frontend`] is each client
//! connection's front end: the TLS handshake, every HTTP/1 request head
//! read under the head limits ([`head`]), and HTTP/2's streams, in front
//! of both transports.
//!
//! The admission lives in the request's context and is released when the
//! context drops — after the response body is fully sent, the client went
//! away, or (for a WebSocket) the tunnel closed — or before a retry routes
//! again.
//!
//! Embedding: [`hooks::GatewayHooks`] adds phases on every transport at
//! the binary's speed (`examples/embed.rs`); [`wrap::GatewayWrapper`]
//! wraps [`Gateway`] in a `ProxyHttp` of your own, every phase you do not
//! write being shardgate's (`examples/embed_wrapper.rs`). Either way
//! [`crate::server::Shardgate`]'s builder keeps the head limits, health
//! checks, admin API and the rest.

pub mod client;
pub mod ctx;
pub mod fast;
pub mod frontend;
mod frontend_h2;
pub mod head;
pub mod listener;
mod pingora;
pub mod pipeline;
pub(crate) mod upstream;
pub mod wrap;

/// The hooks an embedder implements, at the path embedders name
/// (`shardgate::proxy::hooks`); they live below the proxy, where `control`
/// can hold them.
pub use crate::hooks;
pub use pipeline::answer::Refusal;

use crate::control::Control;
use ctx::RequestCtx;
use pipeline::retry::RetryPolicy;
use pipeline::routes::RoutePrefixes;
use pipeline::watch::WatchSettings;
use std::sync::Arc;

/// shardgate's proxy logic. Cloning shares everything (the retry budget
/// included): the fast path and the Pingora path run the same gateway.
#[derive(Clone)]
pub struct Gateway {
    control: Arc<Control>,
    routes: Arc<RoutePrefixes>,
    retry: Arc<RetryPolicy>,
    watch: WatchSettings,
    /// Shards being probed after a reset, and how many resets wait for
    /// that probe's verdict (one probe per shard at a time).
    probing: Arc<parking_lot::Mutex<std::collections::HashMap<crate::routing::ShardId, u32>>>,
    /// Whether the hooks' body phase runs (asked once).
    inspect_bodies: bool,
}

impl Gateway {
    pub fn new(control: Arc<Control>) -> Self {
        let config = &control.config;
        Gateway {
            routes: Arc::new(RoutePrefixes::new(config.route_prefixes())),
            retry: Arc::new(RetryPolicy::new(config.retry.clone())),
            watch: WatchSettings {
                headers_timeout: config.upstream.headers_timeout,
                read_timeout: config.upstream.read_timeout,
                liveness: config.upstream.liveness,
            },
            probing: Arc::default(),
            inspect_bodies: control.hooks.inspects_request_bodies(),
            control,
        }
    }

    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    pub(crate) fn watch_settings(&self) -> WatchSettings {
        self.watch
    }

    /// An HTTP/2 shard's deadline for one stream (Pingora's path has one
    /// read deadline a stream, for its head and each pause of its body):
    /// the longer of `headers_timeout_ms` and `read_timeout_ms`, shortened
    /// by the call's own `grpc-timeout` (DESIGN §8). (gRPC calls reach
    /// HTTP/2 shards only: an HTTP/1.1 shard's watch needs no such rule.)
    pub(crate) fn stream_deadline(&self, ctx: &RequestCtx) -> std::time::Duration {
        let base = self.stream_base();
        ctx.grpc_timeout.map_or(base, |deadline| base.min(deadline))
    }

    /// A request's headers deadline (the fast transport's):
    /// `upstream.headers_timeout_ms`, shortened by a gRPC call's own
    /// `grpc-timeout` (DESIGN §8).
    pub(crate) fn headers_timeout(&self, ctx: &RequestCtx) -> std::time::Duration {
        let base = self.watch.headers_timeout;
        ctx.grpc_timeout.map_or(base, |deadline| base.min(deadline))
    }

    /// Whether the request's deadline is the client's own (a `grpc-timeout`
    /// shorter than the gateway's headers deadline): its running out is no
    /// shard's fault.
    pub(crate) fn clients_own_deadline(&self, ctx: &RequestCtx) -> bool {
        ctx.grpc_timeout
            .is_some_and(|deadline| deadline < self.watch.headers_timeout)
    }

    /// The gateway's own deadline for an HTTP/2 stream.
    fn stream_base(&self) -> std::time::Duration {
        self.watch.headers_timeout.max(self.watch.read_timeout)
    }
}
