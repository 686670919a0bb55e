//! An HTTP/2 peer's frames, watched on the bytes read from it and written
//! to it (a client's connection and a shard's alike): a peer that sends
//! far more frames that carry nothing for a request than the connection's
//! traffic explains is flooding, and its connection is cut off (nginx's
//! "http2 flood detected", Envoy's limits on inbound control frames). The
//! `h2` crate answers a PING or a SETTINGS one at a time, so a flood's
//! memory is bounded already; its cost in CPU, frame by frame, is what
//! this bounds.
//!
//! Carrying nothing: PING and SETTINGS (and their acknowledgements),
//! RST_STREAM, PRIORITY, GOAWAY, frames of unknown types, DATA that
//! carries no data (padding at most) without ending its stream, and
//! WINDOW_UPDATE. Carrying something: HEADERS, CONTINUATION and any other
//! DATA.
//!
//! Each frame the peer sends carrying nothing spends a credit. The
//! connection starts with [`MOST_CREDIT`]; each frame carrying something,
//! sent either way, earns some: a head [`CREDIT_PER_FRAME`], a DATA frame
//! one and one per [`BYTES_PER_CREDIT`] up to as much (a gRPC peer that
//! pings once per DATA frame it receives, to size its window, is
//! answering the gateway's traffic; a peer that makes bodies go in tiny
//! frames buys one idle frame with each); each PING or SETTINGS the
//! gateway sends earns one (its acknowledgement); time earns
//! [`CREDIT_PER_SECOND`]. A WINDOW_UPDATE spends no credit while the DATA
//! the gateway sent allows it ([`WINDOWS_PER_DATA`] per frame carrying
//! data, and one per [`BYTES_PER_WINDOW`]; at most [`MOST_CREDIT`]
//! banked), and a credit beyond: at worst, after a long download, a
//! peer sends 20 000 frames carrying nothing before it is cut off.
//! Credit never exceeds [`MOST_CREDIT`]: an old connection has banked no
//! flood. A frame carrying nothing that finds no credit is a flood.

use std::time::{Duration, Instant};

/// The credit a connection starts with, and holds at most.
pub const MOST_CREDIT: u64 = 10_000;

/// What each frame carrying something, either way, earns at most (a
/// DATA frame: one, and one per [`BYTES_PER_CREDIT`] it carries).
pub const CREDIT_PER_FRAME: u64 = 8;

/// The bytes of DATA that earn one credit more.
pub const BYTES_PER_CREDIT: usize = 2048;

/// The WINDOW_UPDATEs each DATA frame carrying data the gateway sends
/// lets its peer send, whatever its size, and the bytes of it that let
/// one more: a grpc-go peer sends one with each BDP ping (as often as one
/// per small DATA frame it receives), and a Go peer one for its
/// connection and one for the stream per 4 KiB it reads.
pub const WINDOWS_PER_DATA: u64 = 1;
pub const BYTES_PER_WINDOW: usize = 2048;

/// What each second earns: a long-lived connection's keep-alive PINGs, or
/// a shard refusing streams now and then, never add up to a flood.
pub const CREDIT_PER_SECOND: u64 = 100;

/// Milliseconds that earn one credit.
const MS_PER_CREDIT: u128 = 1000 / CREDIT_PER_SECOND as u128;

/// The client connection preface (RFC 9113 §3.4), before a client's frames.
pub const PREFACE_LEN: usize = 24;

const FRAME_HEAD: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const PADDED: u8 = 0x8;

/// The peer has flooded the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flood {
    /// Frames carrying nothing it sent, and frames carrying something
    /// sent either way.
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

/// A frame, as the watch counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Carries nothing for a request.
    Idle,
    /// A head (HEADERS, CONTINUATION, PUSH_PROMISE): earns
    /// [`CREDIT_PER_FRAME`].
    Head,
    /// DATA carrying this many bytes of data (none: it ends its stream).
    Data(usize),
    /// A PING or SETTINGS asking for an acknowledgement.
    Asking,
    /// A WINDOW_UPDATE.
    Window,
}

/// Where one direction's bytes stand in its frames.
#[derive(Debug, Clone)]
struct Frames {
    /// Bytes still to pass before the next frame's head (a payload's, or
    /// the preface's).
    skip: usize,
    head: [u8; FRAME_HEAD],
    /// Bytes of the next frame's head seen so far.
    have: usize,
    /// A padded DATA frame's length, its pad length (the payload's first
    /// byte) not seen yet: whether it carries anything is told then.
    padded: Option<usize>,
}

impl Frames {
    fn after(skip: usize) -> Frames {
        Frames {
            skip,
            head: [0; FRAME_HEAD],
            have: 0,
            padded: None,
        }
    }

    /// Each frame of `bytes` as it is told, to `seen`, which may stop.
    fn read<E>(
        &mut self,
        mut bytes: &[u8],
        mut seen: impl FnMut(Kind) -> Result<(), E>,
    ) -> Result<(), E> {
        while let Some(&first) = bytes.first() {
            if self.skip > 0 {
                if let Some(length) = self.padded.take() {
                    // RFC 9113 §6.1: the pad length, then data, then padding.
                    let data = length.saturating_sub(1 + usize::from(first));
                    seen(match data {
                        0 => Kind::Idle,
                        data => Kind::Data(data),
                    })?;
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
                match kind {
                    DATA if flags & (PADDED | END_STREAM) == PADDED && length > 0 => {
                        self.padded = Some(length);
                    }
                    _ => seen(kind_of(kind, flags, length))?,
                }
            }
        }
        Ok(())
    }
}

fn kind_of(kind: u8, flags: u8, length: usize) -> Kind {
    match kind {
        DATA if flags & END_STREAM != 0 || length > 0 => Kind::Data(length),
        HEADERS | CONTINUATION | PUSH_PROMISE => Kind::Head,
        PING | SETTINGS if flags & ACK == 0 => Kind::Asking,
        WINDOW_UPDATE => Kind::Window,
        // Acknowledgements too: the gateway asks for few (each earns
        // one), and the h2 crate reads (and drops) those it never asked
        // for.
        _ => Kind::Idle,
    }
}

/// What a DATA frame carrying `data` bytes earns: one, and one more per
/// [`BYTES_PER_CREDIT`], up to [`CREDIT_PER_FRAME`]. A frame of a byte
/// earns one, so a peer that makes either side cut a body into tiny
/// frames (tiny windows) buys one idle frame with each, never more.
fn data_credit(data: usize) -> u64 {
    (1 + (data / BYTES_PER_CREDIT) as u64).min(CREDIT_PER_FRAME)
}

/// The WINDOW_UPDATEs a DATA frame of `data` bytes the gateway sent lets
/// its peer send: [`WINDOWS_PER_DATA`], and one per [`BYTES_PER_WINDOW`].
fn data_windows(data: usize) -> u64 {
    match data {
        0 => 0,
        data => WINDOWS_PER_DATA + (data / BYTES_PER_WINDOW) as u64,
    }
}

/// A connection's two directions, and the peer's credit.
#[derive(Debug, Clone)]
pub struct FrameWatch {
    read: Frames,
    written: Frames,
    credit: Credit,
    /// Once flooded, flooded for good.
    flooded: Option<Flood>,
}

impl FrameWatch {
    /// A client's connection: it sends the preface, then frames.
    pub fn of_client(opened: Instant) -> FrameWatch {
        FrameWatch::new(Frames::after(PREFACE_LEN), Frames::after(0), opened)
    }

    /// A server's connection: the gateway sends the preface.
    pub fn of_server(opened: Instant) -> FrameWatch {
        FrameWatch::new(Frames::after(0), Frames::after(PREFACE_LEN), opened)
    }

    fn new(read: Frames, written: Frames, opened: Instant) -> FrameWatch {
        FrameWatch {
            read,
            written,
            credit: Credit {
                left: MOST_CREDIT,
                windows: 0,
                refilled: opened,
                idle: 0,
                useful: 0,
            },
            flooded: None,
        }
    }

    /// Watches the next `bytes` the peer sent (`now` is asked once per
    /// frame that spends credit, never for the others). `Err` once it
    /// flooded, and on every call after.
    pub fn read(&mut self, bytes: &[u8], now: impl Fn() -> Instant) -> Result<(), Flood> {
        if let Some(flood) = self.flooded {
            return Err(flood);
        }
        let credit = &mut self.credit;
        let outcome = self.read.read(bytes, |kind| credit.spend(kind, &now));
        if let Err(flood) = outcome {
            self.flooded = Some(flood);
        }
        outcome
    }

    /// Watches what the gateway wrote to the peer: `n` bytes of `bufs`.
    pub fn wrote(&mut self, bufs: &[std::io::IoSlice<'_>], mut n: usize) {
        for buf in bufs {
            let taken = n.min(buf.len());
            let credit = &mut self.credit;
            let _ = self.written.read::<()>(&buf[..taken], |kind| {
                credit.earn(kind);
                Ok(())
            });
            n -= taken;
            if n == 0 {
                break;
            }
        }
    }
}

/// The peer's credit, and the frames counted.
#[derive(Debug, Clone)]
struct Credit {
    left: u64,
    /// WINDOW_UPDATEs the DATA the gateway sent lets the peer send (at
    /// most [`MOST_CREDIT`]), before they spend credit.
    windows: u64,
    /// Until when time has earned credit.
    refilled: Instant,
    idle: u64,
    useful: u64,
}

impl Credit {
    /// A frame the gateway wrote.
    fn earn(&mut self, kind: Kind) {
        if let Kind::Data(data) = kind {
            self.windows = (self.windows + data_windows(data)).min(MOST_CREDIT);
        }
        match kind {
            Kind::Head | Kind::Data(_) => self.useful(kind),
            Kind::Asking => self.gain(1),
            Kind::Idle | Kind::Window => {}
        }
    }

    /// A frame carrying something, either way: counted, and what it earns.
    fn useful(&mut self, kind: Kind) {
        self.useful += 1;
        self.gain(match kind {
            Kind::Data(data) => data_credit(data),
            _ => CREDIT_PER_FRAME,
        });
    }

    fn gain(&mut self, earned: u64) {
        self.left = self.left.saturating_add(earned).min(MOST_CREDIT);
    }

    /// A frame the peer sent.
    fn spend(&mut self, kind: Kind, now: &impl Fn() -> Instant) -> Result<(), Flood> {
        match kind {
            Kind::Head | Kind::Data(_) => {
                self.useful(kind);
                return Ok(());
            }
            Kind::Window if self.windows > 0 => {
                self.idle += 1;
                self.windows -= 1;
                return Ok(());
            }
            Kind::Idle | Kind::Asking | Kind::Window => self.idle += 1,
        }
        // What time earned since it last did, up to full: credit never
        // exceeds the most, so a connection has banked nothing beyond it.
        let now = now();
        let elapsed = now.saturating_duration_since(self.refilled).as_millis();
        let earned = u64::try_from(elapsed / MS_PER_CREDIT).unwrap_or(u64::MAX);
        if earned > 0 {
            self.left = self.left.saturating_add(earned);
            if self.left >= MOST_CREDIT {
                self.left = MOST_CREDIT;
                self.refilled = now;
            } else {
                // Whole credits only: the rest of the time still counts.
                self.refilled += Duration::from_millis(earned * MS_PER_CREDIT as u64);
            }
        }
        match self.left.checked_sub(1) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(Flood {
                idle: self.idle,
                useful: self.useful,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSlice;
    use std::time::Duration;

    const PRIORITY: u8 = 0x2;
    const RST_STREAM: u8 = 0x3;
    const GOAWAY: u8 = 0x7;

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

    /// A server's connection opened at `t0`, and a clock stopped there.
    fn watch(t0: Instant) -> (FrameWatch, impl Fn() -> Instant) {
        (FrameWatch::of_server(t0), move || t0)
    }

    const MOST: usize = MOST_CREDIT as usize;

    #[test]
    fn a_ping_flood_is_cut_off_when_its_credit_runs_out_and_stays_cut_off() {
        let t0 = Instant::now();
        let (mut watch, now) = watch(t0);
        assert_eq!(watch.read(&pings(MOST), &now), Ok(()));
        let flood = watch
            .read(&pings(1), &now)
            .expect_err("one more is a flood");
        assert_eq!((flood.idle, flood.useful), (MOST_CREDIT + 1, 0));
        let much_later = || t0 + Duration::from_secs(3600);
        assert_eq!(watch.read(&[], much_later), Err(flood), "and stays one");
    }

    #[test]
    fn time_earns_credit_up_to_the_most_never_beyond() {
        let t0 = Instant::now();
        let mut watch = FrameWatch::of_server(t0);
        assert_eq!(watch.read(&pings(MOST), || t0), Ok(()));
        // 60.5 s earn 6 050, the half second included.
        let later = || t0 + Duration::from_millis(60_500);
        let earned = 6_050;
        assert_eq!(watch.read(&pings(earned), later), Ok(()));
        assert!(watch.clone().read(&pings(1), later).is_err());
        let a_bit_later = || t0 + Duration::from_millis(60_510);
        assert_eq!(watch.read(&pings(1), a_bit_later), Ok(()));
        assert!(watch.read(&pings(1), a_bit_later).is_err());
        // A connection that sat below full for an hour holds the most,
        // no more.
        let mut watch = FrameWatch::of_server(t0);
        assert_eq!(watch.read(&pings(1), || t0), Ok(()));
        let hour = || t0 + Duration::from_secs(3600);
        assert_eq!(watch.read(&pings(MOST), hour), Ok(()));
        assert!(watch.read(&pings(1), hour).is_err());
    }

    #[test]
    fn the_clock_is_read_for_frames_carrying_nothing_only() {
        let t0 = Instant::now();
        let reads = std::cell::Cell::new(0);
        let now = || {
            reads.set(reads.get() + 1);
            t0
        };
        let mut watch = FrameWatch::of_server(t0);
        let mut bytes = frame(HEADERS, 0x4, b"\x88").repeat(10);
        bytes.extend(frame(DATA, END_STREAM, b"body"));
        assert_eq!(watch.read(&bytes, now), Ok(()));
        assert_eq!(reads.get(), 0);
        assert_eq!(watch.read(&pings(3), now), Ok(()));
        assert_eq!(reads.get(), 3);
    }

    /// A server's connection whose preface the gateway wrote.
    fn opened(t0: Instant) -> (FrameWatch, impl Fn() -> Instant) {
        let (mut watch, now) = watch(t0);
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        watch.wrote(&[IoSlice::new(preface)], preface.len());
        (watch, now)
    }

    fn updates(n: usize) -> Vec<u8> {
        frame(WINDOW_UPDATE, 0, &[0, 0, 0x10, 0]).repeat(n)
    }

    #[test]
    fn a_go_peer_updating_windows_every_4_kib_is_no_flood() {
        // Go's HTTP/2 reads in 4 KiB and updates its connection's window
        // and the stream's each time: 32 updates for a 64 KiB frame.
        let (mut watch, now) = opened(Instant::now());
        let sent = frame(DATA, 0, &[7; 65536]);
        for _ in 0..1_000 {
            watch.wrote(&[IoSlice::new(&sent)], sent.len());
            assert_eq!(watch.read(&updates(32), &now), Ok(()));
        }
        // And downloads in 16 KiB frames: 8 each.
        let sent = frame(DATA, 0, &[7; 16384]);
        for _ in 0..20_000 {
            watch.wrote(&[IoSlice::new(&sent)], sent.len());
            assert_eq!(watch.read(&updates(8), &now), Ok(()));
        }
        assert_eq!(watch.credit.left, MOST_CREDIT);
    }

    #[test]
    fn a_grpc_go_peer_pinging_and_updating_per_small_message_is_no_flood() {
        // grpc-go's BDP estimate: a connection WINDOW_UPDATE and a PING
        // for a DATA frame it received, as often as once per message.
        let (mut watch, now) = opened(Instant::now());
        let sent = frame(DATA, 0, &[7; 100]);
        let mut answer = updates(1);
        answer.extend(pings(1));
        for _ in 0..50_000 {
            watch.wrote(&[IoSlice::new(&sent)], sent.len());
            assert_eq!(watch.read(&answer, &now), Ok(()));
        }
        // The PING spent what the DATA earned; the update, what it allows.
        assert_eq!(watch.credit.left, MOST_CREDIT - 1);
    }

    #[test]
    fn window_updates_beyond_what_was_sent_are_a_flood() {
        // What DATA sent allows is banked up to the most, then credit.
        let (mut watch, now) = opened(Instant::now());
        let sent = frame(DATA, 0, &[7; 16384]);
        for _ in 0..5_000 {
            watch.wrote(&[IoSlice::new(&sent)], sent.len());
        }
        assert_eq!(watch.read(&updates(MOST * 2), &now), Ok(()));
        assert!(watch.read(&updates(1), &now).is_err());
        // With nothing sent (or DATA ending streams, carrying nothing),
        // the credit alone.
        let (mut watch, now) = opened(Instant::now());
        let ends = frame(DATA, END_STREAM, b"").repeat(100);
        watch.wrote(&[IoSlice::new(&ends)], ends.len());
        assert_eq!(watch.read(&updates(MOST), &now), Ok(()));
        assert!(watch.read(&updates(1), &now).is_err());
        // The peer's DATA lets it send none (the gateway updates windows
        // for what it receives).
        let (mut watch, now) = opened(Instant::now());
        let mut bytes = frame(DATA, 0, &[7; 16384]).repeat(100);
        bytes.extend(updates(MOST));
        assert_eq!(watch.read(&bytes, &now), Ok(()));
        assert!(watch.read(&updates(1), &now).is_err());
    }

    #[test]
    fn a_tiny_data_frame_buys_one_idle_frame() {
        let (mut watch, now) = watch(Instant::now());
        assert_eq!(watch.read(&pings(MOST), &now), Ok(()));
        let mut bytes = frame(DATA, 0, b"x").repeat(3);
        bytes.extend(frame(DATA, 0, &[7; 4096]));
        assert_eq!(watch.read(&bytes, &now), Ok(()));
        assert_eq!(watch.read(&pings(3 + 3), &now), Ok(()));
        assert!(watch.read(&pings(1), &now).is_err());
    }

    #[test]
    fn frames_carrying_something_either_way_earn_credit() {
        let (mut watch, now) = watch(Instant::now());
        assert_eq!(watch.read(&pings(MOST), &now), Ok(()));
        // Received: 10 heads earn 80; written: 5 heads (after the
        // preface) earn 40, a PING of the gateway's 1, an acknowledgement
        // of its none, and one DATA frame of 16 KiB 8.
        let mut bytes = frame(HEADERS, 0x4, b"\x88").repeat(10);
        assert_eq!(watch.read(&bytes, &now), Ok(()));
        bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(HEADERS, 0x4, b"\x88").repeat(5));
        bytes.extend(frame(PING, 0, b"liveness"));
        bytes.extend(frame(PING, ACK, b"answered"));
        bytes.extend(frame(DATA, 0, &[7; 16384]));
        let (front, back) = bytes.split_at(30);
        let slices = [IoSlice::new(front), IoSlice::new(&[]), IoSlice::new(back)];
        watch.wrote(&slices, 0);
        watch.wrote(&slices, bytes.len());
        assert_eq!(watch.read(&pings(129), &now), Ok(()));
        assert!(watch.read(&pings(1), &now).is_err());
    }

    #[test]
    fn only_what_was_written_is_watched_and_the_rest_when_it_is() {
        let (mut watch, now) = watch(Instant::now());
        assert_eq!(watch.read(&pings(MOST), &now), Ok(()));
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(HEADERS, 0x4, b"\x88").repeat(2));
        // The second frame's head was not all written: it earns nothing,
        // until the rest is.
        let first = bytes.len() - 4;
        watch.wrote(&[IoSlice::new(&bytes)], first);
        assert_eq!(watch.read(&pings(8), &now), Ok(()));
        assert!(watch.clone().read(&pings(1), &now).is_err());
        watch.wrote(&[IoSlice::new(&bytes[first..])], 4);
        assert_eq!(watch.read(&pings(8), &now), Ok(()));
        assert!(watch.read(&pings(1), &now).is_err());
    }

    #[test]
    fn a_client_connections_written_frames_start_at_once() {
        // The gateway is the server: it writes no preface.
        let t0 = Instant::now();
        let mut watch = FrameWatch::of_client(t0);
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(pings(MOST));
        assert_eq!(watch.read(&bytes, || t0), Ok(()));
        let head = frame(HEADERS, 0x4, b"\x88");
        watch.wrote(&[IoSlice::new(&head)], head.len());
        assert_eq!(watch.read(&pings(8), || t0), Ok(()));
        assert!(watch.read(&pings(1), || t0).is_err());
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
            let at = (watch.read.have, watch.read.skip);
            assert_eq!(
                (watch.credit.idle, watch.credit.useful, at),
                (7, 5, (0, 0)),
                "by {step}"
            );
        }
    }

    #[test]
    fn what_counts_as_carrying_nothing() {
        let cases: [(Vec<u8>, bool); 16] = [
            (frame(DATA, 0, b""), true),
            (frame(DATA, END_STREAM, b""), false),
            (frame(DATA, 0, b"x"), false),
            (padded(0, 255), true),
            (padded(1, 255), false),
            (frame(DATA, PADDED, &[200]), true),
            (frame(HEADERS, 0, b"\x88"), false),
            (frame(CONTINUATION, 0, b"\x88"), false),
            (frame(PING, 0, b"12345678"), true),
            (frame(PING, ACK, b"12345678"), true),
            (frame(SETTINGS, ACK, b""), true),
            (frame(PRIORITY, 0, &[0, 0, 0, 0, 16]), true),
            (frame(GOAWAY, 0, &[0; 8]), true),
            (frame(WINDOW_UPDATE, 0, &[0, 0, 0, 1]), true),
            (frame(RST_STREAM, 0, &[0, 0, 0, 8]), true),
            (frame(0xfa, 0, b"unknown"), true),
        ];
        for (bytes, idle) in cases {
            let (mut watch, now) = watch(Instant::now());
            assert_eq!(watch.read(&bytes, now), Ok(()));
            let counted = match (watch.credit.idle, watch.credit.useful) {
                (1, 0) => true,
                (0, 1) => false,
                other => panic!("{other:?}"),
            };
            assert_eq!(counted, idle, "{bytes:?}");
        }
    }

    #[test]
    fn a_large_payload_is_passed_over_not_read_as_frames() {
        // A DATA frame whose payload looks like twenty thousand PINGs.
        let (mut watch, now) = watch(Instant::now());
        let mut bytes = frame(DATA, 0, &pings(MOST * 2));
        bytes.extend(frame(DATA, END_STREAM, b""));
        assert_eq!(watch.read(&bytes, now), Ok(()));
        assert_eq!((watch.credit.idle, watch.credit.useful), (0, 2));
    }
}
