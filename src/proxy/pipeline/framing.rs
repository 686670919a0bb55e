//! HTTP/1 body framing, tracked byte by byte for both directions: how far
//! into a body framed by `Content-Length`, by chunks (with extensions and
//! trailers) or by the close a stream is, and where the body ends — so the
//! bytes after it are known to belong to the next message.

use super::fields::{is_hop_by_hop, same_field};
use super::message::Refused;
use bytes::BufMut;
use std::ops::Range;

/// How far into a body we are.
#[derive(Clone, Debug)]
pub enum Framing {
    Length(u64),
    Chunked(ChunkState),
    UntilClose,
}

/// A chunked body's parser state, fed the bytes as they are forwarded.
#[derive(Clone, Copy, Debug)]
pub enum ChunkState {
    /// Reading the size's hex digits (`line`: the size line's bytes so
    /// far, here all digits).
    Size {
        value: u64,
        line: u16,
    },
    /// Whitespace after the size.
    SizeSpace {
        value: u64,
        line: u16,
    },
    /// After the size: an extension, up to CR.
    Extension {
        value: u64,
        line: u16,
    },
    /// Expecting the LF that ends the size line.
    SizeLf {
        value: u64,
    },
    Data {
        left: u64,
    },
    DataCr,
    DataLf,
    /// After the last chunk: at the start of a trailer line (or the end).
    TrailerStart,
    TrailerLine,
    TrailerLf,
    EndLf,
    Done,
}

/// The longest chunk-size line taken, its size, whitespace and extensions
/// (CRLF aside): an endless one (zeros, blanks, an extension) is refused,
/// not read forever. nginx's own bound is its buffer, about as long.
pub const MAX_SIZE_LINE: u16 = 4096;

impl ChunkState {
    /// The state after one more byte (never called in `Data` or `Done`).
    fn step(self, b: u8) -> Result<ChunkState, BadFraming> {
        if let ChunkState::Size { line, .. }
        | ChunkState::SizeSpace { line, .. }
        | ChunkState::Extension { line, .. } = self
        {
            if line >= MAX_SIZE_LINE && b != b'\r' {
                return Err(BadFraming);
            }
        }
        Ok(match self {
            // Leading zeros are digits like any other (RFC 9112 §7.1: a
            // chunk size is 1*HEXDIG); the value is bounded, at 2^60, and
            // the line.
            ChunkState::Size { value, line } => match b {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' if value >> 56 == 0 => {
                    let digit = u64::from((b as char).to_digit(16).ok_or(BadFraming)?);
                    ChunkState::Size {
                        value: value * 16 + digit,
                        line: line + 1,
                    }
                }
                b';' if line > 0 => ChunkState::Extension {
                    value,
                    line: line + 1,
                },
                b' ' | b'\t' if line > 0 => ChunkState::SizeSpace {
                    value,
                    line: line + 1,
                },
                b'\r' if line > 0 => ChunkState::SizeLf { value },
                _ => return Err(BadFraming),
            },
            // RFC 9112 §7.1.1: only whitespace before `;` or the CRLF, so
            // "5 6" is not a size 5 with an extension.
            ChunkState::SizeSpace { value, line } => match b {
                b' ' | b'\t' => ChunkState::SizeSpace {
                    value,
                    line: line + 1,
                },
                b';' => ChunkState::Extension {
                    value,
                    line: line + 1,
                },
                b'\r' => ChunkState::SizeLf { value },
                _ => return Err(BadFraming),
            },
            ChunkState::Extension { value, line } => match b {
                b'\r' => ChunkState::SizeLf { value },
                b'\n' => return Err(BadFraming),
                _ => ChunkState::Extension {
                    value,
                    line: line + 1,
                },
            },
            ChunkState::SizeLf { value: 0 } if b == b'\n' => ChunkState::TrailerStart,
            ChunkState::SizeLf { value } if b == b'\n' => ChunkState::Data { left: value },
            ChunkState::DataCr if b == b'\r' => ChunkState::DataLf,
            ChunkState::DataLf if b == b'\n' => ChunkState::Size { value: 0, line: 0 },
            ChunkState::TrailerStart if b == b'\r' => ChunkState::EndLf,
            ChunkState::TrailerStart | ChunkState::TrailerLine if b != b'\n' && b != b'\r' => {
                ChunkState::TrailerLine
            }
            ChunkState::TrailerLine if b == b'\r' => ChunkState::TrailerLf,
            ChunkState::TrailerLf if b == b'\n' => ChunkState::TrailerStart,
            ChunkState::EndLf if b == b'\n' => ChunkState::Done,
            _ => return Err(BadFraming),
        })
    }
}

/// A chunked body that breaks its framing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadFraming;

impl Framing {
    /// A chunked body, before its first byte.
    pub fn chunked() -> Framing {
        Framing::Chunked(ChunkState::Size { value: 0, line: 0 })
    }

    pub fn is_done(&self) -> bool {
        match self {
            Framing::Length(n) => *n == 0,
            Framing::Chunked(ChunkState::Done) => true,
            _ => false,
        }
    }

    /// Advances over `bytes`; returns how many belong to the body (the
    /// rest, if any, is beyond its end). A malformed chunk stream is an
    /// error.
    pub fn consume(&mut self, bytes: &[u8]) -> Result<usize, BadFraming> {
        self.decode(bytes, |_| {})
    }

    /// As [`Framing::consume`], handing `part` what the bytes hold: the
    /// body's content (chunk data, without sizes or trailers — what a
    /// message framed otherwise carries), each chunk's announced size
    /// before its data, and the trailer section's field lines.
    pub fn decode(
        &mut self,
        bytes: &[u8],
        mut part: impl FnMut(Part),
    ) -> Result<usize, BadFraming> {
        match self {
            Framing::Length(left) => {
                let take = (*left).min(bytes.len() as u64);
                *left -= take;
                if take > 0 {
                    part(Part::Data(0..take as usize));
                }
                Ok(take as usize)
            }
            Framing::UntilClose => {
                if !bytes.is_empty() {
                    part(Part::Data(0..bytes.len()));
                }
                Ok(bytes.len())
            }
            Framing::Chunked(state) => {
                let mut at = 0;
                // Where the trailer bytes being stepped through began.
                let mut trailer: Option<usize> = None;
                while at < bytes.len() {
                    *state = match *state {
                        ChunkState::Done => break,
                        // Chunk data is skipped over, not stepped through.
                        ChunkState::Data { left } => {
                            let take = left.min((bytes.len() - at) as u64);
                            part(Part::Data(at..at + take as usize));
                            at += take as usize;
                            match left - take {
                                0 => ChunkState::DataCr,
                                left => ChunkState::Data { left },
                            }
                        }
                        other => {
                            let b = bytes[at];
                            let in_trailer = match other {
                                ChunkState::TrailerLine | ChunkState::TrailerLf => true,
                                // Its CR starts the final CRLF instead.
                                ChunkState::TrailerStart => b != b'\r',
                                _ => false,
                            };
                            match (in_trailer, trailer) {
                                (true, None) => trailer = Some(at),
                                (false, Some(start)) => {
                                    part(Part::Trailer(start..at));
                                    trailer = None;
                                }
                                _ => {}
                            }
                            at += 1;
                            let next = other.step(b)?;
                            if let (ChunkState::SizeLf { .. }, ChunkState::Data { left }) =
                                (other, next)
                            {
                                part(Part::Chunk(left));
                            }
                            next
                        }
                    };
                }
                if let Some(start) = trailer {
                    part(Part::Trailer(start..at));
                }
                Ok(at)
            }
        }
    }
}

impl Framing {
    /// Checks the start of a request body already in hand (`bytes`, read
    /// with the head), before any shard hears of the request, as nginx
    /// does: chunks that break their framing (a size that overflows
    /// included) are 400; sizes that announce more than `max_body` —
    /// those whose lines ended and the one still being read, which only
    /// grows — are 413. What lies past the body is not looked at.
    pub fn check_start(&self, bytes: &[u8], max_body: Option<u64>) -> Result<(), Refused> {
        let mut framing = self.clone();
        let mut announced = 0u64;
        framing
            .decode(bytes, |part| {
                if let Part::Chunk(size) = part {
                    announced = announced.saturating_add(size);
                }
            })
            .map_err(|_| Refused {
                status: 400,
                code: "invalid-chunked-body",
            })?;
        let pending = match framing {
            Framing::Chunked(
                ChunkState::Size { value, .. }
                | ChunkState::SizeSpace { value, .. }
                | ChunkState::Extension { value, .. }
                | ChunkState::SizeLf { value },
            ) => value,
            _ => 0,
        };
        if max_body.is_some_and(|max| announced.saturating_add(pending) > max) {
            return Err(Refused {
                status: 413,
                code: "body-too-large",
            });
        }
        Ok(())
    }
}

/// Fields no trailer may carry (RFC 9110 §6.5.1), whichever way it goes:
/// framing, routing, request modifiers, authentication, response control
/// and content metadata. A framework that merges trailers into the head's
/// fields would otherwise read them as the head's. (Hop-by-hop fields go
/// too, and the caller's own.)
const NOT_IN_TRAILERS: &[&str] = &[
    "content-length",
    "host",
    "expect",
    "max-forwards",
    "range",
    "cache-control",
    "pragma",
    "authorization",
    "www-authenticate",
    "cookie",
    "set-cookie",
    "age",
    "date",
    "expires",
    "location",
    "retry-after",
    "vary",
    "content-type",
    "content-encoding",
    "content-range",
];

/// The one trailer rule, for request and response trailers on every
/// transport: the fields of a trailer section (`block`: its field lines
/// with their CRLFs, as [`Part::Trailer`] hands them) that may go on.
/// Each line must be a field line as a head's are (a token name, a value
/// without CR, LF or NUL, no line folding): a section with any other line
/// passes nothing, so no line ever goes on as it came. `refused`: the
/// caller's own fields besides [`NOT_IN_TRAILERS`] and hop-by-hop ones.
pub fn trailer_fields(block: &[u8], refused: impl Fn(&str) -> bool) -> Vec<(&str, &[u8])> {
    // httparse reads a section ended by an empty line: the block's own
    // lines are what it checks.
    let mut ended = Vec::with_capacity(block.len() + 2);
    ended.extend_from_slice(block);
    ended.extend_from_slice(b"\r\n");
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let Ok(httparse::Status::Complete((len, fields))) = httparse::parse_headers(&ended, &mut slots)
    else {
        return Vec::new();
    };
    if len != ended.len() {
        return Vec::new();
    }
    let allowed = |name: &str| {
        !is_hop_by_hop(name)
            && !NOT_IN_TRAILERS.iter().any(|f| same_field(name, f))
            && !refused(name)
    };
    // The ranges of `ended` are those of `block`: it is a copy.
    let of_block = |part: &[u8]| {
        let start = part.as_ptr() as usize - ended.as_ptr() as usize;
        &block[start..start + part.len()]
    };
    (fields.iter())
        .filter(|field| allowed(field.name))
        .filter_map(|field| {
            let name = std::str::from_utf8(of_block(field.name.as_bytes())).ok()?;
            Some((name, of_block(field.value)))
        })
        .collect()
}

/// A trailer section as HTTP/2 (or HTTP/3) trailers: the fields
/// [`trailer_fields`] lets through (with no caller's own refused); one
/// the `http` crate cannot hold is left out, not the section. None when
/// nothing is left: the body then simply ends.
pub fn trailer_map(block: &[u8]) -> Option<http::HeaderMap> {
    let mut map = http::HeaderMap::new();
    for (name, value) in trailer_fields(block, |_| false) {
        let (Ok(name), Ok(value)) = (
            crate::wire::fields::field_name(name.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) else {
            continue;
        };
        map.append(name, value);
    }
    (!map.is_empty()).then_some(map)
}

/// The one chunk encoder (the decoder's counterpart), for every body
/// shardgate writes in chunks: one chunk of `len` bytes made of `parts`
/// (nothing if empty: an empty chunk would be the last one).
pub fn put_chunk<'a>(out: &mut impl BufMut, parts: impl IntoIterator<Item = &'a [u8]>, len: usize) {
    if len == 0 {
        return;
    }
    put_chunk_size(out, len);
    for part in parts {
        out.put_slice(part);
    }
    out.put_slice(b"\r\n");
}

/// A chunk's size line (`len` in hex, then CRLF), without an allocation:
/// [`put_chunk`]'s, and the start of a chunk whose data is sent apart.
pub fn put_chunk_size(out: &mut impl BufMut, len: usize) {
    let mut line = [0u8; 2 * std::mem::size_of::<usize>() + 2];
    let mut at = line.len() - 2;
    line[at..].copy_from_slice(b"\r\n");
    let mut rest = len;
    loop {
        at -= 1;
        line[at] = b"0123456789abcdef"[rest & 15];
        rest >>= 4;
        if rest == 0 {
            break;
        }
    }
    out.put_slice(&line[at..]);
}

/// The last chunk, with trailer `fields` (as [`trailer_fields`] let
/// them through), and the end of the body.
pub fn put_last_chunk(out: &mut impl BufMut, fields: &[(&str, &[u8])]) {
    out.put_slice(b"0\r\n");
    for (name, value) in fields {
        for part in [name.as_bytes(), b": ", value, b"\r\n"] {
            out.put_slice(part);
        }
    }
    out.put_slice(b"\r\n");
}

/// What a stretch of body bytes holds (see [`Framing::decode`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// Content: chunk data, or the bytes of a body framed otherwise.
    Data(Range<usize>),
    /// A chunk announced this many bytes of data (sent before them).
    Chunk(u64),
    /// Bytes of the trailer section after the last chunk: whole field
    /// lines with their CRLFs once the body is done.
    Trailer(Range<usize>),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked() -> Framing {
        Framing::chunked()
    }

    #[test]
    fn chunked_bodies_end_where_their_framing_says() {
        let body = b"3;x=1\r\nabc\r\n10 \t;y\r\n0123456789abcdef\r\n0\r\nX-T: 1\r\n\r\nEXTRA";
        let end = body.len() - b"EXTRA".len();
        let mut f = chunked();
        assert_eq!(f.consume(body), Ok(end));
        assert!(f.is_done());
        // Fed one byte at a time, the same.
        let mut f = chunked();
        let mut total = 0;
        for b in body.iter() {
            total += f.consume(std::slice::from_ref(b)).unwrap();
            if f.is_done() {
                break;
            }
        }
        assert_eq!(total, end);
        // Split inside a chunk's data.
        let mut f = chunked();
        assert_eq!(f.consume(&body[..20]), Ok(20));
        assert_eq!(f.consume(&body[20..]), Ok(end - 20));
        assert!(f.is_done());
    }

    #[test]
    fn chunk_data_is_told_apart_from_its_framing() {
        let mut framing = chunked();
        let wire = b"5;ext=1\r\nhello\r\n3\r\n, w\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let mut content = Vec::new();
        let mut trailer = Vec::new();
        let used = framing.decode(wire, |p| match p {
            Part::Data(r) => content.extend_from_slice(&wire[r]),
            Part::Trailer(r) => trailer.extend_from_slice(&wire[r]),
            Part::Chunk(_) => {}
        });
        assert_eq!(used, Ok(wire.len() - 4));
        assert_eq!(content, b"hello, w");
        assert_eq!(trailer, b"Trailer: x\r\n");
        assert!(framing.is_done());
        // Split anywhere, the content, sizes and trailers are the same.
        for cut in 1..wire.len() - 4 {
            let (mut framing, mut content, mut trailer) = (chunked(), Vec::new(), Vec::new());
            let mut sizes = Vec::new();
            for piece in [&wire[..cut], &wire[cut..]] {
                let _ = framing.decode(piece, |p| match p {
                    Part::Data(r) => content.extend_from_slice(&piece[r]),
                    Part::Trailer(r) => trailer.extend_from_slice(&piece[r]),
                    Part::Chunk(n) => sizes.push(n),
                });
            }
            assert_eq!(content, b"hello, w", "cut at {cut}");
            assert_eq!(trailer, b"Trailer: x\r\n", "cut at {cut}");
            assert_eq!(sizes, vec![5, 3], "cut at {cut}");
        }
        let mut length = Framing::Length(3);
        let mut parts = Vec::new();
        assert_eq!(length.decode(b"abcdef", |p| parts.push(p)), Ok(3));
        assert_eq!(parts, vec![Part::Data(0..3)]);
    }

    #[test]
    fn chunk_sizes_are_written_in_hex_as_format_writes_them() {
        for len in [1, 9, 10, 15, 16, 255, 4096, 65_535, 1 << 40, usize::MAX] {
            let mut out = Vec::new();
            put_chunk_size(&mut out, len);
            assert_eq!(out, format!("{len:x}\r\n").into_bytes());
        }
        let mut out = Vec::new();
        put_chunk(&mut out, [&b"ab"[..], b"c"], 3);
        assert_eq!(out, b"3\r\nabc\r\n");
    }

    #[test]
    fn leading_zeros_are_part_of_a_chunk_size() {
        let body = b"0000000000000000000000000003\r\nabc\r\n00000\r\n\r\n";
        let mut f = chunked();
        assert_eq!(f.consume(body), Ok(body.len()));
        assert!(f.is_done());
        // The largest size still taken: 15 hex digits after the zeros.
        let mut f = chunked();
        assert!(f.consume(b"000fffffffffffffff\r\n").is_ok());
    }

    #[test]
    fn a_size_line_is_bounded_whatever_fills_it() {
        let longest = usize::from(MAX_SIZE_LINE);
        let zeros = format!("{}3\r\nabc\r\n0\r\n\r\n", "0".repeat(longest - 1));
        let mut f = chunked();
        assert_eq!(f.consume(zeros.as_bytes()), Ok(zeros.len()));
        assert!(f.is_done());
        for endless in [
            format!("{}3\r\n", "0".repeat(longest)),
            format!("3;{}\r\n", "x".repeat(longest)),
            format!("3{}\r\n", " ".repeat(longest)),
        ] {
            assert_eq!(chunked().consume(endless.as_bytes()), Err(BadFraming));
        }
    }

    #[test]
    fn malformed_chunks_are_errors() {
        for bad in [
            &b"zz\r\n"[..],
            b"3\nabc",
            b"3\r\nabcX\r\n",
            b"FFFFFFFFFFFFFFFF1\r\n",
            b"1000000000000000\r\n",
            b"5 6\r\nhello\r\n",
            b"5 x;a=b\r\nhello\r\n",
            b"\r\n",
            b"0\r\n\n",
        ] {
            assert!(
                chunked().consume(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_body_start_in_hand_is_checked_before_any_shard_hears_of_it() {
        let status = |bytes: &[u8], max| chunked().check_start(bytes, max).map_err(|r| r.status);
        assert_eq!(status(b"5\r\nhel", Some(5)), Ok(()));
        assert_eq!(status(b"", Some(5)), Ok(()));
        assert_eq!(status(b"zz\r\n", None), Err(400));
        assert_eq!(status(b"10000000000000000\r\n", None), Err(400), "2^64");
        assert_eq!(status(b"3\r\nabc\r\n3\r\n", Some(5)), Err(413));
        assert_eq!(status(b"100000400\r\n", Some(1024)), Err(413), "2^32 past");
        assert_eq!(
            status(b"FFFFF", Some(1024)),
            Err(413),
            "a size still coming"
        );
        assert_eq!(Framing::Length(9).check_start(b"x", Some(1)), Ok(()));
    }

    #[test]
    fn trailers_pass_as_valid_fields_a_trailer_may_carry() {
        let names = |block: &[u8]| {
            trailer_fields(block, |name| name.eq_ignore_ascii_case("x-tenant-id"))
                .into_iter()
                .map(|(n, v)| format!("{n}={}", String::from_utf8_lossy(v)))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(b"X-Sum: 1\r\ngrpc-status: 0\r\nContent-Length: 9\r\nSet-Cookie: a=b\r\nX-Tenant-Id: evil\r\nConnection: x\r\nContent_Type: a\r\n"),
            ["X-Sum=1", "grpc-status=0"]
        );
        assert!(names(b"").is_empty());
        for malformed in [
            &b"X-Sum: 1\r\nno colon here\r\n"[..],
            b"X-Sum: 1\r\n folded\r\n",
            b"X Sum: 1\r\n",
            b"X-Sum: a\0b\r\n",
            b"X-Sum: 1\r\n\r\nHTTP/1.1 200 OK\r\n",
        ] {
            assert!(names(malformed).is_empty(), "{malformed:?}");
        }
    }
}
