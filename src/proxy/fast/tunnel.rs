//! The WebSocket tunnel: after the shard's 101, bytes flow both ways until
//! either side closes, each direction on its own, holding no copy buffer
//! while idle.

use super::response::response_head;
use super::upstream::Upstream;
use super::{Exchanged, FastPath};
use crate::proxy::ctx::RequestCtx;
use bytes::BytesMut;
use pingora::protocols::Stream;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The copy buffers of a WebSocket tunnel, each way.
const TUNNEL_BUFFER: usize = 2048;

impl FastPath {
    /// A WebSocket's 101 goes to the client, then bytes flow both ways
    /// until either side closes; the admission is held all along.
    /// `early`: what the client sent after its handshake, before the 101
    /// (read while the shard was awaited): tunnel data, sent on first.
    pub(super) async fn tunnel(
        &self,
        client: &mut Stream,
        early: &mut BytesMut,
        upstream: Upstream,
        ctx: &RequestCtx,
    ) -> Exchanged {
        let Upstream {
            mut conn,
            buf,
            parsed,
        } = upstream;
        let edit = self.response_edit(parsed.status, ctx);
        let mut out = response_head(&buf, &parsed, false, edit.as_ref());
        // Bytes the shard sent right after its 101 are tunnel data.
        out.extend_from_slice(&buf[parsed.head_len..]);
        drop(buf);
        if !self.send(client, &out).await {
            return Exchanged::Closed(101);
        }
        drop(out);
        if !early.is_empty() {
            let early = std::mem::take(early);
            if !self.send(&mut conn, &early).await {
                return Exchanged::Closed(101);
            }
        }
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
