//! The HTTP/1.1 message the fast transport writes and reads, as HTTP/2:
//! a request head as the stream's HEADERS (its connection fields left
//! out, `Host` as the authority; a WebSocket Upgrade as an extended
//! CONNECT, RFC 8441), a trailer section as trailing HEADERS, and the
//! response's head and trailers back in HTTP/1.1 form (a 2xx to an
//! extended CONNECT as the 101 the transport awaits).

use crate::proxy::pipeline::framing::Framing;
use crate::wire::fields::field_name;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Request};
use std::io;

/// The most fields a request head carries here: the client's (the plan
/// holds every protocol's to `limits.max_headers`, 256 at most), with
/// room for the gateway's own and an embedder's. A head beyond it (never
/// written) is refused, not sized into a header map (which panics past
/// 24 576 fields).
const MAX_FIELDS: usize = 1024;

/// Fields an HTTP/2 message may not carry (RFC 9113 §8.2.2): the
/// connection's, not the request's. (`te` is sent anew, as `trailers`.)
pub(super) const CONNECTION_SPECIFIC: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "host",
];

/// How a request's fields go to an HTTP/2 shard.
#[derive(Clone, Debug)]
pub(crate) struct FieldRules {
    /// The client accepts trailers: `te: trailers` is sent.
    pub te_trailers: bool,
    /// The gateway's request-ID field. Its value, new with each request
    /// (as `traceparent`'s), is sent never indexed (RFC 7541 §6.2.3): in
    /// the compression table the connection's requests share, it would
    /// only push out what repeats, and lengthen every lookup.
    pub request_id: HeaderName,
}

impl FieldRules {
    /// Whether a value of `name` is new with each request.
    fn unique(&self, name: &HeaderName) -> bool {
        *name == self.request_id || name == "traceparent"
    }
}

/// The GUID of a WebSocket handshake's accept value (RFC 6455 §1.3).
const WEBSOCKET_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// An HTTP/1.1 request as an HTTP/2 one.
pub(super) struct Outgoing {
    pub request: Request<()>,
    /// How its body's bytes are read (a WebSocket's: as they come).
    pub framing: Framing,
    /// A WebSocket Upgrade, sent as an extended CONNECT: its
    /// `Sec-WebSocket-Key`, for the accept value the client awaits.
    pub websocket_key: Option<Box<str>>,
}

/// The HTTP/2 request of an HTTP/1.1 head the fast transport wrote, and
/// its body's framing. Field values are slices of `head` (not copies).
pub(super) fn request_of(
    head: &Bytes,
    scheme: &http::uri::Scheme,
    rules: &FieldRules,
) -> io::Result<Outgoing> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let (method, target, lines) =
        written_head(head).ok_or_else(|| invalid("an unreadable request line"))?;
    let mut framing = Framing::Length(0);
    let mut authority = None;
    let mut websocket_key = None;
    let mut upgrade = false;
    // Room for every line (one counting pass): the map is not regrown.
    // The request line and the blank one are lines too.
    let lines_in = memchr::memchr_iter(b'\n', head).count();
    if lines_in > MAX_FIELDS + 2 {
        return Err(invalid("too many fields"));
    }
    let mut headers = HeaderMap::with_capacity(lines_in);
    for line in lines {
        let (name, value) = line.ok_or_else(|| invalid("an unreadable request head"))?;
        if name.eq_ignore_ascii_case(b"host") {
            authority = Some(value);
        } else if name.eq_ignore_ascii_case(b"sec-websocket-key") {
            // RFC 8441 §5: an extended CONNECT carries no key.
            websocket_key = std::str::from_utf8(value).ok().map(Box::from);
            continue;
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            framing = Framing::chunked();
        } else if name.eq_ignore_ascii_case(b"content-length") {
            let length = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
            framing = Framing::Length(length.ok_or_else(|| invalid("a bad length"))?);
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            // The transport writes an Upgrade for WebSocket handshakes only.
            upgrade = true;
        }
        if CONNECTION_SPECIFIC
            .iter()
            .any(|c| name.eq_ignore_ascii_case(c.as_bytes()))
        {
            continue;
        }
        let name = field_name(name).map_err(|_| invalid("a field name"))?;
        let value = HeaderValue::from_maybe_shared(head.slice_ref(value));
        let mut value = value.map_err(|_| invalid("a field value"))?;
        value.set_sensitive(rules.unique(&name));
        headers.append(name, value);
    }
    if rules.te_trailers {
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    }
    let authority = authority.ok_or_else(|| invalid("no Host"))?;
    let target = std::str::from_utf8(target).map_err(|_| invalid("a request target"))?;
    let uri = uri_of(scheme, authority, target).map_err(|_| invalid("a request target"))?;
    let mut request = Request::new(());
    *request.method_mut() = http::Method::from_bytes(method).map_err(|_| invalid("a method"))?;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    let outgoing = Outgoing {
        request,
        framing,
        websocket_key,
    };
    Ok(outgoing.upgraded(upgrade))
}

/// A head the transport wrote (`UpstreamHead::write`'s grammar: a
/// request line, `name: value` lines, each ended by CRLF, then a blank
/// line), split at its line ends and colons, not parsed again: its parts
/// were checked as they came in, and are checked again as HTTP/2's
/// (`field_name`, `HeaderValue`, `Uri`). The method, the target, and the
/// field lines (`None`: a line that is no field).
fn written_head(head: &[u8]) -> Option<(&[u8], &[u8], FieldLines<'_>)> {
    let end = memchr::memchr(b'\n', head)?;
    let line = head[..end].strip_suffix(b"\r")?;
    let mut parts = line.splitn(3, |&b| b == b' ');
    let (method, target) = (parts.next()?, parts.next()?);
    parts.next().filter(|version| *version == b"HTTP/1.1")?;
    let rest = &head[end + 1..];
    Some((method, target, FieldLines { rest }))
}

/// The field lines of a written head, up to its blank line.
struct FieldLines<'h> {
    rest: &'h [u8],
}

impl<'h> Iterator for FieldLines<'h> {
    type Item = Option<(&'h [u8], &'h [u8])>;

    fn next(&mut self) -> Option<Self::Item> {
        let end = memchr::memchr(b'\n', self.rest)?;
        let line = &self.rest[..end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        self.rest = &self.rest[end + 1..];
        if line.is_empty() {
            self.rest = &[];
            return None;
        }
        let field = memchr::memchr(b':', line).map(|colon| {
            let (name, value) = line.split_at(colon);
            (name, value[1..].trim_ascii())
        });
        Some(field)
    }
}

impl Outgoing {
    /// A WebSocket handshake as an extended CONNECT (RFC 8441 §4), with
    /// its key kept for the accept value; else no key.
    fn upgraded(mut self, upgrade: bool) -> Outgoing {
        if !upgrade {
            self.websocket_key = None;
            return self;
        }
        *self.request.method_mut() = http::Method::CONNECT;
        let protocol = h2::ext::Protocol::from_static("websocket");
        self.request.extensions_mut().insert(protocol);
        self.framing = Framing::UntilClose;
        self.websocket_key.get_or_insert_with(Box::default);
        self
    }
}

/// The request's URI. A target HTTP/1.1 lets through and a URI does not
/// (`<`, a backtick) has those bytes percent-encoded, as a browser would
/// have sent them.
fn uri_of(
    scheme: &http::uri::Scheme,
    authority: &[u8],
    target: &str,
) -> Result<http::Uri, http::Error> {
    let uri = |target: &str| {
        http::Uri::builder()
            .scheme(scheme.clone())
            .authority(authority)
            .path_and_query(target)
            .build()
    };
    uri(target).or_else(|_| uri(&percent_encoded(target)))
}

/// `target` with every byte a URI's path and query may not hold
/// percent-encoded (RFC 3986 §2.1; a `%` stays: it is one already).
fn percent_encoded(target: &str) -> String {
    const KEPT: &[u8] = b"-._~!$&'()*+,;=:@/?%[]";
    let mut out = String::with_capacity(target.len() + 8);
    for &b in target.as_bytes() {
        if b.is_ascii_alphanumeric() || KEPT.contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// How a response's body follows its head in HTTP/1.1 form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BodyForm {
    /// None (by rule, or the stream ended with its head).
    None,
    /// In chunks, with the trailers in the last one.
    Chunked,
    /// As its DATA came: a shard's length, or a WebSocket's bytes.
    Raw,
}

/// A response head in HTTP/1.1 form, and how its body follows: chunked
/// unless the shard gave a length (or there is none); a 2xx answer to an
/// extended CONNECT is the 101 a WebSocket handshake awaits, its accept
/// value computed from `websocket_key`.
pub(super) fn response_head(
    parts: &http::response::Parts,
    head_only: bool,
    ended: bool,
    websocket_key: Option<&str>,
    head: &mut BytesMut,
) -> BodyForm {
    let status = parts.status.as_u16();
    let switched = websocket_key.filter(|_| parts.status.is_success());
    if let Some(key) = switched {
        head.extend_from_slice(b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\n");
        head.extend_from_slice(b"upgrade: websocket\r\nsec-websocket-accept: ");
        head.extend_from_slice(websocket_accept(key).as_bytes());
        head.extend_from_slice(b"\r\n");
    } else {
        for part in ["HTTP/1.1 ", parts.status.as_str(), " "] {
            head.extend_from_slice(part.as_bytes());
        }
        let reason = parts.status.canonical_reason().unwrap_or("");
        head.extend_from_slice(reason.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    let bodiless = head_only || status < 200 || status == 204 || status == 304;
    let has_length = parts.headers.contains_key(http::header::CONTENT_LENGTH);
    for (name, value) in &parts.headers {
        let tunnel_length = switched.is_some() && name == http::header::CONTENT_LENGTH;
        if CONNECTION_SPECIFIC.contains(&name.as_str()) || tunnel_length {
            continue;
        }
        for part in [name.as_str().as_bytes(), b": ", value.as_bytes(), b"\r\n"] {
            head.extend_from_slice(part);
        }
    }
    let form = match () {
        _ if switched.is_some() => BodyForm::Raw,
        _ if bodiless || ended => BodyForm::None,
        _ if has_length => BodyForm::Raw,
        _ => BodyForm::Chunked,
    };
    match form {
        BodyForm::Chunked => head.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        BodyForm::None if !bodiless && !has_length => {
            head.extend_from_slice(b"content-length: 0\r\n")
        }
        _ => {}
    }
    head.extend_from_slice(b"\r\n");
    form
}

/// `Sec-WebSocket-Accept` for `key` (RFC 6455 §4.2.2).
fn websocket_accept(key: &str) -> String {
    use base64::Engine;
    let mut sha1 = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    sha1.update(key.trim().as_bytes());
    sha1.update(WEBSOCKET_GUID);
    base64::engine::general_purpose::STANDARD.encode(sha1.finish())
}

/// A chunked body's last chunk, with the response's trailers, into `out`.
pub(super) fn last_chunk(trailers: Option<&HeaderMap>, out: &mut BytesMut) {
    out.extend_from_slice(b"0\r\n");
    for (name, value) in trailers.into_iter().flatten() {
        for part in [name.as_str().as_bytes(), b": ", value.as_bytes(), b"\r\n"] {
            out.extend_from_slice(part);
        }
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::pipeline::framing::trailer_map;

    /// What `head` becomes, to a shard of `scheme`, the client accepting
    /// trailers or not.
    fn of(head: &'static [u8], scheme: http::uri::Scheme, te_trailers: bool) -> Outgoing {
        request_of(&Bytes::from_static(head), &scheme, &rules(te_trailers)).unwrap()
    }

    /// The plain-HTTP request of `head`, the client not accepting trailers.
    fn plain(head: &'static [u8]) -> Request<()> {
        of(head, http::uri::Scheme::HTTP, false).request
    }

    fn rules(te_trailers: bool) -> FieldRules {
        FieldRules {
            te_trailers,
            request_id: HeaderName::from_static("x-request-id"),
        }
    }

    #[test]
    fn an_http1_head_becomes_an_http2_request_without_its_connection_fields() {
        let head = b"POST /a?b=1 HTTP/1.1\r\nHost: app.test:8080\r\nConnection: keep-alive\r\n\
Transfer-Encoding: chunked\r\nTE: gzip\r\nX-Forwarded-For: 1.2.3.4\r\nContent-Type: application/grpc\r\n\r\n";
        let Outgoing {
            request, framing, ..
        } = of(head, http::uri::Scheme::HTTP, true);
        assert_eq!(request.uri(), "http://app.test:8080/a?b=1");
        assert_eq!(request.method(), http::Method::POST);
        let names: Vec<&str> = request.headers().keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["x-forwarded-for", "content-type", "te"]);
        assert_eq!(request.headers()["te"], "trailers");
        assert!(matches!(framing, Framing::Chunked(_)));
        let head = b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 7\r\n\r\n";
        let Outgoing {
            request, framing, ..
        } = of(head, http::uri::Scheme::HTTPS, false);
        assert_eq!(request.uri(), "https://a/");
        assert!(request.headers().get("te").is_none());
        assert!(matches!(framing, Framing::Length(7)));
        // Many fields: all of them; beyond the bound: refused.
        let many = |n: usize| {
            let fields: String = (0..n).map(|i| format!("X-F{i}: {i}\r\n")).collect();
            let head = format!("GET / HTTP/1.1\r\nHost: a\r\n{fields}\r\n");
            request_of(&Bytes::from(head), &http::uri::Scheme::HTTP, &rules(false))
        };
        assert_eq!(many(300).unwrap().request.headers().len(), 300);
        // (The Host line is one of them.)
        assert_eq!(
            many(MAX_FIELDS - 1).unwrap().request.headers().len(),
            MAX_FIELDS - 1
        );
        assert!(many(MAX_FIELDS).is_err() && many(30_000).is_err());
        // Bytes a URI may not hold, percent-encoded.
        let head = b"GET /a?q=<b>`c`{d} HTTP/1.1\r\nHost: a\r\n\r\n";
        let request = plain(head);
        assert_eq!(request.uri(), "http://a/a?q=%3Cb%3E%60c%60%7Bd%7D");
        // A value new with each request is never indexed; others may be.
        let head = b"GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: 7\r\ntraceparent: 00-1\r\nAccept: */*\r\n\r\n";
        let request = plain(head);
        let sensitive = |name: &str| request.headers()[name].is_sensitive();
        assert!(sensitive("x-request-id") && sensitive("traceparent") && !sensitive("accept"));
        // A line that is no field, or no request line: refused, not sent.
        for head in [
            &b"GET / HTTP/1.1\r\nHost: a\r\nno colon\r\n\r\n"[..],
            b"GET /\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.1",
        ] {
            let head = Bytes::from_static(head);
            assert!(request_of(&head, &http::uri::Scheme::HTTP, &rules(false)).is_err());
        }
        // Values trimmed as HTTP/1.1 reads them; an empty one kept.
        let request = plain(b"GET / HTTP/1.1\r\nHost: a\r\nX-A:  1 \t\r\nX-B:\r\n\r\n");
        assert_eq!(request.headers()["x-a"], "1");
        assert_eq!(request.headers()["x-b"], "");
        // No Host: no authority to give.
        assert!(request_of(
            &Bytes::from_static(b"GET / HTTP/1.1\r\n\r\n"),
            &http::uri::Scheme::HTTP,
            &rules(false)
        )
        .is_err());
    }

    #[test]
    fn a_websocket_upgrade_is_an_extended_connect_and_its_2xx_a_101() {
        let head =
            b"GET /chat HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
        let out = of(head, http::uri::Scheme::HTTP, false);
        assert_eq!(out.request.method(), http::Method::CONNECT);
        let protocol = out.request.extensions().get::<h2::ext::Protocol>();
        assert_eq!(protocol.map(|p| p.as_str()), Some("websocket"));
        assert!(out.request.headers().get("sec-websocket-key").is_none());
        assert!(matches!(out.framing, Framing::UntilClose));
        let key = out.websocket_key.unwrap();
        let ok = http::Response::builder()
            .status(200)
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let mut head = BytesMut::new();
        let form = response_head(&ok, false, false, Some(&key), &mut head);
        let head = String::from_utf8_lossy(&head).to_string();
        // RFC 6455's own example.
        assert!(
            head.contains("sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
            "{head}"
        );
        assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
        assert_eq!(form, BodyForm::Raw);
        let no = http::Response::builder()
            .status(403)
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let mut head = BytesMut::new();
        let form = response_head(&no, false, false, Some(&key), &mut head);
        assert!(head.starts_with(b"HTTP/1.1 403 "));
        assert_eq!(form, BodyForm::Chunked);
    }

    #[test]
    fn trailers_pass_the_one_rule_both_ways() {
        let fields = trailer_map(b"grpc-status: 0\r\nX-Sum: 1\r\n").unwrap();
        assert_eq!(fields["grpc-status"], "0");
        assert_eq!(fields["x-sum"], "1");
        assert!(trailer_map(b"").is_none());
        let mut map = HeaderMap::new();
        map.insert("grpc-status", HeaderValue::from_static("5"));
        let mut out = BytesMut::new();
        last_chunk(Some(&map), &mut out);
        assert_eq!(&out[..], b"0\r\ngrpc-status: 5\r\n\r\n");
        let mut out = BytesMut::new();
        last_chunk(None, &mut out);
        assert_eq!(&out[..], b"0\r\n\r\n");
    }
}
