//! WebSockets over HTTP/2 (RFC 8441): HTTP/2 listeners announce
//! `SETTINGS_ENABLE_CONNECT_PROTOCOL`, and an extended CONNECT with
//! `:protocol: websocket` is a WebSocket handshake — planned, admitted and
//! counted as an HTTP/1.1 one (seen as the `GET` it stands for), sent to
//! the shard as an HTTP/1.1 Upgrade (with a `Sec-WebSocket-Key` of its
//! own: an HTTP/2 client sends none), answered 200 once the shard
//! switched protocols, then tunnelled: the stream's DATA frames are the
//! socket's bytes, through the same tunnel (`tunnel.rs`) and its idle
//! rules as an HTTP/1.1 WebSocket's.

use super::body::H2Body;
use super::downstream::{Downstream, H2Client};
use super::exchange::{Exchanged, Request, Upstream};
use super::h2::{fields, Served};
use super::request::{Outgoing, UpstreamHead};
use super::response::h2_response_head;
use super::tunnel::{Side, TunnelLog};
use super::FastPath;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::hooks::{RequestLine, RequestView};
use crate::proxy::pipeline::fields::joined_cookie;
use crate::proxy::upstream::h2_stream::poll_window;
use bytes::{Buf, Bytes};
use http::Method;
use pingora::protocols::http::v2::server::HttpSession as H2Stream;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Whether an HTTP/2 request is a WebSocket handshake (RFC 8441 §4).
pub(super) fn is_websocket(stream: &H2Stream) -> bool {
    let req = stream.req_header();
    req.method == Method::CONNECT
        && req
            .extensions
            .get::<h2::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
}

impl FastPath {
    /// Serves an extended CONNECT (see the module documentation).
    pub(super) async fn serve_h2_websocket(&self, mut stream: Box<H2Stream>) -> Served {
        stream.set_write_timeout(Some(self.send_timeout));
        let gw = &self.gateway;
        let mut ctx = RequestCtx::default();
        let client_addr = stream.client_addr().cloned();
        let req = stream.req_header();
        let mut view = RequestView::from_pingora(req);
        view.method = "GET";
        let planned = gw.plan(&view, client_addr.as_ref(), &mut ctx);
        let request = planned.map(|host| {
            let tls = stream.digest().is_some_and(|d| d.ssl_digest.is_some());
            let forwarding = self.forwarding(host, tls, &ctx);
            let cookies = req.headers.get_all(http::header::COOKIE).iter();
            let cookie = joined_cookie(cookies.map(|v| v.as_bytes()));
            let key = websocket_key();
            let mut fields = fields(req, cookie.as_deref());
            fields.push(("Sec-WebSocket-Key", key.as_bytes()));
            let target = std::str::from_utf8(req.raw_path()).unwrap_or("/");
            UpstreamHead {
                method: "GET",
                origin: target,
                host: Some(host),
                fields: &fields,
                websocket: true,
                body: Outgoing::None,
            }
            .write(&forwarding, &ctx.upstream_edit)
        });
        let log = TunnelLog {
            client: client_addr.clone(),
            target: String::from_utf8_lossy(req.raw_path()).into_owned(),
            host: req.uri.authority().map(|a| a.as_str().to_owned()),
            line: ("CONNECT", "HTTP/2", 200),
        };
        let ends = super::h2::ends(&stream);
        // The stream's DATA are the tunnel's, not a body to send up.
        let mut client = H2Client::new(stream, H2Body::new(Outgoing::None, None), false);
        client.tunnel_only();
        let status = match request {
            Err(refusal) => self.answer(&mut client, &mut ctx, refusal, false).await,
            Ok(bytes) => {
                let request = Request {
                    method: &Method::GET,
                    head_only: false,
                    websocket: true,
                    te_trailers: false,
                    bytes: bytes.freeze(),
                    ends,
                };
                match self.exchange(&mut client, &request, &mut ctx).await {
                    Exchanged::Upgraded(upstream) => {
                        return self.switch(client, upstream, ctx, log).await;
                    }
                    Exchanged::Done(status) | Exchanged::Closed(status) => status,
                }
            }
        };
        (ctx.bytes_in, ctx.bytes_out) = client.counts();
        let line = RequestLine {
            client: client_addr.as_ref(),
            method: "CONNECT",
            target: &log.target,
            host: log.host.as_deref(),
            protocol: "HTTP/2",
        };
        gw.finish(&mut ctx, &line, status);
        Served::Done
    }

    /// The shard switched protocols: the client is answered 200 (with the
    /// shard's subprotocol and extensions, as a 101's other fields go on),
    /// then the tunnel runs until either side ends.
    async fn switch(
        &self,
        client: H2Client,
        upstream: Upstream,
        mut ctx: RequestCtx,
        log: TunnelLog,
    ) -> Served {
        let Upstream { conn, buf, parsed } = upstream;
        let mut session = client.session;
        let edit = self.gateway.response_edit(parsed.status, &ctx);
        let head = h2_response_head(&buf, &parsed, edit.as_ref(), self.id_field(&ctx));
        let started = head.and_then(|mut head| {
            head.set_status(200).map_err(|_| ())?;
            head.remove_header("sec-websocket-accept");
            session
                .write_response_header(Box::new(head), false)
                .map_err(|_| ())
        });
        let writer = session.take_response_body_writer();
        let (Ok(()), Some(mut send)) = (started, writer) else {
            // The client cannot be told: its stream is reset, and the
            // request logged as the tunnel's end would, with no answer sent.
            session.shutdown();
            self.not_opened(conn, ctx, log.unanswered());
            return Served::Done;
        };
        // Bytes the shard sent right after its 101 are tunnel data.
        let early = Bytes::copy_from_slice(&buf[parsed.head_len..]);
        let sent = early.len() as u64;
        if !early.is_empty() && send.send_data(early, false).is_err() {
            // The 200 was queued, and the client is gone (it may have
            // got the 200 just before: logged as unanswered all the same).
            self.not_opened(conn, ctx, log.unanswered());
            return Served::Done;
        }
        ctx.bytes_out = sent;
        let side = H2Side {
            session,
            send,
            read: Bytes::new(),
            ended: false,
            shut: false,
        };
        self.run_h2_tunnel(side, conn, ctx, log).await;
        Served::Done
    }
}

/// A fresh `Sec-WebSocket-Key` (RFC 6455 §4.1: 16 random bytes, base64).
fn websocket_key() -> String {
    use base64::Engine;
    use ring::rand::SecureRandom;
    let mut nonce = [0u8; 16];
    // The system's generator; should it fail, a fixed key still works (the
    // key proves nothing to a proxy, only that the shard speaks WebSocket).
    let _ = ring::rand::SystemRandom::new().fill(&mut nonce);
    base64::engine::general_purpose::STANDARD.encode(nonce)
}

/// An HTTP/2 stream as one side of a tunnel: its DATA frames read, and
/// written under its flow control.
struct H2Side {
    session: Box<H2Stream>,
    send: h2::SendStream<Bytes>,
    /// A frame read, not yet handed out whole.
    read: Bytes,
    /// The client ended its side (END_STREAM).
    ended: bool,
    /// Our side was ended.
    shut: bool,
}

impl H2Side {
    /// Waits for the client's next frame (or its end), holding no buffer.
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.read.is_empty() && !self.ended {
            match std::task::ready!(self.session.poll_read_body_bytes(cx)) {
                Some(Ok(data)) => self.read = data,
                Some(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
                None => self.ended = true,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl Side for H2Side {
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_frame(cx)
    }
}

impl AsyncRead for H2Side {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_frame(cx))?;
        let n = this.read.len().min(buf.remaining());
        buf.put_slice(&this.read[..n]);
        this.read.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Side {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let send = &mut self.get_mut().send;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = match std::task::ready!(poll_window(send, buf.len(), cx)) {
            Ok(n) => n,
            Err(Some(e)) => return Poll::Ready(Err(io::Error::other(e))),
            Err(None) => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
        };
        let data = Bytes::copy_from_slice(&buf[..n]);
        send.send_data(data, false).map_err(io::Error::other)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The connection's task writes what was sent.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !std::mem::replace(&mut this.shut, true) {
            this.send
                .send_data(Bytes::new(), true)
                .map_err(io::Error::other)?;
        }
        Poll::Ready(Ok(()))
    }
}
