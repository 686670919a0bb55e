//! The fast transport: shardgate's own forwarding, for every request of
//! the binary — HTTP/1.0 and HTTP/1.1 with or without a body, HTTP/2
//! streams, WebSocket handshakes and tunnels — to `http` and `https`
//! shards.
//!
//! Pingora's proxy runs every request through channels between two tasks,
//! two header maps and a pooled connection guarded by a task of its own;
//! measured here, that costs 3–4× nginx's CPU per request with a body.
//! Here a request is one task: an HTTP/1 request's course in `http1.rs`,
//! an HTTP/2 stream's in `h2.rs`; its head (already read and limited by
//! the front end) parsed once and rewritten byte for byte into the head the
//! shard receives (`request.rs`), its body re-framed as it is read
//! (`body.rs`), both sent on a pooled or new connection, plain or TLS
//! (`upstream.rs`, `conn.rs`), while the response head is awaited
//! (`exchange.rs`); the response parsed once and its body copied to the
//! client framed for it (`response.rs`), through the one responder for
//! HTTP/1 and HTTP/2 clients alike (`respond.rs`, writing through
//! `downstream.rs`); or the socket
//! tunnelled (`tunnel.rs`).
//!
//! This transport only moves bytes: planning, the forwarding fields, the
//! hop-by-hop table, the answers, the headers watch and what a failure
//! means are the pipeline's ([`super::pipeline`]), the same code Pingora's
//! path calls.

mod body;

mod downstream;
mod exchange;
pub(crate) mod h2;
pub(crate) mod h3;
mod http1;
mod request;
mod respond;
mod response;
pub(crate) mod tunnel;
mod upstream;
mod websocket_h2;

pub use crate::proxy::upstream::conn::UpstreamKey;

#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;

use super::ctx::RequestCtx;
use super::pipeline::fields::{Forwarding, Owned};
use super::Gateway;
use body::BodyLimits;
use bytes::BytesMut;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, ReadBuf};
use upstream::Pools;

/// A body that came whole with its head, up to this size, is sent with
/// the head in one write (and kept for a resend).
const WHOLE_BODY_WITH_HEAD: usize = 64 * 1024;

/// shardgate's own forwarding (see the module documentation).
pub struct FastPath {
    gateway: Gateway,
    pools: Pools,
    /// Every shard's HTTP/2 connections.
    h2: crate::proxy::upstream::h2::H2Pool,
    /// The pools' sweep, started by the first release.
    sweeping: std::sync::Once,
    tls: crate::proxy::upstream::conn::UpstreamTls,
    pool_per_shard: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
    send_timeout: Duration,
    body_timeout: Duration,
    /// The most bytes of a next request kept while one is served.
    head_limit: usize,
    body_limits: BodyLimits,
}

/// Displays an optional value, or nothing.
pub(crate) struct OrEmpty<T>(pub Option<T>);

impl<T: fmt::Display> fmt::Display for OrEmpty<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => Ok(()),
        }
    }
}

impl FastPath {
    /// The fast transport of `gateway`; fails if `server.ca_file` cannot
    /// be read.
    pub fn new(gateway: Gateway) -> Result<Self, String> {
        let control = Arc::clone(gateway.control());
        let config = &control.config;
        let upstream = &config.upstream;
        if !upstream.tls_verify {
            log::warn!(
                "upstream.tls_verify is false: the certificates of https shards are not \
                 verified (for development only)"
            );
        }
        let tls = crate::proxy::upstream::conn::UpstreamTls::new(
            config.server.ca_file.as_deref(),
            upstream.tls_verify,
        )?;
        // The owned fields' names as `&'static str`, for the trailers check.
        let leak = |name: &http::HeaderName| -> &'static str { Box::leak(name.as_str().into()) };
        let owned = Owned {
            tenant_header: leak(&config.tenant_header),
            request_id_header: leak(&config.request_id.header),
            trust_forwarded_for: config.trust_forwarded_for,
            traceparent: config.tracing.is_some(),
            tracestate: false,
        };
        Ok(FastPath {
            idle_timeout: upstream.keepalive_timeout,
            connect_timeout: upstream.connect_timeout,
            send_timeout: config.limits.send_timeout,
            body_timeout: config.limits.body_timeout,
            head_limit: config.limits.max_header_bytes,
            body_limits: BodyLimits {
                max_body: config.largest_max_body(),
                max_trailers: config.limits.max_header_bytes,
                owned,
            },
            tls,
            gateway,
            pools: Pools::default(),
            h2: crate::proxy::upstream::h2::H2Pool::new(config),
            sweeping: std::sync::Once::new(),
            pool_per_shard: upstream.pool_per_shard,
        })
    }

    /// The forwarding fields of a request for `host`.
    fn forwarding<'a>(&'a self, host: &'a str, tls: bool, ctx: &'a RequestCtx) -> Forwarding<'a> {
        let config = &self.gateway.control().config;
        Forwarding {
            host,
            proto: self.gateway.scheme_of(tls),
            peer_ip: ctx.client,
            owned: Owned::of(config).for_trace(ctx.trace.as_ref()),
            tenant: ctx.tenant.as_deref().unwrap_or_default(),
            request_id: &ctx.request_id,
            traceparent: ctx.trace.as_ref().map(|t| t.traceparent()),
        }
    }

    /// The request's ID, in its field, for a proxied response head.
    fn id_field<'a>(&'a self, ctx: &'a RequestCtx) -> response::IdField<'a> {
        let header = &self.gateway.control().config.request_id.header;
        Some((header, ctx.request_id.as_str()))
    }

    /// Writes `bytes` and flushes, unless that stalls for longer than
    /// `limits.send_timeout_ms` (a peer that stopped reading). False:
    /// failed or stalled; the caller closes the connection.
    async fn send_all<W>(&self, to: &mut W, bytes: &[u8]) -> bool
    where
        W: tokio::io::AsyncWrite + Unpin + ?Sized,
    {
        use tokio::io::AsyncWriteExt;
        let write = async {
            to.write_all(bytes).await?;
            to.flush().await
        };
        matches!(
            tokio::time::timeout(self.send_timeout, write).await,
            Ok(Ok(()))
        )
    }
}

/// Reads into the spare capacity of `buf` (reserve first); the count read.
pub(super) fn poll_read_buf<R>(
    reader: &mut R,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<std::io::Result<usize>>
where
    R: AsyncRead + Unpin + ?Sized,
{
    let spare = buf.spare_capacity_mut();
    let mut read = ReadBuf::uninit(spare);
    let start = read.filled().as_ptr();
    ready!(Pin::new(&mut *reader).poll_read(cx, &mut read))?;
    if read.filled().as_ptr() != start {
        return Poll::Ready(Err(std::io::Error::other("the reader replaced its buffer")));
    }
    let n = read.filled().len();
    // SAFETY: `ReadBuf` counts as filled only bytes that were initialised,
    // the first `n` of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Poll::Ready(Ok(n))
}
