//! What RFC 9112 lets an intermediary accept in a request head, checked
//! once for every HTTP/1 head before either transport sees it (by
//! the front end), no looser than nginx (DESIGN §2 "Per request", step 6):
//!
//! - the request line is `method SP target SP version`, nothing else: a
//!   space or a control character in the target is 400 (RFC 9112 §3.2; a
//!   proxy that "repairs" it forwards a different request than it read);
//! - a `#` in the target is 400 (a fragment is never sent; DESIGN §3);
//! - a version other than HTTP/1.0 and HTTP/1.1 is 505 (RFC 9110 §15.6.6);
//! - `Content-Length` together with `Transfer-Encoding` is 400 and the
//!   connection closes (RFC 9112 §6.3: the framing cannot be trusted);
//! - a transfer coding other than `chunked` alone is 501 (RFC 9112 §6.1:
//!   a server that does not understand a coding responds 501), and any
//!   `Transfer-Encoding` on HTTP/1.0 is 400 (§6.1: faulty framing);
//! - a `Content-Length` that is not a number, or several that differ, is
//!   400 (§6.3; a list of one length said again is that length); one
//!   larger than `limits.max_body_bytes` is 413 at once;
//! - a WebSocket handshake that declares a body (a `Content-Length` other
//!   than 0, or any `Transfer-Encoding`) is 400 (DESIGN §2 step 5: were
//!   it kept, a shard that declines the upgrade would leave the body on
//!   the connection, to be read as the client's next request).
//!
//! The framing fields are read by one rule for requests and responses
//! ([`declared_framing`], [`content_length`]): a shard's response that
//! breaks it is an upstream error (502, its connection not kept).
//!
//! Every refusal here closes the connection: what follows the head cannot
//! be framed (or is not wanted).

use super::fields::tokens;
use super::framing::Framing;
pub use crate::wire::host::{check_host, host_name, MAX_HOST_LABEL, MAX_HOST_NAME};
pub use crate::wire::target::{request_target, Target};
use smallvec::SmallVec;

/// A head refused before any transport saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    pub status: u16,
    /// The `error` of the JSON answer.
    pub code: &'static str,
}

const fn refused(status: u16, code: &'static str) -> Refused {
    Refused { status, code }
}

/// Checks the request line of the head in `buf` (which holds at least the
/// whole line). Empty lines before it are skipped (RFC 9112 §2.2).
pub fn check_request_line(buf: &[u8]) -> Result<(), Refused> {
    let start = buf
        .iter()
        .position(|b| *b != b'\r' && *b != b'\n')
        .unwrap_or(buf.len());
    let line = buf[start..]
        .split(|b| *b == b'\n')
        .next()
        .unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.split(|b| *b == b' ');
    let (Some(_method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        // Too few words, or a space inside the target.
        return Err(refused(400, "invalid-request-line"));
    };
    if target.is_empty() || target.iter().any(|b| *b < 0x21 || *b == 0x7f) {
        return Err(refused(400, "invalid-target"));
    }
    if target.contains(&b'#') {
        return Err(refused(400, "fragment-in-target"));
    }
    match version {
        b"HTTP/1.1" | b"HTTP/1.0" => Ok(()),
        [b'H', b'T', b'T', b'P', b'/', major, rest @ ..]
            if major.is_ascii_digit()
                && (rest.is_empty()
                    || (rest.len() == 2 && rest[0] == b'.' && rest[1].is_ascii_digit())) =>
        {
            Err(refused(505, "http-version-not-supported"))
        }
        _ => Err(refused(400, "invalid-request-line")),
    }
}

/// Checks what a head says of its authority: no `CONNECT` (405), a target
/// [`request_target`] reads (400), at most one `Host` (RFC 9112 §3.2),
/// and the host rule ([`check_host`]) for a
/// `Host` and an absolute-form target's authority. Pingora's proxy
/// answers a head with user info in its host itself before any of its
/// phases (no request ID, no log line); refused here, every transport
/// answers it the same way. (An empty or missing host is the planner's
/// to refuse: it knows whether an authority stands in for it.)
pub fn check_authority<'a>(
    method: &str,
    target: &str,
    mut hosts: impl Iterator<Item = &'a [u8]>,
) -> Result<(), Refused> {
    if method == "CONNECT" {
        return Err(refused(405, "method-not-allowed"));
    }
    // Origin, asterisk or absolute form (an authority form is CONNECT's).
    let Some(target) = request_target(target) else {
        return Err(refused(400, "invalid-target"));
    };
    let host = match (hosts.next(), hosts.next()) {
        (_, Some(_)) => return Err(refused(400, "duplicate-host")),
        (host, None) => host.unwrap_or_default(),
    };
    let authority = target.authority.unwrap_or_default();
    for name in [host, authority.as_bytes()] {
        if !name.is_empty() {
            let name = crate::wire::text::text(name).ok_or_else(|| refused(400, "invalid-host"))?;
            check_host(name).map_err(|code| refused(400, code))?;
        }
    }
    Ok(())
}

/// The search for the blank line that ends an HTTP/1 head (a request's or
/// a shard's response's) arriving in pieces, kept between reads: each byte
/// is looked at once however many reads the head takes. A line feed, then
/// another, maybe after a carriage return, ends it (as httparse reads line
/// ends); empty lines before the head (RFC 9112 §2.2) are no head.
#[derive(Clone, Copy, Debug, Default)]
pub struct HeadEnd {
    /// Where the head begins, once a byte of it came.
    start: Option<usize>,
    /// Where the search resumes: no blank line begins before it.
    next: usize,
}

impl HeadEnd {
    /// A search for the head that starts at `at` (the one after a head
    /// ending there).
    pub fn at(at: usize) -> HeadEnd {
        HeadEnd {
            start: None,
            next: at,
        }
    }

    /// Just past the blank line that ends the head in `buf` (what it held
    /// at the last call, and more), if it came.
    pub fn find(&mut self, buf: &[u8]) -> Option<usize> {
        let start = match self.start {
            Some(start) => start,
            None => {
                let from = self.next.min(buf.len());
                let Some(at) = buf[from..].iter().position(|b| *b != b'\r' && *b != b'\n') else {
                    self.next = buf.len();
                    return None;
                };
                *self.start.insert(from + at)
            }
        };
        let from = self.next.max(start).min(buf.len());
        // Line feeds found with memchr (a head's lines are tens of bytes:
        // a byte-by-byte scan was 5 % of a GET's instructions).
        let found =
            memchr::memchr_iter(b'\n', &buf[from..]).find_map(|i| match &buf[from + i + 1..] {
                [b'\n', ..] => Some(from + i + 2),
                [b'\r', b'\n', ..] => Some(from + i + 3),
                _ => None,
            });
        // A blank line may straddle the next read: its first two bytes
        // are looked at again.
        self.next = match found {
            Some(end) => end,
            None => buf.len().saturating_sub(2).max(start),
        };
        found
    }
}

/// The one reading of `Content-Length` (RFC 9110 §8.6), for requests and
/// responses on every transport: `values` are the field's values, from
/// one field or several. A list of identical lengths (`5, 5`, or two
/// fields of `5`) is that length; anything else — lengths that differ, a
/// sign, a non-digit, an empty element, a number past `u64` — is no
/// length at all ([`FramingFault::Length`]). `Ok(None)`: no field.
pub fn content_length<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<u64>, FramingFault> {
    let mut length = None;
    for value in values {
        for text in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
            if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
                return Err(FramingFault::Length);
            }
            let n = (crate::wire::text::text(text))
                .and_then(|t| t.parse::<u64>().ok())
                .ok_or(FramingFault::Length)?;
            if length.is_some_and(|l| l != n) {
                return Err(FramingFault::Length);
            }
            length = Some(n);
        }
    }
    Ok(length)
}

/// Why a message's framing fields cannot be trusted (RFC 9112 §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FramingFault {
    /// A `Content-Length` that is no length ([`content_length`]).
    Length,
    /// `Content-Length` beside `Transfer-Encoding` (§6.3: smuggling or
    /// splitting; nginx refuses both, requests and responses).
    LengthWithCoding,
    /// `Transfer-Encoding` in an HTTP/1.0 message (§6.1).
    CodingInHttp10,
    /// A coding other than `chunked` alone: a body re-framed by the proxy
    /// would reach its client still coded but no longer labelled.
    UnsupportedCoding,
}

/// What a message's framing fields say, the same for a client's request
/// and a shard's response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Declared {
    /// Its `Content-Length`, if it has one.
    pub length: Option<u64>,
    /// `Transfer-Encoding: chunked` (the only coding let through).
    pub chunked: bool,
}

/// Reads the framing fields of a message (`fields` as (name, value),
/// `http10`: an HTTP/1.0 message): a length ([`content_length`]), or
/// `chunked` alone, never both.
pub fn declared_framing<'a>(
    fields: impl Iterator<Item = (&'a str, &'a [u8])>,
    http10: bool,
) -> Result<Declared, FramingFault> {
    let (mut lengths, mut codings, mut chunked_only) = (SmallVec::<[&[u8]; 2]>::new(), 0, true);
    for (name, value) in fields {
        if name.eq_ignore_ascii_case("content-length") {
            lengths.push(value);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            for coding in tokens(value) {
                codings += 1;
                chunked_only &= coding.eq_ignore_ascii_case(b"chunked");
            }
            if value.trim_ascii().is_empty() {
                // An empty coding list is no framing at all.
                codings += 1;
                chunked_only = false;
            }
        }
    }
    let length = content_length(lengths)?;
    if codings == 0 {
        return Ok(Declared {
            length,
            chunked: false,
        });
    }
    if length.is_some() {
        return Err(FramingFault::LengthWithCoding);
    }
    if http10 {
        return Err(FramingFault::CodingInHttp10);
    }
    if codings > 1 || !chunked_only {
        return Err(FramingFault::UnsupportedCoding);
    }
    Ok(Declared {
        length: None,
        chunked: true,
    })
}

/// Checks the framing fields of a request head ([`declared_framing`]) and
/// the body size they announce against `max_body` (`None`: unlimited);
/// returns the body's framing.
pub fn check_framing<'a>(
    fields: impl Iterator<Item = (&'a str, &'a [u8])>,
    http10: bool,
    max_body: Option<u64>,
) -> Result<Framing, Refused> {
    let declared = declared_framing(fields, http10).map_err(|fault| match fault {
        FramingFault::Length => refused(400, "invalid-content-length"),
        FramingFault::LengthWithCoding => refused(400, "content-length-with-transfer-encoding"),
        FramingFault::CodingInHttp10 => refused(400, "transfer-encoding-in-http-1.0"),
        FramingFault::UnsupportedCoding => refused(501, "unsupported-transfer-coding"),
    })?;
    if declared.chunked {
        return Ok(Framing::chunked());
    }
    let length = declared.length.unwrap_or(0);
    if max_body.is_some_and(|max| length > max) {
        return Err(refused(413, "body-too-large"));
    }
    Ok(Framing::Length(length))
}

/// The one close rule (RFC 9112 §9.3), for requests and responses alike:
/// whether a message makes its connection's last — `Connection: close`,
/// or HTTP/1.0 (`http10`) without `keep-alive`. `connection`: the values
/// of its `Connection` fields.
pub fn closes_connection<'a>(http10: bool, connection: impl IntoIterator<Item = &'a [u8]>) -> bool {
    let mut keep_alive = false;
    for token in connection.into_iter().flat_map(tokens) {
        if token.eq_ignore_ascii_case(b"close") {
            return true;
        }
        keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
    }
    http10 && !keep_alive
}

/// Whether a response with `status` may carry a `Content-Length` (RFC
/// 9110 §8.6: a 1xx or a 204 never does, and HTTP/2 clients refuse one;
/// to HEAD and on a 304 it describes the resource). `Transfer-Encoding`
/// never goes on from a shard: each writer frames the body itself. The
/// same for HTTP/1 and HTTP/2 clients, on every transport.
pub fn length_allowed(status: u16) -> bool {
    !matches!(status, 100..=199 | 204)
}

/// The framing of a WebSocket handshake whose fields framed its body as
/// `body`: a handshake carries none, and after the switch of protocols
/// everything the client sends is the tunnel's.
pub fn check_handshake(body: Framing) -> Result<Framing, Refused> {
    match body {
        Framing::Length(0) => Ok(Framing::UntilClose),
        _ => Err(refused(400, "body-in-websocket-handshake")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_that_pingora_would_answer_itself_are_refused_here() {
        let check = |method, target, hosts: &[&str]| {
            check_authority(method, target, hosts.iter().map(|h| h.as_bytes()))
        };
        let bad = |code| Err(refused(400, code));
        assert_eq!(
            check("CONNECT", "a:443", &["a:443"]),
            Err(refused(405, "method-not-allowed"))
        );
        assert_eq!(check("GET", "/", &["a", "b"]), bad("duplicate-host"));
        assert_eq!(check("GET", "/", &["u@a"]), bad("invalid-host"));
        assert_eq!(check("GET", "http://u@a/", &["a"]), bad("invalid-host"));
        assert_eq!(check("GET", "HTTP://u:p@a", &[]), bad("invalid-host"));
        for target in ["a:443", "ftp://a/x", "x"] {
            assert_eq!(
                check("GET", target, &["a"]),
                bad("invalid-target"),
                "{target}"
            );
        }
        for (target, hosts) in [
            ("/", &["a"][..]),
            ("/p@th?q=a@b", &["a"]),
            ("http://a/?x=u@b", &["a"]),
            ("http://a/p@th", &["a"]),
            ("*", &["a"]),
            ("http://[::1]:80/", &["[::1]:80"]),
            ("/", &[]),
        ] {
            assert_eq!(check("GET", target, hosts), Ok(()), "{target}");
        }
    }

    #[test]
    fn host_names_are_bounded_as_rfc_1035_bounds_them() {
        let label = |n| "a".repeat(n);
        let name = |labels: usize, last: usize| {
            let mut parts = vec![label(63); labels];
            parts.push(label(last));
            parts.join(".")
        };
        // 3 labels of 63, a last one of 61, 3 dots: 253 bytes.
        let longest = name(3, 61);
        assert_eq!(longest.len(), 253);
        for ok in [
            longest.clone(),
            format!("{longest}:8080"),
            format!("{longest}."),
            label(63),
        ] {
            assert!(check_host(&ok).is_ok(), "{} bytes", ok.len());
        }
        for bad in [
            name(3, 62),
            format!("{}:8080", name(3, 62)),
            label(64),
            format!("{}.example", label(64)),
            label(4000),
        ] {
            assert_eq!(check_host(&bad), Err("invalid-host"), "{} bytes", bad.len());
        }
        let check =
            |target, host: &str| check_authority("GET", target, [host.as_bytes()].into_iter());
        assert!(check("/", &longest).is_ok());
        assert_eq!(
            check("/", &label(64)).map_err(|r| r.code),
            Err("invalid-host")
        );
        let absolute = format!("http://{}/", label(64));
        assert_eq!(
            check(&absolute, "a").map_err(|r| r.code),
            Err("invalid-host")
        );
        assert_eq!(host_name("[::1]:80"), "[::1]");
        assert_eq!(host_name("a.example:80"), "a.example");
        assert_eq!(host_name("a.example"), "a.example");
    }

    #[test]
    fn a_websocket_handshake_carries_no_body() {
        assert!(matches!(
            check_handshake(Framing::Length(0)),
            Ok(Framing::UntilClose)
        ));
        for body in [Framing::Length(45), Framing::chunked()] {
            assert_eq!(check_handshake(body).err().map(|r| r.status), Some(400));
        }
    }

    fn line(text: &str) -> Result<(), u16> {
        check_request_line(text.as_bytes()).map_err(|r| r.status)
    }

    #[test]
    fn request_lines_are_method_target_version_and_nothing_else() {
        assert_eq!(line("GET /a?b=c HTTP/1.1\r\nHost: a\r\n\r\n"), Ok(()));
        assert_eq!(line("\r\nGET / HTTP/1.0\r\n\r\n"), Ok(()));
        assert_eq!(
            line("GET /caf\u{e9} HTTP/1.1\r\n\r\n"),
            Ok(()),
            "obs-text, as nginx"
        );
        for bad in [
            "GET /a b HTTP/1.1\r\n\r\n",
            "GET  /a HTTP/1.1\r\n\r\n",
            "GET /a\tb HTTP/1.1\r\n\r\n",
            "GET /a\0b HTTP/1.1\r\n\r\n",
            "GET /a\x0bb HTTP/1.1\r\n\r\n",
            "GET /a\x0cb HTTP/1.1\r\n\r\n",
            "GET /a\x07b HTTP/1.1\r\n\r\n",
            "GET /a\x08b HTTP/1.1\r\n\r\n",
            "GET /a\x7fb HTTP/1.1\r\n\r\n",
            "GET /a\rb HTTP/1.1\r\n\r\n",
            "GET /a#b HTTP/1.1\r\n\r\n",
            "\r\n\r\nGET /a#b HTTP/1.1\r\n\r\n",
            "GET /a HTTP/1.1 x\r\n\r\n",
            "GET /a\r\n\r\n",
            "GET /a HTTX/1.1\r\n\r\n",
        ] {
            assert_eq!(line(bad), Err(400), "{bad:?}");
        }
        for unsupported in [
            "GET / HTTP/2.0\r\n\r\n",
            "GET / HTTP/1.2\r\n\r\n",
            "GET / HTTP/3\r\n\r\n",
        ] {
            assert_eq!(line(unsupported), Err(505), "{unsupported:?}");
        }
    }

    fn framing(fields: &[(&str, &str)], http10: bool) -> Result<(), u16> {
        check_framing(fields.iter().map(|(n, v)| (*n, v.as_bytes())), http10, None)
            .map(|_| ())
            .map_err(|r| r.status)
    }

    #[test]
    fn lengths_are_numbers_said_once_and_within_the_limit() {
        let check = |fields: &[(&str, &str)], max| {
            check_framing(fields.iter().map(|(n, v)| (*n, v.as_bytes())), false, max)
                .map_err(|r| r.status)
        };
        assert!(matches!(check(&[], None), Ok(Framing::Length(0))));
        assert!(matches!(
            check(&[("Content-Length", "5, 5")], None),
            Ok(Framing::Length(5))
        ));
        for bad in [
            "5, 6",
            "-1",
            "+5",
            "0x10",
            "",
            "5 5",
            "5,",
            " ",
            "99999999999999999999",
        ] {
            assert_eq!(
                check(&[("Content-Length", bad)], None).err(),
                Some(400),
                "{bad:?}"
            );
        }
        assert_eq!(
            check(&[("Content-Length", "5"), ("Content-Length", "6")], None).err(),
            Some(400)
        );
        assert!(matches!(
            check(&[("Content-Length", "5"), ("content-length", "5 ,5")], None),
            Ok(Framing::Length(5))
        ));
        assert_eq!(
            check(&[("Content-Length", "11")], Some(10)).err(),
            Some(413)
        );
        assert!(check(&[("Content-Length", "10")], Some(10)).is_ok());
        // A chunked body's size is only known as it arrives.
        assert!(check(&[("Transfer-Encoding", "chunked")], Some(10)).is_ok());
    }

    #[test]
    fn framing_is_chunked_alone_or_a_length() {
        assert_eq!(framing(&[("Content-Length", "5")], false), Ok(()));
        assert_eq!(framing(&[("Transfer-Encoding", "chunked")], false), Ok(()));
        assert_eq!(
            framing(&[("transfer-encoding", " Chunked ")], false),
            Ok(())
        );
        assert_eq!(
            framing(
                &[("Transfer-Encoding", "chunked"), ("Content-Length", "5")],
                false
            ),
            Err(400)
        );
        assert_eq!(framing(&[("Transfer-Encoding", "chunked")], true), Err(400));
        for coding in ["cow, chunked", "gzip", "chunked, chunked", "identity", ""] {
            assert_eq!(
                framing(&[("Transfer-Encoding", coding)], false),
                Err(501),
                "{coding:?}"
            );
        }
        assert_eq!(
            framing(
                &[
                    ("Transfer-Encoding", "gzip"),
                    ("Transfer-Encoding", "chunked")
                ],
                false
            ),
            Err(501)
        );
    }

    #[test]
    fn a_message_closes_its_connection_by_one_rule() {
        let closes = |http10, values: &[&str]| {
            closes_connection(http10, values.iter().map(|v| v.as_bytes()))
        };
        assert!(!closes(false, &[]));
        assert!(closes(false, &["Upgrade, Close"]));
        assert!(closes(false, &["keep-alive", "close"]));
        assert!(closes(true, &[]));
        assert!(!closes(true, &["x, Keep-Alive"]));
        assert!(closes(true, &["keep-alive, close"]));
    }
}
