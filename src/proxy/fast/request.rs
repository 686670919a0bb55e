//! Request classification and the upstream request head: which requests
//! the fast transport takes, and the head the shard receives — the
//! client's fields byte for byte, minus the hop-by-hop and owned fields of
//! the pipeline's table, plus the pipeline's forwarding fields.

/// Request heads with more fields go to Pingora's path.
const MAX_REQUEST_HEADERS: usize = 128;
use crate::proxy::pipeline::fields::{
    is_hop_by_hop, names_websocket, same_field, tokens, Forwarding,
};
use http::{HeaderName, HeaderValue};

/// Which shape a request head has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    Plain,
    WebSocket,
}

/// A parsed request head, borrowing the buffer it came in.
pub(super) struct RequestHead<'b> {
    pub method: &'b str,
    pub target: &'b str,
    pub headers: Vec<(&'b str, &'b [u8])>,
    /// The client asked to close after this request.
    pub close: bool,
    pub shape: Shape,
}

impl<'b> RequestHead<'b> {
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn values<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'b [u8]> + 's {
        self.headers
            .iter()
            .filter(move |(n, _)| header_is(n, name))
            .map(|(_, v)| *v)
    }

    pub fn head_only(&self) -> bool {
        self.method == "HEAD"
    }

    /// The request head as the shard receives it (see [`upstream_head`]).
    pub fn rewrite(&self, fwd: &Forwarding<'_>, extra: &[(HeaderName, HeaderValue)]) -> Vec<u8> {
        let websocket = self.shape == Shape::WebSocket;
        upstream_head(
            self.method,
            self.target,
            &self.headers,
            websocket,
            fwd,
            extra,
        )
    }
}

/// The request head as the shard receives it: the client's fields byte for
/// byte, minus hop-by-hop and owned fields and those `extra` replaces, then
/// the embedder's `extra` fields (checked by the pipeline's plan), then
/// ours.
pub(super) fn upstream_head(
    method: &str,
    target: &str,
    headers: &[(&str, &[u8])],
    websocket: bool,
    fwd: &Forwarding<'_>,
    extra: &[(HeaderName, HeaderValue)],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        let replaced = extra.iter().any(|(n, _)| same_field(name, n.as_str()));
        if !is_hop_by_hop(name) && !fwd.owns(name) && !replaced {
            push_field(&mut out, name.as_bytes(), value);
        }
    }
    if websocket {
        out.extend_from_slice(b"Connection: Upgrade\r\nUpgrade: websocket\r\n");
    }
    for (name, value) in extra {
        push_field(&mut out, name.as_str().as_bytes(), value.as_bytes());
    }
    let prior_xff = headers
        .iter()
        .filter(|(n, _)| header_is(n, "x-forwarded-for"))
        .map(|(_, v)| *v);
    fwd.each_field(prior_xff, |name, value| {
        push_field(&mut out, name.as_bytes(), value.as_bytes());
    });
    out.extend_from_slice(b"\r\n");
    out
}

pub(super) fn header_is(name: &str, wanted: &str) -> bool {
    name.eq_ignore_ascii_case(wanted)
}

pub(super) fn push_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Parses the head in `buf` and decides whether it is the fast path's.
pub(super) fn classify(buf: &[u8]) -> Option<RequestHead<'_>> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_REQUEST_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        _ => return None,
    };
    // Pipelined bytes, HTTP/1.0, absolute-form and non-ASCII targets:
    // Pingora's path (which refuses what it must).
    if len != buf.len() || req.version != Some(1) {
        return None;
    }
    let (method, target) = (req.method?, req.path?);
    if !target.starts_with('/') || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    let headers: Vec<(&str, &[u8])> = req.headers.iter().map(|h| (h.name, h.value)).collect();
    let (mut upgrade, mut lengths) = (None, 0);
    let (mut close, mut connection_upgrade) = (false, false);
    for (name, value) in &headers {
        if header_is(name, "transfer-encoding") || header_is(name, "expect") {
            return None;
        }
        if header_is(name, "content-length") {
            lengths += 1;
            if lengths > 1 || value.trim_ascii() != b"0" {
                return None;
            }
        }
        if header_is(name, "upgrade") {
            upgrade = Some(*value);
        }
        if header_is(name, "connection") {
            for token in tokens(value) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"upgrade") {
                    connection_upgrade = true;
                } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                    // Naming other fields: Pingora strips them.
                    return None;
                }
            }
        }
    }
    let shape = match upgrade {
        None if matches!(method, "GET" | "HEAD" | "OPTIONS" | "DELETE") => Shape::Plain,
        Some(u) if method == "GET" && connection_upgrade && names_websocket(u) => Shape::WebSocket,
        _ => return None,
    };
    Some(RequestHead {
        method,
        target,
        headers,
        close,
        shape,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_bodiless_requests_take_the_fast_path() {
        let fast = |raw: &str| classify(raw.as_bytes()).map(|h| h.shape);
        assert!(fast("GET / HTTP/1.1\r\nHost: a\r\n\r\n") == Some(Shape::Plain));
        assert!(
            fast(
                "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n"
            ) == Some(Shape::Plain)
        );
        assert!(
            fast("GET /ws HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n")
                == Some(Shape::WebSocket)
        );
        for slow in [
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n",
            "GET / HTTP/1.0\r\nHost: a\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: x-secret\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n",
            "PATCH / HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\n",
        ] {
            assert!(fast(slow).is_none(), "{slow:?}");
        }
    }
}
