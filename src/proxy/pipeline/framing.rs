//! HTTP/1 body framing, tracked byte by byte for both directions: how far
//! into a body framed by `Content-Length`, by chunks (with extensions and
//! trailers) or by the close a stream is, and where the body ends — so the
//! bytes after it are known to belong to the next message.

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
    /// Reading the size's hex digits.
    Size {
        value: u64,
        digits: u8,
    },
    /// Whitespace after the size.
    SizeSpace {
        value: u64,
    },
    /// After the size: an extension, up to CR.
    Extension {
        value: u64,
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

impl ChunkState {
    /// The state after one more byte (never called in `Data` or `Done`).
    fn step(self, b: u8) -> Result<ChunkState, BadFraming> {
        Ok(match self {
            // Leading zeros are digits like any other (RFC 9112 §7.1: a
            // chunk size is 1*HEXDIG); only the value is bounded, at 2^60.
            ChunkState::Size { value, digits } => match b {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' if value >> 56 == 0 => {
                    let digit = u64::from((b as char).to_digit(16).ok_or(BadFraming)?);
                    ChunkState::Size {
                        value: value * 16 + digit,
                        digits: digits.saturating_add(1),
                    }
                }
                b';' if digits > 0 => ChunkState::Extension { value },
                b' ' | b'\t' if digits > 0 => ChunkState::SizeSpace { value },
                b'\r' if digits > 0 => ChunkState::SizeLf { value },
                _ => return Err(BadFraming),
            },
            // RFC 9112 §7.1.1: only whitespace before `;` or the CRLF, so
            // "5 6" is not a size 5 with an extension.
            ChunkState::SizeSpace { value } => match b {
                b' ' | b'\t' => ChunkState::SizeSpace { value },
                b';' => ChunkState::Extension { value },
                b'\r' => ChunkState::SizeLf { value },
                _ => return Err(BadFraming),
            },
            ChunkState::Extension { value } => match b {
                b'\r' => ChunkState::SizeLf { value },
                b'\n' => return Err(BadFraming),
                _ => ChunkState::Extension { value },
            },
            ChunkState::SizeLf { value: 0 } if b == b'\n' => ChunkState::TrailerStart,
            ChunkState::SizeLf { value } if b == b'\n' => ChunkState::Data { left: value },
            ChunkState::DataCr if b == b'\r' => ChunkState::DataLf,
            ChunkState::DataLf if b == b'\n' => ChunkState::Size {
                value: 0,
                digits: 0,
            },
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
        Framing::Chunked(ChunkState::Size {
            value: 0,
            digits: 0,
        })
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
}
