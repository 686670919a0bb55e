//! One exchange with the shards, for HTTP/1 and HTTP/2 clients alike: the
//! attempt loop — a pooled or new connection, the request head and body
//! sent while the response head is awaited under the headers watch, and
//! after a failure the pipeline's verdict (resend, retry elsewhere, or
//! answer) — then the one responder (`respond.rs`).
//!
//! Both directions move in this one task, polled together: nothing is
//! read from one side before the other side took what came before
//! (backpressure), so an exchange holds at most one read of each body.

use super::body::BodyError;
use super::downstream::Downstream;
use super::response::{parse_response, ParsedResponse, MAX_RESPONSE_HEAD};
use super::{poll_read_buf, FastPath};
use crate::control::ShardPeer;
use crate::proxy::buffers;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::hooks::UpstreamFailure;
use crate::proxy::pipeline::answer::Refusal;
use crate::proxy::pipeline::failure::{AttemptFailure, Next};
use crate::proxy::pipeline::message::HeadEnd;
use crate::proxy::pipeline::watch::{Verdict, Waiting};
use crate::proxy::upstream::conn::{Conn, UpstreamKey};
use crate::trace::TraceContext;
use bytes::{Buf, Bytes, BytesMut};
use http::Method;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncWrite;
use tokio::time::{Instant, Sleep};

/// What an exchange sends to the shards.
pub(super) struct Request<'a> {
    pub method: &'a Method,
    pub head_only: bool,
    pub websocket: bool,
    /// The client accepts trailers (`TE: trailers`): an HTTP/2 shard is
    /// told so.
    pub te_trailers: bool,
    /// The head the shard receives, and the whole body when it came with
    /// the head: what a resend or a retry sends again.
    pub bytes: Bytes,
    /// The client's address and the one it connected to: what a PROXY
    /// header to a shard names.
    pub ends: Ends,
}

/// A connection's two ends, the client's first, when both are known.
pub(super) type Ends = Option<(std::net::SocketAddr, std::net::SocketAddr)>;

/// The ends a client connection's socket digest names (the client a
/// PROXY header named, if one did).
pub(super) fn ends_of(digest: Option<&pingora::protocols::SocketDigest>) -> Ends {
    let digest = digest?;
    let client = *digest.peer_addr()?.as_inet()?;
    let local = *digest.local_addr()?.as_inet()?;
    Some((client, local))
}

/// Whether the request's shard may be spoken to in HTTP/2 (what the
/// client accepts then matters: `te: trailers`).
pub(super) fn may_be_h2(ctx: &RequestCtx) -> bool {
    ctx.peer.as_ref().is_some_and(|p| p.protocol.may_be_h2())
}

/// How an exchange ended.
pub(super) enum Exchanged {
    /// Answered, with this status; the client's connection may go on.
    Done(u16),
    /// Over, and the client's connection must close: its answer (the
    /// status, 0 if none was sent) is cut short or says it closes.
    Closed(u16),
    /// The shard switched protocols (a WebSocket): the tunnel starts.
    Upgraded(Upstream),
}

/// An attempt that got a response head.
pub(super) struct Upstream {
    pub(super) conn: Conn,
    /// The head and what came after it.
    pub(super) buf: BytesMut,
    pub(super) parsed: ParsedResponse,
}

/// Why an attempt ended without a response head.
enum Failed {
    /// On the shard's side; the pipeline decides what follows.
    Shard(AttemptFailure),
    /// On the client's side (gone, or a body it may not send).
    Client(BodyError),
}

/// The request's bytes on their way to the shard.
pub(super) struct Outbound {
    /// Read from the client, not yet written to the shard.
    bytes: Bytes,
    /// Written, not yet flushed (TLS holds bytes until flushed).
    unflushed: bool,
    /// A write to the shard failed: only its answer is awaited now.
    pub(super) broken: bool,
    /// The shard has the whole request.
    pub(super) finished: bool,
    /// When request bytes last went to the shard, as of the last look.
    moved: Instant,
    /// When request bytes last went to the shard, on the coarse clock (a
    /// few nanoseconds a read); `moved` catches up when a deadline is due.
    pub(super) progressed: Option<coarsetime::Instant>,
    /// Since when the client's body has been awaited, while it is.
    pub(super) awaiting_body: Option<Instant>,
    /// Body bytes were read from the client past what came with the head:
    /// the request can no longer be sent again.
    streamed: bool,
}

impl Outbound {
    fn new(bytes: Bytes, now: Instant) -> Self {
        Outbound {
            bytes,
            unflushed: false,
            broken: false,
            finished: false,
            moved: now,
            progressed: None,
            awaiting_body: None,
            streamed: false,
        }
    }

    /// Request bytes wait for the shard to take them.
    pub(super) fn blocked_on_shard(&self) -> bool {
        !self.finished && !self.broken && (!self.bytes.is_empty() || self.unflushed)
    }

    /// Moves request bytes from the client to the shard until either has
    /// to wait. Ready once the shard has it all (`Ok`), or when the
    /// client's body failed (`Err`); a failed write to the shard only
    /// stops this direction (the shard may have answered already).
    pub(super) fn poll<D: Downstream>(
        &mut self,
        client: &mut D,
        conn: &mut Conn,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), BodyError>> {
        loop {
            if self.finished {
                return Poll::Ready(Ok(()));
            }
            if self.broken {
                return Poll::Pending;
            }
            while !self.bytes.is_empty() {
                match Pin::new(&mut *conn).poll_write(cx, &self.bytes) {
                    Poll::Ready(Ok(n)) if n > 0 => {
                        self.bytes.advance(n);
                        self.unflushed = true;
                        self.progressed = Some(coarsetime::Instant::now_without_cache_update());
                    }
                    Poll::Ready(_) => {
                        self.broken = true;
                        return Poll::Pending;
                    }
                    Poll::Pending => return Poll::Pending,
                }
            }
            if self.unflushed {
                match Pin::new(&mut *conn).poll_flush(cx) {
                    Poll::Ready(Ok(())) => self.unflushed = false,
                    Poll::Ready(Err(_)) => {
                        self.broken = true;
                        return Poll::Pending;
                    }
                    Poll::Pending => return Poll::Pending,
                }
            }
            if client.body_done() {
                self.finished = true;
                self.awaiting_body = None;
                continue;
            }
            self.awaiting_body.get_or_insert_with(Instant::now);
            match client.poll_body(cx) {
                Poll::Ready(Ok(Some(bytes))) => {
                    self.bytes = bytes;
                    self.streamed = true;
                    self.awaiting_body = None;
                }
                Poll::Ready(Ok(None)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// A timer polled inside an exchange's poll loop, made when first
/// needed (most responses need none) and reset only when its deadline
/// moves.
pub(super) fn poll_timer(
    sleep: &mut Option<Pin<Box<Sleep>>>,
    at: Option<Instant>,
    cx: &mut Context<'_>,
) -> Poll<()> {
    let Some(at) = at else {
        return Poll::Pending;
    };
    let sleep = sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
    if sleep.deadline() != at {
        sleep.as_mut().reset(at);
    }
    sleep.as_mut().poll(cx)
}

/// A retry's bytes: the head's `traceparent` naming the retry's own span
/// (same length, so the rest is unchanged). The first `traceparent` of the
/// head is ours: a client's is dropped when tracing is on.
fn with_traceparent(bytes: &Bytes, trace: &TraceContext) -> Bytes {
    const FIELD: &[u8] = b"\r\ntraceparent: ";
    let head_end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(bytes.len());
    let at = bytes[..head_end]
        .windows(FIELD.len())
        .position(|w| w.eq_ignore_ascii_case(FIELD));
    // Ours, as written: 55 characters and the line's end.
    let ours = |at: usize| {
        bytes.get(at..at + 57).is_some_and(|v| {
            v.ends_with(b"\r\n") && crate::trace::parse_traceparent(&v[..55]).is_some()
        })
    };
    let Some(at) = at.map(|i| i + FIELD.len()).filter(|&at| ours(at)) else {
        return bytes.clone();
    };
    let mut patched = bytes.to_vec();
    let value = trace.traceparent();
    patched[at..at + 55].copy_from_slice(value.as_str().as_bytes());
    Bytes::from(patched)
}

/// What woke an attempt.
enum AttemptEvent {
    Head(ParsedResponse),
    Failed(Failed),
    /// A deadline or a liveness probe is due.
    Due,
}

impl FastPath {
    /// Attempts until a response head arrives or the pipeline says stop,
    /// then the response (or the tunnel's start).
    pub(super) async fn exchange<D: Downstream>(
        &self,
        client: &mut D,
        request: &Request<'_>,
        ctx: &mut RequestCtx,
    ) -> Exchanged {
        loop {
            let Some(peer) = ctx.peer.clone() else {
                let refusal = Refusal::error(502, "upstream-unreachable");
                return Exchanged::Closed(self.answer(client, ctx, refusal, true).await);
            };
            self.gateway.attempt_started(ctx);
            // The first attempt starts with the request (no clock read).
            let now = match ctx.attempts {
                1 => Instant::from_std(ctx.started),
                _ => Instant::now(),
            };
            let bytes = match (ctx.attempts, &ctx.trace) {
                (2.., Some(trace)) => with_traceparent(&request.bytes, trace),
                _ => request.bytes.clone(),
            };
            let mut out = Outbound::new(bytes, now);
            let failure = match self.connection(&peer, request).await {
                Err(failure) => Failed::Shard(failure),
                Ok(connection) => {
                    match self
                        .attempt(
                            client,
                            connection.conn,
                            connection.reused,
                            &mut out,
                            request,
                            (&peer, self.gateway.headers_timeout(ctx)),
                        )
                        .await
                    {
                        Ok(upstream) if request.websocket && upstream.parsed.status == 101 => {
                            self.gateway.attempt_answered(ctx, 101);
                            return Exchanged::Upgraded(upstream);
                        }
                        Ok(upstream) => {
                            self.gateway.attempt_answered(ctx, upstream.parsed.status);
                            return self.respond(client, upstream, out, &peer, ctx).await;
                        }
                        Err(failed) => failed,
                    }
                }
            };
            let failure = match failure {
                Failed::Shard(failure) => failure,
                Failed::Client(error) => {
                    self.gateway.attempt_failed(ctx, "client");
                    return match error.answer() {
                        Some(refusal) => {
                            Exchanged::Closed(self.answer(client, ctx, refusal, true).await)
                        }
                        None => Exchanged::Closed(0),
                    };
                }
            };
            let replayable = !out.streamed;
            if let Err(refusal) =
                self.after_failure(failure, &peer.key, request.method, replayable, ctx)
            {
                return Exchanged::Closed(self.answer(client, ctx, refusal, true).await);
            }
        }
    }

    /// The pipeline's rules after a failed attempt: `Ok` to try again
    /// (resent or rerouted, readmitted), or the answer to give.
    fn after_failure(
        &self,
        failure: AttemptFailure,
        key: &UpstreamKey,
        method: &Method,
        replayable: bool,
        ctx: &mut RequestCtx,
    ) -> Result<(), Refusal> {
        if failure == AttemptFailure::Stale {
            // The shard may have closed an idle connection just as we
            // reused it: the others idle in this thread's pool are likely
            // closed too.
            self.forget(key);
        }
        match self.gateway.after_failure(failure, method, replayable, ctx) {
            Next::Resend => Ok(()),
            Next::Retry => self.gateway.readmit(ctx),
            Next::Answer(refusal) => Err(refusal),
        }
    }

    /// Sends the request and reads the response head, within the headers
    /// deadline (counted from the request's last progress, and not while
    /// the client's body is awaited) and with liveness probes; the body
    /// goes up meanwhile, within `limits.body_timeout_ms` per pause.
    async fn attempt<D: Downstream>(
        &self,
        client: &mut D,
        mut conn: Conn,
        reused: bool,
        out: &mut Outbound,
        request: &Request<'_>,
        (peer, headers_timeout): (&ShardPeer, Duration),
    ) -> Result<Upstream, Failed> {
        let mut settings = self.gateway.watch_settings();
        settings.headers_timeout = headers_timeout;
        let mut waiting = Waiting::new(settings, out.moved);
        let deadline = |out: &Outbound| match out.awaiting_body {
            // The client is slow, not the shard.
            Some(_) => Instant::now() + settings.headers_timeout,
            None => out.moved + settings.headers_timeout,
        };
        let mut head = HeadReader {
            buf: buffers::take(8192),
            head_end: HeadEnd::default(),
            // Nothing came back on a pooled connection: maybe only stale.
            broken: match reused {
                true => AttemptFailure::Stale,
                false => AttemptFailure::Reset,
            },
        };
        let sleep = tokio::time::sleep_until(waiting.wake(deadline(out)));
        tokio::pin!(sleep);
        loop {
            let event = poll_fn(|cx| {
                // The shard's answer first: it may come before the body
                // went whole.
                if let Poll::Ready(event) = head.poll(&mut conn, cx, request) {
                    return Poll::Ready(event);
                }
                match out.poll(client, &mut conn, cx) {
                    Poll::Ready(Err(e)) => {
                        return Poll::Ready(AttemptEvent::Failed(Failed::Client(e)))
                    }
                    // All sent: a client that leaves ends the request (and
                    // frees its admission).
                    Poll::Ready(Ok(())) if client.poll_gone(cx).is_ready() => {
                        return Poll::Ready(AttemptEvent::Failed(Failed::Client(BodyError::Gone)));
                    }
                    _ => {}
                }
                let mut due = waiting.wake(deadline(out));
                if let Some(since) = out.awaiting_body {
                    due = due.min(since + self.body_timeout);
                }
                // Armed for every attempt: on the stack, reset only when the
                // deadline moves.
                if sleep.deadline() != due {
                    sleep.as_mut().reset(due);
                }
                sleep.as_mut().poll(cx).map(|()| AttemptEvent::Due)
            })
            .await;
            match event {
                AttemptEvent::Head(parsed) => {
                    let buf = head.buf;
                    return Ok(Upstream { conn, buf, parsed });
                }
                AttemptEvent::Failed(failed) => return Err(failed),
                AttemptEvent::Due => {
                    // The deadline is read in there, after it moved.
                    self.when_due(out, &mut waiting, deadline, peer).await?
                }
            }
        }
    }

    /// A deadline of the attempt came: the headers deadline moves to the
    /// request's last progress; a client body stalled past
    /// `limits.body_timeout_ms` fails the attempt; else the watch looks at
    /// the shard (timed out, unreachable, or waited on) against the
    /// headers `deadline` as it reads after that move.
    async fn when_due(
        &self,
        out: &mut Outbound,
        waiting: &mut Waiting,
        deadline: impl Fn(&Outbound) -> Instant,
        peer: &ShardPeer,
    ) -> Result<(), Failed> {
        if let Some(at) = out.progressed.take() {
            // The deadline counts from the last progress.
            let now = coarsetime::Instant::now_without_cache_update();
            let ago = Duration::from(now - at);
            out.moved = out.moved.max(Instant::now() - ago);
            waiting.progressed(out.moved);
        }
        if out
            .awaiting_body
            .is_some_and(|since| since.elapsed() >= self.body_timeout)
        {
            return Err(Failed::Client(BodyError::Stalled));
        }
        match waiting.look(deadline(out), peer.addr).await {
            Verdict::None => Ok(()),
            Verdict::TimedOut => Err(Failed::Shard(AttemptFailure::Shard(
                UpstreamFailure::Timeout,
            ))),
            Verdict::Unreachable => Err(Failed::Shard(AttemptFailure::Shard(
                UpstreamFailure::Liveness,
            ))),
        }
    }
}

/// A response head on its way in from the shard.
struct HeadReader {
    buf: BytesMut,
    /// Parsed only when a head's blank line came: a head dribbled a byte
    /// per segment costs one scan, not one parse per read.
    head_end: HeadEnd,
    /// What a connection closed before any byte means.
    broken: AttemptFailure,
}

impl HeadReader {
    /// Reads what the shard sent: the head parsed, or the attempt failed
    /// (closed, or a head that breaks the rules or its bound); `Pending`
    /// while the head is not whole and nothing more is to read.
    fn poll(
        &mut self,
        conn: &mut Conn,
        cx: &mut Context<'_>,
        request: &Request<'_>,
    ) -> Poll<AttemptEvent> {
        loop {
            self.buf.reserve(4096);
            match poll_read_buf(conn, cx, &mut self.buf) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                    let failure = match (conn.failure(), self.buf.is_empty()) {
                        (Some(failure), _) => failure,
                        (None, true) => self.broken,
                        (None, false) => AttemptFailure::Reset,
                    };
                    return Poll::Ready(AttemptEvent::Failed(Failed::Shard(failure)));
                }
                Poll::Ready(Ok(_)) => {
                    // Every head whole in `buf` is parsed at once; the
                    // search goes on past the first.
                    let ended = self.head_end.find(&self.buf);
                    if let Some(end) = ended {
                        self.head_end = HeadEnd::at(end);
                    }
                    let buf = &self.buf;
                    let parsed = match ended.is_some() || buf.len() > MAX_RESPONSE_HEAD {
                        true => parse_response(buf, request.head_only, request.websocket),
                        false => Ok(None),
                    };
                    match parsed {
                        Ok(Some(parsed)) => return Poll::Ready(AttemptEvent::Head(parsed)),
                        Ok(None) if buf.len() <= MAX_RESPONSE_HEAD => {}
                        _ => {
                            let invalid = Failed::Shard(AttemptFailure::Invalid);
                            return Poll::Ready(AttemptEvent::Failed(invalid));
                        }
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
