//! The one responder, for HTTP/1 and HTTP/2 clients alike: the shard's
//! head and body to the client, the rest of the request body still going
//! up (a shard may answer before it read it all), the connection back to
//! the pool; and shardgate's own answers.

use super::downstream::{Downstream, ResponseStart};
use super::exchange::{poll_timer, Exchanged, Outbound, Upstream};
use super::{poll_read_buf, FastPath};
use crate::control::ShardPeer;
use crate::proxy::buffers;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::pipeline::answer::Refusal;
use crate::proxy::pipeline::compression::BodyEncoder;
use crate::proxy::pipeline::framing::{trailer_fields, Framing, Part};
use crate::proxy::pipeline::grpc;
use crate::proxy::upstream::conn::Conn;
use bytes::{Buf, Bytes, BytesMut};
use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// The `grpc-status` in a response head (`head`, as `parsed` read it).
fn grpc_status_in_head(head: &[u8], parsed: &super::response::ParsedResponse) -> Option<u8> {
    let text = |r: &std::ops::Range<usize>| std::str::from_utf8(&head[r.clone()]).unwrap_or("");
    grpc::status_of(
        parsed
            .headers
            .iter()
            .map(|(n, v)| (text(n), &head[v.clone()])),
    )
}

/// Response bodies are read from the shard in reads of up to this much.
const BODY_READ: usize = 16 * 1024;

impl FastPath {
    /// The one responder: the shard's head and body to the client (the
    /// body framed for it), the rest of the request body still going up,
    /// a client slow to read given `limits.send_timeout_ms` per stall; the
    /// connection goes back to the pool when both messages ended clean.
    pub(super) async fn respond<D: Downstream>(
        &self,
        client: &mut D,
        upstream: Upstream,
        mut out: Outbound,
        peer: &ShardPeer,
        ctx: &mut RequestCtx,
    ) -> Exchanged {
        let (conn, mut buf, mut parsed) = (upstream.conn, upstream.buf, upstream.parsed);
        let status = parsed.status;
        let head = buf.split_to(parsed.head_len);
        if ctx.grpc {
            // A trailers-only answer carries it in its head.
            ctx.grpc_status = grpc_status_in_head(&head, &parsed);
        }
        let mut framing = parsed.framing.clone();
        let mut trailers = Vec::new();
        // Body bytes that break the framing before anything was sent: the
        // client still gets an answer.
        let Ok(first) = decode_body(&mut framing, &mut buf, &mut trailers, self.head_limit) else {
            return self.invalid_response(client, ctx).await;
        };
        // Compressed or not, decided before the head says which; an
        // encoder that cannot start leaves the body as it is.
        let (compress, encoder) = (self.gateway).compression(ctx, |n| parsed.facts(&head, n));
        parsed.compress = compress;
        let edit = self.gateway.response_edit(status, ctx);
        let start = ResponseStart {
            buf: &head,
            parsed: &parsed,
            edit: edit.as_ref(),
            id: self.id_field(ctx),
            // What the client still sends of its body cannot be told from
            // a next request once the answer is over: it closes.
            close: !client.body_done(),
        };
        if client.start(start).is_err() {
            return self.invalid_response(client, ctx).await;
        }
        drop(head);
        // The fields are written: their list, for the thread's next head.
        buffers::give_fields(std::mem::take(&mut parsed.headers));
        // Bytes beyond the response: the shard misbehaved; do not reuse it.
        let reusable = parsed.keeps_connection() && buf.is_empty();
        buf.clear();
        let mut relay = Relay::new(conn, buf, framing, trailers, self.head_limit, reusable);
        relay.encoder = encoder;
        if relay.deliver(client, first).is_err() {
            client.abort();
            return Exchanged::Closed(status);
        }
        let bounds = self.bounds();
        let ended = poll_fn(|cx| relay.poll(cx, client, &mut out, &bounds)).await;
        match ended {
            End::Whole => {
                if ctx.grpc {
                    ctx.grpc_status = relay.grpc_status().or(ctx.grpc_status);
                }
                if relay.reusable && out.finished && !out.broken {
                    self.release(peer, relay.conn);
                }
                // Kept for the thread's next response, if the client took
                // every part of it.
                buffers::give(relay.buf);
                // Whether the client's connection goes on is the client's
                // side: its body read whole (the shard may have answered
                // before it took it all, then the connection is not pooled).
                Exchanged::Done(status)
            }
            End::Silent => {
                self.gateway.response_timed_out(ctx);
                client.abort();
                Exchanged::Closed(status)
            }
            End::Cut => {
                client.abort();
                Exchanged::Closed(status)
            }
        }
    }

    /// A response's time bounds: a stalled client, a paused request body,
    /// a silent shard.
    fn bounds(&self) -> Bounds {
        Bounds {
            send: self.send_timeout,
            body: self.body_timeout,
            read: self.gateway.watch_settings().read_timeout,
        }
    }

    /// The answer to a response that cannot be relayed (its head or its
    /// first body bytes broke the rules before anything was sent): 502,
    /// and the client's connection closes.
    async fn invalid_response<D: Downstream>(
        &self,
        client: &mut D,
        ctx: &mut RequestCtx,
    ) -> Exchanged {
        let refusal = Refusal::error(502, "upstream-invalid-response");
        Exchanged::Closed(self.answer(client, ctx, refusal, true).await)
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
        let refusal = self.gateway.identified(refusal, ctx);
        ctx.answered_with(&refusal);
        client.queue_answer(&refusal, close);
        let sent = tokio::time::timeout(self.send_timeout, poll_fn(|cx| client.poll_send(cx)));
        (refusal.status, matches!(sent.await, Ok(Ok(()))))
    }
}

/// The response body on its way to the client: read from the shard,
/// decoded, queued, while the rest of the request body still goes up;
/// each wait bounded.
struct Relay {
    conn: Conn,
    /// Read from the shard, not yet decoded.
    buf: BytesMut,
    framing: Framing,
    /// A body framed by the shard's close.
    until_close: bool,
    /// The trailer section, once read (bounded by `max_trailers`).
    trailers: Vec<u8>,
    max_trailers: usize,
    /// The body ended: all of it is queued for the client.
    done: bool,
    /// The shard's connection may go back to the pool.
    reusable: bool,
    /// Since when the client has not taken what is queued for it.
    stalled: Option<Instant>,
    shard: ShardSilence,
    sleep: Option<Pin<Box<Sleep>>>,
    /// The body's encoder, when it is compressed.
    encoder: Option<BodyEncoder>,
}

/// The waits a relay is bounded by: the client's stall
/// (`limits.send_timeout_ms`), the request body's
/// (`limits.body_timeout_ms`), the shard's silence
/// (`upstream.read_timeout_ms`).
struct Bounds {
    send: Duration,
    body: Duration,
    read: Duration,
}

impl Relay {
    /// A relay of `framing`'s body from `conn` (`buf`: read, not yet
    /// decoded; `trailers` read so far, at most `max_trailers`).
    fn new(
        conn: Conn,
        buf: BytesMut,
        framing: Framing,
        trailers: Vec<u8>,
        max_trailers: usize,
        reusable: bool,
    ) -> Relay {
        Relay {
            conn,
            buf,
            until_close: matches!(framing, Framing::UntilClose),
            done: framing.is_done(),
            framing,
            trailers,
            max_trailers,
            reusable,
            stalled: None,
            shard: ShardSilence::default(),
            sleep: None,
            encoder: None,
        }
    }

    /// Queues `content` for the client, compressed if the body is (each
    /// piece flushed as it comes), with the end and its trailers once the
    /// body is done. `Err`: the encoder failed (the body is cut).
    fn deliver<D: Downstream>(&mut self, client: &mut D, content: Bytes) -> Result<(), ()> {
        let end = self.done.then_some(&self.trailers[..]);
        let Some(encoder) = &mut self.encoder else {
            client.queue(content, end);
            return Ok(());
        };
        let out = encoder.encode(&content, end.is_some()).map_err(|_| ())?;
        client.queue(out, end);
        Ok(())
    }

    /// The `grpc-status` in the trailer section, once read.
    fn grpc_status(&self) -> Option<u8> {
        grpc::status_of(trailer_fields(&self.trailers, |_| false))
    }

    /// One pass: the client sent to, the shard read from while the
    /// client keeps up, the request body sent on, then the deadlines.
    fn poll<D: Downstream>(
        &mut self,
        cx: &mut Context<'_>,
        client: &mut D,
        out: &mut Outbound,
        bounds: &Bounds,
    ) -> Poll<End> {
        loop {
            if client.sending() && self.poll_client(client, cx).is_err() {
                return Poll::Ready(End::Cut);
            }
            if client.sending() {
                // Not reading the shard: its silence is not counted.
                self.shard.reading = None;
            } else if self.done {
                return Poll::Ready(End::Whole);
            } else {
                match self.poll_shard(client, cx) {
                    Poll::Ready(Ok(())) => continue,
                    Poll::Ready(Err(())) => return Poll::Ready(End::Cut),
                    Poll::Pending => {}
                }
            }
            match out.poll(client, &mut self.conn, cx) {
                // The response is under way: a body the client cannot
                // finish (or a client gone) cuts it.
                Poll::Ready(Err(_)) => return Poll::Ready(End::Cut),
                Poll::Ready(Ok(())) if !client.sending() && client.poll_gone(cx).is_ready() => {
                    return Poll::Ready(End::Cut);
                }
                _ => {}
            }
            self.shard.writes(out);
            return self.poll_deadlines(cx, out, bounds);
        }
    }

    /// Sends what is queued for the client; `Err`: it is gone.
    fn poll_client<D: Downstream>(
        &mut self,
        client: &mut D,
        cx: &mut Context<'_>,
    ) -> Result<(), ()> {
        match client.poll_send(cx) {
            Poll::Ready(Ok(())) => self.stalled = None,
            Poll::Ready(Err(_)) => return Err(()),
            Poll::Pending => {
                self.stalled.get_or_insert_with(Instant::now);
            }
        }
        Ok(())
    }

    /// Reads from the shard and queues what it decoded for the client:
    /// `Ready(Ok)` when it did (the relay goes on), `Ready(Err)` when the
    /// body was cut short or broke its framing.
    fn poll_shard<D: Downstream>(
        &mut self,
        client: &mut D,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), ()>> {
        self.buf.reserve(BODY_READ);
        match poll_read_buf(&mut self.conn, cx, &mut self.buf) {
            Poll::Ready(Ok(0)) if self.until_close => {
                self.reusable = false;
                self.done = true;
                Poll::Ready(self.deliver(client, Bytes::new()))
            }
            // Cut short: the client must see it so.
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => Poll::Ready(Err(())),
            Poll::Ready(Ok(_)) => {
                self.shard.reading = None;
                let decoded = decode_body(
                    &mut self.framing,
                    &mut self.buf,
                    &mut self.trailers,
                    self.max_trailers,
                );
                let Ok(content) = decoded else {
                    return Poll::Ready(Err(()));
                };
                self.reusable &= self.buf.is_empty();
                self.buf.clear();
                self.done = self.framing.is_done();
                Poll::Ready(self.deliver(client, content))
            }
            Poll::Pending => {
                self.shard.reading.get_or_insert_with(Instant::now);
                Poll::Pending
            }
        }
    }

    /// Waits for the first of the deadlines: the client stalled, the
    /// request body awaited, the shard silent (which ends as `Silent`).
    fn poll_deadlines(
        &mut self,
        cx: &mut Context<'_>,
        out: &Outbound,
        bounds: &Bounds,
    ) -> Poll<End> {
        let silent = self.shard.since().map(|since| since + bounds.read);
        let due = [
            self.stalled.map(|since| since + bounds.send),
            out.awaiting_body.map(|since| since + bounds.body),
            silent,
        ];
        match poll_timer(&mut self.sleep, due.into_iter().flatten().min(), cx) {
            Poll::Ready(()) if silent.is_some_and(|at| at <= Instant::now()) => {
                Poll::Ready(End::Silent)
            }
            Poll::Ready(()) => Poll::Ready(End::Cut),
            Poll::Pending => Poll::Pending,
        }
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
    /// Cut short because the shard fell silent (`upstream.read_timeout_ms`).
    Silent,
}

/// Since when the shard has kept the response waiting: silent while it is
/// read, or not taking the request body's bytes (nginx's
/// `proxy_read_timeout` and `proxy_send_timeout`, one bound for both).
/// Clocks are read only when a wait starts.
#[derive(Default)]
struct ShardSilence {
    /// Since when a read from the shard has been pending.
    reading: Option<Instant>,
    /// Since when request bytes have waited for the shard to take them.
    writing: Option<Instant>,
}

impl ShardSilence {
    /// Notes the request's side after a poll: bytes that moved restart it.
    fn writes(&mut self, out: &mut Outbound) {
        let took = out.progressed.take().is_some();
        if took {
            // A shard taking the upload is no silent shard, even while it
            // answers nothing yet (a streaming handler reads on first).
            self.reading = self.reading.map(|_| Instant::now());
        }
        if took || !out.blocked_on_shard() {
            self.writing = None;
        } else {
            self.writing.get_or_insert_with(Instant::now);
        }
    }

    /// Since when the shard has been waited on in vain, if it is.
    fn since(&self) -> Option<Instant> {
        [self.reading, self.writing].into_iter().flatten().min()
    }
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
