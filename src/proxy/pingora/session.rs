//! What the Pingora phases read off the session and its errors: whether a
//! request is a WebSocket handshake, whether a response has a body, the
//! status written, what a failed attempt leads to, and shardgate's answer
//! for Pingora's own errors.

use crate::proxy::ctx::RequestCtx;
use crate::proxy::hooks::RequestLine;
use crate::proxy::pipeline::answer::Refusal;
use crate::proxy::pipeline::failure::{AttemptFailure, Next};
use crate::proxy::pipeline::fields::websocket_handshake;
use crate::proxy::Gateway;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::{ErrorSource, ErrorType};
use pingora_proxy::Session;

/// Whether the session is a WebSocket handshake (the pipeline's one rule).
pub(super) fn is_websocket(session: &Session) -> bool {
    let req = session.req_header();
    let values = |name| req.headers.get_all(name).into_iter().map(|v| v.as_bytes());
    websocket_handshake(
        req.method.as_str(),
        req.version == http::Version::HTTP_11,
        values(http::header::CONNECTION),
        values(http::header::UPGRADE),
    )
}

impl Gateway {
    /// Applies the pipeline's verdict on a failed attempt to Pingora's
    /// error: retry (or resend) it, or keep the answer for `fail_to_proxy`.
    pub(super) fn follow(
        &self,
        session: &Session,
        ctx: &mut RequestCtx,
        failure: AttemptFailure,
    ) -> bool {
        let replayable = !session.as_ref().retry_buffer_truncated();
        match self.after_failure(failure, &session.req_header().method, replayable, ctx) {
            Next::Resend => {
                // To the same shard, still admitted: not routed again; and
                // on a fresh connection (the pool may hold more stale ones).
                ctx.shard_chosen = true;
                ctx.fresh_connection = true;
                true
            }
            Next::Retry => true,
            Next::Answer(refusal) => {
                ctx.refusal = Some(refusal);
                false
            }
        }
    }
}

/// A response that has no body to wait for.
pub(super) fn no_body(session: &Session, response: &ResponseHeader) -> bool {
    let status = response.status.as_u16();
    let length = response.headers.get(http::header::CONTENT_LENGTH);
    session.req_header().method == http::Method::HEAD
        || matches!(status, 204 | 304)
        || length.is_some_and(|v| v.as_bytes() == b"0")
}

/// The status of the final response head written to the client, if one
/// was (a 100 Continue passed on from the shard is not: an answer may
/// still follow it; a 101 is, the connection is a tunnel).
pub(super) fn final_status(session: &Session) -> Option<u16> {
    let status = session.response_written()?.status;
    (!status.is_informational() || status == http::StatusCode::SWITCHING_PROTOCOLS)
        .then_some(status.as_u16())
}

/// Whether `e` is the client's chunked body refused by the front end's
/// reader (an `InvalidData` read error; a client gone is another kind).
fn broken_body(e: &Error) -> bool {
    let cause = e.root_cause().downcast_ref::<std::io::Error>();
    cause.is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData)
}

/// shardgate's answer for one of Pingora's own errors (a malformed
/// request, a client timeout, a shard unreachable or invalid); `None`
/// where the client is gone and nothing can be sent.
pub(super) fn refusal_for(e: &Error) -> Option<Refusal> {
    match e.etype() {
        ErrorType::HTTPStatus(code) if *code >= 400 => Some(Refusal::error(
            *code,
            if *code < 500 {
                "bad-request"
            } else {
                "upstream-error"
            },
        )),
        ErrorType::InvalidHTTPHeader if *e.esource() == ErrorSource::Upstream => {
            Some(Refusal::error(502, "upstream-invalid-response"))
        }
        _ => match e.esource() {
            ErrorSource::Upstream => Some(Refusal::error(502, "upstream-unreachable")),
            ErrorSource::Downstream => match e.etype() {
                ErrorType::ReadTimedout => Some(Refusal::error(408, "request-timeout")),
                // The front end's reader refused a chunked body that
                // breaks its framing (`client::OneRequest`).
                ErrorType::ReadError if broken_body(e) => {
                    Some(Refusal::error(400, "invalid-chunked-body"))
                }
                ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => None,
                _ => Some(Refusal::error(400, "bad-request")),
            },
            _ => Some(Refusal::error(500, "internal-error")),
        },
    }
}

/// The access log's view of the request.
pub(super) fn request_line(session: &Session) -> RequestLine<'_> {
    let req = session.req_header();
    let host = (req
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok()))
    .or_else(|| req.uri.authority().map(|a| a.as_str()));
    RequestLine {
        client: session.client_addr(),
        method: req.method.as_str(),
        target: &req.uri,
        host,
        protocol: match req.version {
            http::Version::HTTP_2 => "HTTP/2",
            http::Version::HTTP_10 => "HTTP/1.0",
            _ => "HTTP/1.1",
        },
    }
}
