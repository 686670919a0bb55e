//! HTTP/2 streams on the fast transport. Pingora's HTTP/2 session reads
//! each stream's head and body and writes its response frames (with its
//! checks of the request and its flow control, which holds a body back
//! while the shard is slow to take it); the request goes to the shard
//! through the same exchange as an HTTP/1 request's. How a stream's
//! request is planned and exchanged is here for HTTP/3's streams too
//! (`h3.rs`): only the stream differs.

use super::body::H2Body;
use super::downstream::{Downstream, H2Client};
use super::exchange::{ends_of, may_be_h2, Ends, Exchanged, Request};
use super::request::{Outgoing, UpstreamHead};
use super::FastPath;
use crate::proxy::buffers;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::hooks::{RequestLine, RequestView};
use crate::proxy::pipeline::answer::Refusal;
use crate::proxy::pipeline::fields::{accepts_trailers, joined_cookie};
use crate::proxy::pipeline::message::content_length;
use bytes::BytesMut;
use http::Method;
use pingora::http::RequestHeader;
use pingora::protocols::http::v2::server::HttpSession as H2Stream;
use pingora::protocols::l4::socket::SocketAddr;

impl FastPath {
    /// Serves one HTTP/2 stream.
    pub async fn serve_h2(&self, mut stream: Box<H2Stream>) -> Served {
        if super::websocket_h2::is_websocket(&stream) {
            // Boxed: a tunnel's future (3× a request's) would size all.
            return Box::pin(self.serve_h2_websocket(stream)).await;
        }
        stream.set_write_timeout(Some(self.send_timeout));
        let mut ctx = RequestCtx::default();
        let client_addr = stream.client_addr().cloned();
        let head = StreamHead {
            req: stream.req_header(),
            client: client_addr.as_ref(),
            tls: stream.digest().is_some_and(|d| d.ssl_digest.is_some()),
            body_empty: stream.is_body_empty(),
            early: false,
        };
        let (body, planned) = self.plan_stream(&head, &mut ctx);
        let ends = ends(&stream);
        let mut client = H2Client::new(stream, body, planned.head_only);
        let status = self
            .exchange_stream(&mut client, planned, ends, &mut ctx)
            .await;
        (ctx.bytes_in, ctx.bytes_out) = client.counts();
        {
            let line = log_line(client.session.req_header(), client_addr.as_ref(), "HTTP/2");
            self.gateway.finish(&mut ctx, &line, status);
        }
        // An answer came before the body ended (a refusal, a shard that
        // answered early): the rest is read off a while, its admission
        // released, so that the stream ends cleanly. (Reset at once, some
        // clients drop the answer: curl 7.88 does, on `NO_ERROR`.)
        let reset = client.reset_by_client();
        client.drain().await;
        match reset {
            true => Served::Reset,
            false => Served::Done,
        }
    }

    /// Plans a stream's request (HTTP/2 or HTTP/3): its body's framer for
    /// the shard, and the head the shard receives or the answer to give.
    pub(super) fn plan_stream(
        &self,
        head: &StreamHead<'_>,
        ctx: &mut RequestCtx,
    ) -> (H2Body, Planned) {
        let gw = &self.gateway;
        let req = head.req;
        ctx.tls = head.tls;
        let method = req.method.clone();
        let framed = outgoing(req, head.body_empty, self.body_limits.max_body);
        let outgoing = *framed.as_ref().unwrap_or(&Outgoing::None);
        let mut body = H2Body::new(outgoing, self.body_limits.max_body);
        let view = RequestView::from_pingora(req);
        let planned = match framed {
            Err(refusal) => Err(refusal),
            // RFC 8470: what may be replayed is served from early data.
            Ok(_) if head.early && !method.is_idempotent() => Err(Refusal::error(425, "too-early")),
            Ok(_) => {
                let target = req.raw_path();
                match target.starts_with(b"/") && target.iter().all(u8::is_ascii_graphic) {
                    true => gw.plan(&view, head.client, ctx),
                    false => Err(Refusal::error(400, "invalid-target")),
                }
            }
        };
        if planned.is_ok() {
            body.planned(gw.body_phase(ctx), ctx.max_body);
        }
        let request = planned.map(|host| {
            let forwarding = self.forwarding(host, head.tls, ctx);
            let cookies = req.headers.get_all(http::header::COOKIE).iter();
            let cookie = joined_cookie(cookies.map(|v| v.as_bytes()));
            let fields = fields(req, cookie.as_deref());
            let target = std::str::from_utf8(req.raw_path()).unwrap_or("/");
            UpstreamHead {
                method: req.method.as_str(),
                origin: target,
                host: Some(host),
                fields: &fields,
                websocket: false,
                body: outgoing,
            }
            .write(&forwarding, &ctx.upstream_edit)
        });
        let te = req.headers.get_all(http::header::TE).into_iter();
        let te_trailers = may_be_h2(ctx) && accepts_trailers(te.map(|v| v.as_bytes()));
        let planned = Planned {
            head_only: method == Method::HEAD,
            method,
            request,
            te_trailers,
        };
        (body, planned)
    }

    /// A planned stream's exchange with the shards through `client`, or
    /// its answer: the status the client got.
    pub(super) async fn exchange_stream<D: Downstream>(
        &self,
        client: &mut D,
        planned: Planned,
        ends: Ends,
        ctx: &mut RequestCtx,
    ) -> u16 {
        let mut buf = match planned.request {
            Err(refusal) => return self.answer(client, ctx, refusal, false).await,
            Ok(buf) => buf,
        };
        let request = Request {
            method: &planned.method,
            head_only: planned.head_only,
            websocket: false,
            te_trailers: planned.te_trailers,
            bytes: buffers::share(&mut buf),
            ends,
        };
        let exchanged = self.exchange(client, &request, ctx).await;
        buffers::give_shared(buf, request.bytes);
        match exchanged {
            Exchanged::Done(status) | Exchanged::Closed(status) => status,
            // Not asked for (`websocket: false`): never.
            Exchanged::Upgraded(_) => 502,
        }
    }
}

/// A request that came as a head on a stream of an HTTP/2 or an HTTP/3
/// connection: what the gateway plans with.
pub(super) struct StreamHead<'r> {
    pub req: &'r RequestHeader,
    pub client: Option<&'r SocketAddr>,
    /// The connection is TLS (the forwarding fields' scheme).
    pub tls: bool,
    /// The stream ended with its head.
    pub body_empty: bool,
    /// Sent in TLS early data (HTTP/3's 0-RTT): a request that is not
    /// idempotent is answered 425 (RFC 8470).
    pub early: bool,
}

/// What a stream's request became once planned (beside its body).
pub(super) struct Planned {
    pub method: Method,
    pub head_only: bool,
    /// The head the shard receives, or the answer to give.
    pub request: Result<BytesMut, Refusal>,
    /// The client accepts trailers (an HTTP/2 shard is told so).
    pub te_trailers: bool,
}

/// The access log's view of a stream: logged as Pingora's path logs an
/// HTTP/2 request, by its URI.
pub(super) fn log_line<'a>(
    req: &'a RequestHeader,
    addr: Option<&'a SocketAddr>,
    protocol: &'static str,
) -> RequestLine<'a> {
    RequestLine {
        client: addr,
        method: req.method.as_str(),
        target: &req.uri,
        host: (req.uri.authority().map(|a| a.as_str()))
            .or_else(|| req.headers.get("host").and_then(|h| h.to_str().ok())),
        protocol,
    }
}

/// The two ends of a stream's connection (see [`ends_of`]).
pub(super) fn ends(stream: &H2Stream) -> Ends {
    ends_of(stream.digest().and_then(|d| d.socket_digest.as_deref()))
}

/// How an HTTP/2 stream's service ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// Answered, or ended by the gateway or the connection.
    Done,
    /// Reset by its client before both ends closed it.
    Reset,
}

/// How the stream's body goes to the shard: by its `Content-Length` (read
/// by the one rule, [`content_length`]: 400 if it is no length, 413 at
/// once if over `limits.max_body_bytes`), else in chunks if it has one.
fn outgoing(req: &RequestHeader, body_empty: bool, max: Option<u64>) -> Result<Outgoing, Refusal> {
    let values = req.headers.get_all(http::header::CONTENT_LENGTH);
    match content_length(values.iter().map(|v| v.as_bytes())) {
        Err(_) => Err(Refusal::error(400, "invalid-content-length")),
        Ok(Some(n)) if max.is_some_and(|max| n > max) => Err(Refusal::error(413, "body-too-large")),
        Ok(Some(n)) => Ok(Outgoing::Length(n)),
        Ok(None) if body_empty => Ok(Outgoing::None),
        Ok(None) => Ok(Outgoing::Chunked),
    }
}

/// The client's fields for the HTTP/1.1 head: `Host` comes from the
/// authority (the plan checked it), the `Cookie` fields are joined (RFC
/// 9113 §8.2.3).
pub(super) fn fields<'r>(
    req: &'r RequestHeader,
    cookie: Option<&'r [u8]>,
) -> Vec<(&'r str, &'r [u8])> {
    let mut fields: Vec<(&str, &[u8])> = Vec::with_capacity(req.headers.len() + 1);
    if let Some(cookie) = cookie {
        fields.push(("Cookie", cookie));
    }
    for (name, value) in &req.headers {
        let name = name.as_str();
        let joined = cookie.is_some() && name == "cookie";
        if !joined && name != "host" {
            fields.push((name, value.as_bytes()));
        }
    }
    fields
}
