//! The fast transport: shardgate's own forwarding, for every request of
//! the binary — HTTP/1.0 and HTTP/1.1 with or without a body, HTTP/2
//! streams, WebSocket handshakes and tunnels — to `http` and `https`
//! shards.
//!
//! Pingora's proxy runs every request through channels between two tasks,
//! two header maps and a pooled connection guarded by a task of its own;
//! measured here, that costs 3–4× nginx's CPU per request with a body.
//! Here a request is one task: its head (already read and limited by
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
mod conn;
mod downstream;
mod exchange;
pub(crate) mod h2;
mod request;
mod respond;
mod response;
pub(crate) mod tunnel;
mod upstream;

pub use conn::UpstreamKey;

#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;

use super::client::linger;
use super::ctx::RequestCtx;
use super::head::Head;
use super::hooks::{RequestLine, RequestView, ResponseEdit};
use super::pipeline::answer::Refusal;
use super::pipeline::fields::{Forwarding, Owned};
use super::pipeline::message::request_target;
use super::Gateway;
use body::{BodyLimits, H1Body};
use bytes::{Bytes, BytesMut};
use downstream::{Downstream, H1Client, H1Request};
use exchange::{Exchanged, Request};
use http::Method;
use pingora::protocols::Stream;
use request::{head_in, UpstreamHead};
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
    /// The pools' sweep, started by the first release.
    sweeping: std::sync::Once,
    tls: conn::UpstreamTls,
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
        let tls = conn::UpstreamTls::new(config.server.ca_file.as_deref(), upstream.tls_verify)?;
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
            sweeping: std::sync::Once::new(),
            pool_per_shard: upstream.pool_per_shard,
        })
    }

    /// Serves the HTTP/1 request whose whole head is `head` (read under
    /// the head limits and the message rules by the front end; its body
    /// framed by `body`). `ahead` holds what the client sent past the
    /// head: the body's start, then the next request's, and it keeps
    /// what is read past this request. `closing`: the server is shutting
    /// down, so the connection closes after this request. The client
    /// connection, if it may carry another request.
    pub async fn serve(
        &self,
        mut client: Stream,
        head: BytesMut,
        read: Head,
        ahead: &mut BytesMut,
        closing: bool,
    ) -> Option<Stream> {
        let body = read.body;
        let gw = &self.gateway;
        let mut ctx = RequestCtx::default();
        let client_addr = client
            .get_socket_digest()
            .and_then(|d| d.peer_addr().cloned());
        let Some(parsed) = head_in(&head, &read.layout) else {
            let refusal = gw.identified(Refusal::error(400, "bad-request"), &ctx);
            ctx.bytes_out = refusal.body.len() as u64;
            let _ = self
                .send_all(&mut client, &refusal.http1(false, true))
                .await;
            let line = RequestLine {
                client: client_addr.as_ref(),
                method: "-",
                target: &"-",
                host: None,
                protocol: "HTTP/1.1",
            };
            gw.log_request(&mut ctx, &line, 400);
            return None;
        };
        let log_target = parsed.target;
        let log_host = parsed.values("host").next();
        let log_host = log_host.and_then(|h| std::str::from_utf8(h).ok());
        let finish = |ctx: &mut RequestCtx, status| {
            let line = RequestLine {
                client: client_addr.as_ref(),
                method: parsed.method,
                target: &log_target,
                host: log_host,
                protocol: match parsed.http10 {
                    true => "HTTP/1.0",
                    false => "HTTP/1.1",
                },
            };
            gw.finish(ctx, &line, status);
        };
        let announced_length = parsed.values("content-length").next().is_some();
        let mut h1_body = H1Body::new(body, self.body_limits);
        let outgoing = h1_body.outgoing(announced_length);
        let whole =
            !h1_body.is_done() && ahead.len() <= WHOLE_BODY_WITH_HEAD && h1_body.completes(ahead);
        let mut request = H1Request {
            http10: parsed.http10,
            head_only: parsed.head_only(),
            close: parsed.close || closing,
            // RFC 9110 §10.1.1: an HTTP/1.0 client is never sent a 100.
            expect_continue: parsed.expect_continue && !whole && !parsed.http10,
            head_limit: self.head_limit,
        };
        let method = Method::from_bytes(parsed.method.as_bytes()).unwrap_or(Method::GET);
        let (target, host) = match (method == Method::CONNECT, request_target(parsed.target)) {
            (false, Some(target)) => {
                let host = target.authority;
                (target, host)
            }
            (connect, _) => {
                let refusal = match connect {
                    true => Refusal::error(405, "method-not-allowed"),
                    false => Refusal::error(400, "invalid-target"),
                };
                let mut c = H1Client::new(&mut client, ahead, h1_body, request);
                let status = self.answer(&mut c, &mut ctx, refusal, true).await;
                (ctx.bytes_in, ctx.bytes_out) = c.counts();
                finish(&mut ctx, status);
                return None;
            }
        };
        let view =
            RequestView::from_raw(parsed.method, parsed.target, target.path(), &parsed.headers)
                .with_authority(host);
        let mut planned = gw.plan(&view, &mut ctx);
        if planned.is_ok() {
            h1_body.planned(gw.body_phase(&ctx), &ctx.upstream_edit, ctx.max_body);
        }
        // A body that came whole with its head goes with it (through the
        // body phase and the edit, once planned), and stays sendable again.
        let mut whole_body = None;
        if whole {
            match h1_body.take(ahead) {
                Ok(bytes) => whole_body = Some(bytes),
                // Refused (by its limits or the body phase), answered as
                // any refusal; the connection closes after it (what is left
                // of the body is not read as a request). A plan's refusal
                // stands.
                Err(e) => {
                    request.close = true;
                    if planned.is_ok() {
                        let refusal = e.answer();
                        planned =
                            Err(refusal.unwrap_or_else(|| Refusal::error(400, "bad-request")));
                    }
                }
            }
        }
        let mut c = H1Client::new(&mut client, ahead, h1_body, request);
        let exchanged = match planned {
            Err(refusal) => {
                // The client's connection goes on only if its body was
                // read whole (it came with the head).
                let close = !c.body_done();
                match self.answered(&mut c, &mut ctx, refusal, close).await {
                    (status, true) => Exchanged::Done(status),
                    (status, false) => Exchanged::Closed(status),
                }
            }
            Ok(host_seen) => {
                let tls = c.stream().get_ssl_digest().is_some();
                let forwarding = self.forwarding(host_seen, tls, client_addr.as_ref(), &ctx);
                let mut bytes = UpstreamHead {
                    method: parsed.method,
                    origin: &target.origin,
                    host,
                    fields: &parsed.headers,
                    websocket: parsed.websocket,
                    body: outgoing,
                }
                .write(&forwarding, &ctx.upstream_edit);
                if let Some(whole) = &whole_body {
                    bytes.extend_from_slice(whole);
                }
                let request = Request {
                    method: &method,
                    head_only: parsed.head_only(),
                    websocket: parsed.websocket,
                    bytes: Bytes::from(bytes),
                };
                self.exchange(&mut c, &request, &mut ctx).await
            }
        };
        (ctx.bytes_in, ctx.bytes_out) = c.counts();
        let unread = !c.body_done();
        let keep = !c.close && !unread;
        let status = match exchanged {
            Exchanged::Done(status) if keep => {
                finish(&mut ctx, status);
                return Some(client);
            }
            Exchanged::Done(status) | Exchanged::Closed(status) => {
                finish(&mut ctx, status);
                if unread {
                    // The client may still be sending its body: read it
                    // off a while (its admission already released), so
                    // that closing does not reset the answer away.
                    linger(&mut client).await;
                }
                return None;
            }
            Exchanged::Upgraded(upstream) => {
                // A tunnel may stay open for hours: of the head, only the
                // target is kept (for the log).
                let target = parsed.target.to_owned();
                drop(c);
                match self.open_tunnel(&mut client, ahead, upstream, &ctx).await {
                    Some(upstream) => {
                        let log = tunnel::TunnelLog {
                            client: client_addr,
                            target,
                            host: log_host.map(str::to_owned),
                        };
                        self.spawn_tunnel(client, upstream, ctx, log);
                        return None;
                    }
                    None => 101,
                }
            }
        };
        finish(&mut ctx, status);
        None
    }

    /// The forwarding fields of a request from `client` for `host`.
    fn forwarding<'a>(
        &'a self,
        host: &'a str,
        tls: bool,
        client: Option<&pingora::protocols::l4::socket::SocketAddr>,
        ctx: &'a RequestCtx,
    ) -> Forwarding<'a> {
        let config = &self.gateway.control().config;
        Forwarding {
            host,
            proto: self.gateway.scheme_of(tls),
            peer_ip: client.and_then(|a| a.as_inet()).map(|a| a.ip()),
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

    /// The embedder's edit of a response head (none unless a hook made one).
    fn response_edit(&self, status: u16, ctx: &RequestCtx) -> Option<ResponseEdit> {
        let shard = ctx.shard.as_ref()?;
        let mut edit = ResponseEdit::new(status);
        let tenant = ctx.tenant.as_deref().unwrap_or_default();
        self.gateway
            .control()
            .hooks
            .edit_response(tenant, shard.id(), &mut edit);
        (!edit.is_empty()).then_some(edit)
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
