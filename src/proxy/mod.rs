//! The gateway: one request pipeline ([`pipeline`]) and two transports
//! that move its bytes — shardgate's own HTTP/1.1 forwarding ([`fast`])
//! for bodiless requests and WebSocket handshakes, and Pingora's proxy
//! (`Gateway` as a [`pingora_proxy::ProxyHttp`], in `pingora.rs`) for the
//! rest. [`head::HeadGuard`] reads every HTTP/1 request head under the
//! head limits in front of both.
//!
//! The admission lives in the request's context and is released when the
//! context drops — after the response body is fully sent, the client went
//! away, or (for a WebSocket) the tunnel closed — or before a retry routes
//! again.
//!
//! Embedding: [`Gateway`] is a plain library type; wrap it in your own
//! `ProxyHttp` and build the server with [`crate::server::Shardgate`]'s
//! builder to keep the head limits, health checks, admin API and the rest
//! (see `examples/embed.rs`).

pub mod client;
pub mod ctx;
pub mod fast;
pub mod head;
pub mod hooks;
mod pingora;
pub mod pipeline;

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
}

impl Gateway {
    pub fn new(control: Arc<Control>) -> Self {
        let config = &control.config;
        Gateway {
            routes: Arc::new(RoutePrefixes::new(
                config.limits.routes.iter().map(|(p, _)| p.clone()),
            )),
            retry: Arc::new(RetryPolicy::new(config.retry.clone())),
            watch: WatchSettings {
                headers_timeout: config.upstream.headers_timeout,
                liveness: config.upstream.liveness,
            },
            probing: Arc::default(),
            control,
        }
    }

    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    pub(crate) fn watch_settings(&self) -> WatchSettings {
        self.watch
    }
}

tokio::task_local! {
    /// A request the fast path planned but hands to Pingora's path (its
    /// shard speaks https): picked up by `new_ctx`, so it is not routed,
    /// admitted or charged twice.
    static PLANNED: std::cell::RefCell<Option<RequestCtx>>;
}

/// The context the fast path planned for this Pingora session, if any.
pub(crate) fn take_planned() -> Option<RequestCtx> {
    PLANNED
        .try_with(|planned| planned.borrow_mut().take())
        .ok()
        .flatten()
}

/// Runs `serve` (one Pingora session) with `ctx` as its planned context.
pub(crate) async fn with_planned<F: std::future::Future>(ctx: RequestCtx, serve: F) -> F::Output {
    PLANNED
        .scope(std::cell::RefCell::new(Some(ctx)), serve)
        .await
}
