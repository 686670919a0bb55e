//! The client connection between two request heads: the bytes a client
//! sent past the end of the request being served (a pipelined request, or
//! the first bytes of the next one) are kept for the front end's next head,
//! in order, on both transports (RFC 9112 §9.3.2; DESIGN §2 step 6).
//!
//! Pingora reads a client in large buffers. Without its pipelining opt-in
//! it refuses to reuse a connection it read past a request on (the
//! pipelined request is lost, the client gets a reset); with it, it keeps
//! those bytes where only its own parser sees them, past the front end's
//! limits, its message rules and the fast transport. So on Pingora's path
//! the client is read through [`OneRequest`], a stream that ends where the
//! request's body ends (its framing tracked as a response's is): what
//! comes after is kept, and a read past the end only watches for the
//! client closing. The fast transport watches the same way ([`poll_watch`])
//! while it waits for a shard.

use super::pipeline::framing::{Framing, Part, MAX_SIZE_LINE};
use super::watched::Watched;
use bytes::BytesMut;
use pingora::protocols::tls::TlsRef;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Reads `client` while a request is served, keeping what it sends in
/// `ahead` (at most `limit` bytes, then it stops looking). Ready when the
/// client closed (or failed): it is gone, even if it sent more first (as
/// nginx, which ends a request whose client closed whatever it pipelined).
/// A real read, not a peek: it works on TLS, and a byte sent before the
/// close does not hide the close.
pub fn poll_watch(
    client: Pin<&mut Stream>,
    ahead: &mut BytesMut,
    limit: usize,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    let client = client.get_mut();
    let mut chunk = [0u8; 2048];
    loop {
        if ahead.len() >= limit {
            // The next head is as large as a head may be: the front end
            // refuses it (431) once this request is done.
            return Poll::Pending;
        }
        let mut read = ReadBuf::new(&mut chunk);
        ready!(Pin::new(&mut *client).poll_read(cx, &mut read))?;
        match read.filled() {
            [] => return Poll::Ready(Ok(())),
            bytes => ahead.extend_from_slice(bytes),
        }
    }
}

/// The client stream for one request on Pingora's path: reads end where
/// the request's body does.
#[derive(Debug)]
pub struct OneRequest {
    inner: Stream,
    /// How much of the body is still to come; done: reads only watch.
    body: Framing,
    /// Read past the request: the start of the next one.
    ahead: BytesMut,
    limit: usize,
    /// The framing bytes (size lines, extensions, CRLFs) a chunked body
    /// may still spend: the fast transport's budget, the body limit and
    /// one size line (`None`: unlimited).
    framing_left: Option<u64>,
}

impl OneRequest {
    /// `body`: the framing of what the client still has to send of this
    /// request (its head and any body bytes already read are not read
    /// through here); `ahead`: bytes already read past it; `limit`: the
    /// most to keep (the head size limit).
    pub fn new(
        inner: Stream,
        body: Framing,
        ahead: BytesMut,
        limit: usize,
        max_body: Option<u64>,
    ) -> Self {
        OneRequest {
            inner,
            body,
            ahead,
            limit,
            framing_left: max_body.map(|max| max.saturating_add(u64::from(MAX_SIZE_LINE))),
        }
    }

    /// The client stream, and what it sent past the request.
    pub fn into_parts(self) -> (Stream, BytesMut) {
        (self.inner, self.ahead)
    }

    /// Takes back a stream Pingora's path was given: the client and the
    /// bytes read past its request. `None` if it is not a [`OneRequest`]
    /// (never, as the front end hands out only those).
    pub fn unwrap(stream: Stream) -> Option<(Stream, BytesMut)> {
        let any: Box<dyn std::any::Any> = stream.into_any();
        any.downcast::<OneRequest>()
            .ok()
            .map(|one| one.into_parts())
    }
}

impl AsyncRead for OneRequest {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.body.is_done() {
            return poll_watch(Pin::new(&mut this.inner), &mut this.ahead, this.limit, cx);
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let new = &buf.filled()[before..];
        let mut content = 0;
        let decoded = this.body.decode(new, |part| {
            if let Part::Data(range) | Part::Trailer(range) = part {
                content += range.len();
            }
        });
        // Framing that outgrows the body it frames (a byte of data per
        // size line full of extensions): refused as the fast transport
        // refuses it.
        let framing = decoded.map_or(0, |used| (used - content) as u64);
        let over = match &mut this.framing_left {
            Some(left) => left.checked_sub(framing).map(|l| *left = l).is_none(),
            None => false,
        };
        match decoded
            .map_err(|_| ())
            .and_then(|used| if over { Err(()) } else { Ok(used) })
        {
            Ok(used) if used < new.len() => {
                this.ahead.extend_from_slice(&new[used..]);
                buf.set_filled(before + used);
            }
            Ok(_) => {}
            // Broken chunks by shardgate's rule (an endless size line, say,
            // which Pingora's parser would take): the body goes no further.
            Err(_) => {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a chunked body that breaks its framing",
                )))
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// The rest of a client stream wrapper's `IO`, passed to its `inner`
/// stream: writes, shutdown and the digests. No peeking: a peek would see
/// the wrapper's bytes out of order.
macro_rules! forward_to_inner {
    ($wrapper:ty) => {
        forward_to_inner!($wrapper, writes);
        forward_to_inner!($wrapper, the rest);
    };
    ($wrapper:ty, writes) => {
        impl AsyncWrite for $wrapper {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
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
    };
    ($wrapper:ty, the rest) => {
        #[async_trait::async_trait]
        impl Shutdown for $wrapper {
            async fn shutdown(&mut self) {
                Shutdown::shutdown(&mut *self.inner).await
            }
        }

        impl UniqueID for $wrapper {
            fn id(&self) -> UniqueIDType {
                self.inner.id()
            }
        }

        impl Ssl for $wrapper {
            fn get_ssl(&self) -> Option<&TlsRef> {
                self.inner.get_ssl()
            }

            fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
                self.inner.get_ssl_digest()
            }

            fn selected_alpn_proto(&self) -> Option<ALPN> {
                self.inner.selected_alpn_proto()
            }
        }

        impl GetTimingDigest for $wrapper {
            fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
                self.inner.get_timing_digest()
            }

            fn get_read_pending_time(&self) -> std::time::Duration {
                self.inner.get_read_pending_time()
            }

            fn get_write_pending_time(&self) -> std::time::Duration {
                self.inner.get_write_pending_time()
            }
        }

        impl GetProxyDigest for $wrapper {
            fn get_proxy_digest(
                &self,
            ) -> Option<Arc<pingora::protocols::raw_connect::ProxyDigest>> {
                self.inner.get_proxy_digest()
            }
        }

        impl GetSocketDigest for $wrapper {
            fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
                self.inner.get_socket_digest()
            }
        }

        #[async_trait::async_trait]
        impl Peek for $wrapper {}
    };
}

forward_to_inner!(OneRequest);

// An HTTP/2 client's stream (`super::watched`) is one to Pingora too.
forward_to_inner!(Watched<Stream>, the rest);

/// Reads and drops what the client still sends (a body it is uploading)
/// for a while after the answer, before the socket closes: closing with
/// unread bytes resets the connection, and a reset can destroy the answer
/// before the client reads it (RFC 9112 §9.6). At most a second and
/// 1 MiB, as nginx's lingering close.
pub(crate) async fn linger(stream: &mut Stream) {
    use tokio::io::AsyncReadExt;
    // On the heap: an array here would sit in every connection's future,
    // silent ones too, for the whole connection.
    let mut scratch = vec![0u8; 4096];
    let mut left = 1usize << 20;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
        while left > 0 {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}
