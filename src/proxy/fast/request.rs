//! The client's request head and the head the shard receives: the
//! client's fields byte for byte, minus the hop-by-hop fields (the
//! pipeline's table and what `Connection` names), the fields shardgate
//! owns, `Expect` (answered here) and the framing fields (written anew
//! for the body as it is forwarded), plus the pipeline's forwarding fields.

use crate::proxy::buffers;
use crate::proxy::head::Layout;
use crate::proxy::hooks::UpstreamEdit;
use crate::proxy::pipeline::fields::{is_hop_by_hop, tokens, websocket_handshake, Forwarding};
use crate::proxy::pipeline::message::closes_connection;
use bytes::BytesMut;

/// A request's fields, on the stack for most heads.
pub(super) type Fields<'b> = smallvec::SmallVec<[(&'b str, &'b [u8]); 16]>;

/// A client's HTTP/1 request head, borrowing the buffer it came in.
pub(super) struct RequestHead<'b> {
    pub method: &'b str,
    /// The target as sent.
    pub target: &'b str,
    pub http10: bool,
    pub headers: Fields<'b>,
    /// The connection closes after this exchange: the client said
    /// `Connection: close`, or is HTTP/1.0 without `keep-alive`.
    pub close: bool,
    pub websocket: bool,
    /// `Expect: 100-continue`: the client may wait for a 100 before
    /// sending its body.
    pub expect_continue: bool,
}

impl<'b> RequestHead<'b> {
    pub fn head_only(&self) -> bool {
        self.method == "HEAD"
    }

    /// Every value of the field `name`.
    pub fn values<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'b [u8]> + 's {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }
}

/// A request head from the parts the head reader found in `buf` (it read
/// it under the head limits and the message rules). `None`: parts that
/// are not text where they must be (never, for a head httparse read).
pub(super) fn head_in<'b>(buf: &'b [u8], layout: &Layout) -> Option<RequestHead<'b>> {
    // One check of the whole head (all ASCII, nearly always), then parts
    // of it; a head with other bytes (obs-text in a field value, say)
    // part by part.
    let whole = std::str::from_utf8(buf).ok();
    let text = |r: &std::ops::Range<u32>| {
        let range = r.start as usize..r.end as usize;
        match whole {
            Some(whole) => whole.get(range),
            None => std::str::from_utf8(buf.get(range)?).ok(),
        }
    };
    let bytes = |r: &std::ops::Range<u32>| buf.get(r.start as usize..r.end as usize);
    let (method, target, http10) = (text(&layout.method)?, text(&layout.target)?, layout.http10);
    let mut headers = Fields::with_capacity(layout.fields.len());
    for (name, value) in &layout.fields {
        headers.push((text(name)?, bytes(value)?));
    }
    let field = |wanted: &'static str| {
        headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(wanted))
            .map(|(_, v)| *v)
    };
    let expect_continue =
        field("expect").any(|v| v.trim_ascii().eq_ignore_ascii_case(b"100-continue"));
    let websocket = websocket_handshake(method, !http10, field("connection"), field("upgrade"));
    Some(RequestHead {
        method,
        target,
        http10,
        close: closes_connection(http10, field("connection")),
        websocket,
        expect_continue,
        headers,
    })
}

/// Parses the complete head at the start of `buf` (tests and fuzzing; the
/// gateway takes the head reader's parts, [`head_in`]).
#[cfg(any(test, feature = "fuzzing"))]
pub(super) fn parse_head(buf: &[u8]) -> Option<RequestHead<'_>> {
    head_in(buf, &Layout::parse(buf)?)
}

/// How the request body goes to the shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outgoing {
    /// No body, and no framing field.
    None,
    /// `Content-Length`: the bytes as they come.
    Length(u64),
    /// `Transfer-Encoding: chunked`, chunks written anew.
    Chunked,
}

/// What the head the shard receives is made of.
pub(super) struct UpstreamHead<'a> {
    pub method: &'a str,
    /// The path and query, in origin form.
    pub origin: &'a str,
    /// The `Host` to send in place of the client's (an absolute-form
    /// target's authority, HTTP/2's `:authority`); `None`: the client's.
    pub host: Option<&'a str>,
    /// The client's fields, as received.
    pub fields: &'a [(&'a str, &'a [u8])],
    pub websocket: bool,
    pub body: Outgoing,
}

impl UpstreamHead<'_> {
    /// The request head as the shard receives it: the client's fields
    /// byte for byte, minus hop-by-hop ones (the table, and what the
    /// client's `Connection` names but `Host`), the fields shardgate owns
    /// and those the embedder's `edit` replaces or removes, `Expect` and
    /// the framing fields; then the edit's fields (checked by the plan),
    /// ours, and the body's framing.
    pub fn write(&self, fwd: &Forwarding<'_>, edit: &UpstreamEdit) -> BytesMut {
        let named = self
            .fields
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
            .flat_map(|(_, v)| tokens(v));
        let named: smallvec::SmallVec<[&[u8]; 4]> =
            named.filter(|t| !t.eq_ignore_ascii_case(b"host")).collect();
        let mut out = buffers::take_vec(512);
        out.extend_from_slice(self.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.origin.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        if let Some(host) = self.host {
            push_field(&mut out, b"Host", host.as_bytes());
        }
        for (name, value) in self.fields {
            let dropped = is_hop_by_hop(name)
                || fwd.owns(name)
                || named
                    .iter()
                    .any(|n| name.as_bytes().eq_ignore_ascii_case(n))
                || ["content-length", "expect"]
                    .iter()
                    .any(|f| name.eq_ignore_ascii_case(f))
                || (self.host.is_some() && name.eq_ignore_ascii_case("host"))
                || (!edit.is_empty() && edit.replaces(name));
            if !dropped {
                push_field(&mut out, name.as_bytes(), value);
            }
        }
        if self.websocket {
            out.extend_from_slice(b"Connection: Upgrade\r\nUpgrade: websocket\r\n");
        }
        for (name, value) in &edit.add {
            push_field(&mut out, name.as_str().as_bytes(), value.as_bytes());
        }
        let prior_xff = self
            .fields
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("x-forwarded-for"))
            .map(|(_, v)| *v);
        fwd.each_field(prior_xff, |name, value| {
            push_field(&mut out, name.as_bytes(), value.as_bytes());
        });
        match self.body {
            Outgoing::None => {}
            Outgoing::Length(n) => {
                let mut digits = itoa::Buffer::new();
                push_field(&mut out, b"Content-Length", digits.format(n).as_bytes());
            }
            Outgoing::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        }
        out.extend_from_slice(b"\r\n");
        // From the thread's buffers: the exchange gives it back once the
        // shard has it.
        let mut head = buffers::take(out.len());
        head.extend_from_slice(&out);
        buffers::give_vec(out);
        head
    }
}

pub(super) fn push_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::pipeline::fields::Owned;

    fn forwarding() -> Forwarding<'static> {
        Forwarding {
            host: "a.example",
            proto: "http",
            peer_ip: Some("10.0.0.1".parse().unwrap()),
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
        }
    }

    #[test]
    fn heads_say_how_their_connection_goes_on() {
        let head = |raw: &str| {
            let h = parse_head(raw.as_bytes()).expect("a head");
            (h.close, h.websocket, h.expect_continue, h.http10)
        };
        assert_eq!(
            head("GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
            (false, false, false, false)
        );
        assert_eq!(
            head("GET / HTTP/1.0\r\nHost: a\r\n\r\n"),
            (true, false, false, true)
        );
        assert_eq!(
            head("GET / HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n"),
            (false, false, false, true)
        );
        assert_eq!(
            head("GET /ws HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n"),
            (false, true, false, false)
        );
        assert_eq!(
            head("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nConnection: close\r\nContent-Length: 1\r\n\r\n"),
            (true, false, true, false)
        );
        assert!(parse_head(b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n").is_none());
    }

    #[test]
    fn the_shard_gets_the_fields_minus_hops_and_ours_with_framing_anew() {
        let raw = "POST /up?x=1 HTTP/1.1\r\nHost: a.example\r\nConnection: keep-alive, X-Hop, Host\r\nX-Hop: 1\r\n\
Keep-Alive: 5\r\nExpect: 100-continue\r\nContent-Length: 5, 5\r\nX-Tenant-Id: evil\r\nX-Request-Id: theirs\r\nX-Kept: yes\r\n\r\n";
        let head = parse_head(raw.as_bytes()).unwrap();
        let up = UpstreamHead {
            method: head.method,
            origin: head.target,
            host: None,
            fields: &head.headers,
            websocket: false,
            body: Outgoing::Length(5),
        };
        let text =
            String::from_utf8(up.write(&forwarding(), &Default::default()).to_vec()).unwrap();
        assert_eq!(
            text,
            "POST /up?x=1 HTTP/1.1\r\nHost: a.example\r\nX-Kept: yes\r\nX-Forwarded-Host: a.example\r\n\
X-Forwarded-Proto: http\r\nX-Forwarded-For: 10.0.0.1\r\nX-Real-IP: 10.0.0.1\r\nx-tenant-id: a\r\n\
x-request-id: id-1\r\nContent-Length: 5\r\n\r\n"
        );
        let up = UpstreamHead {
            host: Some("b.example"),
            origin: "/",
            body: Outgoing::Chunked,
            ..up
        };
        let text =
            String::from_utf8(up.write(&forwarding(), &Default::default()).to_vec()).unwrap();
        assert!(
            text.starts_with("POST / HTTP/1.1\r\nHost: b.example\r\nX-Kept"),
            "{text}"
        );
        assert!(
            text.ends_with("Transfer-Encoding: chunked\r\n\r\n"),
            "{text}"
        );
        assert_eq!(text.matches("\r\nHost:").count(), 1, "{text}");
    }
}
