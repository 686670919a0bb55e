//! The one responder, for HTTP/1 and HTTP/2 clients alike: the shard's
//! head and body to the client, the rest of the request body still going
//! up (a shard may answer before it read it all), the connection back to
//! the pool; and shardgate's own answers.

use super::conn::UpstreamKey;
use super::downstream::{Downstream, ResponseStart};
use super::exchange::{poll_timer, Exchanged, Outbound, Upstream};
use super::{poll_read_buf, FastPath};
use crate::proxy::ctx::RequestCtx;
use crate::proxy::pipeline::answer::Refusal;
use crate::proxy::pipeline::framing::{Framing, Part};
use bytes::{Buf, Bytes, BytesMut};
use std::future::poll_fn;
use std::task::Poll;
use tokio::time::Instant;

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
            id: self.id_field(ctx),
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
        let mut shard = ShardSilence::default();
        let read_timeout = self.gateway.watch_settings().read_timeout;
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
            if client.sending() {
                // Not reading the shard: its silence is not counted.
                shard.reading = None;
            } else {
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
                        shard.reading = None;
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
                    Poll::Pending => {
                        shard.reading.get_or_insert_with(Instant::now);
                    }
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
            shard.writes(&mut out);
            let silent = shard.since().map(|since| since + read_timeout);
            let due = [
                stalled.map(|since| since + self.send_timeout),
                out.awaiting_body.map(|since| since + self.body_timeout),
                silent,
            ];
            return match poll_timer(&mut sleep, due.into_iter().flatten().min(), cx) {
                Poll::Ready(()) if silent.is_some_and(|at| at <= Instant::now()) => {
                    Poll::Ready(End::Silent)
                }
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
        let refusal = self.gateway.identified(refusal, ctx);
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
