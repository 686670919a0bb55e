//! One exchange with the shards, for HTTP/1 and HTTP/2 clients alike: the
//! attempt loop — a pooled or new connection, the request head and body
//! sent while the response head is awaited under the headers watch, and
//! after a failure the pipeline's verdict (resend, retry elsewhere, or
//! answer) — then the one responder: the shard's head and body to the
//! client, the rest of the request body still going up (a shard may
//! answer before it read it all), the connection back to the pool.
//!
//! Both directions move in this one task, polled together: nothing is
//! read from one side before the other side took what came before
//! (backpressure), so an exchange holds at most one read of each body.

use super::body::BodyError;
use super::conn::{Conn, UpstreamKey};
use super::downstream::{Downstream, ResponseStart};
use super::response::{parse_response, ParsedResponse, MAX_RESPONSE_HEAD};
use super::{poll_read_buf, FastPath};
use crate::control::ShardPeer;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::hooks::UpstreamFailure;
use crate::proxy::pipeline::answer::Refusal;
use crate::proxy::pipeline::failure::{AttemptFailure, Next};
use crate::proxy::pipeline::framing::{Framing, Part};
use crate::proxy::pipeline::watch::{Verdict, Waiting};
use bytes::{Buf, Bytes, BytesMut};
use http::Method;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncWrite;
use tokio::time::{Instant, Sleep};

/// Response bodies are read from the shard in reads of up to this much.
const BODY_READ: usize = 16 * 1024;

/// What an exchange sends to the shards.
pub(super) struct Request<'a> {
    pub method: &'a Method,
    pub head_only: bool,
    pub websocket: bool,
    /// The head the shard receives, and the whole body when it came with
    /// the head: what a resend or a retry sends again.
    pub bytes: Bytes,
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
struct Outbound {
    /// Read from the client, not yet written to the shard.
    bytes: Bytes,
    /// Written, not yet flushed (TLS holds bytes until flushed).
    unflushed: bool,
    /// A write to the shard failed: only its answer is awaited now.
    broken: bool,
    /// The shard has the whole request.
    finished: bool,
    /// When request bytes last went to the shard, as of the last look.
    moved: Instant,
    /// When request bytes last went to the shard, on the coarse clock (a
    /// few nanoseconds a read); `moved` catches up when a deadline is due.
    progressed: Option<coarsetime::Instant>,
    /// Since when the client's body has been awaited, while it is.
    awaiting_body: Option<Instant>,
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

    /// Moves request bytes from the client to the shard until either has
    /// to wait. Ready once the shard has it all (`Ok`), or when the
    /// client's body failed (`Err`); a failed write to the shard only
    /// stops this direction (the shard may have answered already).
    fn poll<D: Downstream>(
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
fn poll_timer(
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
            ctx.attempts += 1;
            // The first attempt starts with the request (no clock read).
            let now = match ctx.attempts {
                1 => Instant::from_std(ctx.started),
                _ => Instant::now(),
            };
            let mut out = Outbound::new(request.bytes.clone(), now);
            let failure = match self.connection(&peer).await {
                Err(failure) => Failed::Shard(failure),
                Ok(connection) => {
                    match self
                        .attempt(
                            client,
                            connection.conn,
                            connection.reused,
                            &mut out,
                            request,
                            &peer,
                        )
                        .await
                    {
                        Ok(upstream) if request.websocket && upstream.parsed.status == 101 => {
                            return Exchanged::Upgraded(upstream);
                        }
                        Ok(upstream) => {
                            return self.respond(client, upstream, out, &peer.key, ctx).await
                        }
                        Err(failed) => failed,
                    }
                }
            };
            let failure = match failure {
                Failed::Shard(failure) => failure,
                Failed::Client(error) => {
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
        peer: &ShardPeer,
    ) -> Result<Upstream, Failed> {
        let settings = self.gateway.watch_settings();
        let mut waiting = Waiting::new(settings, out.moved);
        let deadline = |out: &Outbound| match out.awaiting_body {
            // The client is slow, not the shard.
            Some(_) => Instant::now() + settings.headers_timeout,
            None => out.moved + settings.headers_timeout,
        };
        let mut buf = BytesMut::with_capacity(8192);
        // Nothing came back on a pooled connection: maybe only stale.
        let broken = match reused {
            true => AttemptFailure::Stale,
            false => AttemptFailure::Reset,
        };
        let sleep = tokio::time::sleep_until(waiting.wake(deadline(out)));
        tokio::pin!(sleep);
        loop {
            let event = poll_fn(|cx| {
                // The shard's answer first: it may come before the body
                // went whole.
                loop {
                    buf.reserve(4096);
                    match poll_read_buf(&mut conn, cx, &mut buf) {
                        Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                            let failure = match buf.is_empty() {
                                true => broken,
                                false => AttemptFailure::Reset,
                            };
                            return Poll::Ready(AttemptEvent::Failed(Failed::Shard(failure)));
                        }
                        Poll::Ready(Ok(_)) => {
                            match parse_response(&buf, request.head_only, request.websocket) {
                                Ok(Some(parsed)) => return Poll::Ready(AttemptEvent::Head(parsed)),
                                Ok(None) if buf.len() <= MAX_RESPONSE_HEAD => {}
                                _ => {
                                    let invalid = Failed::Shard(AttemptFailure::Invalid);
                                    return Poll::Ready(AttemptEvent::Failed(invalid));
                                }
                            }
                        }
                        Poll::Pending => break,
                    }
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
                AttemptEvent::Head(parsed) => return Ok(Upstream { conn, buf, parsed }),
                AttemptEvent::Failed(failed) => return Err(failed),
                AttemptEvent::Due => {
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
                        Verdict::None => {}
                        Verdict::TimedOut => {
                            return Err(Failed::Shard(AttemptFailure::Shard(
                                UpstreamFailure::Timeout,
                            )))
                        }
                        Verdict::Unreachable => {
                            return Err(Failed::Shard(AttemptFailure::Shard(
                                UpstreamFailure::Liveness,
                            )))
                        }
                    }
                }
            }
        }
    }

    /// The one responder: the shard's head and body to the client (the
    /// body framed for it), the rest of the request body still going up,
    /// a client slow to read given `limits.send_timeout_ms` per stall; the
    /// connection goes back to the pool when both messages ended clean.
    async fn respond<D: Downstream>(
        &self,
        client: &mut D,
        upstream: Upstream,
        mut out: Outbound,
        key: &UpstreamKey,
        ctx: &mut RequestCtx,
    ) -> Exchanged {
        let Upstream {
            mut conn,
            mut buf,
            parsed,
        } = upstream;
        let status = parsed.status;
        let head = buf.split_to(parsed.head_len);
        let mut framing = parsed.framing.clone();
        let mut trailers = Vec::new();
        // Body bytes that break the framing before anything was sent: the
        // client still gets an answer.
        let Ok(first) = decode_body(&mut framing, &mut buf, &mut trailers, self.head_limit) else {
            let refusal = Refusal::error(502, "upstream-invalid-response");
            return Exchanged::Closed(self.answer(client, ctx, refusal, true).await);
        };
        let edit = self.response_edit(status, ctx);
        let start = ResponseStart {
            buf: &head,
            parsed: &parsed,
            edit: edit.as_ref(),
            // What the client still sends of its body cannot be told from
            // a next request once the answer is over: it closes.
            close: !client.body_done(),
        };
        if client.start(start).is_err() {
            let refusal = Refusal::error(502, "upstream-invalid-response");
            return Exchanged::Closed(self.answer(client, ctx, refusal, true).await);
        }
        drop(head);
        // Bytes beyond the response: the shard misbehaved; do not reuse it.
        let mut reusable = parsed.keeps_connection() && buf.is_empty();
        buf.clear();
        let mut done = framing.is_done();
        client.queue(first, done.then_some(&trailers[..]));
        let until_close = matches!(framing, Framing::UntilClose);
        let mut stalled: Option<Instant> = None;
        let mut sleep = None;
        let ended = poll_fn(|cx| loop {
            if client.sending() {
                match client.poll_send(cx) {
                    Poll::Ready(Ok(())) => stalled = None,
                    Poll::Ready(Err(_)) => return Poll::Ready(End::Cut),
                    Poll::Pending => {
                        stalled.get_or_insert_with(Instant::now);
                    }
                }
            }
            if !client.sending() {
                if done {
                    return Poll::Ready(End::Whole);
                }
                buf.reserve(BODY_READ);
                match poll_read_buf(&mut conn, cx, &mut buf) {
                    Poll::Ready(Ok(0)) if until_close => {
                        reusable = false;
                        done = true;
                        client.queue(Bytes::new(), Some(&[]));
                        continue;
                    }
                    // Cut short: the client must see it so.
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(End::Cut),
                    Poll::Ready(Ok(_)) => {
                        let Ok(content) =
                            decode_body(&mut framing, &mut buf, &mut trailers, self.head_limit)
                        else {
                            return Poll::Ready(End::Cut);
                        };
                        reusable &= buf.is_empty();
                        buf.clear();
                        done = framing.is_done();
                        client.queue(content, done.then_some(&trailers[..]));
                        continue;
                    }
                    Poll::Pending => {}
                }
            }
            match out.poll(client, &mut conn, cx) {
                // The response is under way: a body the client cannot
                // finish (or a client gone) cuts it.
                Poll::Ready(Err(_)) => return Poll::Ready(End::Cut),
                Poll::Ready(Ok(())) if !client.sending() && client.poll_gone(cx).is_ready() => {
                    return Poll::Ready(End::Cut);
                }
                _ => {}
            }
            let mut due = stalled.map(|since| since + self.send_timeout);
            if let Some(since) = out.awaiting_body {
                let body = since + self.body_timeout;
                due = Some(due.map_or(body, |d| d.min(body)));
            }
            return match poll_timer(&mut sleep, due, cx) {
                Poll::Ready(()) => Poll::Ready(End::Cut),
                Poll::Pending => Poll::Pending,
            };
        })
        .await;
        match ended {
            End::Whole => {
                if reusable && out.finished && !out.broken {
                    self.release(key, conn);
                }
                // Whether the client's connection goes on is the client's
                // side: its body read whole (the shard may have answered
                // before it took it all, then the connection is not pooled).
                Exchanged::Done(status)
            }
            End::Cut => {
                client.abort();
                Exchanged::Closed(status)
            }
        }
    }

    /// Writes shardgate's own answer; returns its status.
    pub(super) async fn answer<D: Downstream>(
        &self,
        client: &mut D,
        ctx: &mut RequestCtx,
        refusal: Refusal,
        close: bool,
    ) -> u16 {
        self.answered(client, ctx, refusal, close).await.0
    }

    /// As [`FastPath::answer`], and whether it went out whole (else the
    /// connection must close: the client could not tell where it ends).
    pub(super) async fn answered<D: Downstream>(
        &self,
        client: &mut D,
        ctx: &mut RequestCtx,
        refusal: Refusal,
        close: bool,
    ) -> (u16, bool) {
        ctx.answered = Some(refusal.status);
        client.queue_answer(&refusal, close);
        let sent = tokio::time::timeout(self.send_timeout, poll_fn(|cx| client.poll_send(cx)));
        (refusal.status, matches!(sent.await, Ok(Ok(()))))
    }
}

/// How the responder ended.
enum End {
    /// Both messages went whole (the request's body may have been left
    /// unsent if the shard answered before it).
    Whole,
    /// Cut short: the client's connection closes (an HTTP/2 stream is
    /// reset) so that the client sees it.
    Cut,
}

/// Decodes the response body bytes at the front of `buf`, leaving there
/// only what lies beyond the body: the content (for a length or a close
/// the bytes themselves, without a copy), the trailer section into
/// `trailers`.
fn decode_body(
    framing: &mut Framing,
    buf: &mut BytesMut,
    trailers: &mut Vec<u8>,
    max_trailers: usize,
) -> Result<Bytes, ()> {
    if !matches!(framing, Framing::Chunked(_)) {
        let used = framing.consume(buf).map_err(|_| ())?;
        return Ok(buf.split_to(used).freeze());
    }
    let mut content = BytesMut::new();
    let used = framing
        .decode(buf, |part| match part {
            Part::Data(range) => content.extend_from_slice(&buf[range]),
            Part::Trailer(range) => trailers.extend_from_slice(&buf[range]),
            Part::Chunk(_) => {}
        })
        .map_err(|_| ())?;
    if trailers.len() > max_trailers {
        // A shard's trailer section is held until it ends: bounded as a
        // head is.
        return Err(());
    }
    buf.advance(used);
    Ok(content.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_body_leaves_what_lies_beyond_it_and_its_trailers_are_bounded() {
        let mut framing = Framing::Length(5);
        let mut buf = BytesMut::from(&b"helloHTTP/1.1"[..]);
        let content = decode_body(&mut framing, &mut buf, &mut Vec::new(), 64).unwrap();
        assert_eq!((&content[..], &buf[..]), (&b"hello"[..], &b"HTTP/1.1"[..]));
        let mut framing = Framing::chunked();
        let mut trailers = Vec::new();
        let mut buf = BytesMut::from(&b"3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\nextra"[..]);
        let content = decode_body(&mut framing, &mut buf, &mut trailers, 64).unwrap();
        assert_eq!(&content[..], b"abc");
        assert_eq!(trailers, b"X-Sum: 1\r\n");
        assert_eq!(&buf[..], b"extra");
        // A shard's endless trailer section is cut, not held.
        let mut framing = Framing::chunked();
        let mut trailers = Vec::new();
        let endless = format!("0\r\n{}", "X-Pad: aaaaaaaaaaaaaaaa\r\n".repeat(10));
        let mut buf = BytesMut::from(endless.as_bytes());
        assert!(decode_body(&mut framing, &mut buf, &mut trailers, 64).is_err());
    }
}
