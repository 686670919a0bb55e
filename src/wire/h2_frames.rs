//! An HTTP/2 peer's frames, watched on the bytes read from it (a client's
//! connection and a shard's alike): a peer that sends far more frames
//! that carry nothing for a request than frames that do is flooding, and
//! its connection is cut off (nginx's "http2 flood detected", Envoy's
//! limits on inbound control frames). The `h2` crate answers a PING or a
//! SETTINGS one at a time, so a flood's memory is bounded already; its
//! cost in CPU, frame by frame, is what this bounds.
//!
//! Counted as carrying nothing: PING and SETTINGS (and their
//! acknowledgements), RST_STREAM, PRIORITY, GOAWAY, frames of unknown
//! types, and DATA that carries no data (padding at most) without ending
//! its stream. Counted as carrying something: HEADERS, CONTINUATION and
//! any other DATA. Not counted: WINDOW_UPDATE, which a peer sends for
//! the gateway's own DATA (not seen here; a flood of them costs the h2
//! crate a window's arithmetic per frame).

use std::time::Instant;

/// Frames carrying nothing that any peer may send.
pub const FREE_IDLE_FRAMES: u64 = 10_000;

/// Frames carrying nothing that each frame carrying something allows on
/// top of [`FREE_IDLE_FRAMES`].
pub const IDLE_PER_USEFUL: u64 = 8;

/// Frames carrying nothing allowed for each second the connection has been
/// open, on top: a long-lived connection's keep-alive PINGs, or a shard
/// refusing streams now and then, never add up to a flood.
pub const IDLE_PER_SECOND: u64 = 100;

/// The client connection preface (RFC 9113 §3.4), before a client's frames.
pub const PREFACE_LEN: usize = 24;

const FRAME_HEAD: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const PADDED: u8 = 0x8;

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
#[derive(Debug, Clone)]
pub struct FrameWatch {
    /// Bytes still to pass before the next frame's head (a payload's, or
    /// the preface's).
    skip: usize,
    head: [u8; FRAME_HEAD],
    /// Bytes of the next frame's head seen so far.
    have: usize,
    /// A padded DATA frame's length, its pad length (the payload's first
    /// byte) not seen yet: whether it carries anything is told then.
    padded: Option<usize>,
    idle: u64,
    useful: u64,
    /// When the connection opened: the allowance grows with its age.
    opened: Instant,
}

impl FrameWatch {
    /// A client's bytes: the preface, then frames.
    pub fn of_client(opened: Instant) -> FrameWatch {
        FrameWatch {
            skip: PREFACE_LEN,
            ..FrameWatch::of_server(opened)
        }
    }

    /// A server's bytes: frames from the first.
    pub fn of_server(opened: Instant) -> FrameWatch {
        FrameWatch {
            skip: 0,
            head: [0; FRAME_HEAD],
            have: 0,
            padded: None,
            idle: 0,
            useful: 0,
            opened,
        }
    }

    /// Watches the next `bytes` the peer sent (`now` is asked only when
    /// the frames carrying nothing are past what the others allow). `Err`
    /// once it flooded, and on every call after.
    pub fn read(&mut self, mut bytes: &[u8], now: impl Fn() -> Instant) -> Result<(), Flood> {
        self.check(&now)?;
        while let Some(&first) = bytes.first() {
            if self.skip > 0 {
                if let Some(length) = self.padded.take() {
                    // RFC 9113 §6.1: the pad length, then data, then padding.
                    let data = length.saturating_sub(1 + usize::from(first));
                    self.counted(data == 0);
                    self.check(&now)?;
                }
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
                self.check(&now)?;
            }
        }
        Ok(())
    }

    fn count(&mut self, kind: u8, flags: u8, length: usize) {
        let idle = match kind {
            DATA if flags & END_STREAM != 0 => false,
            DATA if flags & PADDED != 0 && length > 0 => {
                self.padded = Some(length);
                return;
            }
            DATA => length == 0,
            HEADERS | CONTINUATION | PUSH_PROMISE => false,
            WINDOW_UPDATE => return,
            // Acknowledgements too: the gateway asks for few, and the h2
            // crate reads (and drops) those it never asked for.
            _ => true,
        };
        self.counted(idle);
    }

    fn counted(&mut self, idle: bool) {
        match idle {
            true => self.idle += 1,
            false => self.useful += 1,
        }
    }

    fn check(&self, now: &impl Fn() -> Instant) -> Result<(), Flood> {
        let earned = FREE_IDLE_FRAMES.saturating_add(self.useful.saturating_mul(IDLE_PER_USEFUL));
        if self.idle <= earned {
            return Ok(());
        }
        let age = now().saturating_duration_since(self.opened).as_secs();
        match self.idle > earned.saturating_add(age.saturating_mul(IDLE_PER_SECOND)) {
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
    use std::time::Duration;

    const PRIORITY: u8 = 0x2;
    const RST_STREAM: u8 = 0x3;
    const SETTINGS: u8 = 0x4;
    const PING: u8 = 0x6;
    const GOAWAY: u8 = 0x7;
    const ACK: u8 = 0x1;

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

    /// A padded DATA frame: `data` bytes of data, `pad` of padding.
    fn padded(data: usize, pad: u8) -> Vec<u8> {
        let mut payload = vec![pad];
        payload.extend(std::iter::repeat_n(b'd', data));
        payload.extend(std::iter::repeat_n(0, usize::from(pad)));
        frame(DATA, PADDED, &payload)
    }

    /// A watch of a connection opened at `t0`, read at `t0` (no age).
    fn watch(t0: Instant) -> (FrameWatch, impl Fn() -> Instant) {
        (FrameWatch::of_server(t0), move || t0)
    }

    #[test]
    fn a_ping_flood_is_cut_off_at_the_free_allowance() {
        let (mut watch, now) = watch(Instant::now());
        let free = FREE_IDLE_FRAMES as usize;
        assert_eq!(watch.read(&pings(free), &now), Ok(()));
        let flood = watch
            .read(&pings(1), &now)
            .expect_err("one more is a flood");
        assert_eq!((flood.idle, flood.useful), (FREE_IDLE_FRAMES + 1, 0));
        assert!(watch.read(&[], &now).is_err(), "and stays one");
    }

    #[test]
    fn the_allowance_grows_with_the_connections_age() {
        let t0 = Instant::now();
        let mut watch = FrameWatch::of_server(t0);
        let free = FREE_IDLE_FRAMES as usize;
        let later = || t0 + Duration::from_secs(60);
        let aged = 60 * IDLE_PER_SECOND as usize;
        assert_eq!(watch.read(&pings(free + aged), later), Ok(()));
        assert!(watch.read(&pings(1), later).is_err());
    }

    #[test]
    fn frames_split_anywhere_are_counted_the_same() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(HEADERS, 0x4, b"\x88").repeat(3));
        bytes.extend(frame(SETTINGS, 0, &[0, 4, 0, 0, 0xff, 0xff]).repeat(5));
        bytes.extend(frame(DATA, 0, b"hello"));
        bytes.extend(padded(0, 3));
        bytes.extend(padded(2, 3));
        bytes.extend(frame(PING, ACK, b"12345678"));
        let t0 = Instant::now();
        for step in 1..bytes.len() {
            let mut watch = FrameWatch::of_client(t0);
            for piece in bytes.chunks(step) {
                assert_eq!(watch.read(piece, || t0), Ok(()));
            }
            let seen = (watch.idle, watch.useful, watch.have, watch.skip);
            assert_eq!(seen, (7, 5, 0, 0), "read {step} bytes at a time");
        }
    }

    #[test]
    fn what_counts_as_carrying_nothing() {
        let cases: [(Vec<u8>, Option<bool>); 16] = [
            (frame(DATA, 0, b""), Some(true)),
            (frame(DATA, END_STREAM, b""), Some(false)),
            (frame(DATA, 0, b"x"), Some(false)),
            (padded(0, 255), Some(true)),
            (padded(1, 255), Some(false)),
            (frame(DATA, PADDED, &[200]), Some(true)),
            (frame(HEADERS, 0, b"\x88"), Some(false)),
            (frame(CONTINUATION, 0, b"\x88"), Some(false)),
            (frame(PING, 0, b"12345678"), Some(true)),
            (frame(PING, ACK, b"12345678"), Some(true)),
            (frame(SETTINGS, ACK, b""), Some(true)),
            (frame(PRIORITY, 0, &[0, 0, 0, 0, 16]), Some(true)),
            (frame(GOAWAY, 0, &[0; 8]), Some(true)),
            (frame(WINDOW_UPDATE, 0, &[0, 0, 0, 1]), None),
            (frame(RST_STREAM, 0, &[0, 0, 0, 8]), Some(true)),
            (frame(0xfa, 0, b"unknown"), Some(true)),
        ];
        for (bytes, idle) in cases {
            let (mut watch, now) = watch(Instant::now());
            assert_eq!(watch.read(&bytes, now), Ok(()));
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
        let (mut watch, now) = watch(Instant::now());
        let mut bytes = frame(HEADERS, 0x4, b"\x88").repeat(10);
        bytes.extend(pings(FREE_IDLE_FRAMES as usize + 80));
        assert_eq!(watch.read(&bytes, &now), Ok(()));
        assert!(watch.read(&pings(1), &now).is_err());
    }

    #[test]
    fn a_large_payload_is_passed_over_not_read_as_frames() {
        // A DATA frame whose payload looks like twenty thousand PINGs.
        let (mut watch, now) = watch(Instant::now());
        let mut bytes = frame(DATA, 0, &pings(FREE_IDLE_FRAMES as usize * 2));
        bytes.extend(frame(DATA, END_STREAM, b""));
        assert_eq!(watch.read(&bytes, now), Ok(()));
        assert_eq!((watch.idle, watch.useful), (0, 2));
    }
}
