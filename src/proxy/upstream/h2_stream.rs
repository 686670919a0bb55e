//! One request on a shared HTTP/2 connection to a shard, read and written
//! as the HTTP/1.1 exchange the fast transport speaks to every shard: the
//! request's HTTP/1.1 head becomes the stream's HEADERS (hop-by-hop fields
//! left out, `Host` as the authority), its body's framing is decoded into
//! DATA frames sent as the stream's flow control allows, its trailer
//! section into trailing HEADERS; the response comes back as an HTTP/1.1
//! head and body (chunked unless the shard gave a length), its trailers as
//! the last chunk's. So the attempt loop, the headers watch, the responder,
//! the answers and every rule of the pipeline are the ones an HTTP/1.1
//! shard's request goes through (HTTP/1.1 is the transport's own message
//! form, as HAProxy's HTX is its).
//!
//! Bounded: request bytes are taken while less than [`MAX_PENDING`] wait
//! for the shard's flow-control window (the writer waits otherwise), and a
//! response's DATA are taken while the reader holds less than 64 KiB of
//! them, their window given back as they are taken (the shard cannot send
//! further ahead than the stream's window and that). Dropping the stream
//! before its end resets it (`CANCEL`), and only it: the connection goes
//! on for the other streams.

use super::h2::Slot;
use super::h2_message::{last_chunk, request_of, response_head, BodyForm, FieldRules, Outgoing};
use crate::proxy::pipeline::failure::AttemptFailure;
use crate::proxy::pipeline::framing::{put_chunk_size, trailer_map, Framing, Part};
use crate::proxy::pipeline::message::HeadEnd;
use bytes::{Buf, Bytes, BytesMut};
use h2::client::{ResponseFuture, SendRequest};
use h2::{Reason, RecvStream, SendStream};
use http::{Request, Response};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Request bytes taken from the writer but not yet sent (waiting for the
/// stream's window) at most.
pub(crate) const MAX_PENDING: usize = 64 * 1024;

/// Room the scratch buffer makes when it runs out (a response head
/// fits); the longest chunk-size line (16 hex digits and CRLF); what a
/// last chunk usually takes (gRPC's trailers); a longer one grows
/// the buffer as it is written.
const SCRATCH: usize = 512;
const CHUNK_SIZE_LINE: usize = 18;
const LAST_CHUNK: usize = 64;

/// Response bytes collected for one read at most, and pieces of them.
const MAX_OUTPUT: usize = 64 * 1024;
const MAX_PIECES: usize = 96;

/// A request on an HTTP/2 connection (see the module documentation).
pub(crate) struct ShardStream {
    /// The connection's handle, until the request is sent.
    send_request: Option<SendRequest<Bytes>>,
    /// Its place among the connection's streams, given back on drop.
    slot: Slot,
    scheme: http::uri::Scheme,
    rules: FieldRules,
    /// HTTP/1.1 request bytes not yet turned into HTTP/2.
    input: BytesMut,
    head_end: HeadEnd,
    up: Up,
    /// Body content decoded, waiting for the window.
    data: VecDeque<Bytes>,
    /// The trailer section's field lines, as they came.
    trailers: Vec<u8>,
    head_only: bool,
    /// A WebSocket handshake sent as an extended CONNECT: its key.
    websocket_key: Option<Box<str>>,
    down: Down,
    /// The response in HTTP/1.1 form, not yet read, and its length.
    output: VecDeque<Bytes>,
    output_len: usize,
    /// Where the pieces shardgate writes (the head, chunk sizes, the last
    /// chunk) are written, then split off: one buffer for a response's
    /// small pieces, not one allocation each.
    scratch: BytesMut,
    failure: Option<AttemptFailure>,
}

/// The request's side.
enum Up {
    /// Its head is being written.
    Head,
    /// Parsed, waiting for the connection to take a new stream.
    Ready(Box<Request<()>>, Framing),
    /// Its body going up.
    Body(SendStream<Bytes>, Framing),
    Done,
    Broken,
}

/// The response's side.
enum Down {
    NotYet,
    Head(ResponseFuture),
    Body { recv: RecvStream, chunked: bool },
    Done,
    Broken,
}

impl ShardStream {
    pub(crate) fn new(
        send_request: SendRequest<Bytes>,
        slot: Slot,
        tls: bool,
        rules: FieldRules,
    ) -> ShardStream {
        ShardStream {
            send_request: Some(send_request),
            slot,
            scheme: match tls {
                true => http::uri::Scheme::HTTPS,
                false => http::uri::Scheme::HTTP,
            },
            rules,
            input: BytesMut::new(),
            head_end: HeadEnd::default(),
            up: Up::Head,
            data: VecDeque::new(),
            trailers: Vec::new(),
            head_only: false,
            websocket_key: None,
            down: Down::NotYet,
            output: VecDeque::new(),
            output_len: 0,
            scratch: BytesMut::new(),
            failure: None,
        }
    }

    /// How the stream failed, if its shard said more than a broken
    /// connection says.
    pub(crate) fn failure(&self) -> Option<AttemptFailure> {
        self.failure
    }

    /// Records `e` and breaks both sides; the error a reader or writer
    /// gets. (An error of the request's side alone, once the stream
    /// opened, is [`ShardStream::fail_up`]'s: the response may go on.)
    fn fail(&mut self, e: h2::Error) -> io::Error {
        let before_head = matches!(self.down, Down::NotYet | Down::Head(_));
        let failure = match self.send_request.is_some() {
            // The stream never opened: the request never left.
            true => AttemptFailure::Unprocessed,
            false => failure_of(&e),
        };
        if before_head {
            self.failure = Some(failure);
        }
        if e.is_go_away() || failure == AttemptFailure::Unprocessed {
            // The connection is going away, refused the stream, or took no
            // new one: the request goes again on another.
            self.slot.retire();
        }
        self.up = Up::Broken;
        self.down = Down::Broken;
        self.data.clear();
        io::Error::other(e)
    }

    /// The request's side failed after the stream opened (the shard reset
    /// it after answering early, say): only that side stops; the response
    /// goes on, and its side reports its own errors.
    fn fail_up(&mut self, e: h2::Error) -> io::Error {
        if matches!(self.down, Down::NotYet) {
            return self.fail(e);
        }
        self.broken_up();
        io::Error::other(e)
    }

    /// A request this transport cannot put in HTTP/2 terms: nothing was
    /// sent, and the shard is not to blame.
    fn unconvertible(&mut self, e: io::Error) -> io::Error {
        self.failure = Some(AttemptFailure::Invalid);
        self.up = Up::Broken;
        self.down = Down::Broken;
        self.input.clear();
        self.data.clear();
        e
    }

    fn broken(&self) -> io::Error {
        io::Error::new(io::ErrorKind::BrokenPipe, "the HTTP/2 stream failed")
    }

    /// Moves the request on as far as it goes without waiting: its head
    /// parsed, its stream opened once the connection takes one, its body
    /// sent as the window allows, its end. `Err` once it failed; then the
    /// task is woken once, so that a reader which found nothing to await (the
    /// stream never opened: a GOAWAY, a refused extended CONNECT) reads
    /// the failure now, not at the attempt's next timer.
    fn drive(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let was_broken = matches!(self.up, Up::Broken);
        let driven = self.drive_up(cx);
        if driven.is_err() && !was_broken {
            // Once, as it fails (a woken reader that finds the response
            // going on must not be woken again and again).
            cx.waker().wake_by_ref();
        }
        driven
    }

    fn drive_up(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        loop {
            match &mut self.up {
                Up::Head => {
                    let Some(end) = self.head_end.find(&self.input) else {
                        return Ok(());
                    };
                    let head = self.input.split_to(end).freeze();
                    let Outgoing {
                        request,
                        framing,
                        websocket_key,
                    } = match request_of(&head, &self.scheme, &self.rules) {
                        Ok(outgoing) => outgoing,
                        Err(e) => return Err(self.unconvertible(e)),
                    };
                    self.head_only = request.method() == http::Method::HEAD;
                    self.websocket_key = websocket_key;
                    self.up = Up::Ready(Box::new(request), framing);
                }
                Up::Ready(..) => {
                    let Some(send_request) = self.send_request.as_mut() else {
                        return Err(self.broken());
                    };
                    match send_request.poll_ready(cx) {
                        Poll::Pending => return Ok(()),
                        Poll::Ready(Err(e)) => return Err(self.fail(e)),
                        Poll::Ready(Ok(())) => {}
                    }
                    if self.websocket_key.is_some()
                        && !send_request.is_extended_connect_protocol_enabled()
                    {
                        // RFC 8441 §3: the shard must have said it takes
                        // extended CONNECT.
                        self.failure = Some(AttemptFailure::Invalid);
                        self.up = Up::Broken;
                        return Err(io::Error::other("the shard takes no extended CONNECT"));
                    }
                    let Up::Ready(request, framing) = std::mem::replace(&mut self.up, Up::Done)
                    else {
                        return Err(self.broken());
                    };
                    let end = framing.is_done();
                    match send_request.send_request(*request, end) {
                        Err(e) => return Err(self.fail(e)),
                        Ok((response, send)) => {
                            self.send_request = None;
                            self.down = Down::Head(response);
                            // A reader that found nothing to await before
                            // (polled before the writer) awaits it now.
                            cx.waker().wake_by_ref();
                            if !end {
                                self.up = Up::Body(send, framing);
                            }
                        }
                    }
                }
                Up::Body(..) => return self.send_body(cx),
                Up::Done => return Ok(()),
                Up::Broken => return Err(self.broken()),
            }
        }
    }

    /// The body's bytes decoded and sent as the window allows; its end
    /// once the framing says so: on its last DATA, or its trailers (or an
    /// empty DATA, when the trailers held no field HTTP/2 carries).
    fn send_body(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Up::Body(send, framing) = &mut self.up else {
            return Ok(());
        };
        if !self.input.is_empty() && !framing.is_done() {
            let bytes = self.input.split().freeze();
            let (data, trailers) = (&mut self.data, &mut self.trailers);
            let decoded = framing.decode(&bytes, |part| match part {
                Part::Data(range) => data.push_back(bytes.slice(range)),
                Part::Trailer(range) => trailers.extend_from_slice(&bytes[range]),
                Part::Chunk(_) => {}
            });
            if decoded.is_err() {
                // The transport wrote these bytes: never.
                self.up = Up::Broken;
                return Err(io::Error::other("a request body that breaks its framing"));
            }
        }
        // A body with no trailer section ends on its last DATA frame, not
        // on an empty one after it (one frame less for both ends).
        let ends_with_data = framing.is_done() && self.trailers.is_empty();
        while let Some(front) = self.data.front_mut() {
            if front.is_empty() {
                self.data.pop_front();
                continue;
            }
            let n = match poll_window(send, front.len(), cx) {
                Poll::Pending => return Ok(()),
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(Some(e))) => return Err(self.fail_up(e)),
                Poll::Ready(Err(None)) => return Err(self.broken_up()),
            };
            let piece = front.split_to(n);
            if front.is_empty() {
                self.data.pop_front();
            }
            let last = ends_with_data && self.data.iter().all(Bytes::is_empty);
            if let Err(e) = send.send_data(piece, last) {
                return Err(self.fail_up(e));
            }
            if last {
                self.data.clear();
                self.up = Up::Done;
                return Ok(());
            }
        }
        if !framing.is_done() {
            return Ok(());
        }
        let ended = match trailer_map(&self.trailers) {
            Some(fields) => send.send_trailers(fields),
            None => send.send_data(Bytes::new(), true),
        };
        match ended {
            Ok(()) => {
                self.up = Up::Done;
                Ok(())
            }
            Err(e) => Err(self.fail_up(e)),
        }
    }

    /// The shard stopped taking the body (it answered, or reset the
    /// stream): the response may still come.
    fn broken_up(&mut self) -> io::Error {
        self.up = Up::Broken;
        self.data.clear();
        self.broken()
    }

    /// Turns what the shard sent into HTTP/1.1 bytes in `output`, as much
    /// as has come (up to [`MAX_OUTPUT`]: a head, its data and trailers go
    /// to the client in one write when they came together); `Ready` when
    /// there are some, or the response ended (`output` empty).
    fn poll_response(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = self.collect(cx);
        match (polled, self.output.is_empty()) {
            (Poll::Pending, false) => Poll::Ready(Ok(())),
            (Poll::Ready(Err(e)), false) => {
                // What came before the error goes first; the error next.
                drop(e);
                Poll::Ready(Ok(()))
            }
            (polled, _) => polled,
        }
    }

    /// Collects what the shard sent into `output` until nothing more has
    /// come, the output is full, or the response ended.
    fn collect(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            // Bytes, and pieces (a shard's 1-byte frames are 3 pieces each).
            if self.output_len >= MAX_OUTPUT || self.output.len() >= MAX_PIECES {
                return Poll::Ready(Ok(()));
            }
            match &mut self.down {
                Down::NotYet => {
                    return match self.up {
                        Up::Broken => Poll::Ready(Err(self.broken())),
                        // `drive` is woken when the stream opens.
                        _ => Poll::Pending,
                    };
                }
                Down::Head(response) => match Pin::new(response).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(self.fail(e))),
                    Poll::Ready(Ok(response)) => self.start_response(response),
                },
                Down::Body { recv, chunked } => match recv.poll_data(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(data))) => {
                        let _ = recv.flow_control().release_capacity(data.len());
                        if data.is_empty() {
                            continue;
                        }
                        let chunked = *chunked;
                        if chunked {
                            let len = data.len();
                            self.put_written(CHUNK_SIZE_LINE, |out| put_chunk_size(out, len));
                        }
                        self.put(data);
                        if chunked {
                            self.put(Bytes::from_static(b"\r\n"));
                        }
                    }
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(self.fail(e))),
                    Poll::Ready(None) => {
                        let chunked = *chunked;
                        match recv.poll_trailers(cx) {
                            Poll::Pending => return Poll::Pending,
                            Poll::Ready(Err(e)) => return Poll::Ready(Err(self.fail(e))),
                            Poll::Ready(Ok(trailers)) => {
                                if chunked {
                                    let trailers = trailers.as_ref();
                                    self.put_written(LAST_CHUNK, |out| last_chunk(trailers, out));
                                }
                                self.down = Down::Done;
                            }
                        }
                    }
                },
                Down::Done => return Poll::Ready(Ok(())),
                Down::Broken => return Poll::Ready(Err(self.broken())),
            }
        }
    }

    /// Queues response bytes for the reader.
    fn put(&mut self, bytes: Bytes) {
        self.output_len += bytes.len();
        self.output.push_back(bytes);
    }

    /// Queues what `write` writes into the scratch buffer (`need` bytes,
    /// usually). Room is made [`SCRATCH`] bytes at a time and only when
    /// short: pieces split off earlier still hold the block, so a reserve
    /// that does not fit takes a new one (a piece that outgrows it, a long
    /// head, grows it as it is written).
    fn put_written<R>(&mut self, need: usize, write: impl FnOnce(&mut BytesMut) -> R) -> R {
        if self.scratch.capacity() - self.scratch.len() < need {
            self.scratch.reserve(SCRATCH);
        }
        let written = write(&mut self.scratch);
        let piece = self.scratch.split().freeze();
        self.put(piece);
        written
    }

    /// The response's head, in HTTP/1.1 form, and how its body follows.
    fn start_response(&mut self, response: Response<RecvStream>) {
        let (parts, recv) = response.into_parts();
        let ended = recv.is_end_stream();
        // The key served its one use: the answer's accept value.
        let (key, head_only) = (self.websocket_key.take(), self.head_only);
        let form = self.put_written(SCRATCH, |out| {
            response_head(&parts, head_only, ended, key.as_deref(), out)
        });
        self.down = match form {
            BodyForm::None => Down::Done,
            BodyForm::Chunked => Down::Body {
                recv,
                chunked: true,
            },
            BodyForm::Raw => Down::Body {
                recv,
                chunked: false,
            },
        };
    }

    /// Ready when a read would find bytes, the end or an error (a
    /// tunnel's wait, holding no buffer).
    pub(crate) fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let _ = self.drive(cx);
        self.poll_response(cx)
    }
}

/// Waits until `send` may carry some of `want` bytes (its flow-control
/// window, HTTP/2's backpressure): how many; or why not (`None`: the
/// stream closed). The one way both sides of the gateway send DATA they
/// hold no more of than they may.
pub(crate) fn poll_window(
    send: &mut SendStream<Bytes>,
    want: usize,
    cx: &mut Context<'_>,
) -> Poll<Result<usize, Option<h2::Error>>> {
    loop {
        let have = send.capacity();
        if have > 0 {
            return Poll::Ready(Ok(have.min(want)));
        }
        send.reserve_capacity(want);
        match std::task::ready!(send.poll_capacity(cx)) {
            Some(Ok(_)) => {}
            Some(Err(e)) => return Poll::Ready(Err(Some(e))),
            None => return Poll::Ready(Err(None)),
        }
    }
}

/// What a failed stream says of its request: unprocessed when the shard
/// refused the stream or went away before reading it (RFC 9113 §8.7: safe
/// to send again, whatever the method); the shard broke the protocol when
/// the h2 library found it so; else what a reset connection says.
fn failure_of(e: &h2::Error) -> AttemptFailure {
    let refused = e.is_reset() && e.reason() == Some(Reason::REFUSED_STREAM);
    if e.is_remote() && (refused || e.is_go_away()) {
        return AttemptFailure::Unprocessed;
    }
    match e.is_library() {
        true => AttemptFailure::Invalid,
        false => AttemptFailure::Reset,
    }
}

impl AsyncWrite for ShardStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.drive(cx)?;
        let waiting = this.input.len() + this.data.iter().map(Bytes::len).sum::<usize>();
        // The head is taken whole (the transport bounds it).
        let room = match this.up {
            Up::Head => buf.len(),
            _ => MAX_PENDING.saturating_sub(waiting).min(buf.len()),
        };
        if room == 0 {
            return Poll::Pending;
        }
        if this.input.capacity() == 0 {
            this.input.reserve(room);
        }
        this.input.extend_from_slice(&buf[..room]);
        this.drive(cx)?;
        Poll::Ready(Ok(room))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.drive(cx)?;
        let sent = match this.up {
            Up::Done => true,
            Up::Body(..) => this.input.is_empty() && this.data.is_empty(),
            _ => false,
        };
        match sent {
            true => Poll::Ready(Ok(())),
            false => Poll::Pending,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.as_mut().poll_flush(cx))?;
        // A tunnel's end (a WebSocket's bytes have no framing to end them).
        let this = self.get_mut();
        if let Up::Body(send, _) = &mut this.up {
            if let Err(e) = send.send_data(Bytes::new(), true) {
                return Poll::Ready(Err(this.fail_up(e)));
            }
            this.up = Up::Done;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for ShardStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A writer done with its part still needs the stream opened. (A
        // broken response side reports itself, after what it holds.)
        if let Err(e) = this.drive(cx) {
            if matches!(this.down, Down::NotYet) {
                return Poll::Ready(Err(e));
            }
        }
        std::task::ready!(this.poll_response(cx))?;
        while buf.remaining() > 0 {
            let Some(front) = this.output.front_mut() else {
                break;
            };
            let n = front.len().min(buf.remaining());
            buf.put_slice(&front[..n]);
            front.advance(n);
            this.output_len -= n;
            if front.is_empty() {
                this.output.pop_front();
            }
        }
        Poll::Ready(Ok(()))
    }
}
