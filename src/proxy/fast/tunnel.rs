//! The WebSocket tunnel: after the shard's 101, bytes flow both ways, each
//! direction on its own, holding no copy buffer while idle, until both
//! sides have closed (a side's end is passed on as a write shutdown to the
//! other), either fails, or the other side lingers past [`HALF_OPEN_IDLE`].
//!
//! A tunnel may stay open for hours, mostly idle, so it runs in a task of
//! its own that holds only what it needs: the two sockets, the admission,
//! the stall timer and what the access log line says when it ends. The
//! accept task — Pingora's and shardgate's request-serving state — ends as
//! soon as the tunnel starts. A plain client connection is moved out of
//! Pingora's stream (which keeps a write buffer and timing fields for its
//! whole life) onto a bare socket.

use super::exchange::Upstream;
use super::response::{response_head, Encoding, Persist};
use super::FastPath;
use crate::control::keepalive;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::hooks::RequestLine;
use crate::proxy::upstream::conn::Conn;
use crate::proxy::Gateway;
use bytes::BytesMut;
use pingora::protocols::l4::socket::SocketAddr;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::Stream;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The copy buffer of a WebSocket tunnel, each way: allocated for a read
/// and dropped once its bytes are written. It starts at the smallest size
/// and doubles while reads fill it (large messages move in few reads),
/// halving again when they do not.
const TUNNEL_BUFFER_MIN: usize = 2048;
const TUNNEL_BUFFER_MAX: usize = 64 * 1024;

/// Once one side has closed, how long the other may stay silent before
/// the tunnel ends anyway (nginx's `lingering_timeout` is 5 s too): its
/// last words (a WebSocket close frame) still go through, but a side that
/// never closes does not hold the admission.
const HALF_OPEN_IDLE: Duration = Duration::from_secs(5);

/// Once one side has closed (and its admission gone), how long the other
/// may go on at most, silent or not (nginx's `lingering_time` is 30 s):
/// a client that closes at once cannot keep a tunnel fed by its shard
/// past the connection cap.
const HALF_OPEN_MAX: Duration = Duration::from_secs(30);

/// What the access log line of a tunnel says when it ends.
pub(super) struct TunnelLog {
    pub client: Option<SocketAddr>,
    pub target: String,
    pub host: Option<String>,
    /// The handshake's method, protocol and status: `GET`, HTTP/1.1 and
    /// 101; `CONNECT`, HTTP/2 and 200 over HTTP/2 (RFC 8441).
    pub line: (&'static str, &'static str, u16),
}

impl TunnelLog {
    /// A handshake the client got no answer to (its stream reset): logged
    /// with status 0, as any request that went unanswered.
    pub(super) fn unanswered(mut self) -> TunnelLog {
        self.line.2 = 0;
        self
    }
}

/// What a tunnel's end reports (the access line, the hooks' logging
/// phase, the request's span) and the admission it holds, taken out of
/// its request's context: an idle tunnel keeps this for hours, not the
/// whole context of a request being served (three times its size).
struct Ended {
    started: std::time::Instant,
    request_id: crate::proxy::pipeline::request_id::RequestId,
    tenant: Option<compact_str::CompactString>,
    shard: Option<std::sync::Arc<crate::routing::ShardEntry>>,
    decision: Option<crate::routing::Decision>,
    attempts: u32,
    failure: Option<crate::proxy::hooks::UpstreamFailure>,
    route: crate::proxy::pipeline::routes::RouteMatch,
    /// A traced request's context and attempt spans (most have none).
    traced: Option<Box<(crate::trace::TraceContext, Vec<crate::trace::AttemptSpan>)>>,
    admission: Option<crate::limits::AdmissionGuard>,
    /// The client's address (a tunnel's client is on a TCP listener).
    client: Option<std::net::SocketAddr>,
    target: Box<str>,
    host: Option<Box<str>>,
    line: (&'static str, &'static str, u16),
    /// Bytes moved so far: the client's to the shard and the shard's to
    /// the client (the log's `bytes_in` and `bytes_out`), counted as they
    /// are written: a tunnel ended by a shutdown still reports them.
    moved: [u64; 2],
}

impl Ended {
    fn of(ctx: RequestCtx, log: TunnelLog) -> Ended {
        Ended {
            started: ctx.started,
            request_id: ctx.request_id,
            tenant: ctx.tenant,
            shard: ctx.shard,
            decision: ctx.decision,
            attempts: ctx.attempts,
            failure: ctx.failure,
            route: ctx.route,
            traced: ctx.trace.map(|t| Box::new((t, ctx.attempt_spans))),
            admission: ctx.admission,
            client: log.client.as_ref().and_then(|a| a.as_inet()).copied(),
            target: log.target.into_boxed_str(),
            host: log.host.map(String::into_boxed_str),
            line: log.line,
            moved: [ctx.bytes_in, ctx.bytes_out],
        }
    }

    /// The request's context again, as the request's end reads it.
    fn context(&mut self) -> RequestCtx {
        let (trace, attempt_spans) = match self.traced.take() {
            Some(traced) => (Some(traced.0), traced.1),
            None => (None, Vec::new()),
        };
        RequestCtx {
            started: self.started,
            request_id: std::mem::take(&mut self.request_id),
            tenant: self.tenant.take(),
            shard: self.shard.take(),
            decision: self.decision,
            attempts: self.attempts,
            failure: self.failure,
            route: self.route,
            trace,
            attempt_spans,
            admission: self.admission.take(),
            bytes_in: self.moved[0],
            bytes_out: self.moved[1],
            ..RequestCtx::default()
        }
    }
}

impl FastPath {
    /// A WebSocket's 101 goes to the client (with what the shard sent
    /// after it), then what the client sent after its handshake, before
    /// the 101 (`early`, read while the shard was awaited), goes to the
    /// shard; both count as the tunnel's bytes. The shard's connection,
    /// unless either side failed.
    pub(super) async fn open_tunnel(
        &self,
        client: &mut Stream,
        early: &mut BytesMut,
        upstream: Upstream,
        ctx: &mut RequestCtx,
    ) -> Option<Conn> {
        let Upstream {
            mut conn,
            buf,
            parsed,
        } = upstream;
        let edit = self.gateway.response_edit(parsed.status, ctx);
        let mut out = response_head(
            &buf,
            &parsed,
            Encoding::Bodiless,
            Persist::Default,
            edit.as_ref(),
            self.id_field(ctx),
        );
        // Bytes the shard sent right after its 101 are tunnel data.
        let data = &buf[parsed.head_len..];
        out.extend_from_slice(data);
        let sent = data.len() as u64;
        drop(buf);
        if !self.send_all(client, &out).await {
            return None;
        }
        drop(out);
        ctx.bytes_out += sent;
        if !early.is_empty() {
            let early = std::mem::take(early);
            if !self.send_all(&mut conn, &early).await {
                return None;
            }
            ctx.bytes_in += early.len() as u64;
        }
        Some(conn)
    }

    /// Runs the tunnel in a task of its own (see the module documentation);
    /// the admission in `ctx` is held until it ends, then the request is
    /// finished (metrics, access log) as any other.
    pub(super) fn spawn_tunnel(
        &self,
        client: Stream,
        upstream: Conn,
        ctx: RequestCtx,
        log: TunnelLog,
    ) {
        let send_timeout = self.send_timeout;
        match bare(client) {
            Ok(Ok(client)) => {
                let tunnel = self.running(client, upstream, ctx, log);
                tokio::spawn(run_tunnel(tunnel, send_timeout));
            }
            Err(client) => {
                let tunnel = self.running(client, upstream, ctx, log);
                tokio::spawn(run_tunnel(tunnel, send_timeout));
            }
            Ok(Err(e)) => {
                log::warn!("tunnel: the client socket could not be registered ({e})");
                self.not_opened(upstream, ctx, log);
            }
        }
    }

    /// A tunnel that could not start: its request is finished (metrics,
    /// access log) as the tunnel's end would have, and `upstream` closed.
    pub(super) fn not_opened(&self, upstream: Conn, ctx: RequestCtx, log: TunnelLog) {
        // Finished as it is dropped.
        drop(self.running((), upstream, ctx, log));
    }

    /// A tunnel about to run, its request finished when it is dropped.
    fn running<C>(&self, client: C, upstream: Conn, ctx: RequestCtx, log: TunnelLog) -> Running<C> {
        let done = Finish {
            gateway: self.gateway.clone(),
            ended: Ended::of(ctx, log),
        };
        Running {
            client,
            upstream,
            done,
        }
    }
}

impl FastPath {
    /// Runs a tunnel in this task, with an HTTP/2 stream as its client
    /// side (RFC 8441); the request is finished when it ends.
    pub(super) async fn run_h2_tunnel<C: Side>(
        &self,
        client: C,
        upstream: Conn,
        ctx: RequestCtx,
        log: TunnelLog,
    ) {
        let tunnel = self.running(client, upstream, ctx, log);
        run_tunnel(tunnel, self.send_timeout).await;
    }
}

/// Finishes a tunnel's request (duration, admission, access log line)
/// exactly once, however the tunnel ends: also when the runtime drops its
/// task at the end of a graceful shutdown.
struct Finish {
    gateway: Gateway,
    ended: Ended,
}

impl Drop for Finish {
    fn drop(&mut self) {
        let mut ctx = self.ended.context();
        let client = self.ended.client.map(SocketAddr::Inet);
        let (method, protocol, status) = self.ended.line;
        let line = RequestLine {
            client: client.as_ref(),
            method,
            target: &self.ended.target,
            host: self.ended.host.as_deref(),
            protocol,
        };
        self.gateway.finish(&mut ctx, &line, status);
    }
}

/// Sets [`keepalive`] on a shard socket of the fast transport.
pub(crate) fn keep_alive(socket: &TcpStream) {
    if let Err(e) = pingora::protocols::l4::ext::set_tcp_keepalive(socket, &keepalive()) {
        log::debug!("no TCP keep-alive on a shard socket ({e})");
    }
}

/// A running tunnel. Its fields drop in order, the sockets before `done`
/// on every path (also when the runtime drops the task at shutdown): the
/// access line and the metrics come once the sockets are closed.
struct Running<C> {
    client: C,
    upstream: Conn,
    done: Finish,
}

/// Takes the tunnel whole (not its parts, which a task would keep twice:
/// as arguments and as the locals they were moved to).
async fn run_tunnel<C: Side>(mut tunnel: Running<C>, send_timeout: Duration) {
    let Running {
        client,
        upstream,
        done,
    } = &mut tunnel;
    let ended = &mut done.ended;
    // DESIGN §1.3: the admission is held until either side closes; the
    // other side's last words may still follow.
    relay(client, upstream, send_timeout, &mut ended.moved, || {
        ended.admission = None;
    })
    .await;
}

/// Bytes flow both ways, each direction on its own: a side slow to read
/// holds back only what is sent to it, for at most `send_timeout`. A
/// side's end is passed on (a write shutdown to the other side) and the
/// other direction goes on until it ends too, or stays silent for
/// [`HALF_OPEN_IDLE`] (even while a write to it is slow: it closed its
/// other half), or for [`HALF_OPEN_MAX`] in all. A failure on either side
/// ends both. `moved` counts the bytes written to `b` and to `a`, as they
/// are. `closed` runs once, when the first side closes.
async fn relay<A: Side, B: Side>(
    a: &mut A,
    b: &mut B,
    send_timeout: Duration,
    moved: &mut [u64; 2],
    mut closed: impl FnMut(),
) {
    let mut legs = [Leg::default(), Leg::default()];
    let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
    // Once one direction has ended: when it did, and when the other last
    // moved.
    let mut first_close: Option<tokio::time::Instant> = None;
    let mut half_open: Option<tokio::time::Instant> = None;
    poll_fn(|cx| {
        let [to_b, to_a] = &mut *moved;
        let [a_to_b, b_to_a] = &mut legs;
        for (i, polled) in [
            a_to_b.poll_move(a, b, to_b, cx),
            b_to_a.poll_move(b, a, to_a, cx),
        ]
        .into_iter()
        .enumerate()
        {
            match polled {
                Poll::Ready(End::Failed) => return Poll::Ready(()),
                Poll::Ready(End::Closed) if legs[1 - i].ended => return Poll::Ready(()),
                Poll::Ready(End::Closed) => closed(),
                Poll::Pending => {}
            }
        }
        if legs.iter().any(|leg| leg.ended) {
            let other = legs.iter_mut().find(|leg| !leg.ended);
            if let Some(leg) = other {
                if std::mem::take(&mut leg.moved) || half_open.is_none() {
                    let now = tokio::time::Instant::now();
                    half_open = Some(now);
                    first_close.get_or_insert(now);
                }
            }
        }
        let stalled = legs.iter().filter_map(|leg| leg.stalled).min();
        let deadline = [
            stalled.map(|since| since + send_timeout),
            half_open.map(|since| since + HALF_OPEN_IDLE),
            first_close.map(|since| since + HALF_OPEN_MAX),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(deadline) = deadline else {
            timer = None;
            return Poll::Pending;
        };
        let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        timer.as_mut().poll(cx)
    })
    .await
}

/// How one direction of a tunnel ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    /// Its reader closed and the writer was shut down after the last byte.
    Closed,
    /// A read or write failed.
    Failed,
}

/// One end of a tunnel: a stream that can wait until it is readable
/// without a buffer.
pub(super) trait Side: AsyncRead + AsyncWrite + Unpin {
    /// Ready when a read would find bytes (or the end, or an error).
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

impl Side for TcpStream {
    /// The reactor's readiness: no system call.
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_read_ready(cx)
    }
}

impl Side for Conn {
    /// The reactor's readiness (or bytes TLS holds decrypted already).
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Conn::poll_readable(self, cx)
    }
}

impl Side for Stream {
    /// An empty read: it completes when the socket is readable, or at once
    /// on a stream that cannot wait that way (the read after it then
    /// waits, with its buffer).
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut probe = ReadBuf::new(&mut []);
        Pin::new(&mut **self).poll_read(cx, &mut probe)
    }
}

/// A plain client connection as a bare socket (`Ok`), or the stream as it
/// is (`Err`: TLS, or anything but Pingora's TCP stream). The descriptor
/// is duplicated, Pingora's stream dropped (deregistering and closing its
/// own), and the copy registered anew; the socket never closes meanwhile.
/// Its write buffer is empty: the 101 was flushed.
fn bare(client: Stream) -> Result<io::Result<TcpStream>, Stream> {
    use std::os::fd::{AsRawFd, BorrowedFd};
    let copy = match (*client).as_any().downcast_ref::<L4Stream>() {
        // SAFETY: the descriptor stays open while `l4` lives; it is only
        // borrowed here to be duplicated.
        Some(l4) => unsafe { BorrowedFd::borrow_raw(l4.as_raw_fd()) }.try_clone_to_owned(),
        None => return Err(client),
    };
    let copy = match copy {
        Ok(copy) => copy,
        Err(e) => {
            log::debug!("tunnel: the client socket stays in Pingora's stream ({e})");
            return Err(client);
        }
    };
    drop(client);
    let socket = std::net::TcpStream::from(copy);
    Ok(socket
        .set_nonblocking(true)
        .and_then(|()| TcpStream::from_std(socket)))
}

/// One direction of a WebSocket tunnel: what was read from one side and
/// is being written to the other (nothing while idle).
struct Leg {
    pending: Vec<u8>,
    written: usize,
    /// Since when the write has been waiting without progress.
    stalled: Option<tokio::time::Instant>,
    /// The next read's buffer size.
    size: usize,
    /// The last read did not fill its buffer: the socket is likely empty,
    /// so the next read first waits for it without a buffer.
    drained: bool,
    /// The reader closed: the writer is being (or has been) shut down.
    closing: bool,
    /// Done: closed and shut down. Never polled again.
    ended: bool,
    /// Bytes moved since the relay last looked (only read once the other
    /// direction has ended).
    moved: bool,
}

impl Default for Leg {
    fn default() -> Self {
        Leg {
            pending: Vec::new(),
            written: 0,
            stalled: None,
            size: TUNNEL_BUFFER_MIN,
            drained: true,
            closing: false,
            ended: false,
            moved: false,
        }
    }
}

impl Leg {
    /// Moves bytes from `from` to `to` until one of them has to wait,
    /// adding those written to `written`. Ready: this direction ended
    /// (once; an ended leg stays pending).
    fn poll_move<R: Side, W: Side>(
        &mut self,
        from: &mut R,
        to: &mut W,
        written: &mut u64,
        cx: &mut Context<'_>,
    ) -> Poll<End> {
        if self.ended {
            return Poll::Pending;
        }
        loop {
            if self.closing {
                return match Pin::new(&mut *to).poll_shutdown(cx) {
                    Poll::Ready(Ok(())) => {
                        self.ended = true;
                        self.stalled = None;
                        Poll::Ready(End::Closed)
                    }
                    Poll::Ready(Err(_)) => Poll::Ready(End::Failed),
                    Poll::Pending => self.wait(),
                };
            }
            if self.pending.is_empty() {
                match ready!(self.poll_read(from, cx)) {
                    Ok(bytes) if !bytes.is_empty() => {
                        self.pending = bytes;
                        self.written = 0;
                        self.moved = true;
                    }
                    Ok(_) => {
                        self.closing = true;
                        continue;
                    }
                    Err(_) => return Poll::Ready(End::Failed),
                }
            }
            while self.written < self.pending.len() {
                match Pin::new(&mut *to).poll_write(cx, &self.pending[self.written..]) {
                    Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(End::Failed),
                    Poll::Ready(Ok(n)) => {
                        self.written += n;
                        *written += n as u64;
                        self.stalled = None;
                        self.moved = true;
                    }
                    Poll::Pending => return self.wait(),
                }
            }
            match Pin::new(&mut *to).poll_flush(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(_)) => return Poll::Ready(End::Failed),
                Poll::Pending => return self.wait(),
            }
            self.pending = Vec::new();
            self.stalled = None;
        }
    }

    fn wait(&mut self) -> Poll<End> {
        self.stalled.get_or_insert_with(tokio::time::Instant::now);
        Poll::Pending
    }

    /// Reads what `from` has, without holding a buffer while it waits: if
    /// the socket is likely empty, it first waits until it is readable,
    /// then reads into a fresh buffer that is dropped again if nothing is
    /// there after all. An idle tunnel therefore holds no copy buffers.
    /// Empty: the stream ended.
    fn poll_read<R: Side>(
        &mut self,
        from: &mut R,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<Vec<u8>>> {
        if self.drained {
            ready!(from.poll_readable(cx))?;
        }
        // Not zeroed: a read fills what it reports, no more.
        let mut bytes: Vec<u8> = Vec::with_capacity(self.size);
        let start = bytes.as_ptr();
        let mut buf = ReadBuf::uninit(&mut bytes.spare_capacity_mut()[..self.size]);
        let polled = Pin::new(&mut *from).poll_read(cx, &mut buf);
        if polled.is_pending() {
            self.drained = true;
        }
        ready!(polled)?;
        if buf.filled().as_ptr() != start {
            // A reader that swapped the buffer: its bytes are not ours.
            return Poll::Ready(Err(io::Error::other("the reader replaced its buffer")));
        }
        let n = buf.filled().len();
        // SAFETY: `ReadBuf` counts as filled only bytes that were
        // initialised, the first `n` of `bytes`' capacity.
        unsafe { bytes.set_len(n) };
        self.drained = n < self.size;
        if n == self.size {
            self.size = (self.size * 2).min(TUNNEL_BUFFER_MAX);
        } else if n < self.size / 4 {
            self.size = (self.size / 2).max(TUNNEL_BUFFER_MIN);
        }
        Poll::Ready(Ok(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle tunnel's task: its two sockets, the relay's state and what
    /// its end reports. It was 2 384 bytes when it kept the whole request
    /// context, twice.
    #[tokio::test]
    async fn an_idle_tunnels_task_keeps_only_what_it_needs() {
        let yaml = "listen: [{ addr: \"127.0.0.1:1\" }]\nstate: false\nshards: []\ndomains: { fallback_suffix: .localhost }\n";
        let config = crate::config::Config::parse(yaml, None).expect("config");
        let hooks = std::sync::Arc::new(crate::proxy::hooks::DefaultHooks);
        let control = crate::control::Control::new(config, hooks).expect("control");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let shard = TcpStream::connect(addr).await.unwrap();
        let log = TunnelLog {
            client: None,
            target: "/chat".to_string(),
            host: None,
            line: ("GET", "HTTP/1.1", 101),
        };
        let done = Finish {
            gateway: Gateway::new(std::sync::Arc::new(control)),
            ended: Ended::of(RequestCtx::default(), log),
        };
        let tunnel = Running {
            client,
            upstream: Conn::Plain(shard),
            done,
        };
        let task = run_tunnel(tunnel, Duration::from_secs(1));
        let size = std::mem::size_of_val(&task);
        // 1 224 in a debug build since the tunnel counts its bytes (16,
        // and the relay's reference to them).
        assert!(size <= 1280, "{size} bytes");
    }
}
