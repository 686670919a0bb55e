//! Client request heads under limits. Pingora reads a request head with a
//! per-read timeout and a 1 MiB / 256-header ceiling, which a slowloris
//! client dribbling a byte at a time defeats. [`HeadGuard`] runs in front
//! of the proxy on every HTTP/1 connection: it reads each request head
//! itself — the whole head within `limits.header_timeout_ms` of its first
//! byte (408), at most `max_header_bytes` and `max_headers` (431), an idle
//! keep-alive connection closed after `keepalive_timeout_ms` — and hands
//! the bytes to Pingora's session as already read, so nothing is read
//! twice.

use super::client::OneRequest;
use super::ctx::RequestCtx;
use super::fast::h2::H2Outcome;
use super::fast::{FastPath, Outcome};
use super::pipeline::answer::Refusal;
use super::pipeline::edge::edge_answer;
use super::pipeline::framing::Framing;
use super::pipeline::message::{check_framing, check_request_line, Refused};
use super::with_planned;
use crate::tls::{Edge, Roles};
use bytes::BytesMut;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::http::v2::server::HttpSession as H2Session;
use pingora::protocols::http::ServerSession;
use pingora::protocols::{Stream, ALPN};
use pingora::server::ShutdownWatch;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The limits a request head must respect.
#[derive(Clone, Copy, Debug)]
pub struct HeadLimits {
    pub header_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// How long a kept-alive connection may wait for its next request.
    pub keepalive_timeout: Duration,
    /// Largest request body (`None`: unlimited); a larger `Content-Length`
    /// is 413 at once.
    pub max_body_bytes: Option<u64>,
}

/// A whole request head at the start of a buffer.
#[derive(Clone, Debug)]
pub struct Head {
    /// Its length in bytes.
    pub len: usize,
    /// The framing of its body.
    pub body: Framing,
}

/// Why a head was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadError {
    /// The head did not complete in time: 408.
    Timeout,
    /// Too many bytes or too many fields: 431.
    TooLarge,
    /// Not a request line or framing RFC 9112 lets through (see
    /// `pipeline::message`): 400, 501 or 505, and the connection closes.
    Refused(Refused),
}

/// Reads one request head into `buf` (which may already hold bytes).
/// `Ok(None)`: the connection closed or idled out before a request began,
/// or the server is shutting down (`shutdown`, if given, turned true)
/// while it waited for one.
pub async fn read_head(
    stream: &mut Stream,
    buf: &mut BytesMut,
    limits: &HeadLimits,
    mut shutdown: Option<&mut ShutdownWatch>,
) -> Result<Option<Head>, HeadError> {
    let mut deadline =
        (!buf.is_empty()).then(|| tokio::time::Instant::now() + limits.header_timeout);
    loop {
        if !buf.is_empty() {
            match parse(buf, limits) {
                Parsed::Complete(head) => return Ok(Some(head)),
                // Pingora answers it (400) and closes: everything read is
                // its to see.
                Parsed::Invalid => {
                    return Ok(Some(Head {
                        len: buf.len(),
                        body: Framing::UntilClose,
                    }))
                }
                Parsed::Refused(refused) => return Err(HeadError::Refused(refused)),
                Parsed::TooLarge => return Err(HeadError::TooLarge),
                Parsed::Partial if buf.len() > limits.max_header_bytes => {
                    return Err(HeadError::TooLarge)
                }
                Parsed::Partial => {}
            }
        }
        let wait = match (deadline, shutdown.as_deref_mut()) {
            (Some(d), _) => tokio::time::timeout_at(d, stream.read_buf(buf)).await,
            (None, None) => {
                tokio::time::timeout(limits.keepalive_timeout, stream.read_buf(buf)).await
            }
            // Idle between requests: closed at once when shutdown starts,
            // as Pingora closes its idle keep-alive connections.
            (None, Some(watch)) => {
                if *watch.borrow() {
                    return Ok(None);
                }
                let read = tokio::time::timeout(limits.keepalive_timeout, stream.read_buf(buf));
                tokio::select! {
                    wait = read => wait,
                    _ = watch.changed() => return Ok(None),
                }
            }
        };
        match wait {
            Err(_) if deadline.is_some() => return Err(HeadError::Timeout),
            Err(_) => return Ok(None), // idle keep-alive: close quietly
            Ok(Err(_)) | Ok(Ok(0)) => return Ok(None),
            Ok(Ok(_)) => {
                deadline.get_or_insert_with(|| tokio::time::Instant::now() + limits.header_timeout);
            }
        }
    }
}

enum Parsed {
    Complete(Head),
    Partial,
    TooLarge,
    /// Not HTTP as httparse reads it, and whole, but with a valid request
    /// line: Pingora answers it (400).
    Invalid,
    /// Whole, and refused by the message rules.
    Refused(Refused),
}

/// Heads with up to this many fields are parsed with no allocation.
const STACK_HEADERS: usize = 128;

fn parse(buf: &[u8], limits: &HeadLimits) -> Parsed {
    let mut on_stack = [httparse::EMPTY_HEADER; STACK_HEADERS];
    let mut on_heap = Vec::new();
    let headers: &mut [httparse::Header<'_>] = if limits.max_headers <= STACK_HEADERS {
        &mut on_stack[..limits.max_headers]
    } else {
        on_heap.resize(limits.max_headers, httparse::EMPTY_HEADER);
        &mut on_heap
    };
    let mut req = httparse::Request::new(headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len > limits.max_header_bytes => Parsed::TooLarge,
        Ok(httparse::Status::Complete(len)) => {
            let fields = req.headers.iter().map(|h| (h.name, h.value));
            let http10 = req.version == Some(0);
            match check_request_line(buf)
                .and_then(|()| check_framing(fields, http10, limits.max_body_bytes))
            {
                // After a switch of protocols (a WebSocket), everything the
                // client sends is the tunnel's.
                Ok(_)
                    if req
                        .headers
                        .iter()
                        .any(|h| h.name.eq_ignore_ascii_case("upgrade")) =>
                {
                    Parsed::Complete(Head {
                        len,
                        body: Framing::UntilClose,
                    })
                }
                Ok(body) => Parsed::Complete(Head { len, body }),
                Err(refused) => Parsed::Refused(refused),
            }
        }
        Ok(httparse::Status::Partial) => Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => Parsed::TooLarge,
        // Pingora repairs these (it escapes the target) and then reads on
        // with only its own per-read timeout and ceilings: it gets the head
        // only once it is whole, within ours.
        Err(httparse::Error::Token | httparse::Error::Version) => match head_end(buf) {
            None => Parsed::Partial,
            Some(end) => {
                // The request line and the blank line are not fields.
                let fields = buf[..end].iter().filter(|b| **b == b'\n').count() - 2;
                if end > limits.max_header_bytes || fields > limits.max_headers {
                    Parsed::TooLarge
                } else if let Err(refused) = check_request_line(buf) {
                    // A space or control byte in the target: Pingora would
                    // escape it and forward another request than it read.
                    Parsed::Refused(refused)
                } else {
                    Parsed::Invalid
                }
            }
        },
        Err(_) => Parsed::Invalid,
    }
}

/// Where a head ends: just past its blank line (CRLF CRLF, or bare LFs).
fn head_end(buf: &[u8]) -> Option<usize> {
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4);
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|at| at + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Writes a final answer on a connection that is about to close.
async fn refuse(stream: &mut Stream, error: HeadError) {
    let refusal = match error {
        HeadError::Timeout => Refusal::error(408, "request-timeout"),
        HeadError::TooLarge => Refusal::error(431, "header-too-large"),
        HeadError::Refused(refused) => Refusal::error(refused.status, refused.code),
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(&refusal.http1(false, true)).await;
        let _ = stream.flush().await;
        let _ = stream.shutdown().await;
    })
    .await;
    linger(stream).await;
}

/// Reads and drops what the client still sends (a body it is uploading)
/// for a while after the answer, before the socket closes: closing with
/// unread bytes resets the connection, and a reset can destroy the answer
/// before the client reads it (RFC 9112 §9.6). At most a second and
/// 1 MiB, as nginx's lingering close.
async fn linger(stream: &mut Stream) {
    let mut scratch = [0u8; 4096];
    let mut left = 1usize << 20;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while left > 0 {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// An HTTP application (the proxy) behind the head limits, with the fast
/// path (if on) taking the requests it serves first.
pub struct HeadGuard<A> {
    inner: Arc<A>,
    limits: HeadLimits,
    fast: Option<FastPath>,
    /// What each listener is (TLS, redirecting), and the edge's state.
    edge: Option<(Arc<Roles>, Arc<Edge>)>,
}

impl<A> HeadGuard<A> {
    pub fn new(inner: A, limits: HeadLimits) -> Self {
        HeadGuard {
            inner: Arc::new(inner),
            limits,
            fast: None,
            edge: None,
        }
    }

    /// Runs each TLS listener's handshake, and answers what the edge
    /// answers before routing (ACME challenges, the https redirect).
    pub fn with_edge(mut self, roles: Arc<Roles>, edge: Arc<Edge>) -> Self {
        self.edge = Some((roles, edge));
        self
    }

    /// Lets `fast` serve each request head it takes before Pingora sees it.
    pub fn with_fast_path(mut self, fast: Option<FastPath>) -> Self {
        self.fast = fast;
        self
    }
}

#[async_trait::async_trait]
impl<A> ServerApp for HeadGuard<A>
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
        let stream = match role.as_ref().and_then(|r| r.tls.as_ref()) {
            Some(handshake) => handshake.accept(stream).await?,
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
            if let (false, Some(fast)) = (h2c, &self.fast) {
                if stream.selected_alpn_proto() == Some(ALPN::H2) {
                    self.serve_h2(fast, stream, shutdown).await;
                    return None;
                }
            }
            // HTTP/2 without the fast transport (and custom protocols) keep
            // Pingora's own handling.
            return ServerApp::process_new(&self.inner, stream, shutdown).await;
        }
        let mut stream = stream;
        let mut settings = None;
        let mut watch = shutdown.clone();
        let mut first = true;
        // What the client sent past the last request: the next one's start.
        let mut ahead = BytesMut::new();
        loop {
            let mut buf = std::mem::take(&mut ahead);
            buf.reserve(4096);
            // A new connection's first request is read even while shutting
            // down (one accepted during a graceful upgrade is served); only
            // connections idle between requests close when shutdown starts.
            let idle_watch = (!first).then_some(&mut watch);
            first = false;
            let head = match read_head(&mut stream, &mut buf, &self.limits, idle_watch).await {
                Ok(Some(head)) => head,
                Ok(None) => return None,
                Err(e) => {
                    refuse(&mut stream, e).await;
                    return None;
                }
            };
            // The head and the body bytes read with it are this request's;
            // anything after them is the next one's.
            let bodiless = matches!(head.body, Framing::Length(0));
            let mut body = head.body;
            let mut rest = buf.split_off(head.len);
            let used = body.consume(&rest).unwrap_or_else(|_| {
                body = Framing::UntilClose;
                rest.len()
            });
            ahead = rest.split_off(used);
            buf.unsplit(rest);
            if let (false, Some((_, edge))) = (tls, &self.edge) {
                if let Some(answer) = edge_answer(&buf[..head.len], redirect, edge) {
                    // A request with a body (or a protocol switch) is not
                    // read on: the connection closes after the answer.
                    let more = bodiless && !answer.close && !*shutdown.borrow();
                    let sent = async {
                        stream.write_all(&answer.bytes).await?;
                        stream.flush().await
                    };
                    let sent = tokio::time::timeout(self.limits.keepalive_timeout, sent).await;
                    if matches!(sent, Ok(Ok(()))) && more {
                        continue;
                    }
                    let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
                    linger(&mut stream).await;
                    return None;
                }
            }
            let mut planned = None;
            if let Some(fast) = &self.fast {
                let closing = *shutdown.borrow();
                match fast.serve(stream, buf, &mut ahead, closing).await {
                    Outcome::Served(Some(next)) => {
                        stream = next;
                        continue;
                    }
                    Outcome::Served(None) => return None,
                    Outcome::NotMine(next, head, ctx) => {
                        (stream, buf, planned) = (next, head, ctx);
                    }
                }
            }
            if matches!(body, Framing::UntilClose) {
                // A protocol switch (or a head Pingora refuses): whatever
                // the client sent past the head is Pingora's to see, in
                // order, bytes the fast transport read while it held the
                // request included.
                buf.unsplit(std::mem::take(&mut ahead));
            }
            let limit = self.limits.max_header_bytes;
            let client: Stream = Box::new(OneRequest::new(
                stream,
                body,
                std::mem::take(&mut ahead),
                limit,
            ));
            let mut session = ServerSession::new_http1(client);
            match settings.take() {
                Some(s) => pingora::apps::HttpPersistentSettings::apply_to_session(s, &mut session),
                None => session.set_keepalive(Some(self.limits.keepalive_timeout.as_secs().max(1))),
            }
            if *shutdown.borrow() {
                session.set_keepalive(None);
            }
            session.set_pipelined_prefix(buf);
            let serve = self.inner.process_new_http(session, shutdown);
            let reused = match planned {
                Some(ctx) => with_planned(*ctx, serve).await?,
                None => serve.await?,
            };
            let (next, persistent) = reused.consume();
            (stream, ahead) = OneRequest::unwrap(next)?;
            settings = persistent;
        }
    }

    async fn cleanup(&self) {
        self.inner.http_cleanup().await;
    }
}

/// The streams in flight on an HTTP/2 connection, and a wake-up when the
/// last one ends (its idle timeout starts then).
#[derive(Default)]
struct InFlight {
    count: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// One stream in flight, until dropped (also by a panic).
struct Started(Arc<InFlight>);

impl InFlight {
    fn start(this: &Arc<InFlight>) -> Started {
        this.count.fetch_add(1, Ordering::AcqRel);
        Started(Arc::clone(this))
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_one();
        }
    }
}

/// What the fast transport gives back of an HTTP/2 stream: nothing once
/// served, or the stream for Pingora's path with its context if already
/// planned (admitted), still counted in flight.
type LeftOver = Option<(Box<H2Session>, Option<Box<RequestCtx>>, Started)>;

/// Offers a stream to the fast transport. Its future is boxed when taken,
/// so a stream in flight holds only what it uses.
async fn offer_h2(fast: &FastPath, session: Box<H2Session>, started: Started) -> LeftOver {
    match Box::pin(fast.serve_h2(session)).await {
        H2Outcome::Served => None,
        H2Outcome::NotMine(session, planned) => Some((session, planned, started)),
    }
}

/// A client that sends more malformed streams than this on one HTTP/2
/// connection loses it (Pingora's own budget).
const MAX_MALFORMED_H2_STREAMS: usize = 32;

impl<A> HeadGuard<A>
where
    A: HttpServerApp + Send + Sync + 'static,
{
    /// An HTTP/2 connection, as Pingora's accept loop serves it (its
    /// handshake options, idle timeout, graceful shutdown and stream
    /// checks), with each stream offered to the fast transport first;
    /// what it does not take goes to Pingora's path.
    ///
    /// The fast transport's streams run on this connection's own task, not
    /// a task each as Pingora spawns them: a stream's response and the
    /// connection's next flush are then one wake-up, and no stream pays a
    /// spawn (about 14 % less CPU per request, `benches/load/README.md`).
    /// They run side by side, but one connection's streams share one core,
    /// as they do in nginx and HAProxy. Streams for Pingora's path are
    /// spawned.
    async fn serve_h2(self: &Arc<Self>, fast: &FastPath, stream: Stream, shutdown: &ShutdownWatch) {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        use futures_util::FutureExt;
        use pingora::protocols::http::v2::server::{handshake, H2Accept};
        use pingora::protocols::Digest;
        let digest = Arc::new(Digest {
            ssl_digest: stream.get_ssl_digest(),
            timing_digest: stream.get_timing_digest(),
            proxy_digest: stream.get_proxy_digest(),
            socket_digest: stream.get_socket_digest(),
        });
        let mut conn = match handshake(stream, self.inner.h2_options()).await {
            Ok(conn) => conn,
            Err(e) => {
                log::debug!("HTTP/2 handshake with a client failed: {e}");
                return;
            }
        };
        let idle_timeout = self.inner.server_options().and_then(|o| o.h2_idle_timeout);
        let active = Arc::new(InFlight::default());
        let mut watch = shutdown.clone();
        let mut closing = false;
        let mut malformed = 0;
        // The fast transport's streams in flight, driven by this task. A
        // panic in one ends that stream only, as it would in its own task
        // (one inside the h2 crate, holding its lock, ends the connection
        // either way).
        let mut local = FuturesUnordered::new();
        loop {
            let idle = async {
                while active.count.load(Ordering::Acquire) != 0 {
                    active.idle.notified().await;
                }
                tokio::time::sleep(idle_timeout.unwrap_or_default()).await;
            };
            let accepted = tokio::select! {
                biased;
                _ = watch.changed(), if !closing => {
                    conn.graceful_shutdown();
                    closing = true;
                    continue;
                }
                Some(done) = local.next(), if !local.is_empty() => {
                    self.hand_over(done, shutdown);
                    continue;
                }
                accepted = H2Session::from_h2_conn(&mut conn, Arc::clone(&digest)) => accepted,
                // Idle with nothing in flight: the socket closes now.
                () = idle, if idle_timeout.is_some() && !closing => return,
            };
            let session = match accepted {
                Ok(Some(H2Accept::Session(session))) => Box::new(session),
                Ok(Some(H2Accept::Rejected)) => {
                    malformed += 1;
                    if malformed >= MAX_MALFORMED_H2_STREAMS {
                        log::warn!("an HTTP/2 client sent {malformed} malformed streams: closed");
                        break;
                    }
                    continue;
                }
                // Closed, or a connection error.
                Ok(None) | Err(_) => break,
            };
            let offer = offer_h2(fast, session, InFlight::start(&active));
            local.push(std::panic::AssertUnwindSafe(offer).catch_unwind());
        }
        // The connection is over: streams still in flight see it closed
        // once it is dropped, and end.
        drop(conn);
        while let Some(done) = local.next().await {
            self.hand_over(done, shutdown);
        }
    }

    /// What the fast transport left of a stream: nothing, a stream for
    /// Pingora's path (spawned, with its context if already planned), or
    /// a panic (logged; the stream is reset as it is dropped).
    fn hand_over(self: &Arc<Self>, done: std::thread::Result<LeftOver>, shutdown: &ShutdownWatch) {
        let (session, planned, started) = match done {
            Ok(None) => return,
            Ok(Some(left)) => left,
            Err(panic) => {
                let what = (panic.downcast_ref::<&str>().copied())
                    .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                    .unwrap_or("?");
                log::error!("an HTTP/2 stream panicked ({what}); the stream was reset");
                return;
            }
        };
        let (guard, shutdown) = (Arc::clone(self), shutdown.clone());
        // Each path's future is boxed when taken: the task itself stays
        // small, where Pingora's proxy future inlined would make every
        // stream's spawn copy kilobytes.
        tokio::spawn(async move {
            let _started = started;
            let serve = guard
                .inner
                .process_new_http(ServerSession::new_http2(*session), &shutdown);
            match planned {
                Some(ctx) => Box::pin(with_planned(*ctx, serve)).await,
                None => Box::pin(serve).await,
            };
        });
    }
}
