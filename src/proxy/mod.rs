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

pub(crate) mod blocks;
pub(crate) mod buffers;
pub mod client;
pub mod ctx;
pub mod fast;
pub mod frontend;
mod frontend_h2;
pub mod head;
pub mod listener;
mod pingora;
pub mod pipeline;
pub mod proxy_protocol;
pub mod quic;
pub(crate) mod upstream;
pub mod watched;
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

    /// An HTTP/2 shard's deadline for one stream on Pingora's path (one
    /// read deadline a stream, for its head and each pause of its body):
    /// the longer of `headers_timeout_ms` and `read_timeout_ms`, shortened
    /// by the call's own `grpc-timeout` ([`Gateway::call_deadline`]).
    pub(crate) fn stream_deadline(&self, ctx: &mut RequestCtx) -> std::time::Duration {
        self.call_deadline(ctx, self.stream_base())
    }

    /// A request's headers deadline on the fast transport:
    /// `upstream.headers_timeout_ms`, shortened by the call's own
    /// `grpc-timeout` ([`Gateway::call_deadline`]).
    pub(crate) fn headers_timeout(&self, ctx: &mut RequestCtx) -> std::time::Duration {
        self.call_deadline(ctx, self.watch.headers_timeout)
    }

    /// The one rule of a call's own deadline (DESIGN §8): the gateway's
    /// `base`, shortened by a shorter `grpc-timeout`; and when it is, its
    /// running out is the client's, no shard's fault (noted in `ctx` for
    /// the failure rules).
    fn call_deadline(
        &self,
        ctx: &mut RequestCtx,
        base: std::time::Duration,
    ) -> std::time::Duration {
        let own = ctx.grpc_timeout.filter(|&deadline| deadline < base);
        ctx.clients_deadline = own.is_some();
        own.unwrap_or(base)
    }

    /// The gateway's own deadline for an HTTP/2 stream.
    fn stream_base(&self) -> std::time::Duration {
        self.watch.headers_timeout.max(self.watch.read_timeout)
    }
}
