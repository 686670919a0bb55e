//! Client request heads under limits. Pingora reads a request head with a
//! per-read timeout and a 1 MiB / 256-header ceiling, which a slowloris
//! client dribbling a byte at a time defeats. [`read_head`] reads each
//! HTTP/1 request head for the front end ([`super::frontend`]) — the whole
//! head within `limits.header_timeout_ms` of its first byte (408), at
//! most `max_header_bytes` and `max_headers` (431), an idle keep-alive
//! connection closed after `keepalive_timeout_ms` — and checks it against
//! the message rules (`pipeline::message`) before either transport sees it.

use super::pipeline::fields::websocket_handshake;
use super::pipeline::framing::Framing;
use super::pipeline::message::{
    check_authority, check_framing, check_handshake, check_request_line, HeadEnd, Refused,
};
use bytes::BytesMut;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use smallvec::SmallVec;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The limits a request head must respect.
#[derive(Clone, Copy, Debug)]
pub struct HeadLimits {
    pub header_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// How long a kept-alive connection may wait for its next request.
    pub keepalive_timeout: Duration,
    /// Largest request body (`None`: unlimited); a larger `Content-Length`
    /// is 413 at once.
    pub max_body_bytes: Option<u64>,
}

/// A whole request head at the start of a buffer.
#[derive(Clone, Debug)]
pub struct Head {
    /// Its length in bytes.
    pub len: usize,
    /// The framing of its body.
    pub body: Framing,
    /// Where its parts are, so that no transport parses it again.
    pub layout: Layout,
}

/// Where the parts of a request head are in its buffer (byte offsets).
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub method: Range<u32>,
    pub target: Range<u32>,
    pub http10: bool,
    /// Each field's name and value.
    pub fields: SmallVec<[(Range<u32>, Range<u32>); 16]>,
}

impl Layout {
    /// Parses the complete head at the start of `buf` (tests and fuzzing).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn parse(buf: &[u8]) -> Option<Layout> {
        let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; 256];
        let mut req = httparse::Request::new(&mut []);
        match req.parse_with_uninit_headers(buf, &mut slots) {
            Ok(httparse::Status::Complete(_)) => Some(Layout::of(buf, &req)),
            _ => None,
        }
    }

    /// The layout of a head httparse read from `buf`.
    fn of(buf: &[u8], req: &httparse::Request<'_, '_>) -> Layout {
        let at = |part: &[u8]| {
            let start = (part.as_ptr() as usize - buf.as_ptr() as usize) as u32;
            start..start + part.len() as u32
        };
        Layout {
            method: at(req.method.unwrap_or_default().as_bytes()),
            target: at(req.path.unwrap_or_default().as_bytes()),
            http10: req.version == Some(0),
            fields: req
                .headers
                .iter()
                .map(|h| (at(h.name.as_bytes()), at(h.value)))
                .collect(),
        }
    }
}

/// Why a head was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadError {
    /// The head did not complete in time: 408.
    Timeout,
    /// Too many bytes or too many fields: 431.
    TooLarge,
    /// Not a request line or framing RFC 9112 lets through (see
    /// `pipeline::message`): 400, 501 or 505, and the connection closes.
    Refused(Refused),
    /// The HTTP/2 connection preface (RFC 9113 §3.4): a client with prior
    /// knowledge, served as HTTP/2 where a connection may be (a plain
    /// connection's start), else 505 as any other version.
    Preface,
}

/// A refused head: why, and when its first byte came (for the log).
#[derive(Clone, Copy, Debug)]
pub struct HeadFailure {
    pub error: HeadError,
    pub began: std::time::Instant,
}

/// The least room a read of a request head is given.
pub(crate) const HEAD_READ: usize = 4096;

/// Reads one request head into `buf` (which may already hold bytes).
/// `Ok(None)`: the connection closed or idled out before a request began,
/// or the server is shutting down (`shutdown`, if given, turned true)
/// while it waited for one.
pub async fn read_head(
    stream: &mut Stream,
    buf: &mut BytesMut,
    limits: &HeadLimits,
    mut shutdown: Option<&mut ShutdownWatch>,
) -> Result<Option<Head>, HeadFailure> {
    let mut deadline =
        (!buf.is_empty()).then(|| tokio::time::Instant::now() + limits.header_timeout);
    // A byte came: the deadline is set if the head needs another read (one
    // that came whole, nearly every one, costs no clock read for it).
    let mut begun = false;
    let mut scan = Scan::default();
    loop {
        // A deadline set is the timeout after the head began (its first
        // bytes, give or take a parse of them); none set, it began now.
        let failed = move |error| {
            let began = deadline.map_or_else(std::time::Instant::now, |d| {
                (d - limits.header_timeout).into_std()
            });
            Err(HeadFailure { error, began })
        };
        if scan.due(buf, limits.max_header_bytes) {
            match parse(buf, limits) {
                Parsed::Complete(head) => return Ok(Some(head)),
                Parsed::Refused(refused) => return failed(HeadError::Refused(refused)),
                Parsed::Preface => return failed(HeadError::Preface),
                Parsed::TooLarge => return failed(HeadError::TooLarge),
                Parsed::Partial if buf.len() > limits.max_header_bytes => {
                    return failed(HeadError::TooLarge)
                }
                Parsed::Partial => {}
            }
        }
        if begun && deadline.is_none() {
            deadline = Some(tokio::time::Instant::now() + limits.header_timeout);
        }
        let wait = match (deadline, shutdown.as_deref_mut()) {
            (Some(d), _) => tokio::time::timeout_at(d, read_some(stream, buf)).await,
            (None, None) => {
                tokio::time::timeout(limits.keepalive_timeout, read_some(stream, buf)).await
            }
            // Idle between requests: closed at once when shutdown starts,
            // as Pingora closes its idle keep-alive connections.
            (None, Some(watch)) => {
                if *watch.borrow() {
                    return Ok(None);
                }
                let read = tokio::time::timeout(limits.keepalive_timeout, read_some(stream, buf));
                tokio::select! {
                    wait = read => wait,
                    _ = watch.changed() => return Ok(None),
                }
            }
        };
        match wait {
            Err(_) if deadline.is_some() => return failed(HeadError::Timeout),
            Err(_) => return Ok(None), // idle keep-alive: close quietly
            Ok(Err(_)) | Ok(Ok(0)) => return Ok(None),
            Ok(Ok(_)) => begun = true,
        }
    }
}

/// Reads what the client sends next into `buf`. Room to read into: 4 KiB
/// for a head's start, doubled while a longer head comes in. (1 KiB, as
/// nginx's first header buffer, split a head and its small body over two
/// reads: 1.5x the CPU per 1 KiB POST.) An empty `buf` holds no room while
/// the client is silent: the first bytes are read onto the stack (the
/// array lives only during a poll, not in the waiting future) and copied
/// into a buffer made when they came, so that a silent or idle connection
/// holds no read buffer (nor the block the last request's bytes shared).
async fn read_some(stream: &mut Stream, buf: &mut BytesMut) -> std::io::Result<usize> {
    use std::task::{ready, Poll};
    if buf.is_empty() {
        *buf = BytesMut::new();
        return std::future::poll_fn(|cx| {
            let mut scratch = [MaybeUninit::<u8>::uninit(); HEAD_READ];
            let mut read = tokio::io::ReadBuf::uninit(&mut scratch);
            ready!(std::pin::Pin::new(&mut *stream).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n > 0 {
                *buf = super::buffers::take(HEAD_READ);
                buf.extend_from_slice(read.filled());
            }
            Poll::Ready(Ok(n))
        })
        .await;
    }
    if buf.capacity() - buf.len() < HEAD_READ {
        buf.reserve(buf.len().max(HEAD_READ));
    }
    stream.read_buf(buf).await
}

// A parse's outcome, returned and matched at once, never kept: the size of
// a whole head's layout (on the stack, no allocation) is the point.
#[allow(clippy::large_enum_variant)]
enum Parsed {
    Complete(Head),
    Partial,
    TooLarge,
    /// Whole, and refused by the message rules (or not HTTP as httparse
    /// reads it: a field name with a space, an obs-fold, a bare CR; 400 as
    /// RFC 9112 §5 says).
    Refused(Refused),
    /// The start of the HTTP/2 connection preface.
    Preface,
}

/// How the HTTP/2 connection preface starts: the request line and blank
/// line an HTTP/1 reader sees of it (RFC 9113 §3.4).
const PREFACE_HEAD: &[u8] = b"PRI * HTTP/2.0\r\n\r\n";

/// A whole head httparse does not read.
const MALFORMED: Refused = Refused {
    status: 400,
    code: "bad-request",
};

/// Heads with up to this many fields are parsed with no allocation.
const STACK_HEADERS: usize = 128;

fn parse(buf: &[u8], limits: &HeadLimits) -> Parsed {
    if buf.starts_with(PREFACE_HEAD) {
        return Parsed::Preface;
    }
    // Not initialised: httparse writes the slots it fills, no more.
    let mut on_stack = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; STACK_HEADERS];
    let mut on_heap = Vec::new();
    let headers: &mut [MaybeUninit<httparse::Header<'_>>] = if limits.max_headers <= STACK_HEADERS {
        &mut on_stack[..limits.max_headers]
    } else {
        on_heap.resize_with(limits.max_headers, MaybeUninit::uninit);
        &mut on_heap
    };
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(buf, headers) {
        Ok(httparse::Status::Complete(len)) if len > limits.max_header_bytes => Parsed::TooLarge,
        Ok(httparse::Status::Complete(len)) => {
            let fields = req.headers.iter().map(|h| (h.name, h.value));
            let http10 = req.version == Some(0);
            let values = |name: &'static str| {
                req.headers
                    .iter()
                    .filter(move |h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| h.value)
            };
            let websocket = websocket_handshake(
                req.method.unwrap_or_default(),
                !http10,
                values("connection"),
                values("upgrade"),
            );
            match check_request_line(buf)
                .and_then(|()| {
                    let (method, target) =
                        (req.method.unwrap_or_default(), req.path.unwrap_or_default());
                    check_authority(method, target, values("host"))
                })
                .and_then(|()| check_framing(fields, http10, limits.max_body_bytes))
                .and_then(|body| match websocket {
                    true => check_handshake(body),
                    false => Ok(body),
                }) {
                Ok(body) => Parsed::Complete(Head {
                    len,
                    body,
                    layout: Layout::of(buf, &req),
                }),
                Err(refused) => Parsed::Refused(refused),
            }
        }
        Ok(httparse::Status::Partial) => Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => Parsed::TooLarge,
        // Refused only once whole (a space in the target, say): what the
        // client sends is read under the head limits all the same.
        Err(httparse::Error::Token | httparse::Error::Version) => match head_end(buf) {
            None => Parsed::Partial,
            Some(end) => {
                // The request line and the blank line are not fields.
                let fields = buf[..end].iter().filter(|b| **b == b'\n').count() - 2;
                if end > limits.max_header_bytes || fields > limits.max_headers {
                    Parsed::TooLarge
                } else if let Err(refused) = check_request_line(buf) {
                    // A space or control byte in the target.
                    Parsed::Refused(refused)
                } else {
                    Parsed::Refused(MALFORMED)
                }
            }
        },
        Err(_) => Parsed::Refused(MALFORMED),
    }
}

/// Where a head ends: just past its blank line (CRLF CRLF, or bare LFs).
fn head_end(buf: &[u8]) -> Option<usize> {
    HeadEnd::default().find(buf)
}

/// When to parse a head arriving in pieces: each byte is looked at once
/// however many reads the head takes (re-parsing it whole on each read
/// costs n²/2 for a head dribbled a byte per segment), and httparse runs
/// only when it may answer.
#[derive(Default)]
struct Scan {
    /// The search for the head's blank line.
    end: HeadEnd,
    /// The buffer's length when httparse last read it.
    parsed: usize,
}

impl Scan {
    /// Whether to parse `buf` (what it held at the last call, and more)
    /// now: its blank line came, or it outgrew `max` (431, or whatever
    /// else httparse sees), or it doubled since the last parse. The last
    /// rule answers a head httparse refuses before its end (a TLS hello
    /// on a plain port, a bad field name) at once, as before, for at most
    /// twice the bytes in parsing.
    fn due(&mut self, buf: &[u8], max: usize) -> bool {
        let due = !buf.is_empty()
            && (self.end.find(buf).is_some() || buf.len() > max || buf.len() >= 2 * self.parsed);
        if due {
            self.parsed = buf.len();
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_arriving_a_byte_at_a_time_ends_at_its_blank_line() {
        for head in [
            "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\nHost: a\n\n",
            "GET / HTTP/1.1\r\nHost: a\r\n\n",
            "GET / HTTP/1.1\nHost: a\n\r\n",
            "\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
            "\n\nGET / HTTP/1.1\n\n",
        ] {
            let bytes = format!("{head}GET /next HTTP/1.1\r\n\r\n").into_bytes();
            let mut scan = HeadEnd::default();
            for n in 0..head.len() {
                assert_eq!(scan.find(&bytes[..n]), None, "{head:?} at {n}");
            }
            assert_eq!(
                scan.find(&bytes[..head.len()]),
                Some(head.len()),
                "{head:?}"
            );
            assert_eq!(head_end(&bytes), Some(head.len()), "{head:?}");
        }
        assert_eq!(head_end(b"\r\n\r\n\r\n"), None, "empty lines are no head");
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n"), None);
    }

    #[test]
    fn a_head_dribbled_a_byte_at_a_time_is_parsed_a_few_times_only() {
        let head = format!("GET / HTTP/1.1\r\nX-Long: {}\r\n\r\n", "a".repeat(100_000));
        let (mut scan, mut parses, mut parsed, mut last) = (Scan::default(), 0, 0, 0);
        for n in 1..=head.len() {
            if scan.due(&head.as_bytes()[..n], 131_072) {
                (parses, parsed, last) = (parses + 1, parsed + n, n);
            }
        }
        assert!(parses <= 20, "{parses} parses");
        assert!(parsed <= 3 * head.len(), "{parsed} bytes parsed");
        assert_eq!(last, head.len(), "parsed once whole");
    }
}
