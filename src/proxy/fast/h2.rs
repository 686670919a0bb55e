//! HTTP/2 streams on the fast transport. Pingora's HTTP/2 session reads
//! each stream's head and writes its response frames (with its checks of
//! the request and its flow control); a bodiless stream to a plain-HTTP
//! shard is then forwarded here, through the fast transport's own
//! connections, as an HTTP/1.1 request. Measured, the HTTP/2 side costs
//! about what nginx does in all; Pingora's proxy path (a task and a timer
//! per pooled connection it releases, two tasks per request) cost three
//! to four times that per request.
//!
//! Anything else — a request body, a target not in origin form, a request
//! routed to an `https` shard (handed over planned) — goes to Pingora's
//! path, stream by stream.

use super::request::upstream_head;
use super::upstream::Upstream;
use super::{FastPath, OrEmpty};
use crate::proxy::ctx::RequestCtx;
use crate::proxy::hooks::RequestView;
use crate::proxy::pipeline::answer::Refusal;
use crate::proxy::pipeline::fields::{joined_cookie, strip_response_hop_by_hop, Forwarding};
use crate::proxy::pipeline::framing::Framing;
use bytes::{Bytes, BytesMut};
use http::Method;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::v2::server::HttpSession as H2Stream;
use std::net::SocketAddr;
use tokio::io::AsyncReadExt;

/// Response bodies are read from the shard in reads of up to this much.
const BODY_READ: usize = 16 * 1024;

/// What the fast path did with an HTTP/2 stream.
pub enum H2Outcome {
    Served,
    /// For Pingora's path, with the context if already planned (admitted).
    NotMine(Box<H2Stream>, Option<Box<RequestCtx>>),
}

/// How an HTTP/2 exchange with the shards ended.
enum H2Exchanged {
    /// The status sent (0 if none).
    Done(u16),
    /// A retry was routed to an `https` shard: Pingora's path takes it.
    HandOver,
}

impl FastPath {
    /// Serves one HTTP/2 stream if it is the fast path's shape: no body,
    /// a method that takes none, an origin-form target.
    pub async fn serve_h2(&self, mut stream: Box<H2Stream>) -> H2Outcome {
        stream.set_write_timeout(Some(self.send_timeout));
        let req = stream.req_header();
        let bodiless = matches!(
            req.method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::DELETE
        ) && stream.is_body_empty();
        let target = req.raw_path();
        if !bodiless || !target.starts_with(b"/") || !target.iter().all(u8::is_ascii_graphic) {
            return H2Outcome::NotMine(stream, None);
        }
        let gw = &self.gateway;
        let mut ctx = RequestCtx::default();
        let client_addr = stream.client_addr().cloned();
        let head_only = req.method == Method::HEAD;
        let method = req.method.clone();
        let view = RequestView::from_pingora(req);
        let planned = gw.plan(&view, &mut ctx);
        let request = match planned {
            Err(refusal) => Err(refusal),
            Ok(_) if ctx.peer.as_ref().is_some_and(|p| p.peer.is_tls()) => {
                return H2Outcome::NotMine(stream, Some(Box::new(ctx)));
            }
            Ok(host) => {
                let tls = stream.digest().is_some_and(|d| d.ssl_digest.is_some());
                let forwarding = self.forwarding(host, tls, client_addr.as_ref(), &ctx);
                Ok(http1_request(req, &forwarding, &ctx.extra_fields))
            }
        };
        let status = match request {
            Err(refusal) => {
                self.answer_h2(&mut stream, &mut ctx, &refusal, head_only)
                    .await
            }
            Ok(request) => {
                match self
                    .exchange_h2(&mut stream, request, &method, head_only, &mut ctx)
                    .await
                {
                    H2Exchanged::Done(status) => status,
                    H2Exchanged::HandOver => {
                        return H2Outcome::NotMine(stream, Some(Box::new(ctx)))
                    }
                }
            }
        };
        // Logged as Pingora's path logs an HTTP/2 request: its URI.
        let req = stream.req_header();
        gw.finish(
            &mut ctx,
            &OrEmpty(client_addr.as_ref()),
            req.method.as_str(),
            &req.uri,
            status,
        );
        H2Outcome::Served
    }

    /// Attempts until a response head arrives or the pipeline says stop,
    /// then the response (as [`FastPath::exchange`] does for HTTP/1.1).
    async fn exchange_h2(
        &self,
        stream: &mut H2Stream,
        request: Vec<u8>,
        method: &Method,
        head_only: bool,
        ctx: &mut RequestCtx,
    ) -> H2Exchanged {
        loop {
            let Some(peer) = ctx.peer.clone() else {
                let refusal = Refusal::error(502, "upstream-unreachable");
                return H2Exchanged::Done(self.answer_h2(stream, ctx, &refusal, head_only).await);
            };
            if peer.peer.is_tls() {
                ctx.rerouted = ctx.attempts > 0;
                return H2Exchanged::HandOver;
            }
            ctx.attempts += 1;
            let attempt = self.attempt(peer.addr, &request, head_only, false);
            // A client that resets the stream ends the request (and frees
            // its admission).
            let result = tokio::select! {
                result = attempt => result,
                _ = stream.idle() => return H2Exchanged::Done(0),
            };
            let failure = match result {
                Ok(upstream) => {
                    let status = self
                        .respond_h2(stream, upstream, peer.addr, head_only, ctx)
                        .await;
                    return H2Exchanged::Done(status);
                }
                Err(failure) => failure,
            };
            let Err(refusal) = self.after_failure(failure, peer.addr, method, ctx) else {
                continue;
            };
            return H2Exchanged::Done(self.answer_h2(stream, ctx, &refusal, head_only).await);
        }
    }

    /// Writes shardgate's answer on the stream; returns its status.
    async fn answer_h2(
        &self,
        stream: &mut H2Stream,
        ctx: &mut RequestCtx,
        refusal: &Refusal,
        head_only: bool,
    ) -> u16 {
        ctx.answered = Some(refusal.status);
        let Ok(head) = refusal.response_header() else {
            return refusal.status;
        };
        let body = (!head_only && !refusal.body.is_empty()).then(|| refusal.body.clone());
        if stream.write_response_header(head, body.is_none()).is_ok() {
            if let Some(body) = body {
                let _ = stream.write_body(Bytes::from(body), true).await;
            }
        }
        refusal.status
    }

    /// Writes the shard's response head as HEADERS and its body, without
    /// its HTTP/1 framing, as DATA; the connection goes back to the pool
    /// when its framing allows. Returns the status.
    async fn respond_h2(
        &self,
        stream: &mut H2Stream,
        upstream: Upstream,
        addr: SocketAddr,
        head_only: bool,
        ctx: &mut RequestCtx,
    ) -> u16 {
        let Upstream {
            mut conn,
            mut buf,
            parsed,
        } = upstream;
        let status = parsed.status;
        let keeps = parsed.keeps_connection();
        // No case map: HTTP/2 sends field names in lower case anyway.
        let mut head = match ResponseHeader::build_no_case(status, Some(parsed.headers.len())) {
            Ok(head) => head,
            Err(_) => return self.invalid_response(stream, head_only, ctx).await,
        };
        for (name, value) in &parsed.headers {
            let appended = http::HeaderName::from_bytes(&buf[name.clone()])
                .map_err(|_| ())
                .and_then(|name| {
                    head.append_header(name, &buf[value.clone()])
                        .map_err(|_| ())
                });
            if appended.is_err() {
                return self.invalid_response(stream, head_only, ctx).await;
            }
        }
        strip_response_hop_by_hop(&mut head);
        let length = &http::header::CONTENT_LENGTH;
        if parsed.transfer_encoding || status == 204 {
            // The length of a body sent in chunks is the chunks' (RFC 9112
            // §6.3): a `Content-Length` beside them says nothing; a 204 has
            // none (RFC 9110 §8.6), and HTTP/2 clients refuse one.
            head.remove_header(length);
        } else if head.headers.get_all(length).iter().count() > 1 {
            // The same length said twice (the parser accepts only that):
            // HTTP/2 allows it once.
            if let Some(value) = head.headers.get(length).cloned() {
                let _ = head.insert_header(length, value);
            }
        }
        if let Some(edit) = self.response_edit(status, ctx) {
            if edit.apply(&mut head).is_err() {
                return self.invalid_response(stream, head_only, ctx).await;
            }
        }
        let mut framing = parsed.framing;
        let mut body = buf.split_off(parsed.head_len);
        let mut reusable = keeps;
        let mut head = Some(head);
        loop {
            let chunked = matches!(framing, Framing::Chunked(_));
            let mut data = BytesMut::new();
            let used = match chunked {
                true => framing.consume_data(&body, |r| data.extend_from_slice(&body[r])),
                // The content is the bytes themselves: no copy.
                false => framing.consume(&body),
            };
            let used = match used {
                Ok(used) => used,
                // Body bytes that break the framing before anything was
                // sent: the client still gets an answer.
                Err(_) if head.is_some() => {
                    return self.invalid_response(stream, head_only, ctx).await
                }
                // Cut short visibly: the stream is reset, not ended.
                Err(_) => {
                    stream.shutdown();
                    return status;
                }
            };
            // Bytes beyond the response: the shard misbehaved.
            reusable &= used == body.len();
            if !chunked {
                data = body.split_to(used);
            }
            let done = framing.is_done();
            if let Some(head) = head.take() {
                // A response without content ends with its head.
                let end = done && data.is_empty();
                if stream.write_response_header(Box::new(head), end).is_err() {
                    return status;
                }
                if end {
                    break;
                }
            }
            if (!data.is_empty() || done) && stream.write_body(data.freeze(), done).await.is_err() {
                return status;
            }
            if done {
                break;
            }
            body.clear();
            body.reserve(BODY_READ);
            let read = tokio::select! {
                read = conn.read_buf(&mut body) => read,
                _ = stream.idle() => return status,
            };
            match read {
                Ok(0) if matches!(framing, Framing::UntilClose) => {
                    let _ = stream.write_body(Bytes::new(), true).await;
                    return status;
                }
                Ok(0) | Err(_) => {
                    stream.shutdown();
                    return status;
                }
                Ok(_) => {}
            }
        }
        if reusable {
            self.release(addr, conn);
        }
        status
    }

    /// A response HTTP/2 cannot carry (a field, an edit, a broken first
    /// chunk), before anything was sent: 502.
    async fn invalid_response(
        &self,
        stream: &mut H2Stream,
        head_only: bool,
        ctx: &mut RequestCtx,
    ) -> u16 {
        let refusal = Refusal::error(502, "upstream-invalid-response");
        self.answer_h2(stream, ctx, &refusal, head_only).await
    }
}

/// The HTTP/1.1 request head for an HTTP/2 request: `Host` from the
/// authority (`host`, checked by the plan), the `Cookie` fields joined,
/// the rest as [`upstream_head`] writes any request.
fn http1_request(
    req: &RequestHeader,
    fwd: &Forwarding<'_>,
    extra: &[(http::HeaderName, http::HeaderValue)],
) -> Vec<u8> {
    let cookies = req.headers.get_all(http::header::COOKIE).iter();
    let cookie = joined_cookie(cookies.map(|v| v.as_bytes()));
    let mut fields: Vec<(&str, &[u8])> = Vec::with_capacity(req.headers.len() + 2);
    fields.push(("Host", fwd.host.as_bytes()));
    if let Some(cookie) = &cookie {
        fields.push(("Cookie", cookie));
    }
    for (name, value) in &req.headers {
        let name = name.as_str();
        let joined = cookie.is_some() && name == "cookie";
        if !joined && !matches!(name, "host" | "content-length") {
            fields.push((name, value.as_bytes()));
        }
    }
    let target = std::str::from_utf8(req.raw_path()).unwrap_or("/");
    upstream_head(req.method.as_str(), target, &fields, false, fwd, extra)
}
