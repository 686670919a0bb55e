//! The client's side of one request, as the exchange with the shards sees
//! it, whatever the protocol: its body (as the shard receives it), whether
//! the client went away, and where the answer goes. [`H1Client`] reads and
//! writes an HTTP/1 connection's bytes; [`H2Client`] one HTTP/2 stream
//! through Pingora's session (its flow control is the backpressure); an
//! HTTP/3 stream's is in `h3.rs`.

use super::body::{BodyError, H1Body, H2Body, BODY_READ};
use super::poll_read_buf;
use super::response::{
    h2_response_head, response_head, Encoding, IdField, ParsedResponse, Persist,
};
use crate::proxy::buffers;
use crate::proxy::client::poll_watch;
use crate::proxy::hooks::ResponseEdit;
use crate::proxy::pipeline::answer::Refusal;
use crate::proxy::pipeline::framing::{put_chunk, put_last_chunk, trailer_fields, trailer_map};
use crate::proxy::upstream::h2_stream::poll_window;
use bytes::{Bytes, BytesMut};
use pingora::protocols::http::v2::server::HttpSession as H2Stream;
use pingora::protocols::Stream;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::AsyncWrite;

/// A shard's response head, on its way to the client.
pub(super) struct ResponseStart<'a> {
    /// The bytes the head was read in.
    pub buf: &'a [u8],
    pub parsed: &'a ParsedResponse,
    pub edit: Option<&'a ResponseEdit>,
    /// The request's ID, in its field.
    pub id: IdField<'a>,
    /// The client's connection closes after this response.
    pub close: bool,
}

/// The client's side of one request (see the module documentation).
/// Everything is polled: the exchange moves both directions in one task.
pub(super) trait Downstream {
    /// The next bytes of the request body as the shard receives them
    /// (framing included); `None` once it all went.
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, BodyError>>;

    /// Whether the client has no more body to send.
    fn body_done(&self) -> bool;

    /// Ready when the client went away; polled only once its body is read.
    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<()>;

    /// Starts the response with the shard's head. `Err`: one this client
    /// cannot be sent (answered 502 instead).
    fn start(&mut self, head: ResponseStart<'_>) -> Result<(), ()>;

    /// Queues body content; with `end`, the body's end and its trailer
    /// section (HTTP/1 field lines).
    fn queue(&mut self, content: Bytes, end: Option<&[u8]>);

    /// Writes what is queued; ready once it all went.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// Whether something queued is still to be written.
    fn sending(&self) -> bool;

    /// Queues shardgate's own answer, whole; `close`: the connection
    /// closes after it (and says so).
    fn queue_answer(&mut self, refusal: &Refusal, close: bool);

    /// The response was cut short: make sure the client sees it so (an
    /// HTTP/1 connection does once it closes; an HTTP/2 stream is reset).
    fn abort(&mut self) {}

    /// Body bytes read from the client so far, and queued for it (the
    /// access log's `bytes_in`, `bytes_out`).
    fn counts(&self) -> (u64, u64);
}

/// The interim answer to `Expect: 100-continue`.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// An HTTP/1 client connection, for one request.
pub(super) struct H1Client<'c> {
    stream: &'c mut Stream,
    /// Bytes read past the request head: its body's start, then the next
    /// request's.
    ahead: &'c mut BytesMut,
    body: H1Body,
    /// The most bytes of a next request kept while this one is served.
    head_limit: usize,
    http10: bool,
    head_only: bool,
    /// The connection closes after this exchange.
    pub close: bool,
    /// `Expect: 100-continue`, not answered yet.
    expect_continue: bool,
    /// How much of the `100 Continue` went out, while it is being written.
    interim: Option<usize>,
    encoding: Encoding,
    /// Bytes for the client, written before `pending`.
    out: Vec<u8>,
    written: usize,
    /// Content for the client, written as it is (no copy).
    pending: Bytes,
    /// Bytes were written and not yet flushed.
    unflushed: bool,
    /// Body bytes queued for the client.
    bytes_out: u64,
}

/// What an HTTP/1 request is, beside its body.
pub(super) struct H1Request {
    pub http10: bool,
    pub head_only: bool,
    pub close: bool,
    pub expect_continue: bool,
    pub head_limit: usize,
}

impl<'c> H1Client<'c> {
    pub(super) fn new(
        stream: &'c mut Stream,
        ahead: &'c mut BytesMut,
        body: H1Body,
        request: H1Request,
    ) -> Self {
        H1Client {
            stream,
            ahead,
            body,
            head_limit: request.head_limit,
            http10: request.http10,
            head_only: request.head_only,
            close: request.close,
            // A client that sent body bytes with its head did not wait.
            expect_continue: request.expect_continue,
            interim: None,
            bytes_out: 0,
            encoding: Encoding::Bodiless,
            out: Vec::new(),
            written: 0,
            pending: Bytes::new(),
            unflushed: false,
        }
    }

    /// A final answer comes before the `100 Continue` went: none goes
    /// (one already under way is finished first).
    fn forgo_continue(&mut self) {
        self.expect_continue = false;
        if self.interim == Some(0) {
            self.interim = None;
        }
    }

    /// Writes the `100 Continue` under way, then `out`, then `pending`.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some(sent) = self.interim {
            let rest = &CONTINUE[sent..];
            if rest.is_empty() {
                self.interim = None;
                break;
            }
            let n = ready!(Pin::new(&mut *self.stream).poll_write(cx, rest))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.interim = Some(sent + n);
            self.unflushed = true;
        }
        while self.written < self.out.len() {
            let n = ready!(Pin::new(&mut *self.stream).poll_write(cx, &self.out[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
            self.unflushed = true;
        }
        if !self.out.is_empty() {
            self.out.clear();
            self.written = 0;
        }
        while !self.pending.is_empty() {
            let n = ready!(Pin::new(&mut *self.stream).poll_write(cx, &self.pending))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            let _ = self.pending.split_to(n);
            self.unflushed = true;
        }
        // Written is not sent: TLS holds what it took until flushed, and
        // nothing else would flush it once the exchange is over.
        if self.unflushed {
            ready!(Pin::new(&mut *self.stream).poll_flush(cx))?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for H1Client<'_> {
    fn drop(&mut self) {
        // The head's buffer, for the thread's next response.
        buffers::give_vec(std::mem::take(&mut self.out));
    }
}

impl Downstream for H1Client<'_> {
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, BodyError>> {
        if std::mem::take(&mut self.expect_continue)
            && self.ahead.is_empty()
            && !self.body.is_done()
        {
            // RFC 9110 §10.1.1, as nginx: the gateway asks for the body
            // once it is ready to send it (admitted, and a shard connected).
            self.interim = Some(0);
        }
        if self.interim.is_some() || self.unflushed {
            ready!(self.poll_write_out(cx)).map_err(|_| BodyError::Gone)?;
        }
        loop {
            if self.body.is_done() {
                return Poll::Ready(Ok(None));
            }
            if !self.ahead.is_empty() {
                let bytes = self.body.take(self.ahead)?;
                if !bytes.is_empty() {
                    return Poll::Ready(Ok(Some(bytes)));
                }
                continue;
            }
            self.ahead.reserve(BODY_READ);
            match ready!(poll_read_buf(&mut *self.stream, cx, self.ahead)) {
                Ok(0) | Err(_) => return Poll::Ready(Err(BodyError::Gone)),
                Ok(_) => {}
            }
        }
    }

    fn body_done(&self) -> bool {
        self.body.is_done()
    }

    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        poll_watch(Pin::new(&mut *self.stream), self.ahead, self.head_limit, cx).map(|_| ())
    }

    fn start(&mut self, head: ResponseStart<'_>) -> Result<(), ()> {
        self.forgo_continue();
        self.encoding = Encoding::of(head.parsed, self.http10);
        self.close |= head.close || self.encoding == Encoding::Close;
        let persist = match (self.close, self.http10) {
            (true, _) => Persist::Close,
            (false, true) => Persist::KeepAlive,
            (false, false) => Persist::Default,
        };
        self.out = response_head(
            head.buf,
            head.parsed,
            self.encoding,
            persist,
            head.edit,
            head.id,
        );
        self.written = 0;
        Ok(())
    }

    fn queue(&mut self, content: Bytes, end: Option<&[u8]>) {
        if self.encoding != Encoding::Bodiless {
            self.bytes_out += content.len() as u64;
        }
        match self.encoding {
            Encoding::Bodiless => {}
            Encoding::Length | Encoding::Close => {
                if self.out.is_empty() && self.pending.is_empty() && content.len() > 4096 {
                    self.pending = content;
                } else {
                    self.out.extend_from_slice(&self.pending);
                    self.pending = Bytes::new();
                    self.out.extend_from_slice(&content);
                }
            }
            Encoding::Chunked => {
                self.out.extend_from_slice(&self.pending);
                self.pending = Bytes::new();
                put_chunk(&mut self.out, [&content[..]], content.len());
                if let Some(trailers) = end {
                    put_last_chunk(&mut self.out, &trailer_fields(trailers, |_| false));
                }
            }
        }
    }

    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_write_out(cx)
    }

    fn sending(&self) -> bool {
        self.interim.is_some() || !self.out.is_empty() || !self.pending.is_empty() || self.unflushed
    }

    fn queue_answer(&mut self, refusal: &Refusal, close: bool) {
        self.forgo_continue();
        self.close |= close;
        self.out = refusal.http1_to(self.head_only, self.close, self.http10);
        self.written = 0;
        self.pending = Bytes::new();
        if !self.head_only {
            self.bytes_out += refusal.body.len() as u64;
        }
    }

    fn counts(&self) -> (u64, u64) {
        (self.body.received(), self.bytes_out)
    }
}

/// An HTTP/2 stream, for its one request.
pub(super) struct H2Client {
    pub(super) session: Box<H2Stream>,
    body: H2Body,
    body_done: bool,
    head_only: bool,
    /// The response body's writer, once the head went.
    writer: Option<h2::SendStream<Bytes>>,
    queued: Bytes,
    /// The end is queued (with trailers if any).
    end: Option<Option<http::HeaderMap>>,
    ended: bool,
    /// Body bytes queued for the client.
    bytes_out: u64,
    /// The gateway reset the stream itself.
    aborted: bool,
}

impl H2Client {
    pub(super) fn new(session: Box<H2Stream>, body: H2Body, head_only: bool) -> Self {
        H2Client {
            body_done: session.is_body_empty(),
            session,
            body,
            head_only,
            writer: None,
            queued: Bytes::new(),
            end: None,
            ended: false,
            bytes_out: 0,
            aborted: false,
        }
    }

    /// A stream whose DATA are a tunnel's (RFC 8441), not a body to send
    /// up with the handshake.
    pub(super) fn tunnel_only(&mut self) {
        self.body_done = true;
    }

    /// Whether the client reset the stream (`RST_STREAM`) before both
    /// ends closed it: what the rapid-reset guard counts once the stream
    /// was accepted. A reset of the gateway's own does not count.
    pub(super) fn reset_by_client(&mut self) -> bool {
        use futures_util::FutureExt;
        let reset = std::future::poll_fn(|cx| self.poll_reset(cx)).now_or_never();
        !self.aborted && matches!(reset, Some(Ok(_)))
    }

    /// Ready with the reason once the stream was reset (by either end), or
    /// with an error once the connection failed.
    fn poll_reset(&mut self, cx: &mut Context<'_>) -> Poll<pingora::Result<h2::Reason>> {
        match &mut self.writer {
            Some(writer) => writer
                .poll_reset(cx)
                .map_err(|e| pingora::Error::because(pingora::ErrorType::H2Error, "reset", e)),
            None => Pin::new(&mut self.session.idle()).poll(cx),
        }
    }
}

impl H2Client {
    /// Reads off what the client still sends of its body (and drops it),
    /// for at most a second and 1 MiB, as the HTTP/1 lingering close.
    pub(super) async fn drain(&mut self) {
        let mut left = 1usize << 20;
        let drained = std::future::poll_fn(|cx| loop {
            if self.body_done || left == 0 {
                return Poll::Ready(());
            }
            match ready!(self.session.poll_read_body_bytes(cx)) {
                Some(Ok(data)) => left = left.saturating_sub(data.len()),
                Some(Err(_)) | None => self.body_done = true,
            }
        });
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drained).await;
    }
}

impl Downstream for H2Client {
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, BodyError>> {
        loop {
            if self.body_done {
                return Poll::Ready(Ok(None));
            }
            match ready!(self.session.poll_read_body_bytes(cx)) {
                Some(Ok(data)) => {
                    let data = self.body.data(data)?;
                    if !data.is_empty() {
                        return Poll::Ready(Ok(Some(data)));
                    }
                }
                Some(Err(_)) => return Poll::Ready(Err(BodyError::Gone)),
                None => {
                    self.body_done = true;
                    let end = self.body.end()?;
                    if !end.is_empty() {
                        return Poll::Ready(Ok(Some(end)));
                    }
                }
            }
        }
    }

    fn body_done(&self) -> bool {
        self.body_done
    }

    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.poll_reset(cx).map(|_| ())
    }

    fn start(&mut self, head: ResponseStart<'_>) -> Result<(), ()> {
        let header = h2_response_head(head.buf, head.parsed, head.edit, head.id)?;
        let end = head.parsed.bodiless
            || matches!(
                head.parsed.framing,
                crate::proxy::pipeline::framing::Framing::Length(0)
            );
        self.session
            .write_response_header(Box::new(header), end)
            .map_err(|_| ())?;
        self.writer = self.session.take_response_body_writer();
        self.ended = end;
        Ok(())
    }

    fn queue(&mut self, content: Bytes, end: Option<&[u8]>) {
        if self.ended {
            return;
        }
        self.bytes_out += content.len() as u64;
        append(&mut self.queued, content);
        if let Some(trailers) = end {
            self.end = Some(trailer_map(trailers));
        }
    }

    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.ended {
            self.queued = Bytes::new();
            return Poll::Ready(Ok(()));
        }
        let Some(writer) = self.writer.as_mut() else {
            return Poll::Ready(Err(io::ErrorKind::NotConnected.into()));
        };
        let closed = |_| io::Error::from(io::ErrorKind::BrokenPipe);
        while !self.queued.is_empty() {
            match ready!(poll_window(writer, self.queued.len(), cx)) {
                Ok(n) => {
                    let chunk = self.queued.split_to(n);
                    let last = self.queued.is_empty() && matches!(self.end, Some(None));
                    writer.send_data(chunk, last).map_err(closed)?;
                    self.ended |= last;
                }
                Err(Some(e)) => return Poll::Ready(Err(closed(e))),
                Err(None) => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            }
        }
        if let (Some(end), false) = (self.end.take(), self.ended) {
            match end {
                Some(trailers) => writer.send_trailers(trailers).map_err(closed)?,
                None => writer.send_data(Bytes::new(), true).map_err(closed)?,
            }
            self.ended = true;
        }
        Poll::Ready(Ok(()))
    }

    fn sending(&self) -> bool {
        !self.queued.is_empty() || (self.end.is_some() && !self.ended)
    }

    /// Resets the stream: a response cut short must not look complete. (A
    /// whole answer is never reset: a reset drops the frames still queued
    /// for the stream. Dropped with its body unread, the stream ends with
    /// an implicit `NO_ERROR` reset after them, RFC 9113 §8.1.)
    fn abort(&mut self) {
        if self.ended {
            return;
        }
        // A stream its client reset already (the usual reason a response
        // is cut) stays the client's reset: the rapid-reset guard counts it.
        let reset = std::future::poll_fn(|cx| self.poll_reset(cx));
        let by_client = futures_util::FutureExt::now_or_never(reset).is_some();
        match &mut self.writer {
            Some(writer) => writer.send_reset(h2::Reason::INTERNAL_ERROR),
            None => self.session.shutdown(),
        }
        self.ended = true;
        self.aborted = !by_client;
    }

    fn queue_answer(&mut self, refusal: &Refusal, _close: bool) {
        let Ok(head) = refusal.response_header() else {
            return;
        };
        let body = !self.head_only && !refusal.body.is_empty();
        if self.session.write_response_header(head, !body).is_err() {
            self.ended = true;
            return;
        }
        self.writer = self.session.take_response_body_writer();
        self.ended = !body;
        if body {
            self.bytes_out += refusal.body.len() as u64;
            self.queued = Bytes::from(refusal.body.clone());
            self.end = Some(None);
        }
    }

    fn counts(&self) -> (u64, u64) {
        (self.body.received(), self.bytes_out)
    }
}

/// Queues `content` after what `queued` holds (a stream's body frames,
/// HTTP/2's and HTTP/3's, go out as one when they can).
pub(super) fn append(queued: &mut Bytes, content: Bytes) {
    if queued.is_empty() {
        *queued = content;
    } else if !content.is_empty() {
        let mut joined = BytesMut::from(&queued[..]);
        joined.extend_from_slice(&content);
        *queued = joined.freeze();
    }
}
