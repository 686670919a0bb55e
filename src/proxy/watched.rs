//! An HTTP/2 connection's stream, every byte both ways watched for a
//! flood (`wire::h2_frames`): a client's (TLS or prior knowledge) and an
//! `h2` shard's alike. The log says who flooded, and how.
//!
//! A flooding client's server is alarmed: it sends GOAWAY
//! (`ENHANCE_YOUR_CALM`, as to a rapid reset) and closes the connection.
//! From the flood on (or from a GOAWAY for a rapid reset), what the
//! client sends is read and dropped, and for a second more once the
//! write side is shut after the GOAWAY (as nginx's lingering close):
//! closed with unread bytes, the socket would be reset, and a reset can
//! destroy the GOAWAY before the client reads it. A flooding shard's
//! reads fail: its connection closes at once, and its streams fail as a
//! reset connection's do.

use crate::wire::h2_frames::FrameWatch;
use bytes::Bytes;
use pingora::protocols::l4::socket::SocketAddr as ClientAddr;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// How long, and how many bytes, a flooding client is read after its
/// connection's write side is shut (nginx's `lingering_time` is longer:
/// this client is hostile).
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 1 << 20;

/// Between a client's connection and its server: the flood told, and
/// the GOAWAY that closes the connection.
#[derive(Debug, Default)]
pub struct Alarm {
    /// Told when the client floods.
    pub flooded: Notify,
    /// The client flooded, or its server sent GOAWAY to end the
    /// connection (a rapid reset): what it sends is dropped from then on.
    calmed: AtomicBool,
}

impl Alarm {
    /// The client's bytes are dropped from now on: it flooded, or its
    /// server is ending the connection with a GOAWAY.
    pub fn calm(&self) {
        self.calmed.store(true, Ordering::Relaxed);
    }
}

/// Who is on the other end, as a flood's log line names it.
#[derive(Debug, Clone)]
enum Peer {
    Client(Option<ClientAddr>),
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
    /// A client's server's; `None`: a flood fails the reads.
    alarm: Option<Arc<Alarm>>,
    /// After a client's flood: what is still dropped of what it sends,
    /// and until when once the write side is shut.
    linger: Option<Linger>,
}

#[derive(Debug)]
struct Linger {
    bytes: usize,
    shut: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> Watched<S> {
    /// A client's connection, `front` read from it already (its preface
    /// comes first); `alarm` is told if it floods.
    pub fn client(
        inner: S,
        front: &[u8],
        addr: Option<ClientAddr>,
        alarm: Arc<Alarm>,
    ) -> Watched<S> {
        Watched {
            front: Bytes::copy_from_slice(front),
            inner,
            frames: FrameWatch::of_client(Instant::now()),
            peer: Peer::Client(addr),
            alarm: Some(alarm),
            linger: None,
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
            linger: None,
        }
    }
}

impl<S: AsyncRead + Unpin> Watched<S> {
    /// Whether what the client sends is dropped now (the alarm says so).
    fn lingers(&mut self) -> bool {
        let calmed = (self.alarm.as_ref()).is_some_and(|a| a.calmed.load(Ordering::Relaxed));
        if calmed && self.linger.is_none() {
            self.linger = Some(Linger {
                bytes: LINGER_BYTES,
                shut: None,
            });
        }
        self.linger.is_some()
    }

    /// Reads and drops what the client sends: ready once it closed (or
    /// failed), or sent [`LINGER_BYTES`] since it was first dropped.
    fn poll_drop(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(linger) = self.linger.as_mut() else {
            return Poll::Ready(());
        };
        let mut scratch = [0u8; 4096];
        while linger.bytes > 0 {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut self.inner).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => {
                    linger.bytes = linger.bytes.saturating_sub(buf.filled().len());
                }
                Poll::Ready(_) => break,
                Poll::Pending => return Poll::Pending,
            }
        }
        linger.bytes = 0;
        Poll::Ready(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.lingers() {
            // Nothing more reaches the h2 crate, which reads no more once
            // it sends its GOAWAY (ready, this registered no waker: the
            // alarm and the connection's writes wake its task).
            let _ = this.poll_drop(cx);
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
        match &this.peer {
            Peer::Client(Some(addr)) => log::warn!("{flood} from client {addr}: GOAWAY"),
            Peer::Client(None) => log::warn!("{flood} from a client: GOAWAY"),
            Peer::Shard(addr) => log::warn!("{flood} from shard {addr}: connection closed"),
        }
        let Some(alarm) = &this.alarm else {
            return Poll::Ready(Err(flood.into()));
        };
        // What came with the flood is dropped too, and all that follows.
        buf.set_filled(before);
        alarm.calm();
        alarm.flooded.notify_one();
        if this.lingers() {
            let _ = this.poll_drop(cx);
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Watched<S> {
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

    /// After a client's flood or a GOAWAY to it, the write side shut
    /// (the GOAWAY sent before it), what the client still sends is read
    /// for [`LINGER`] at most, and dropped.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.lingers() {
            return Pin::new(&mut this.inner).poll_shutdown(cx);
        }
        let Some(linger) = this.linger.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        if linger.shut.is_none() {
            ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            if linger.bytes == 0 {
                return Poll::Ready(Ok(()));
            }
            linger.shut = Some(Box::pin(tokio::time::sleep(LINGER)));
        }
        if this.poll_drop(cx).is_ready() {
            return Poll::Ready(Ok(()));
        }
        match this.linger.as_mut().and_then(|l| l.shut.as_mut()) {
            Some(sleep) => sleep.as_mut().poll(cx).map(Ok),
            None => Poll::Ready(Ok(())),
        }
    }
}
