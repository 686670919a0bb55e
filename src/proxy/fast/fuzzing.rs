//! Entry points for the fuzz targets `fuzz/fuzz_targets/upstream.rs` and
//! `request.rs`; not an API, and built only for tests and with the
//! `fuzzing` feature (which the fuzz crate turns on).

use super::request::classify;
use super::response::{parse_response, response_head};

/// `bytes` as a shard's response, read as `attempt` reads it: what the
/// client would receive is one well-formed head with the same status,
/// no hop-by-hop field (but a 101's), never both `Content-Length` and
/// `Transfer-Encoding`; the body framing counts the same bytes fed
/// whole or split at `split`, and never more than it was given.
pub fn response(bytes: &[u8], head_only: bool, websocket: bool, split: usize) {
    let Ok(Some(parsed)) = parse_response(bytes, head_only, websocket) else {
        return;
    };
    let head = response_head(bytes, &parsed, false, None);
    let mut slots = [httparse::EMPTY_HEADER; 260];
    let mut resp = httparse::Response::new(&mut slots);
    match resp.parse(&head) {
        Ok(httparse::Status::Complete(n)) => {
            assert_eq!(n, head.len(), "one head, nothing after it")
        }
        other => panic!("the client's head does not parse: {other:?}"),
    }
    assert_eq!(resp.code, Some(parsed.status));
    let has = |name: &str| {
        resp.headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case(name))
    };
    assert!(!(has("transfer-encoding") && has("content-length")));
    if parsed.status != 101 {
        for hop in [
            "connection",
            "keep-alive",
            "upgrade",
            "te",
            "trailer",
            "proxy-connection",
        ] {
            assert!(!has(hop), "{hop} forwarded");
        }
    }
    let body = &bytes[parsed.head_len..];
    let mut whole = parsed.framing.clone();
    let at_once = whole.consume(body);
    let split = split.min(body.len());
    let mut parts = parsed.framing.clone();
    let in_two = parts.consume(&body[..split]).and_then(|n| {
        if n < split || parts.is_done() {
            Ok(n)
        } else {
            parts.consume(&body[split..]).map(|m| n + m)
        }
    });
    assert_eq!(at_once.is_ok(), in_two.is_ok(), "{at_once:?} {in_two:?}");
    if let (Ok(a), Ok(b)) = (at_once, in_two) {
        assert_eq!(a, b);
        assert!(a <= body.len());
    }
}

/// `bytes` as a client's request head: what the fast path takes is a
/// complete HTTP/1.1 head with an origin-form ASCII target and no body.
pub fn request(bytes: &[u8]) {
    if let Some(head) = classify(bytes) {
        assert!(head.target.starts_with('/') && head.target.is_ascii());
        assert!(head.values("transfer-encoding").next().is_none());
        assert!(head
            .values("content-length")
            .all(|v| v.trim_ascii() == b"0"));
    }
}
