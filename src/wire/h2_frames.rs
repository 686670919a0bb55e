//! An HTTP/2 peer's frames, watched on the bytes read from it (a client's
//! connection and a shard's alike): a peer that sends far more frames
//! that carry nothing for a request than frames that do is flooding, and
//! its connection is cut off (nginx's "http2 flood detected", Envoy's
//! limits on inbound control frames). The `h2` crate answers a PING or a
//! SETTINGS one at a time, so a flood's memory is bounded already; its
//! cost in CPU, frame by frame, is what this bounds.
//!
//! Counted as carrying nothing: PING and SETTINGS (not their
//! acknowledgements), RST_STREAM, PRIORITY, frames of unknown types, and
//! DATA that is empty (not ending its stream) or small enough to be all
//! padding. Counted as carrying something: HEADERS, CONTINUATION and any
//! other DATA. Neither: acknowledgements, WINDOW_UPDATE (it follows what
//! the gateway sends) and GOAWAY (it ends the connection anyway).

/// Frames carrying nothing that any peer may send.
pub const FREE_IDLE_FRAMES: u64 = 10_000;

/// Frames carrying nothing that each frame carrying something allows on
/// top of [`FREE_IDLE_FRAMES`] (nginx allows 8 bytes of frames per byte
/// of payload).
pub const IDLE_PER_USEFUL: u64 = 8;

/// The client connection preface (RFC 9113 §3.4), before a client's frames.
pub const PREFACE_LEN: usize = 24;

const FRAME_HEAD: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const PADDED: u8 = 0x8;
/// A padded frame's padding at most: its length byte and 255 bytes.
const MOST_PADDING: usize = 256;

/// The peer has flooded the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flood {
    pub idle: u64,
    pub useful: u64,
}

impl std::fmt::Display for Flood {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "an HTTP/2 flood: {} frames carrying nothing against {} carrying something",
            self.idle, self.useful
        )
    }
}

impl From<Flood> for std::io::Error {
    fn from(flood: Flood) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, flood.to_string())
    }
}

/// What a peer has sent so far: where the stream of bytes stands in its
/// frames, and the two counts.
#[derive(Debug, Clone, Default)]
pub struct FrameWatch {
    /// Bytes still to pass before the next frame's head (a payload's, or
    /// the preface's).
    skip: usize,
    head: [u8; FRAME_HEAD],
    /// Bytes of the next frame's head seen so far.
    have: usize,
    idle: u64,
    useful: u64,
}

impl FrameWatch {
    /// A client's bytes: the preface, then frames.
    pub fn of_client() -> FrameWatch {
        FrameWatch {
            skip: PREFACE_LEN,
            ..FrameWatch::default()
        }
    }

    /// A server's bytes: frames from the first.
    pub fn of_server() -> FrameWatch {
        FrameWatch::default()
    }

    /// Watches the next `bytes` the peer sent. `Err` once it flooded (and
    /// on every call after).
    pub fn read(&mut self, mut bytes: &[u8]) -> Result<(), Flood> {
        self.check()?;
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (FRAME_HEAD - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == FRAME_HEAD {
                self.have = 0;
                let [l0, l1, l2, kind, flags, ..] = self.head;
                let length = u32::from_be_bytes([0, l0, l1, l2]) as usize;
                self.skip = length;
                self.count(kind, flags, length);
                self.check()?;
            }
        }
        Ok(())
    }

    fn count(&mut self, kind: u8, flags: u8, length: usize) {
        let idle = match kind {
            DATA if flags & END_STREAM != 0 => false,
            DATA if flags & PADDED != 0 => length <= MOST_PADDING,
            DATA => length == 0,
            HEADERS | CONTINUATION | PUSH_PROMISE => false,
            PING | SETTINGS if flags & ACK != 0 => return,
            WINDOW_UPDATE | GOAWAY => return,
            PING | SETTINGS | RST_STREAM | PRIORITY => true,
            _ => true,
        };
        if idle {
            self.idle += 1;
        } else {
            self.useful += 1;
        }
    }

    fn check(&self) -> Result<(), Flood> {
        let allowed = FREE_IDLE_FRAMES.saturating_add(self.useful.saturating_mul(IDLE_PER_USEFUL));
        match self.idle > allowed {
            true => Err(Flood {
                idle: self.idle,
                useful: self.useful,
            }),
            false => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut out = len.to_be_bytes()[1..].to_vec();
        out.extend_from_slice(&[kind, flags, 0, 0, 0, 1]);
        out.extend_from_slice(payload);
        out
    }

    fn pings(n: usize) -> Vec<u8> {
        frame(PING, 0, b"12345678").repeat(n)
    }

    #[test]
    fn a_ping_flood_is_cut_off_at_the_free_allowance() {
        let mut watch = FrameWatch::of_server();
        let free = FREE_IDLE_FRAMES as usize;
        assert_eq!(watch.read(&pings(free)), Ok(()));
        let flood = watch.read(&pings(1)).expect_err("one more is a flood");
        assert_eq!((flood.idle, flood.useful), (FREE_IDLE_FRAMES + 1, 0));
        assert!(watch.read(&[]).is_err(), "and stays one");
    }

    #[test]
    fn frames_split_anywhere_are_counted_the_same() {
        let mut bytes = frame(HEADERS, 0x4, b"\x88").repeat(3);
        bytes.extend(frame(SETTINGS, 0, &[0, 4, 0, 0, 0xff, 0xff]).repeat(5));
        bytes.extend(frame(DATA, 0, b"hello"));
        bytes.extend(frame(PING, ACK, b"12345678"));
        for step in 1..bytes.len() {
            let mut watch = FrameWatch::of_server();
            for piece in bytes.chunks(step) {
                assert_eq!(watch.read(piece), Ok(()));
            }
            assert_eq!(
                (watch.idle, watch.useful, watch.have, watch.skip),
                (5, 4, 0, 0)
            );
        }
    }

    #[test]
    fn a_clients_preface_is_passed_over() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        assert_eq!(bytes.len(), PREFACE_LEN);
        bytes.extend(frame(SETTINGS, 0, &[]));
        bytes.extend(frame(HEADERS, 0x5, b"\x82"));
        let mut watch = FrameWatch::of_client();
        assert_eq!(watch.read(&bytes), Ok(()));
        assert_eq!((watch.idle, watch.useful), (1, 1));
    }

    #[test]
    fn what_counts_as_carrying_nothing() {
        let cases: [(Vec<u8>, Option<bool>); 12] = [
            (frame(DATA, 0, b""), Some(true)),
            (frame(DATA, END_STREAM, b""), Some(false)),
            (frame(DATA, 0, b"x"), Some(false)),
            (frame(DATA, PADDED, &[255; 256]), Some(true)),
            (frame(DATA, PADDED, &[0; 257]), Some(false)),
            (frame(HEADERS, 0, b"\x88"), Some(false)),
            (frame(CONTINUATION, 0, b"\x88"), Some(false)),
            (frame(PING, ACK, b"12345678"), None),
            (frame(SETTINGS, ACK, b""), None),
            (frame(WINDOW_UPDATE, 0, &[0, 0, 0, 1]), None),
            (frame(RST_STREAM, 0, &[0, 0, 0, 8]), Some(true)),
            (frame(0xfa, 0, b"unknown"), Some(true)),
        ];
        for (bytes, idle) in cases {
            let mut watch = FrameWatch::of_server();
            assert_eq!(watch.read(&bytes), Ok(()));
            let counted = match (watch.idle, watch.useful) {
                (0, 0) => None,
                (1, 0) => Some(true),
                (0, 1) => Some(false),
                other => panic!("{other:?}"),
            };
            assert_eq!(counted, idle, "{bytes:?}");
        }
    }

    #[test]
    fn frames_carrying_something_allow_more_of_those_that_do_not() {
        let mut watch = FrameWatch::of_server();
        let mut bytes = frame(HEADERS, 0x4, b"\x88").repeat(10);
        bytes.extend(pings(FREE_IDLE_FRAMES as usize + 80));
        assert_eq!(watch.read(&bytes), Ok(()));
        assert!(watch.read(&pings(1)).is_err());
    }

    #[test]
    fn a_large_payload_is_passed_over_not_read_as_frames() {
        // A DATA frame whose payload looks like twenty thousand PINGs.
        let mut watch = FrameWatch::of_server();
        let mut bytes = frame(DATA, 0, &pings(FREE_IDLE_FRAMES as usize * 2));
        bytes.extend(frame(DATA, END_STREAM, b""));
        assert_eq!(watch.read(&bytes), Ok(()));
        assert_eq!((watch.idle, watch.useful), (0, 2));
    }
}
