//! The fast path: shardgate's own HTTP/1.1 forwarding for the shapes that
//! make up most traffic — requests without a body (GET, HEAD, OPTIONS,
//! DELETE) and WebSocket handshakes — to plain-HTTP shards.
//!
//! Pingora's proxy runs every request through channels between two tasks,
//! two header maps and a pooled connection guarded by a task of its own;
//! measured here, a bare Pingora proxy spends about half again nginx's CPU
//! per request before shardgate does anything. Here a request is one task:
//! the head (already read and limited by `HeadGuard`) is rewritten byte for
//! byte into one write, the response head is parsed once, the body is
//! copied with its framing tracked, and the upstream connection goes back
//! to a small per-thread pool. A WebSocket tunnel is a bidirectional copy
//! with 2 KiB buffers. The decisions are the Gateway's own: `plan_parts`
//! routes and admits, failures go through the same hook, retry rules and
//! budget; the headers deadline and liveness probes run in the request's
//! task.
//!
//! Anything else — a body, `Expect`, HTTP/1.0, an absolute-form target, a
//! `Connection` naming other fields, pipelined bytes — goes to Pingora's
//! path, which already handles it; so does a request routed to an `https`
//! shard, handed over already planned (see [`super::with_planned`]).

use super::ctx::RequestCtx;
use super::hooks::UpstreamFailure;
use super::respond::Refusal;
use super::watch::probe;
use super::{host_from, Gateway};
use bytes::BytesMut;
use http::Method;
use pingora::protocols::http::date::get_cached_date;
use pingora::protocols::Stream;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::future::{poll_fn, Future};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use thread_local::ThreadLocal;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// Response heads larger than this are refused (502).
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// As Pingora's limit on header fields.
const MAX_RESPONSE_HEADERS: usize = 256;
/// Request heads with more fields go to Pingora's path.
const MAX_REQUEST_HEADERS: usize = 128;
/// Idle upstream connections kept per shard and worker thread.
const POOL_PER_SHARD: usize = 256;
/// Every this many releases, a thread's pool drops expired connections to
/// every shard (removed shards included).
const POOL_SWEEP_EVERY: u32 = 1024;
/// Pooled connections idle for longer are checked before reuse.
const CHECK_IDLE_AFTER: Duration = Duration::from_secs(1);
/// The copy buffers of a WebSocket tunnel, each way.
const TUNNEL_BUFFER: usize = 2048;
/// Response bodies are copied in reads of up to this much.
const BODY_READ: usize = 16 * 1024;

/// What the fast path did with a request.
pub enum Outcome {
    /// Served; the client connection, if it may carry another request.
    Served(Option<Stream>),
    /// For Pingora's path: the connection, the head as read, and the
    /// context if the request is already planned (and admitted).
    NotMine(Stream, BytesMut, Option<Box<RequestCtx>>),
}

/// Which shape a request head has.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Plain,
    WebSocket,
}

/// A parsed request head, borrowing the buffer it came in.
struct RequestHead<'b> {
    method: &'b str,
    target: &'b str,
    headers: Vec<(&'b str, &'b [u8])>,
    /// The client asked to close after this request.
    close: bool,
    shape: Shape,
}

impl<'b> RequestHead<'b> {
    fn values<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'b [u8]> + 's {
        self.headers
            .iter()
            .filter(move |(n, _)| header_is(n, name))
            .map(|(_, v)| *v)
    }

    fn head_only(&self) -> bool {
        self.method == "HEAD"
    }
}

/// Idle upstream connections of one worker thread, per shard address.
#[derive(Default)]
struct Pool {
    idle: HashMap<SocketAddr, Vec<(TcpStream, Instant)>>,
    releases: u32,
}

/// shardgate's own forwarding for bodiless HTTP/1.1 requests and WebSocket
/// handshakes (see the module documentation).
pub struct FastPath {
    gateway: Gateway,
    pools: ThreadLocal<RefCell<Pool>>,
    idle_timeout: Duration,
    connect_timeout: Duration,
    send_timeout: Duration,
}

fn header_is(name: &str, wanted: &str) -> bool {
    name.eq_ignore_ascii_case(wanted)
}

/// Comma-separated tokens of a field value, trimmed, empty ones skipped.
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Hop-by-hop fields never forwarded as the client sent them.
fn hop_by_hop(name: &str) -> bool {
    const FIELDS: [&str; 9] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ];
    FIELDS.iter().any(|f| header_is(name, f))
}

/// Parses the head in `buf` and decides whether it is the fast path's.
fn classify(buf: &[u8]) -> Option<RequestHead<'_>> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_REQUEST_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        _ => return None,
    };
    // Pipelined bytes, HTTP/1.0, absolute-form and non-ASCII targets:
    // Pingora's path (which refuses what it must).
    if len != buf.len() || req.version != Some(1) {
        return None;
    }
    let (method, target) = (req.method?, req.path?);
    if !target.starts_with('/') || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    let headers: Vec<(&str, &[u8])> = req.headers.iter().map(|h| (h.name, h.value)).collect();
    let (mut upgrade, mut lengths) = (None, 0);
    let (mut close, mut connection_upgrade) = (false, false);
    for (name, value) in &headers {
        if header_is(name, "transfer-encoding") || header_is(name, "expect") {
            return None;
        }
        if header_is(name, "content-length") {
            lengths += 1;
            if lengths > 1 || value.trim_ascii() != b"0" {
                return None;
            }
        }
        if header_is(name, "upgrade") {
            upgrade = Some(*value);
        }
        if header_is(name, "connection") {
            for token in tokens(value) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"upgrade") {
                    connection_upgrade = true;
                } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                    // Naming other fields: Pingora strips them.
                    return None;
                }
            }
        }
    }
    let shape = match upgrade {
        None if matches!(method, "GET" | "HEAD" | "OPTIONS" | "DELETE") => Shape::Plain,
        Some(u)
            if method == "GET"
                && connection_upgrade
                && u.trim_ascii().eq_ignore_ascii_case(b"websocket") =>
        {
            Shape::WebSocket
        }
        _ => return None,
    };
    Some(RequestHead {
        method,
        target,
        headers,
        close,
        shape,
    })
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
    pub fn new(gateway: Gateway) -> Self {
        let upstream = &gateway.control().config.upstream;
        FastPath {
            idle_timeout: upstream.keepalive_timeout,
            connect_timeout: upstream.connect_timeout,
            send_timeout: gateway.control().config.limits.send_timeout,
            gateway,
            pools: ThreadLocal::new(),
        }
    }

    /// Serves the request whose whole head is in `buf`, if it is a shape
    /// the fast path takes. `closing`: the server is shutting down, so the
    /// connection closes after this request.
    pub async fn serve(&self, mut client: Stream, buf: BytesMut, closing: bool) -> Outcome {
        let Some(head) = classify(&buf) else {
            return Outcome::NotMine(client, buf, None);
        };
        let gw = &self.gateway;
        let config = &gw.control().config;
        let mut ctx = RequestCtx::default();
        let host = host_from(None, head.values("host"));
        let path = head.target.split('?').next().unwrap_or_default();
        let channel = config
            .routing
            .channel_header
            .as_ref()
            .and_then(|name| head.values(name.as_str()).next());
        let client_addr = client
            .get_socket_digest()
            .and_then(|d| d.peer_addr().cloned());
        let close = head.close || closing;
        let (status, keep) = match gw.plan_parts(host, path, channel, &mut ctx) {
            Err(refusal) => {
                ctx.answered = Some(refusal.status);
                let answer = refusal_bytes(&refusal, head.head_only(), close);
                let written = self.send(&mut client, answer.as_bytes()).await;
                (refusal.status, written && !close)
            }
            Ok(()) if ctx.peer.as_ref().is_some_and(|p| p.peer.is_tls()) => {
                drop(head);
                return Outcome::NotMine(client, buf, Some(Box::new(ctx)));
            }
            Ok(()) => {
                let forwarded = Forwarded {
                    host: host.unwrap_or_default(),
                    proto: gw.scheme_of(client.get_ssl_digest().is_some()),
                    peer_ip: client_addr
                        .as_ref()
                        .and_then(|a| a.as_inet())
                        .map(|a| canonical_ip(a.ip())),
                };
                let request = self.rewrite(&head, &forwarded, &ctx);
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
                        .exchange(&mut client, request, &how, &mut ctx, &mut held)
                        .await
                    {
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
                    .exchange(&mut client, request, &how, &mut ctx, &mut None)
                    .await
                {
                    Exchanged::Done(status, keep) => (status, keep),
                    Exchanged::Closed(status) => (status, false),
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

    /// Attempts until a response head arrives or the rules say stop, then
    /// the response (or the tunnel). A retry routed to an `https` shard is
    /// handed to Pingora's path, already routed; `held` is the head's
    /// buffer when the caller needs it back for that, dropped once a
    /// tunnel starts. While the shard is awaited, a client that closes
    /// ends the request (and frees its admission), as on Pingora's path.
    async fn exchange(
        &self,
        client: &mut Stream,
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
            let result = tokio::select! {
                result = attempt => result,
                () = client_gone(client) => return Exchanged::Closed(0),
            };
            let failure = match result {
                Ok(upstream) if how.websocket && upstream.parsed.status == 101 => {
                    drop(request);
                    *held = None;
                    return self.tunnel(client, upstream).await;
                }
                // A handshake refused: an ordinary response, then close.
                Ok(upstream) => {
                    let close = how.close || how.websocket;
                    return self.respond(client, close, upstream, peer.addr).await;
                }
                Err(failure) => failure,
            };
            if let Err(refusal) = self.after_failure(failure, &how.method, ctx) {
                return Exchanged::Closed(self.answer(client, ctx, refusal, how.head_only).await);
            }
        }
    }

    /// After a failed attempt: `Ok` to try again — on a fresh connection to
    /// the same shard after a stale pooled one, else routed again with the
    /// failed shard excluded — or the answer to give. The rules are the
    /// Pingora path's (`error_while_proxy`, `fail_to_connect`).
    fn after_failure(
        &self,
        failure: AttemptError,
        method: &Method,
        ctx: &mut RequestCtx,
    ) -> Result<(), Refusal> {
        let gw = &self.gateway;
        let kind = match failure {
            AttemptError::Stale if ctx.stale_retries == 0 => {
                // The shard may have closed an idle connection just as we
                // reused it: sent again, on a fresh connection (the others
                // idle in this thread's pool are likely closed too).
                if let Some(peer) = &ctx.peer {
                    self.forget(peer.addr);
                }
                if gw.may_resend_stale(method, true, ctx) {
                    return Ok(());
                }
                return Err(Refusal::error(502, "upstream-unreachable"));
            }
            AttemptError::Stale => UpstreamFailure::Reset,
            AttemptError::Failed(kind) => kind,
            // The shard answered, but not in HTTP/1.x as we read it: it is
            // reachable (no hook; one tenant's broken app must not take a
            // shared shard out of rotation), and the request was delivered.
            AttemptError::Invalid => return Err(Refusal::error(502, "upstream-invalid-response")),
        };
        gw.record_failure(ctx, kind);
        if kind == UpstreamFailure::Timeout {
            return Err(Refusal::error(504, "upstream-timeout"));
        }
        if !gw.may_retry_request(method, true, ctx, kind != UpstreamFailure::Connect) {
            return Err(Refusal::error(502, "upstream-unreachable"));
        }
        gw.readmit(ctx)
    }

    /// The request head as the shard receives it: the client's fields byte
    /// for byte, minus hop-by-hop and forwarding fields, plus ours (the
    /// same fields as [`super::forward::Forwarding`]).
    fn rewrite(&self, head: &RequestHead<'_>, fwd: &Forwarded<'_>, ctx: &RequestCtx) -> Vec<u8> {
        let config = &self.gateway.control().config;
        let tenant_header = config.tenant_header.as_str();
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(head.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(head.target.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        for (name, value) in &head.headers {
            if hop_by_hop(name)
                || super::forward::is_ours(name, tenant_header, config.trust_forwarded_for)
            {
                continue;
            }
            push_field(&mut out, name.as_bytes(), value);
        }
        if head.shape == Shape::WebSocket {
            out.extend_from_slice(b"Connection: Upgrade\r\nUpgrade: websocket\r\n");
        }
        push_field(&mut out, b"X-Forwarded-Host", fwd.host.as_bytes());
        push_field(&mut out, b"X-Forwarded-Proto", fwd.proto.as_bytes());
        if let Some(ip) = fwd.peer_ip {
            out.extend_from_slice(b"X-Forwarded-For: ");
            if config.trust_forwarded_for {
                let prior: Vec<&[u8]> = head.values("x-forwarded-for").collect();
                // As the Pingora path: only a prior chain that is all text.
                if prior
                    .iter()
                    .all(|v| v.iter().all(|b| *b == b'\t' || (b' '..=b'~').contains(b)))
                {
                    for value in prior {
                        out.extend_from_slice(value);
                        out.extend_from_slice(b", ");
                    }
                }
            }
            let mut ip_text = String::with_capacity(40);
            let _ = fmt::write(&mut ip_text, format_args!("{ip}"));
            out.extend_from_slice(ip_text.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        push_field(
            &mut out,
            tenant_header.as_bytes(),
            ctx.tenant.as_deref().unwrap_or_default().as_bytes(),
        );
        out.extend_from_slice(b"\r\n");
        out
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
        let _ = self
            .send(client, refusal_bytes(&refusal, head_only, true).as_bytes())
            .await;
        refusal.status
    }

    fn pool(&self) -> std::cell::RefMut<'_, Pool> {
        self.pools.get_or(RefCell::default).borrow_mut()
    }

    /// A pooled connection to `addr`, if any: the most recently used one.
    /// A connection the reactor has seen become readable while idle (the
    /// shard closed it, or sent bytes no request asked for — reused, they
    /// would answer the next request) is checked with a read and dropped
    /// unless that finds nothing; so is one idle for longer than
    /// [`CHECK_IDLE_AFTER`]. A quiet young one costs no syscall (a peek
    /// on every reuse was one syscall in five under load); one closed too
    /// recently for the reactor to know is retried once on a fresh
    /// connection (see `after_failure`).
    fn pooled(&self, addr: SocketAddr) -> Option<TcpStream> {
        let mut pool = self.pool();
        let idle = pool.idle.get_mut(&addr)?;
        while let Some((conn, since)) = idle.pop() {
            let idle_for = since.elapsed();
            if idle_for >= self.idle_timeout {
                continue;
            }
            let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
            let quiet = conn.poll_read_ready(&mut cx).is_pending();
            if (quiet && idle_for < CHECK_IDLE_AFTER) || nothing_to_read(&conn) {
                return Some(conn);
            }
        }
        None
    }

    /// Drops this thread's idle connections to `addr` (one was found
    /// closed: the shard may have restarted).
    fn forget(&self, addr: SocketAddr) {
        self.pool().idle.remove(&addr);
    }

    fn release(&self, addr: SocketAddr, conn: TcpStream) {
        let timeout = self.idle_timeout;
        let mut pool = self.pool();
        pool.releases = pool.releases.wrapping_add(1);
        if pool.releases % POOL_SWEEP_EVERY == 0 {
            pool.idle.retain(|_, idle| {
                idle.retain(|(_, since)| since.elapsed() < timeout);
                !idle.is_empty()
            });
        }
        let idle = pool.idle.entry(addr).or_default();
        if idle.len() < POOL_PER_SHARD {
            idle.push((conn, Instant::now()));
        }
    }

    /// Sends the request on a pooled or new connection and reads the
    /// response head, within the headers deadline and with liveness probes.
    async fn attempt(
        &self,
        addr: SocketAddr,
        request: &[u8],
        head_only: bool,
        websocket: bool,
    ) -> Result<Upstream, AttemptError> {
        let (mut conn, broken) = match self.pooled(addr) {
            Some(conn) => (conn, AttemptError::Stale),
            None => {
                let connect = tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr));
                let Ok(Ok(conn)) = connect.await else {
                    return Err(AttemptError::Failed(UpstreamFailure::Connect));
                };
                let _ = conn.set_nodelay(true);
                (conn, AttemptError::Failed(UpstreamFailure::Reset))
            }
        };
        let settings = self.gateway.watch_settings();
        let started = tokio::time::Instant::now();
        let deadline = started + settings.headers_timeout;
        match tokio::time::timeout_at(deadline, conn.write_all(request)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(broken),
            Err(_) => return Err(AttemptError::Failed(UpstreamFailure::Timeout)),
        }
        let mut next_probe = settings.liveness.map(|l| started + l.after);
        let mut buf = BytesMut::with_capacity(8192);
        let mut received = false;
        loop {
            let wake = next_probe.map_or(deadline, |p| p.min(deadline));
            tokio::select! {
                read = conn.read_buf(&mut buf) => {
                    match read {
                        // Nothing came back on a pooled connection: stale.
                        Ok(0) | Err(_) if !received => return Err(broken),
                        Ok(0) | Err(_) => return Err(AttemptError::Failed(UpstreamFailure::Reset)),
                        Ok(_) => received = true,
                    }
                    match parse_response(&buf, head_only, websocket) {
                        Ok(Some(parsed)) => return Ok(Upstream { conn, buf, parsed }),
                        Ok(None) if buf.len() <= MAX_RESPONSE_HEAD => {}
                        _ => return Err(AttemptError::Invalid),
                    }
                }
                _ = tokio::time::sleep_until(wake) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(AttemptError::Failed(UpstreamFailure::Timeout));
                    }
                    if let Some(liveness) = settings.liveness {
                        if !probe(addr, liveness.probe_timeout).await {
                            return Err(AttemptError::Failed(UpstreamFailure::Liveness));
                        }
                        next_probe = Some(tokio::time::Instant::now() + liveness.after);
                    }
                }
            }
        }
    }

    /// Writes the response head and streams the body; the upstream
    /// connection goes back to the pool when its framing allows.
    async fn respond(
        &self,
        client: &mut Stream,
        close: bool,
        upstream: Upstream,
        addr: SocketAddr,
    ) -> Exchanged {
        let Upstream {
            mut conn,
            mut buf,
            parsed,
        } = upstream;
        let status = parsed.status;
        // A body that ends when the shard closes ends the client's
        // connection too.
        let close = close || matches!(parsed.framing, Framing::UntilClose);
        let mut out = response_head(&buf, &parsed, close);
        let mut framing = parsed.framing;
        let body = buf.split_off(parsed.head_len);
        // Body bytes that break the framing before anything was sent: the
        // client still gets an answer.
        let Ok(used) = framing.consume(&body) else {
            let refusal = Refusal::error(502, "upstream-invalid-response");
            let _ = self
                .send(client, refusal_bytes(&refusal, false, true).as_bytes())
                .await;
            return Exchanged::Closed(502);
        };
        // Bytes beyond the response: the shard misbehaved; do not reuse it.
        let mut reusable = used == body.len() && !parsed.upstream_close;
        out.extend_from_slice(&body[..used]);
        if !self.send(client, &out).await {
            return Exchanged::Closed(status);
        }
        drop(out);
        buf = body;
        while !framing.is_done() {
            buf.clear();
            buf.reserve(BODY_READ);
            let read = tokio::select! {
                read = conn.read_buf(&mut buf) => read,
                () = client_gone(client) => return Exchanged::Closed(status),
            };
            match read {
                Ok(0) | Err(_) if matches!(framing, Framing::UntilClose) => {
                    reusable = false;
                    break;
                }
                // Cut short: the client's connection cannot frame anything
                // after this.
                Ok(0) | Err(_) => return Exchanged::Closed(status),
                Ok(_) => {}
            }
            let Ok(used) = framing.consume(&buf) else {
                return Exchanged::Closed(status);
            };
            reusable &= used == buf.len();
            if !self.send(client, &buf[..used]).await {
                return Exchanged::Closed(status);
            }
        }
        if reusable {
            self.release(addr, conn);
        }
        Exchanged::Done(status, !close)
    }

    /// A WebSocket's 101 goes to the client, then bytes flow both ways
    /// until either side closes; the admission is held all along.
    async fn tunnel(&self, client: &mut Stream, upstream: Upstream) -> Exchanged {
        let Upstream {
            mut conn,
            buf,
            parsed,
        } = upstream;
        let mut out = response_head(&buf, &parsed, false);
        // Bytes the shard sent right after its 101 are tunnel data.
        out.extend_from_slice(&buf[parsed.head_len..]);
        drop(buf);
        if !self.send(client, &out).await {
            return Exchanged::Closed(101);
        }
        drop(out);
        // Until either side closes (or fails): a WebSocket does not
        // half-close, and a client that keeps its end open after the
        // shard's close would otherwise hold the admission forever. Each
        // direction moves on its own: a side slow to read holds back only
        // what is sent to it, for at most `limits.send_timeout_ms`.
        let mut legs = [Leg::default(), Leg::default()];
        let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
        poll_fn(|cx| {
            if legs[0].poll_move(&mut **client, &mut conn, cx).is_ready()
                || legs[1].poll_move(&mut conn, &mut **client, cx).is_ready()
            {
                return Poll::Ready(());
            }
            let Some(since) = legs.iter().filter_map(|leg| leg.stalled).min() else {
                timer = None;
                return Poll::Pending;
            };
            let deadline = since + self.send_timeout;
            let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if timer.deadline() != deadline {
                timer.as_mut().reset(deadline);
            }
            timer.as_mut().poll(cx)
        })
        .await;
        Exchanged::Closed(101)
    }
}

/// One direction of a WebSocket tunnel: what was read from one side and
/// is being written to the other (nothing while idle).
#[derive(Default)]
struct Leg {
    pending: Vec<u8>,
    written: usize,
    /// Since when the write has been waiting without progress.
    stalled: Option<tokio::time::Instant>,
}

impl Leg {
    /// Moves bytes from `from` to `to` until one of them has to wait.
    /// Ready: this direction ended (closed or failed).
    fn poll_move<R, W>(&mut self, from: &mut R, to: &mut W, cx: &mut Context<'_>) -> Poll<()>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        loop {
            if self.pending.is_empty() {
                match ready!(poll_read_lazily(from, cx)) {
                    Ok(bytes) if !bytes.is_empty() => {
                        self.pending = bytes;
                        self.written = 0;
                    }
                    _ => return Poll::Ready(()),
                }
            }
            while self.written < self.pending.len() {
                match Pin::new(&mut *to).poll_write(cx, &self.pending[self.written..]) {
                    Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(()),
                    Poll::Ready(Ok(n)) => {
                        self.written += n;
                        self.stalled = None;
                    }
                    Poll::Pending => return self.wait(),
                }
            }
            match Pin::new(&mut *to).poll_flush(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => return self.wait(),
            }
            self.pending = Vec::new();
            self.stalled = None;
        }
    }

    fn wait(&mut self) -> Poll<()> {
        self.stalled.get_or_insert_with(tokio::time::Instant::now);
        Poll::Pending
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
}

/// Completes when the client closes its connection (or it fails) while a
/// response is awaited; never if it sends bytes instead (a pipelined
/// request, kept for later: the peek puts them back) or cannot be peeked.
async fn client_gone(client: &mut Stream) {
    let mut byte = [0u8; 1];
    if client.try_peek(&mut byte).await.is_ok() {
        std::future::pending::<()>().await;
    }
}

/// How a request is exchanged with its shard.
struct How {
    method: Method,
    head_only: bool,
    websocket: bool,
    /// The client connection closes after the response.
    close: bool,
}

/// Reads what `io` has, without holding a buffer while it waits: an empty
/// read first (it completes when the socket is readable, or at once on a
/// stream that cannot wait that way), then a read into a fresh buffer
/// that is dropped again if nothing is there after all. An idle tunnel
/// therefore holds no copy buffers. Empty: the stream ended.
fn poll_read_lazily<R: AsyncRead + Unpin + ?Sized>(
    io: &mut R,
    cx: &mut Context<'_>,
) -> Poll<io::Result<Vec<u8>>> {
    let mut probe = ReadBuf::new(&mut []);
    ready!(Pin::new(&mut *io).poll_read(cx, &mut probe))?;
    let mut bytes = vec![0u8; TUNNEL_BUFFER];
    let mut buf = ReadBuf::new(&mut bytes);
    ready!(Pin::new(&mut *io).poll_read(cx, &mut buf))?;
    let n = buf.filled().len();
    bytes.truncate(n);
    Poll::Ready(Ok(bytes))
}

fn push_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The response head the client receives: the shard's status and fields,
/// minus hop-by-hop ones (as [`super::forward::strip_response_hop_by_hop`];
/// a 101 keeps `Connection` and `Upgrade`) and minus a `Content-Length`
/// that `Transfer-Encoding` overrides; plus a `Date` if it has none.
fn response_head(buf: &[u8], parsed: &ParsedResponse, close: bool) -> Vec<u8> {
    let switching = parsed.status == 101;
    let mut out = Vec::with_capacity(parsed.head_len + 32);
    // httparse accepts only three-digit codes: 100..=999.
    let code = parsed.status;
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(&[
        b'0' + (code / 100) as u8,
        b'0' + (code / 10 % 10) as u8,
        b'0' + (code % 10) as u8,
        b' ',
    ]);
    out.extend_from_slice(&buf[parsed.reason.clone()]);
    out.extend_from_slice(b"\r\n");
    let mut dated = false;
    for (name, value) in &parsed.headers {
        let (name, value) = (&buf[name.clone()], &buf[value.clone()]);
        let text = std::str::from_utf8(name).unwrap_or_default();
        dated |= header_is(text, "date");
        let keep = if header_is(text, "transfer-encoding") {
            parsed.chunked
        } else if header_is(text, "content-length") {
            !parsed.transfer_encoding
        } else if switching && (header_is(text, "connection") || header_is(text, "upgrade")) {
            true
        } else {
            !hop_by_hop(text)
                && (switching || !parsed.named.iter().any(|n| n.eq_ignore_ascii_case(name)))
        };
        if keep {
            push_field(&mut out, name, value);
        }
    }
    if !dated {
        // RFC 9110 §6.6.1: a forwarded response gets a Date if it has none.
        push_field(&mut out, b"Date", get_cached_date().as_bytes());
    }
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// What a request's forwarding fields say.
struct Forwarded<'a> {
    host: &'a str,
    proto: &'static str,
    peer_ip: Option<IpAddr>,
}

/// An IPv4 client on a dual-stack listener, as IPv4.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether an idle connection has neither been closed nor sent anything:
/// a non-blocking read must find nothing (it also clears the reactor's
/// readiness, so a quiet connection reads as quiet next time). A byte it
/// does read condemns the connection anyway.
fn nothing_to_read(conn: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(conn.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// An attempt that got a response head.
struct Upstream {
    conn: TcpStream,
    buf: BytesMut,
    parsed: ParsedResponse,
}

enum AttemptError {
    /// A reused pooled connection broke before any response byte: maybe
    /// just closed by the shard while idle.
    Stale,
    Failed(UpstreamFailure),
    /// The shard answered with something that is not an HTTP/1.x response
    /// we forward (malformed, over the head limits, a 101 nobody asked for).
    Invalid,
}

/// A response head, as ranges into the buffer it was read in.
struct ParsedResponse {
    status: u16,
    /// The reason phrase ("OK"), possibly empty.
    reason: Range<usize>,
    headers: Vec<(Range<usize>, Range<usize>)>,
    /// Fields the shard's `Connection` names (hop-by-hop).
    named: Vec<Vec<u8>>,
    /// The shard will close the connection after this response.
    upstream_close: bool,
    transfer_encoding: bool,
    /// `Transfer-Encoding` ends in `chunked`.
    chunked: bool,
    head_len: usize,
    framing: Framing,
}

fn range_of(base: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - base.as_ptr() as usize;
    start..start + part.len()
}

/// Parses a response head; skips informational (1xx) heads other than a
/// WebSocket's 101. `Ok(None)`: incomplete.
fn parse_response(
    buf: &[u8],
    head_only: bool,
    websocket: bool,
) -> Result<Option<ParsedResponse>, ()> {
    let mut offset = 0;
    loop {
        let mut slots = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
        let mut resp = httparse::Response::new(&mut slots);
        let rest = &buf[offset..];
        let len = match resp.parse(rest) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(()),
        };
        // HTTP/1.0 (Python's http.server, say): framed by length or by
        // the close, never chunked, and the connection is not reused.
        let http10 = resp.version == Some(0);
        let status = resp.code.ok_or(())?;
        if status == 101 && (!websocket || http10) {
            return Err(());
        }
        if (100..200).contains(&status) && status != 101 {
            offset += len;
            continue;
        }
        // The reason phrase, as a range of `buf` (httparse hands out a
        // static "" when there is none; it also skips leading empty lines,
        // so the status line is not necessarily where `rest` starts).
        let reason = match resp.reason {
            Some(text) if !text.is_empty() => range_of(buf, text.as_bytes()),
            _ => 0..0,
        };
        let mut parsed = ParsedResponse {
            status,
            reason,
            headers: Vec::with_capacity(resp.headers.len()),
            named: Vec::new(),
            upstream_close: http10,
            transfer_encoding: false,
            chunked: false,
            head_len: offset + len,
            framing: Framing::UntilClose,
        };
        let mut length: Option<u64> = None;
        for h in resp.headers.iter() {
            parsed
                .headers
                .push((range_of(buf, h.name.as_bytes()), range_of(buf, h.value)));
            if header_is(h.name, "connection") {
                for token in tokens(h.value) {
                    if token.eq_ignore_ascii_case(b"close") {
                        parsed.upstream_close = true;
                    } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                        parsed.named.push(token.to_vec());
                    }
                }
            } else if header_is(h.name, "transfer-encoding") {
                if http10 {
                    return Err(());
                }
                parsed.transfer_encoding = true;
                parsed.chunked = tokens(h.value)
                    .last()
                    .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
            } else if header_is(h.name, "content-length") {
                let value = h.value.trim_ascii();
                if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
                    return Err(());
                }
                let n: u64 = std::str::from_utf8(value)
                    .map_err(|_| ())?
                    .parse()
                    .map_err(|_| ())?;
                if length.is_some_and(|l| l != n) {
                    return Err(());
                }
                length = Some(n);
            }
        }
        parsed.framing = if head_only || matches!(status, 101 | 204 | 304) {
            Framing::Length(0)
        } else if parsed.chunked {
            Framing::Chunked(ChunkState::Size {
                value: 0,
                digits: 0,
            })
        } else if parsed.transfer_encoding {
            Framing::UntilClose
        } else if let Some(n) = length {
            Framing::Length(n)
        } else {
            Framing::UntilClose
        };
        parsed.upstream_close |= matches!(parsed.framing, Framing::UntilClose);
        return Ok(Some(parsed));
    }
}

/// How far into a response body we are.
#[derive(Clone, Debug)]
enum Framing {
    Length(u64),
    Chunked(ChunkState),
    UntilClose,
}

/// A chunked body's parser state, fed the bytes as they are forwarded.
#[derive(Clone, Copy, Debug)]
enum ChunkState {
    /// Reading the size's hex digits.
    Size {
        value: u64,
        digits: u8,
    },
    /// Whitespace after the size.
    SizeSpace {
        value: u64,
    },
    /// After the size: an extension, up to CR.
    Extension {
        value: u64,
    },
    /// Expecting the LF that ends the size line.
    SizeLf {
        value: u64,
    },
    Data {
        left: u64,
    },
    DataCr,
    DataLf,
    /// After the last chunk: at the start of a trailer line (or the end).
    TrailerStart,
    TrailerLine,
    TrailerLf,
    EndLf,
    Done,
}

impl ChunkState {
    /// The state after one more byte (never called in `Data` or `Done`).
    fn step(self, b: u8) -> Result<ChunkState, ()> {
        Ok(match self {
            ChunkState::Size { value, digits } => match b {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' if digits < 15 => {
                    let digit = u64::from((b as char).to_digit(16).ok_or(())?);
                    ChunkState::Size {
                        value: value * 16 + digit,
                        digits: digits + 1,
                    }
                }
                b';' if digits > 0 => ChunkState::Extension { value },
                b' ' | b'\t' if digits > 0 => ChunkState::SizeSpace { value },
                b'\r' if digits > 0 => ChunkState::SizeLf { value },
                _ => return Err(()),
            },
            // RFC 9112 §7.1.1: only whitespace before `;` or the CRLF, so
            // "5 6" is not a size 5 with an extension.
            ChunkState::SizeSpace { value } => match b {
                b' ' | b'\t' => ChunkState::SizeSpace { value },
                b';' => ChunkState::Extension { value },
                b'\r' => ChunkState::SizeLf { value },
                _ => return Err(()),
            },
            ChunkState::Extension { value } => match b {
                b'\r' => ChunkState::SizeLf { value },
                b'\n' => return Err(()),
                _ => ChunkState::Extension { value },
            },
            ChunkState::SizeLf { value: 0 } if b == b'\n' => ChunkState::TrailerStart,
            ChunkState::SizeLf { value } if b == b'\n' => ChunkState::Data { left: value },
            ChunkState::DataCr if b == b'\r' => ChunkState::DataLf,
            ChunkState::DataLf if b == b'\n' => ChunkState::Size {
                value: 0,
                digits: 0,
            },
            ChunkState::TrailerStart if b == b'\r' => ChunkState::EndLf,
            ChunkState::TrailerStart | ChunkState::TrailerLine if b != b'\n' && b != b'\r' => {
                ChunkState::TrailerLine
            }
            ChunkState::TrailerLine if b == b'\r' => ChunkState::TrailerLf,
            ChunkState::TrailerLf if b == b'\n' => ChunkState::TrailerStart,
            ChunkState::EndLf if b == b'\n' => ChunkState::Done,
            _ => return Err(()),
        })
    }
}

impl Framing {
    fn is_done(&self) -> bool {
        match self {
            Framing::Length(n) => *n == 0,
            Framing::Chunked(ChunkState::Done) => true,
            _ => false,
        }
    }

    /// Advances over `bytes`; returns how many belong to the body (the
    /// rest, if any, is beyond its end). A malformed chunk stream is an
    /// error.
    fn consume(&mut self, bytes: &[u8]) -> Result<usize, ()> {
        match self {
            Framing::Length(left) => {
                let take = (*left).min(bytes.len() as u64);
                *left -= take;
                Ok(take as usize)
            }
            Framing::UntilClose => Ok(bytes.len()),
            Framing::Chunked(state) => {
                let mut at = 0;
                while at < bytes.len() {
                    *state = match *state {
                        ChunkState::Done => return Ok(at),
                        // Chunk data is skipped over, not stepped through.
                        ChunkState::Data { left } => {
                            let take = left.min((bytes.len() - at) as u64);
                            at += take as usize;
                            match left - take {
                                0 => ChunkState::DataCr,
                                left => ChunkState::Data { left },
                            }
                        }
                        other => {
                            at += 1;
                            other.step(bytes[at - 1])?
                        }
                    };
                }
                Ok(at)
            }
        }
    }
}

/// One of shardgate's own JSON answers, as written to the client.
fn refusal_bytes(refusal: &Refusal, head_only: bool, close: bool) -> String {
    let reason = http::StatusCode::from_u16(refusal.status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or_default();
    let mut out = format!(
        "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\ncache-control: no-store\r\n",
        refusal.status,
        refusal.body.len()
    );
    if let Some(secs) = refusal.retry_after {
        out.push_str(&format!("retry-after: {secs}\r\n"));
    }
    if close {
        out.push_str("connection: close\r\n");
    }
    out.push_str("\r\n");
    if !head_only {
        out.push_str(&refusal.body);
    }
    out
}

/// Entry points for the fuzz target `fuzz/fuzz_targets/upstream.rs`; not
/// an API.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// `bytes` as a shard's response, read as `attempt` reads it: what the
    /// client would receive is one well-formed head with the same status,
    /// no hop-by-hop field (but a 101's), never both `Content-Length` and
    /// `Transfer-Encoding`; the body framing counts the same bytes fed
    /// whole or split at `split`, and never more than it was given.
    pub fn response(bytes: &[u8], head_only: bool, websocket: bool, split: usize) {
        let Ok(Some(parsed)) = parse_response(bytes, head_only, websocket) else {
            return;
        };
        let head = response_head(bytes, &parsed, false);
        let mut slots = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS + 4];
        let mut resp = httparse::Response::new(&mut slots);
        match resp.parse(&head) {
            Ok(httparse::Status::Complete(n)) => {
                assert_eq!(n, head.len(), "one head, nothing after it")
            }
            other => panic!("the client's head does not parse: {other:?}"),
        }
        assert_eq!(resp.code, Some(parsed.status));
        let has = |name: &str| {
            resp.headers
                .iter()
                .any(|h| h.name.eq_ignore_ascii_case(name))
        };
        assert!(!(has("transfer-encoding") && has("content-length")));
        if parsed.status != 101 {
            for hop in [
                "connection",
                "keep-alive",
                "upgrade",
                "te",
                "trailer",
                "proxy-connection",
            ] {
                assert!(!has(hop), "{hop} forwarded");
            }
        }
        let body = &bytes[parsed.head_len..];
        let mut whole = parsed.framing.clone();
        let at_once = whole.consume(body);
        let split = split.min(body.len());
        let mut parts = parsed.framing.clone();
        let in_two = parts.consume(&body[..split]).and_then(|n| {
            if n < split || parts.is_done() {
                Ok(n)
            } else {
                parts.consume(&body[split..]).map(|m| n + m)
            }
        });
        assert_eq!(at_once.is_ok(), in_two.is_ok(), "{at_once:?} {in_two:?}");
        if let (Ok(a), Ok(b)) = (at_once, in_two) {
            assert_eq!(a, b);
            assert!(a <= body.len());
        }
    }

    /// `bytes` as a client's request head: what the fast path takes is a
    /// complete HTTP/1.1 head with an origin-form ASCII target and no body.
    pub fn request(bytes: &[u8]) {
        if let Some(head) = classify(bytes) {
            assert!(head.target.starts_with('/') && head.target.is_ascii());
            assert!(head.values("transfer-encoding").next().is_none());
            assert!(head
                .values("content-length")
                .all(|v| v.trim_ascii() == b"0"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked() -> Framing {
        Framing::Chunked(ChunkState::Size {
            value: 0,
            digits: 0,
        })
    }

    #[test]
    fn chunked_bodies_end_where_their_framing_says() {
        let body = b"3;x=1\r\nabc\r\n10 \t;y\r\n0123456789abcdef\r\n0\r\nX-T: 1\r\n\r\nEXTRA";
        let end = body.len() - b"EXTRA".len();
        let mut f = chunked();
        assert_eq!(f.consume(body), Ok(end));
        assert!(f.is_done());
        // Fed one byte at a time, the same.
        let mut f = chunked();
        let mut total = 0;
        for b in body.iter() {
            total += f.consume(std::slice::from_ref(b)).unwrap();
            if f.is_done() {
                break;
            }
        }
        assert_eq!(total, end);
        // Split inside a chunk's data.
        let mut f = chunked();
        assert_eq!(f.consume(&body[..20]), Ok(20));
        assert_eq!(f.consume(&body[20..]), Ok(end - 20));
        assert!(f.is_done());
    }

    #[test]
    fn malformed_chunks_are_errors() {
        for bad in [
            &b"zz\r\n"[..],
            b"3\nabc",
            b"3\r\nabcX\r\n",
            b"FFFFFFFFFFFFFFFF1\r\n",
            b"5 6\r\nhello\r\n",
            b"5 x;a=b\r\nhello\r\n",
            b"\r\n",
            b"0\r\n\n",
        ] {
            assert!(
                chunked().consume(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn response_heads_choose_their_framing() {
        let parse = |head: &[u8], head_only| parse_response(head, head_only, false);
        let p = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false)
            .unwrap()
            .unwrap();
        assert!(matches!(p.framing, Framing::Length(5)));
        assert_eq!((p.status, p.head_len), (200, 38));
        let p = parse(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.status, 204);
        assert!(p.framing.is_done());
        let p = parse(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3\r\n\r\n",
            false,
        )
        .unwrap()
        .unwrap();
        assert!(matches!(p.framing, Framing::Chunked(_)));
        let p = parse(b"HTTP/1.1 200 OK\r\n\r\n", false).unwrap().unwrap();
        assert!(matches!(p.framing, Framing::UntilClose) && p.upstream_close);
        let p = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", true)
            .unwrap()
            .unwrap();
        assert!(p.framing.is_done(), "HEAD has no body");
        assert!(parse(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            false
        )
        .is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\n", false).is_err());
        assert!(parse(b"HTTP/1.1 101 Switching\r\n\r\n", false).is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Le", false)
            .unwrap()
            .is_none());
    }

    #[test]
    fn response_heads_lose_hop_by_hop_fields() {
        let raw = b"HTTP/1.1 200 Fine\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\n\
Transfer-Encoding: chunked\r\nContent-Length: 12\r\nTrailer: x-sum\r\nX-Kept: yes\r\nDate: then\r\n\r\n";
        let p = parse_response(raw, false, false).unwrap().unwrap();
        let head = response_head(raw, &p, false);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "HTTP/1.1 200 Fine\r\nTransfer-Encoding: chunked\r\nX-Kept: yes\r\nDate: then\r\n\r\n"
        );
        let raw = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nKeep-Alive: 1\r\n\r\n";
        let p = parse_response(raw, false, true).unwrap().unwrap();
        let head = String::from_utf8(response_head(raw, &p, true)).unwrap();
        assert!(
            head.starts_with("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nDate: "),
            "{head}"
        );
        assert!(
            head.ends_with(" GMT\r\nConnection: close\r\n\r\n"),
            "{head}"
        );
    }

    #[test]
    fn status_lines_are_rebuilt_from_code_and_reason() {
        // Found by the `upstream` fuzz target: httparse skips empty lines
        // before the status line, which once made the copied range run
        // backwards (a panic on a shard's bytes).
        for (raw, line) in [
            (
                &b"\r\n\nHTTP/1.1 404 Not Here\r\n\r\n"[..],
                "HTTP/1.1 404 Not Here\r\n",
            ),
            (
                b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
                "HTTP/1.1 200 \r\n",
            ),
            (b"HTTP/1.1 503 \r\n\r\n", "HTTP/1.1 503 \r\n"),
        ] {
            let p = parse_response(raw, false, false).unwrap().unwrap();
            let head = String::from_utf8(response_head(raw, &p, false)).unwrap();
            assert!(head.starts_with(line), "{head:?}");
        }
    }

    #[test]
    fn only_plain_bodiless_requests_take_the_fast_path() {
        let fast = |raw: &str| classify(raw.as_bytes()).map(|h| h.shape);
        assert!(fast("GET / HTTP/1.1\r\nHost: a\r\n\r\n") == Some(Shape::Plain));
        assert!(
            fast(
                "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n"
            ) == Some(Shape::Plain)
        );
        assert!(
            fast("GET /ws HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n")
                == Some(Shape::WebSocket)
        );
        for slow in [
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n",
            "GET / HTTP/1.0\r\nHost: a\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: x-secret\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n",
            "PATCH / HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\n",
        ] {
            assert!(fast(slow).is_none(), "{slow:?}");
        }
    }
}
