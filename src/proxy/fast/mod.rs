//! The fast transport: shardgate's own HTTP/1.1 forwarding for the shapes
//! that make up most traffic — requests without a body (GET, HEAD, OPTIONS,
//! DELETE) and WebSocket handshakes — to plain-HTTP shards.
//!
//! Pingora's proxy runs every request through channels between two tasks,
//! two header maps and a pooled connection guarded by a task of its own;
//! measured here, a bare Pingora proxy spends about half again nginx's CPU
//! per request before shardgate does anything. Here a request is one task:
//! the head (already read and limited by `HeadGuard`) is classified and
//! rewritten byte for byte into one write (`request.rs`), sent on a pooled
//! or new connection and its response head awaited (`upstream.rs`), the
//! response head parsed once and the body copied with its framing tracked
//! (`response.rs`), or the socket tunnelled (`tunnel.rs`).
//!
//! This transport only moves bytes: planning, the forwarding fields, the
//! hop-by-hop table, the answers, the headers watch and what a failure
//! means are the pipeline's ([`super::pipeline`]), the same code Pingora's
//! path calls.
//!
//! Anything else — a body, `Expect`, HTTP/1.0, an absolute-form target, a
//! `Connection` naming other fields, pipelined bytes — goes to Pingora's
//! path; so does a request routed to an `https` shard, handed over already
//! planned.

pub(crate) mod h2;
mod request;
mod response;
pub(crate) mod tunnel;
mod upstream;

#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;

use super::client::poll_watch;
use super::ctx::RequestCtx;
use super::hooks::RequestView;
use super::pipeline::answer::Refusal;
use super::pipeline::failure::{AttemptFailure, Next};
use super::pipeline::fields::Forwarding;
use super::Gateway;
use bytes::BytesMut;
use http::Method;
use pingora::protocols::Stream;
use request::{classify, Shape};
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use upstream::Pools;

/// What the fast path did with a request.
pub enum Outcome {
    /// Served; the client connection, if it may carry another request.
    Served(Option<Stream>),
    /// For Pingora's path: the connection, the head as read, and the
    /// context if the request is already planned (and admitted).
    NotMine(Stream, BytesMut, Option<Box<RequestCtx>>),
}

/// shardgate's own forwarding for bodiless HTTP/1.1 requests and WebSocket
/// handshakes (see the module documentation).
pub struct FastPath {
    gateway: Gateway,
    pools: Pools,
    /// The pools' sweep, started by the first release.
    sweeping: std::sync::Once,
    pool_per_shard: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
    send_timeout: Duration,
    /// The most bytes of a next request kept while one is served.
    head_limit: usize,
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

/// How an exchange with the shards ended.
enum Exchanged {
    /// Answered; whether the client connection may carry another request.
    Done(u16, bool),
    /// The client connection must close (the status, 0 if none was sent).
    Closed(u16),
    /// A retry was routed to an `https` shard: Pingora's path takes it.
    HandOver,
    /// The shard switched protocols (a WebSocket): the tunnel starts.
    Upgraded(upstream::Upstream),
}

/// How a request is exchanged with its shard.
struct How {
    method: Method,
    head_only: bool,
    websocket: bool,
    /// The client connection closes after the response.
    close: bool,
}

impl FastPath {
    pub fn new(gateway: Gateway) -> Self {
        let control = Arc::clone(gateway.control());
        let upstream = &control.config.upstream;
        FastPath {
            idle_timeout: upstream.keepalive_timeout,
            connect_timeout: upstream.connect_timeout,
            send_timeout: gateway.control().config.limits.send_timeout,
            head_limit: gateway.control().config.limits.max_header_bytes,
            gateway,
            pools: Pools::default(),
            sweeping: std::sync::Once::new(),
            pool_per_shard: upstream.pool_per_shard,
        }
    }

    /// Serves the request whose whole head is in `buf`, if it is a shape
    /// the fast path takes. `closing`: the server is shutting down, so the
    /// connection closes after this request.
    /// What the client sends meanwhile is appended to `ahead` (the next
    /// request's start).
    pub async fn serve(
        &self,
        mut client: Stream,
        buf: BytesMut,
        ahead: &mut BytesMut,
        closing: bool,
    ) -> Outcome {
        let Some(head) = classify(&buf) else {
            return Outcome::NotMine(client, buf, None);
        };
        let gw = &self.gateway;
        let mut ctx = RequestCtx::default();
        let path = head.target.split(['?', '#']).next().unwrap_or_default();
        let view = RequestView::from_raw(head.method, head.target, path, &head.headers);
        let client_addr = client
            .get_socket_digest()
            .and_then(|d| d.peer_addr().cloned());
        let close = head.close || closing;
        let (status, keep) = match gw.plan(&view, &mut ctx) {
            Err(refusal) => {
                ctx.answered = Some(refusal.status);
                let written = self
                    .send(&mut client, &refusal.http1(head.head_only(), close))
                    .await;
                (refusal.status, written && !close)
            }
            Ok(_) if ctx.peer.as_ref().is_some_and(|p| p.peer.is_tls()) => {
                drop(head);
                return Outcome::NotMine(client, buf, Some(Box::new(ctx)));
            }
            Ok(host) => {
                let tls = client.get_ssl_digest().is_some();
                let forwarding = self.forwarding(host, tls, client_addr.as_ref(), &ctx);
                let request = head.rewrite(&forwarding, &ctx.extra_fields);
                let how = How {
                    // `classify` took only methods `http` knows.
                    method: Method::from_bytes(head.method.as_bytes()).unwrap_or(Method::GET),
                    head_only: head.head_only(),
                    websocket: head.shape == Shape::WebSocket,
                    close,
                };
                if how.websocket {
                    // A tunnel may stay open for hours: of the head, only
                    // the target is kept (for the log), and the buffer
                    // only until the tunnel starts.
                    let target = head.target.to_owned();
                    drop(head);
                    let mut held = Some(buf);
                    let status = match self
                        .exchange(&mut client, ahead, request, &how, &mut ctx, &mut held)
                        .await
                    {
                        Exchanged::Upgraded(upstream) => {
                            match self.open_tunnel(&mut client, ahead, upstream, &ctx).await {
                                Some(upstream) => {
                                    let log = tunnel::TunnelLog {
                                        client: client_addr,
                                        target,
                                    };
                                    self.spawn_tunnel(client, upstream, ctx, log);
                                    return Outcome::Served(None);
                                }
                                None => 101,
                            }
                        }
                        Exchanged::Done(status, _) | Exchanged::Closed(status) => status,
                        Exchanged::HandOver => match held {
                            Some(buf) => return Outcome::NotMine(client, buf, Some(Box::new(ctx))),
                            None => 0,
                        },
                    };
                    gw.finish(
                        &mut ctx,
                        &OrEmpty(client_addr.as_ref()),
                        "GET",
                        &target,
                        status,
                    );
                    return Outcome::Served(None);
                }
                match self
                    .exchange(&mut client, ahead, request, &how, &mut ctx, &mut None)
                    .await
                {
                    Exchanged::Done(status, keep) => (status, keep),
                    Exchanged::Closed(status) => (status, false),
                    // Only a WebSocket handshake is answered with a tunnel.
                    Exchanged::Upgraded(_) => (101, false),
                    Exchanged::HandOver => {
                        drop(head);
                        return Outcome::NotMine(client, buf, Some(Box::new(ctx)));
                    }
                }
            }
        };
        gw.finish(
            &mut ctx,
            &OrEmpty(client_addr.as_ref()),
            head.method,
            &head.target,
            status,
        );
        Outcome::Served(keep.then_some(client))
    }

    /// Attempts until a response head arrives or the pipeline says stop,
    /// then the response (or the tunnel). A retry routed to an `https`
    /// shard is handed to Pingora's path, already routed; `held` is the
    /// head's buffer when the caller needs it back for that, dropped once a
    /// tunnel starts.
    async fn exchange(
        &self,
        client: &mut Stream,
        ahead: &mut BytesMut,
        request: Vec<u8>,
        how: &How,
        ctx: &mut RequestCtx,
        held: &mut Option<BytesMut>,
    ) -> Exchanged {
        loop {
            let Some(peer) = ctx.peer.clone() else {
                let refusal = Refusal::error(502, "upstream-unreachable");
                return Exchanged::Closed(self.answer(client, ctx, refusal, how.head_only).await);
            };
            if peer.peer.is_tls() {
                ctx.rerouted = ctx.attempts > 0;
                return Exchanged::HandOver;
            }
            ctx.attempts += 1;
            let attempt = self.attempt(peer.addr, &request, how.head_only, how.websocket);
            // While the shard is awaited, a client that closes ends the
            // request (and frees its admission), as on Pingora's path.
            let result = tokio::select! {
                result = attempt => result,
                () = self.client_gone(client, ahead) => return Exchanged::Closed(0),
            };
            let failure = match result {
                Ok(upstream) if how.websocket && upstream.parsed.status == 101 => {
                    drop(request);
                    *held = None;
                    return Exchanged::Upgraded(upstream);
                }
                // A handshake refused: an ordinary response, then close.
                Ok(upstream) => {
                    let close = how.close || how.websocket;
                    return self
                        .respond(client, ahead, close, upstream, peer.addr, ctx)
                        .await;
                }
                Err(failure) => failure,
            };
            let Err(refusal) = self.after_failure(failure, peer.addr, &how.method, ctx) else {
                continue;
            };
            return Exchanged::Closed(self.answer(client, ctx, refusal, how.head_only).await);
        }
    }

    /// The pipeline's rules after a failed attempt of a bodiless request
    /// to `addr`: `Ok` to try again (resent or rerouted, readmitted), or
    /// the answer to give.
    fn after_failure(
        &self,
        failure: AttemptFailure,
        addr: std::net::SocketAddr,
        method: &Method,
        ctx: &mut RequestCtx,
    ) -> Result<(), Refusal> {
        if failure == AttemptFailure::Stale {
            // The shard may have closed an idle connection just as we
            // reused it: the others idle in this thread's pool are likely
            // closed too.
            self.forget(addr);
        }
        match self.gateway.after_failure(failure, method, true, ctx) {
            Next::Resend => Ok(()),
            Next::Retry => self.gateway.readmit(ctx),
            Next::Answer(refusal) => Err(refusal),
        }
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
            trust_forwarded_for: config.trust_forwarded_for,
            tenant_header: config.tenant_header.as_str(),
            tenant: ctx.tenant.as_deref().unwrap_or_default(),
        }
    }

    /// Writes `bytes` and flushes, unless that stalls for longer than
    /// `limits.send_timeout_ms` (a peer that stopped reading). False:
    /// failed or stalled; the caller closes the connection.
    async fn send<W: AsyncWrite + Unpin + ?Sized>(&self, to: &mut W, bytes: &[u8]) -> bool {
        let write = async {
            to.write_all(bytes).await?;
            to.flush().await
        };
        matches!(
            tokio::time::timeout(self.send_timeout, write).await,
            Ok(Ok(()))
        )
    }

    /// Writes shardgate's answer after upstream failures; the connection
    /// closes after it (as on the Pingora path). Returns its status.
    async fn answer(
        &self,
        client: &mut Stream,
        ctx: &mut RequestCtx,
        refusal: Refusal,
        head_only: bool,
    ) -> u16 {
        ctx.answered = Some(refusal.status);
        let _ = self.send(client, &refusal.http1(head_only, true)).await;
        refusal.status
    }
}

impl FastPath {
    /// Completes when the client closes its connection (or it fails) while
    /// its request is served; what it sends instead is kept in `ahead` (a
    /// pipelined request), up to the head size limit.
    async fn client_gone(&self, client: &mut Stream, ahead: &mut BytesMut) {
        let limit = self.head_limit;
        let _ = std::future::poll_fn(|cx| poll_watch(Pin::new(client), ahead, limit, cx)).await;
    }
}
