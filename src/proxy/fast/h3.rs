//! HTTP/3 streams on the fast transport (DESIGN §9). The h3 crate reads
//! each stream's head and DATA and writes its response frames over quinn
//! (whose flow control holds a body back while the shard is slow to take
//! it); the request is planned and exchanged with the shards as an HTTP/2
//! stream's is (`h2.rs`): only the stream differs, here [`H3Client`].
//!
//! h3 sends asynchronously (a frame is handed to quinn, then its writing
//! awaited), while the exchange polls: each frame's sending is a future
//! that owns the stream's send half and gives it back once done. A
//! response cut short resets the stream (quinn would finish a stream
//! dropped unfinished, and a cut response would look whole).

use super::body::{BodyError, H2Body};
use super::downstream::{append, Downstream, ResponseStart};
use super::h2::{log_line, Served, StreamHead};
use super::response::h2_response_head;
use super::FastPath;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::pipeline::answer::Refusal;
use crate::proxy::pipeline::framing::trailer_map;
use bytes::{Buf, Bytes};
use futures_util::FutureExt;
use h3::error::{Code, StreamError};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::l4::socket::SocketAddr;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

/// How long a GET or HEAD's stream end is waited for (then it goes as a
/// request whose body may come).
const BODYLESS_END_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// A request stream as the h3 crate accepts it.
pub type H3Stream = h3::server::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>;
type SendHalf = h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;
type RecvHalf = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// What a stream's connection says of it.
pub struct H3Conn {
    pub conn: quinn::Connection,
    /// The client's address.
    pub client: SocketAddr,
    /// The address the client sent to (a PROXY header to a shard names it).
    pub local: Option<std::net::SocketAddr>,
}

impl FastPath {
    /// Serves one HTTP/3 request: `req`, its head, came on `stream`;
    /// `early`: before the handshake was done (0-RTT). A stream its client
    /// reset already is not served (it reaches no shard, spends no token):
    /// [`Served::Reset`].
    pub async fn serve_h3(
        &self,
        req: http::Request<()>,
        stream: H3Stream,
        conn: &H3Conn,
        early: bool,
    ) -> Served {
        let (parts, ()) = req.into_parts();
        let req = RequestHeader::from(parts);
        let (send, mut recv) = stream.split();
        let Some((body_empty, first)) = self.body_start(&req, &mut recv).await else {
            let line = log_line(&req, Some(&conn.client), "HTTP/3");
            self.gateway.finish(&mut RequestCtx::default(), &line, 0);
            return Served::Reset;
        };
        let mut ctx = RequestCtx::default();
        let head = StreamHead {
            req: &req,
            client: Some(&conn.client),
            tls: true,
            body_empty,
            early,
        };
        let (body, planned) = self.plan_stream(&head, &mut ctx);
        let ends = conn.client.as_inet().copied().zip(conn.local);
        let mut client = H3Client::new(send, recv, body, conn.conn.clone());
        client.first = first;
        client.body_done = body_empty;
        client.head_only = planned.head_only;
        let status = self
            .exchange_stream(&mut client, planned, ends, &mut ctx)
            .await;
        (ctx.bytes_in, ctx.bytes_out) = client.counts();
        {
            let line = log_line(&req, Some(&conn.client), "HTTP/3");
            self.gateway.finish(&mut ctx, &line, status);
        }
        // An answer came before the body ended: the client is told to
        // stop sending it (RFC 9114 §4.1.1), the answer stands. (By
        // dropping the receive half: quinn sends STOP_SENDING then, with
        // code 0, which HTTP/3 reads as H3_NO_ERROR; h3-quinn's
        // `stop_sending` panics while a read is pending.)
        drop(client);
        Served::Done
    }

    /// What came after the head: whether the body is empty, and its first
    /// bytes; `None`: the client reset the stream. A GET or HEAD without
    /// a length whose stream has not ended yet is waited for a while
    /// ([`BODYLESS_END_WAIT`]: its end mostly comes a packet later), so
    /// that it goes to the shard without a body; other requests go on at
    /// once (a gRPC client may wait for the answer's head before it
    /// sends).
    async fn body_start(
        &self,
        req: &RequestHeader,
        recv: &mut RecvHalf,
    ) -> Option<(bool, Option<Bytes>)> {
        let mut first = poll_fn(|cx| recv.poll_recv_data(cx)).now_or_never();
        let bodiless = matches!(req.method, http::Method::GET | http::Method::HEAD);
        if first.is_none() && bodiless && !req.headers.contains_key(http::header::CONTENT_LENGTH) {
            let read = poll_fn(|cx| recv.poll_recv_data(cx));
            first = tokio::time::timeout(BODYLESS_END_WAIT, read).await.ok();
        }
        match first {
            Some(Ok(None)) => Some((true, None)),
            Some(Ok(Some(mut data))) => Some((false, Some(data.copy_to_bytes(data.remaining())))),
            Some(Err(_)) => None,
            None => Some((false, None)),
        }
    }
}

/// A frame to send on a stream.
enum Frame {
    Head(http::Response<()>),
    Data(Bytes),
    /// Trailers, then the stream's end.
    Trailers(http::HeaderMap),
    End,
}

impl Frame {
    async fn send(self, to: &mut SendHalf) -> Result<(), StreamError> {
        match self {
            Frame::Head(head) => to.send_response(head).await,
            Frame::Data(data) => to.send_data(data).await,
            Frame::Trailers(trailers) => {
                to.send_trailers(trailers).await?;
                to.finish().await
            }
            Frame::End => to.finish().await,
        }
    }
}

/// A frame's sending, owning the send half until it is done (or cut:
/// `Err(None)`).
type Sending =
    Pin<Box<dyn Future<Output = (SendHalf, Result<(), Option<StreamError>>)> + Send + 'static>>;

/// Sends `frame` on `to`, unless `cut` is set first.
fn sending(mut to: SendHalf, frame: Frame, cut: Arc<AtomicBool>) -> Sending {
    Box::pin(async move {
        let done = {
            let send = frame.send(&mut to);
            let mut send = std::pin::pin!(send);
            poll_fn(|cx| match cut.load(Ordering::Relaxed) {
                true => Poll::Ready(Err(None)),
                false => send.as_mut().poll(cx).map(|r| r.map_err(Some)),
            })
            .await
        };
        (to, done)
    })
}

/// An HTTP/3 request stream, for its one request.
pub(super) struct H3Client {
    recv: RecvHalf,
    /// Body bytes read with the head.
    first: Option<Bytes>,
    body: H2Body,
    body_done: bool,
    head_only: bool,
    /// The send half, while no frame is being sent.
    idle: Option<SendHalf>,
    /// The frame being sent (it holds the send half).
    busy: Option<Sending>,
    /// The response head, until it is sent.
    head: Option<http::Response<()>>,
    queued: Bytes,
    /// The end is queued (with trailers if any).
    end: Option<Option<http::HeaderMap>>,
    /// The end was handed to the stream.
    ended: bool,
    /// The end went: the stream is finished (never reset after).
    finished: bool,
    /// Body bytes queued for the client.
    bytes_out: u64,
    conn: quinn::Connection,
    /// The connection's end, once watched.
    closed: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// Set to cut the frame being sent (the response is reset).
    cut: Arc<AtomicBool>,
}

impl H3Client {
    fn new(send: SendHalf, recv: RecvHalf, body: H2Body, conn: quinn::Connection) -> Self {
        H3Client {
            recv,
            first: None,
            body,
            body_done: false,
            head_only: false,
            idle: Some(send),
            busy: None,
            head: None,
            queued: Bytes::new(),
            end: None,
            ended: false,
            finished: false,
            bytes_out: 0,
            conn,
            closed: None,
            cut: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The response head `head` goes first; `end`: with no body after it.
    fn head(&mut self, head: ResponseHeader, end: bool) {
        let parts = http::response::Parts::from(head);
        self.head = Some(http::Response::from_parts(parts, ()));
        if end {
            self.end = Some(None);
        }
    }

    /// The next frame to send, if any.
    fn next_frame(&mut self) -> Option<Frame> {
        if let Some(head) = self.head.take() {
            return Some(Frame::Head(head));
        }
        if !self.queued.is_empty() {
            return Some(Frame::Data(std::mem::take(&mut self.queued)));
        }
        let end = self.end.take()?;
        self.ended = true;
        Some(match end {
            Some(trailers) => Frame::Trailers(trailers),
            None => Frame::End,
        })
    }
}

impl H3Client {
    /// Resets the stream unless its end went (an end still queued, or a
    /// frame half sent, is cut).
    fn reset(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.ended = true;
        self.head = None;
        self.queued = Bytes::new();
        self.end = None;
        self.cut.store(true, Ordering::Relaxed);
        if let Some(mut busy) = self.busy.take() {
            // Cut: ready at its next poll, with the send half back. (Not
            // while a panic unwinds: the panic may have come from that
            // future, and polling it again would abort the process.)
            if !std::thread::panicking() {
                let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
                if let Poll::Ready((to, _)) = busy.as_mut().poll(&mut cx) {
                    self.idle = Some(to);
                }
            }
        }
        if let Some(to) = &mut self.idle {
            to.stop_stream(Code::H3_INTERNAL_ERROR);
        }
    }
}

/// A stream dropped before its end went (a panic, a send that timed out)
/// is reset: quinn would finish it, and a cut response would look whole.
impl Drop for H3Client {
    fn drop(&mut self) {
        self.reset();
    }
}

impl Downstream for H3Client {
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, BodyError>> {
        loop {
            if self.body_done {
                return Poll::Ready(Ok(None));
            }
            let data = match self.first.take() {
                Some(first) => first,
                None => match ready!(self.recv.poll_recv_data(cx)) {
                    Ok(Some(mut data)) => data.copy_to_bytes(data.remaining()),
                    Ok(None) => {
                        self.body_done = true;
                        let end = self.body.end()?;
                        if !end.is_empty() {
                            return Poll::Ready(Ok(Some(end)));
                        }
                        continue;
                    }
                    Err(_) => return Poll::Ready(Err(BodyError::Gone)),
                },
            };
            let data = self.body.data(data)?;
            if !data.is_empty() {
                return Poll::Ready(Ok(Some(data)));
            }
        }
    }

    fn body_done(&self) -> bool {
        self.body_done
    }

    /// Ready once the connection is gone. (A stream its client stopped
    /// reading is found when its response is written.)
    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let conn = &self.conn;
        let closed = self.closed.get_or_insert_with(|| {
            let conn = conn.clone();
            Box::pin(async move {
                conn.closed().await;
            })
        });
        closed.as_mut().poll(cx)
    }

    fn start(&mut self, head: ResponseStart<'_>) -> Result<(), ()> {
        let header = h2_response_head(head.buf, head.parsed, head.edit, head.id)?;
        let end = head.parsed.bodiless
            || matches!(
                head.parsed.framing,
                crate::proxy::pipeline::framing::Framing::Length(0)
            );
        self.head(header, end);
        Ok(())
    }

    fn queue(&mut self, content: Bytes, end: Option<&[u8]>) {
        if self.ended || self.end.is_some() {
            return;
        }
        self.bytes_out += content.len() as u64;
        append(&mut self.queued, content);
        if let Some(trailers) = end {
            self.end = Some(trailer_map(trailers));
        }
    }

    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if let Some(busy) = &mut self.busy {
                let (to, done) = ready!(busy.as_mut().poll(cx));
                self.busy = None;
                self.idle = Some(to);
                if done.is_err() {
                    return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
                }
                // The frame that went was the end (trailers and all).
                self.finished = self.ended;
            }
            let Some(frame) = self.next_frame() else {
                return Poll::Ready(Ok(()));
            };
            let Some(to) = self.idle.take() else {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            };
            self.busy = Some(sending(to, frame, Arc::clone(&self.cut)));
        }
    }

    fn sending(&self) -> bool {
        self.head.is_some() || !self.queued.is_empty() || self.end.is_some() || self.busy.is_some()
    }

    /// Resets the stream: a response cut short must not look complete (a
    /// whole one, finished, is left to go out).
    fn abort(&mut self) {
        self.reset();
    }

    fn queue_answer(&mut self, refusal: &Refusal, _close: bool) {
        let Ok(head) = refusal.response_header() else {
            return;
        };
        let body = !self.head_only && !refusal.body.is_empty();
        self.head(*head, !body);
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
