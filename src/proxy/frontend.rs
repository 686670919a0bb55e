//! Each client connection's front end: the listener's role (TLS, the
//! https redirect), the TLS handshake, then its requests — HTTP/1 heads
//! read one at a time under the head limits ([`super::head`]), what the
//! edge answers itself (ACME challenges, the redirect), and each request
//! handed to the fast transport, or to Pingora's proxy when the fast
//! transport is off; HTTP/2 connections to `frontend_h2`.

use super::blocks::InBlock;
use super::client::{linger, OneRequest};
use super::ctx::RequestCtx;
use super::fast::FastPath;
use super::head::{read_head, Head, HeadError, HeadFailure, HeadLimits};
use super::hooks::RequestLine;
use super::pipeline::answer::Refusal;
use super::pipeline::edge::{edge_answer, EdgeAnswer};
use super::pipeline::framing::Framing;
use super::Gateway;
use crate::tls::{Edge, Role, Roles};
use bytes::BytesMut;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::l4::socket::SocketAddr;
use pingora::protocols::{SocketDigest, Stream, ALPN};
use pingora::server::ShutdownWatch;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// The front end of every client connection, in front of `inner` (the
/// Pingora proxy) and the fast transport (if on).
pub struct Frontend<A> {
    pub(super) inner: Arc<A>,
    pub(super) limits: HeadLimits,
    pub(super) fast: Option<Arc<FastPath>>,
    /// What each listener is (TLS, redirecting), and the edge's state.
    edge: Option<(Arc<Roles>, Arc<Edge>)>,
    /// Logs what the front end answers itself.
    gateway: Option<Gateway>,
}

impl<A> Frontend<A> {
    pub fn new(inner: A, limits: HeadLimits) -> Self {
        Frontend {
            inner: Arc::new(inner),
            limits,
            fast: None,
            edge: None,
            gateway: None,
        }
    }

    /// Logs what the front end answers itself (the head reader's
    /// refusals, the edge's answers) through `gateway`, as its requests.
    pub fn with_log(mut self, gateway: Gateway) -> Self {
        self.gateway = Some(gateway);
        self
    }

    /// Runs each TLS listener's handshake, and answers what the edge
    /// answers before routing (ACME challenges, the https redirect).
    pub fn with_edge(mut self, roles: Arc<Roles>, edge: Arc<Edge>) -> Self {
        self.edge = Some((roles, edge));
        self
    }

    /// Lets `fast` serve every request (else Pingora's proxy does).
    pub fn with_fast_path(mut self, fast: Option<Arc<FastPath>>) -> Self {
        self.fast = fast;
        self
    }
}

impl<A> Frontend<A> {
    /// Writes the head reader's refusal on a connection that is about to
    /// close, and logs it.
    async fn refuse(&self, stream: &mut Stream, head: &[u8], failure: HeadFailure) {
        let refusal = match failure.error {
            HeadError::Timeout => Refusal::error(408, "request-timeout"),
            HeadError::TooLarge => Refusal::error(431, "header-too-large"),
            HeadError::Refused(refused) => Refusal::error(refused.status, refused.code),
            HeadError::Preface => Refusal::error(505, "http-version-not-supported"),
        };
        let mut ctx = RequestCtx {
            started: failure.began,
            ..RequestCtx::default()
        };
        let refusal = self.identified(refusal, &ctx);
        ctx.bytes_out = refusal.body.len() as u64;
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            let _ = stream.write_all(&refusal.http1(false, true)).await;
            let _ = stream.flush().await;
            let _ = stream.shutdown().await;
        })
        .await;
        self.log_head(&mut ctx, stream, head, refusal.status);
        linger(stream).await;
    }

    /// `answer` saying the request's ID (when the front end knows the
    /// gateway's configuration).
    fn identified(&self, answer: Refusal, ctx: &RequestCtx) -> Refusal {
        match &self.gateway {
            Some(gateway) => gateway.identified(answer, ctx),
            None => answer,
        }
    }

    /// The connection, its client named by the PROXY header that opens
    /// it on a listener taking them (DESIGN §10); `None`: closed.
    async fn proxied(&self, stream: Stream, role: Option<&Role>) -> Option<Stream> {
        let Some(from) = role.and_then(|r| r.proxy_from.as_deref()) else {
            return Some(stream);
        };
        let deadline = self.limits.header_timeout;
        match super::proxy_protocol::accept(stream, from, deadline).await {
            Ok(stream) => Some(stream),
            Err(refused) => {
                log::debug!("PROXY protocol: connection closed: {refused:?}");
                None
            }
        }
    }

    /// [`Frontend::log`] for an HTTP/1 head answered on `stream`: its
    /// request line if readable, else `-`.
    fn log_head(&self, ctx: &mut RequestCtx, stream: &Stream, head: &[u8], status: u16) {
        let (method, target, protocol) = request_line(head).unwrap_or(("-", "-", "HTTP/1.1"));
        let client = peer(stream.get_socket_digest().as_ref());
        let line = RequestLine {
            client: client.as_ref(),
            method,
            target: &target,
            host: None,
            protocol,
        };
        self.log(ctx, &line, status);
    }

    /// Logs a request the front end answered (or dropped) itself — the
    /// head reader's refusals, the edge's answers, HTTP/2 streams reset by
    /// their client before they were served — as every request is logged:
    /// the access line and the hooks' logging phase.
    pub(super) fn log(&self, ctx: &mut RequestCtx, line: &RequestLine<'_>, status: u16) {
        if let Some(gateway) = &self.gateway {
            gateway.log_request(ctx, line, status);
        }
    }
}

/// The client's address of a connection.
pub(super) fn peer(socket: Option<&Arc<SocketDigest>>) -> Option<SocketAddr> {
    socket.and_then(|d| d.peer_addr().cloned())
}

/// The method, target and protocol of `head`'s request line, if it has a
/// whole one of visible ASCII (what the log may show of a head it
/// refused).
fn request_line(head: &[u8]) -> Option<(&str, &str, &'static str)> {
    let end = head.iter().position(|&b| b == b'\n')?;
    let line = std::str::from_utf8(&head[..end])
        .ok()?
        .trim_end_matches('\r');
    let mut parts = line.split(' ');
    let (method, target) = (parts.next()?, parts.next()?);
    let protocol = match parts.next() {
        Some("HTTP/1.0") => "HTTP/1.0",
        _ => "HTTP/1.1",
    };
    let visible = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic());
    (visible(method) && visible(target)).then_some((method, target, protocol))
}

#[async_trait::async_trait]
impl<A> ServerApp for Frontend<A>
where
    A: HttpServerApp + Send + Sync + 'static,
{
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let role = match &self.edge {
            Some((roles, _)) => match roles.of(&stream) {
                Ok(role) => role.cloned(),
                // Never serve a TLS listener's connection as plain HTTP.
                Err(_) => return None,
            },
            None => None,
        };
        let stream = self.proxied(stream, role.as_ref()).await?;
        let stream = match role.as_ref().and_then(|r| r.tls.as_ref()) {
            // Boxed, as the other large futures below: this one's state
            // would otherwise sit in every connection's, silent ones too.
            Some(handshake) => Box::pin(handshake.accept(stream)).await?,
            None => stream,
        };
        let tls = role.as_ref().is_some_and(|r| r.tls.is_some());
        let redirect = role.as_ref().and_then(|r| r.redirect_https);
        let h2c = self
            .inner
            .server_options()
            .is_some_and(|o| o.h2c || o.force_custom);
        if h2c
            || matches!(
                stream.selected_alpn_proto(),
                Some(ALPN::H2) | Some(ALPN::Custom(_))
            )
        {
            if !h2c && stream.selected_alpn_proto() == Some(ALPN::H2) {
                Box::pin(self.serve_h2(self.fast.as_deref(), stream, &[], shutdown)).await;
                return None;
            }
            // h2c and custom protocols keep Pingora's own handling.
            return ServerApp::process_new(&self.inner, stream, shutdown).await;
        }
        self.serve_http1_connection(stream, tls, redirect, shutdown)
            .await
    }

    async fn cleanup(&self) {
        self.inner.http_cleanup().await;
    }
}

impl<A> Frontend<A>
where
    A: HttpServerApp + Send + Sync + 'static,
{
    /// An HTTP/1 connection's requests, one after another, until it
    /// closes (or turns out to be HTTP/2 with prior knowledge); the
    /// connection back if Pingora's path hands it on.
    async fn serve_http1_connection(
        self: &Arc<Self>,
        stream: Stream,
        tls: bool,
        redirect: Option<u16>,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // A new connection's first request is read even while shutting
        // down (one accepted during a graceful upgrade is served); only
        // connections idle between requests close when shutdown starts.
        let mut watch = None;
        let mut stream = stream;
        let mut next = Next::default();
        let (failure, buf) = loop {
            let mut buf = std::mem::take(&mut next.ahead);
            let head = match read_head(&mut stream, &mut buf, &self.limits, watch.as_mut()).await {
                Ok(Some(head)) => head,
                Ok(None) => return None,
                // Answered past the loop: awaited here, the result's room
                // would be kept across that wait (and, for the compiler,
                // in every connection's state).
                Err(e) => break (e, buf),
            };
            let (buf, head, mut ahead, exception) = self.prepared(buf, head, tls, redirect);
            // Apart: a request's state (5.9 KiB on the fast transport) is
            // held only while one is served, not by connections silent or
            // idle between requests, in a block of the thread's (no
            // allocation). The fast transport's own future goes in whole,
            // not inside a wrapper that would copy it on every request.
            (stream, next) = match (self.fast.as_deref(), exception) {
                (Some(fast), None) => {
                    let closing = *shutdown.borrow();
                    let served = fast.serve(stream, buf, head, &mut ahead, closing);
                    // Pingora's keep-alive settings are its path's alone
                    // (`serve_on_pingora`, which runs with no fast
                    // transport): there are none to carry here.
                    let settings = None;
                    (InBlock::new(served).await?, Next { ahead, settings })
                }
                (_, exception) => {
                    let settings = next.settings;
                    let served =
                        self.serve_http1(stream, buf, head, ahead, settings, exception, shutdown);
                    InBlock::new(served).await?
                }
            };
            watch.get_or_insert_with(|| shutdown.clone());
        };
        // HTTP/2 with prior knowledge (DESIGN §8) only on a plain
        // connection's first bytes, not a redirect listener's (those
        // answer HTTP/1 only). Boxed, as the rest: its state (HTTP/2's, or
        // the answer's write and the lingering read) would sit in every
        // silent connection's.
        let h2 = watch.is_none() && !tls && redirect.is_none();
        Box::pin(self.not_http1(stream, buf, failure, h2, shutdown)).await;
        None
    }

    /// A head that is no HTTP/1 request: HTTP/2 with prior knowledge when
    /// it opens with the preface and `h2` allows it, else refused.
    async fn not_http1(
        self: &Arc<Self>,
        mut stream: Stream,
        buf: BytesMut,
        failure: HeadFailure,
        h2: bool,
        shutdown: &ShutdownWatch,
    ) {
        if h2 && failure.error == HeadError::Preface {
            let fast = self.fast.as_deref();
            self.serve_h2(fast, stream, &buf, shutdown).await;
        } else {
            self.refuse(&mut stream, &buf, failure).await;
        }
    }

    /// A request's head (read into `buf`), what followed it split off
    /// ([`Self::past_head`]), and whether it is answered before either
    /// transport connects to a shard ([`Self::exception`]). The head is
    /// taken and given back: borrowed by the caller instead, it would stay
    /// in the connection's state across the request (the compiler keeps a
    /// borrowed local's room across an await even once it is moved), and
    /// idle connections hold that state too.
    fn prepared(
        &self,
        mut buf: BytesMut,
        head: Head,
        tls: bool,
        redirect: Option<u16>,
    ) -> (BytesMut, Head, BytesMut, Option<Exception>) {
        let ahead = self.past_head(&mut buf, &head);
        let exception = self.exception(&buf, &head, &ahead, tls, redirect);
        (buf, head, ahead, exception)
    }

    /// What follows a request's head in `buf`: the body's start, then the
    /// next request's, split off. None, nearly always for a GET: on the
    /// fast transport, no split, which would share the buffer through a
    /// counted allocation. (Pingora's path freezes `buf`: split, it is
    /// shared already, and freezing costs nothing more.)
    fn past_head(&self, buf: &mut BytesMut, head: &Head) -> BytesMut {
        match self.fast.is_some() && buf.len() == head.len {
            true => BytesMut::new(),
            false => buf.split_off(head.len),
        }
    }

    /// Whether a request is answered before either transport connects to
    /// a shard: at the edge (a plain listener's redirect to HTTPS, a bad
    /// host), or refused for a broken chunked body whose start came with
    /// the head (`ahead`).
    fn exception(
        &self,
        buf: &[u8],
        head: &Head,
        ahead: &[u8],
        tls: bool,
        redirect: Option<u16>,
    ) -> Option<Exception> {
        if let (false, Some((_, edge))) = (tls, &self.edge) {
            if let Some(answer) = edge_answer(buf, redirect, edge) {
                return Some(Exception::Edge(answer));
            }
        }
        let refused = head
            .body
            .check_start(ahead, self.limits.max_body_bytes)
            .err()?;
        Some(Exception::Refused(HeadFailure {
            error: HeadError::Refused(refused),
            began: std::time::Instant::now(),
        }))
    }

    /// One request of an HTTP/1 connection answered at the edge, refused,
    /// or (without the fast transport) on Pingora's, from its `head` (read
    /// into `buf`, what followed it in `ahead`) on; the connection back if
    /// it serves another.
    #[allow(clippy::too_many_arguments)]
    async fn serve_http1(
        self: &Arc<Self>,
        mut stream: Stream,
        buf: BytesMut,
        head: Head,
        ahead: BytesMut,
        settings: Option<pingora::apps::HttpPersistentSettings>,
        exception: Option<Exception>,
        shutdown: &ShutdownWatch,
    ) -> Option<(Stream, Next)> {
        match exception {
            Some(Exception::Edge(answer)) => {
                let more = self.answer_at_edge(&mut stream, &buf, &head.body, answer, shutdown);
                more.await.then_some((stream, Next { ahead, settings }))
            }
            Some(Exception::Refused(failure)) => {
                self.refuse(&mut stream, &buf, failure).await;
                None
            }
            None => {
                self.serve_on_pingora(stream, buf, head.body, ahead, settings, shutdown)
                    .await
            }
        }
    }

    /// An answer at the edge, with no shard (a redirect to HTTPS, a bad
    /// host); whether the connection serves another request. A request
    /// with a body (or a protocol switch) is not read on: the connection
    /// closes after the answer.
    async fn answer_at_edge(
        &self,
        stream: &mut Stream,
        head: &[u8],
        body: &Framing,
        answer: EdgeAnswer,
        shutdown: &ShutdownWatch,
    ) -> bool {
        let bodiless = matches!(body, Framing::Length(0));
        let more = bodiless && !answer.close && !*shutdown.borrow();
        let mut ctx = RequestCtx::default();
        let reply = self.identified(answer.answer, &ctx);
        let sent = async {
            stream
                .write_all(&reply.http1(answer.head_only, answer.close))
                .await?;
            stream.flush().await
        };
        let sent = tokio::time::timeout(self.limits.keepalive_timeout, sent).await;
        let sent = matches!(sent, Ok(Ok(())));
        let status = if sent { reply.status } else { 0 };
        if sent && !answer.head_only {
            ctx.bytes_out = reply.body.len() as u64;
        }
        self.log_head(&mut ctx, stream, head, status);
        if sent && more {
            return true;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
        linger(stream).await;
        false
    }

    /// The request on Pingora's proxy: the head and the body bytes read
    /// with it are this request's; anything after them is the next one's.
    async fn serve_on_pingora(
        self: &Arc<Self>,
        stream: Stream,
        mut buf: BytesMut,
        mut body: Framing,
        ahead: BytesMut,
        settings: Option<pingora::apps::HttpPersistentSettings>,
        shutdown: &ShutdownWatch,
    ) -> Option<(Stream, Next)> {
        let mut rest = ahead;
        let used = body.consume(&rest).unwrap_or_else(|_| {
            body = Framing::UntilClose;
            rest.len()
        });
        let mut ahead = rest.split_off(used);
        buf.unsplit(rest);
        if matches!(body, Framing::UntilClose) {
            // A protocol switch: whatever the client sent past the head
            // is Pingora's to see, in order.
            buf.unsplit(std::mem::take(&mut ahead));
        }
        let limit = self.limits.max_header_bytes;
        let client: Stream = Box::new(OneRequest::new(
            stream,
            body,
            std::mem::take(&mut ahead),
            limit,
            self.limits.max_body_bytes,
        ));
        let mut session = ServerSession::new_http1(client);
        match settings {
            Some(s) => pingora::apps::HttpPersistentSettings::apply_to_session(s, &mut session),
            None => session.set_keepalive(Some(self.limits.keepalive_timeout.as_secs().max(1))),
        }
        if *shutdown.borrow() {
            session.set_keepalive(None);
        }
        session.set_pipelined_prefix(buf);
        let reused = self.inner.process_new_http(session, shutdown).await?;
        let (next, persistent) = reused.consume();
        let (stream, ahead) = OneRequest::unwrap(next)?;
        Some((
            stream,
            Next {
                ahead,
                settings: persistent,
            },
        ))
    }
}

/// A request answered before either transport connects to a shard.
enum Exception {
    Edge(EdgeAnswer),
    Refused(HeadFailure),
}

/// What an HTTP/1 connection carries from one request to the next.
#[derive(Default)]
struct Next {
    /// What the client sent past the last request: the next one's start.
    ahead: BytesMut,
    /// Pingora's keep-alive settings of the last request (its path only).
    settings: Option<pingora::apps::HttpPersistentSettings>,
}
