//! An HTTP/2 connection's stream, every byte both ways watched for a
//! flood (`wire::h2_frames`): a client's (TLS or prior knowledge) and an
//! `h2` shard's alike. The log says who flooded, and how. A client's
//! reads then stop, and its server is alarmed: it sends GOAWAY
//! (`ENHANCE_YOUR_CALM`, as to a rapid reset) and closes. A shard's reads
//! fail: its connection closes, and its streams fail as a reset
//! connection's do.

use crate::wire::h2_frames::FrameWatch;
use bytes::Bytes;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// Who is on the other end, as a flood's log line names it.
#[derive(Debug, Clone, Copy)]
enum Peer {
    /// A client, at its address (none: a Unix socket's).
    Client(Option<SocketAddr>),
    Shard(SocketAddr),
}

/// A stream watched for an HTTP/2 flood, with the bytes already read from
/// it (a client's first, read before the h2 crate's handshake takes its
/// buffers) put back in front.
#[derive(Debug)]
pub struct Watched<S> {
    front: Bytes,
    pub(super) inner: S,
    frames: FrameWatch,
    peer: Peer,
    /// Told when the peer floods, from then on its reads wait; `None`:
    /// they fail.
    alarm: Option<Arc<Notify>>,
}

impl<S> Watched<S> {
    /// A client's connection, `front` read from it already (its preface
    /// comes first); `alarm` is told if it floods.
    pub fn client(
        inner: S,
        front: &[u8],
        addr: Option<SocketAddr>,
        alarm: Arc<Notify>,
    ) -> Watched<S> {
        Watched {
            front: Bytes::copy_from_slice(front),
            inner,
            frames: FrameWatch::of_client(Instant::now()),
            peer: Peer::Client(addr),
            alarm: Some(alarm),
        }
    }

    /// A shard's connection (the gateway sends the preface).
    pub fn shard(inner: S, addr: SocketAddr) -> Watched<S> {
        Watched {
            front: Bytes::new(),
            inner,
            frames: FrameWatch::of_server(Instant::now()),
            peer: Peer::Shard(addr),
            alarm: None,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.frames.flooded() && this.alarm.is_some() {
            return Poll::Pending;
        }
        let before = buf.filled().len();
        if this.front.is_empty() {
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        } else {
            let n = this.front.len().min(buf.remaining());
            buf.put_slice(&this.front.split_to(n));
        }
        let Err(flood) = this.frames.read(&buf.filled()[before..], Instant::now) else {
            return Poll::Ready(Ok(()));
        };
        match this.peer {
            Peer::Client(Some(addr)) => log::warn!("{flood} from client {addr}: GOAWAY"),
            Peer::Client(None) => log::warn!("{flood} from a client: GOAWAY"),
            Peer::Shard(addr) => log::warn!("{flood} from shard {addr}: connection closed"),
        }
        match &this.alarm {
            Some(alarm) => {
                // Nothing more of the peer's is read (what came with the
                // flood is dropped): the GOAWAY goes out, and the
                // connection closes.
                buf.set_filled(before);
                alarm.notify_one();
                Poll::Pending
            }
            None => Poll::Ready(Err(flood.into())),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.frames.wrote(&[io::IoSlice::new(buf)], n);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, bufs))?;
        this.frames.wrote(bufs, n);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
