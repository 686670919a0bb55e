//! Entry points for the fuzz targets `fuzz/fuzz_targets/upstream.rs` and
//! `request.rs`; not an API, and built only for tests and with the
//! `fuzzing` feature (which the fuzz crate turns on).

use super::request::{parse_head, Outgoing, UpstreamHead};
use super::response::{parse_response, response_head, Encoding, Persist};
use crate::proxy::pipeline::fields::{Forwarding, Owned};

/// `bytes` as a shard's response, read as `attempt` reads it: what the
/// client would receive is one well-formed head with the same status,
/// no hop-by-hop field (but a 101's), never both `Content-Length` and
/// `Transfer-Encoding`; the body framing counts the same bytes fed
/// whole or split at `split`, and never more than it was given.
pub fn response(bytes: &[u8], head_only: bool, websocket: bool, split: usize) {
    let Ok(Some(parsed)) = parse_response(bytes, head_only, websocket) else {
        return;
    };
    let head = response_head(
        bytes,
        &parsed,
        Encoding::of(&parsed, false),
        Persist::Default,
        None,
        None,
    );
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

/// `bytes` as a client's request head: the head the shard receives from
/// it is one well-formed HTTP/1.1 head, with one `Host` at most, none of
/// the client's hop-by-hop, framing or `Expect` fields, and the framing
/// shardgate chose.
pub fn request(bytes: &[u8]) {
    let Some(head) = parse_head(bytes) else {
        return;
    };
    let Some(target) = crate::proxy::pipeline::message::request_target(head.target) else {
        return;
    };
    let fwd = Forwarding {
        host: "a.example",
        proto: "http",
        peer_ip: None,
        owned: Owned {
            tenant_header: "x-tenant-id",
            request_id_header: "x-request-id",
            trust_forwarded_for: false,
            traceparent: false,
            tracestate: false,
        },
        tenant: "a",
        request_id: "id-1",
        traceparent: None,
    };
    let upstream = UpstreamHead {
        method: head.method,
        origin: &target.origin,
        host: target.authority,
        fields: &head.headers,
        websocket: head.websocket,
        body: Outgoing::Length(3),
    }
    .write(&fwd, &Default::default());
    let mut slots = [httparse::EMPTY_HEADER; 300];
    let mut req = httparse::Request::new(&mut slots);
    match req.parse(&upstream) {
        Ok(httparse::Status::Complete(n)) => assert_eq!(n, upstream.len(), "one head"),
        other => panic!("the shard's head does not parse: {other:?}"),
    }
    let count = |name: &str| {
        req.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .count()
    };
    assert!(count("host") <= 1);
    assert_eq!(count("content-length"), 1);
    for gone in ["transfer-encoding", "expect", "keep-alive", "te", "trailer"] {
        assert_eq!(count(gone), 0, "{gone} forwarded");
    }
}

#[cfg(test)]
mod tests {
    /// The `upstream` target's seed corpus replayed (each file as the
    /// fuzzer's input: two flags, a split, then the bytes), so that a
    /// change to the codecs meets the seeds in every test run, not only
    /// when the fuzzer runs.
    #[test]
    fn the_upstream_seed_corpus_holds_the_targets_invariants() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/upstream");
        let mut seeds = 0;
        for entry in std::fs::read_dir(dir).expect("the seed corpus").flatten() {
            let input = std::fs::read(entry.path()).expect("a seed");
            let flag = |i: usize| input.get(i).is_some_and(|b| b & 1 == 1);
            let split = u16::from_le_bytes([
                input.get(2).copied().unwrap_or(0),
                input.get(3).copied().unwrap_or(0),
            ]);
            let bytes = input.get(4..).unwrap_or_default();
            super::response(bytes, flag(0), flag(1), usize::from(split));
            super::request(bytes);
            seeds += 1;
        }
        assert!(seeds > 100, "{seeds} seeds");
    }
}
