//! HTTP/2 streams on the fast transport. Pingora's HTTP/2 session reads
//! each stream's head and body and writes its response frames (with its
//! checks of the request and its flow control, which holds a body back
//! while the shard is slow to take it); the request goes to the shard as
//! HTTP/1.1 through the same exchange as an HTTP/1 request's.

use super::body::H2Body;
use super::downstream::{Downstream, H2Client};
use super::exchange::{ends_of, may_be_h2, Ends, Exchanged, Request};
use super::request::{Outgoing, UpstreamHead};
use super::FastPath;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::hooks::{RequestLine, RequestView};
use crate::proxy::pipeline::answer::Refusal;
use crate::proxy::pipeline::fields::{accepts_trailers, joined_cookie};
use crate::proxy::pipeline::message::content_length;
use bytes::Bytes;
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
        let gw = &self.gateway;
        let mut ctx = RequestCtx::default();
        let client_addr = stream.client_addr().cloned();
        let req = stream.req_header();
        let method = req.method.clone();
        let head_only = method == Method::HEAD;
        let framed = outgoing(req, &stream, self.body_limits.max_body);
        let outgoing = *framed.as_ref().unwrap_or(&Outgoing::None);
        let mut body = H2Body::new(outgoing, self.body_limits.max_body);
        let view = RequestView::from_pingora(req);
        let planned = match framed {
            Err(refusal) => Err(refusal),
            Ok(_) => {
                let target = req.raw_path();
                match target.starts_with(b"/") && target.iter().all(u8::is_ascii_graphic) {
                    true => gw.plan(&view, client_addr.as_ref(), &mut ctx),
                    false => Err(Refusal::error(400, "invalid-target")),
                }
            }
        };
        if planned.is_ok() {
            body.planned(gw.body_phase(&ctx), ctx.max_body);
        }
        let request = planned.map(|host| {
            let tls = stream.digest().is_some_and(|d| d.ssl_digest.is_some());
            let forwarding = self.forwarding(host, tls, &ctx);
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
        let te_trailers = may_be_h2(&ctx) && accepts_trailers(te.map(|v| v.as_bytes()));
        let mut client = H2Client::new(stream, body, head_only);
        let status = match request {
            Err(refusal) => self.answer(&mut client, &mut ctx, refusal, false).await,
            Ok(bytes) => {
                let request = Request {
                    method: &method,
                    head_only,
                    websocket: false,
                    te_trailers,
                    bytes: Bytes::from(bytes),
                    ends: ends(&client.session),
                };
                match self.exchange(&mut client, &request, &mut ctx).await {
                    Exchanged::Done(status) | Exchanged::Closed(status) => status,
                    // Not asked for (`websocket: false`): never.
                    Exchanged::Upgraded(_) => 502,
                }
            }
        };
        (ctx.bytes_in, ctx.bytes_out) = client.counts();
        gw.finish(&mut ctx, &log_line(&client, client_addr.as_ref()), status);
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
}

/// The access log's view of a stream: logged as Pingora's path logs an
/// HTTP/2 request, by its URI.
fn log_line<'a>(client: &'a H2Client, addr: Option<&'a SocketAddr>) -> RequestLine<'a> {
    let req = client.session.req_header();
    RequestLine {
        client: addr,
        method: req.method.as_str(),
        target: &req.uri,
        host: (req.uri.authority().map(|a| a.as_str()))
            .or_else(|| req.headers.get("host").and_then(|h| h.to_str().ok())),
        protocol: "HTTP/2",
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
fn outgoing(req: &RequestHeader, stream: &H2Stream, max: Option<u64>) -> Result<Outgoing, Refusal> {
    let values = req.headers.get_all(http::header::CONTENT_LENGTH);
    match content_length(values.iter().map(|v| v.as_bytes())) {
        Err(_) => Err(Refusal::error(400, "invalid-content-length")),
        Ok(Some(n)) if max.is_some_and(|max| n > max) => Err(Refusal::error(413, "body-too-large")),
        Ok(Some(n)) => Ok(Outgoing::Length(n)),
        Ok(None) if stream.is_body_empty() => Ok(Outgoing::None),
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
