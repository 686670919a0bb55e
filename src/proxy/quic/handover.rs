//! A `quic` listener's UDP socket across a graceful upgrade (SIGQUIT).
//!
//! The new process inherits the UDP socket as it does the TCP listeners;
//! unlike TCP, where each connection has a socket of its own, every
//! datagram of every connection then arrives on that one socket, in either
//! process. So each process marks the connection IDs it issues with a tag
//! of its own (hidden under a keyed hash of the rest of the ID, so that
//! it does not link one connection's IDs), and the two processes pass
//! each other, over a Unix datagram channel handed over with the socket,
//! the datagrams of the other's connections: the old process keeps its
//! connections until they end (their requests finish), the new one takes
//! every new connection. Envoy's hot restart does not do this for HTTP/3
//! (its QUIC connections are reset); `docs/http3.md` has what was
//! measured here.
//!
//! The channel: each process makes a pair at start and puts one end in
//! the table a graceful upgrade hands over (`udp-fwd://ADDR`). A new
//! process that finds one says hello on it with its identity, and the old
//! one answers with its own: from then on, the old process forwards what
//! is not its own, the new one what is the old one's. A datagram comes
//! through the channel once, and is never sent on again.

use parking_lot::Mutex;
use pingora::server::ListenFds;
use quinn::udp::{EcnCodepoint, RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::net::UnixDatagram;

/// The length of the connection IDs shardgate issues.
pub(super) const CID_LEN: usize = 8;

/// How long a new process waits for the old one's answer to its hello.
const HELLO_WAIT: Duration = Duration::from_secs(3);

/// The largest message on the channel: a datagram and its addresses.
const MESSAGE: usize = 65_536 + 64;

/// What tells one process's connection IDs from another's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Identity {
    tag: u16,
    seed: u64,
}

impl Identity {
    fn random() -> Identity {
        let bytes = random_bytes::<10>();
        Identity {
            tag: u16::from_be_bytes([bytes[0], bytes[1]]),
            seed: u64::from_be_bytes(bytes[2..].try_into().unwrap_or_default()),
        }
    }

    /// The mask hiding the tag of an ID whose rest is `rest`.
    fn mask(&self, rest: &[u8]) -> u16 {
        xxhash_rust::xxh3::xxh3_64_with_seed(rest, self.seed) as u16
    }

    /// Whether `cid` is one this process issued (by its tag).
    pub(super) fn owns(&self, cid: &[u8]) -> bool {
        cid.len() == CID_LEN
            && u16::from_be_bytes([cid[0], cid[1]]) ^ self.mask(&cid[2..]) == self.tag
    }

    fn encode(&self) -> [u8; 10] {
        let mut out = [0u8; 10];
        out[..2].copy_from_slice(&self.tag.to_be_bytes());
        out[2..].copy_from_slice(&self.seed.to_be_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Identity> {
        let bytes: &[u8; 10] = bytes.get(..10)?.try_into().ok()?;
        Some(Identity {
            tag: u16::from_be_bytes([bytes[0], bytes[1]]),
            seed: u64::from_be_bytes(bytes[2..].try_into().ok()?),
        })
    }
}

/// `N` bytes from the system's random source.
fn random_bytes<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; N];
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    bytes
}

/// Issues this process's connection IDs: random, with its tag; none that
/// would also read as the predecessor's (its tag is 16 bits: one ID in
/// 65 536 would).
pub(super) struct Issuer {
    pub me: Identity,
    pub predecessor: Option<Identity>,
}

impl quinn::ConnectionIdGenerator for Issuer {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        loop {
            let mut cid = random_bytes::<CID_LEN>();
            let tag = self.me.tag ^ self.me.mask(&cid[2..]);
            cid[..2].copy_from_slice(&tag.to_be_bytes());
            if !self.predecessor.is_some_and(|p| p.owns(&cid)) {
                return quinn::ConnectionId::new(&cid);
            }
        }
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The messages on the channel: hello (the new process's identity), its
/// answer (the old one's), the new one's confirmation that it got the
/// answer in time (only then does the old one pass datagrams on: a new
/// process that gave up waiting reads nothing from the channel), and a
/// datagram.
const HELLO: u8 = b'H';
const ANSWER: u8 = b'A';
const CONFIRM: u8 = b'C';
const DATAGRAM: u8 = b'D';

/// The two processes' channel, as one of them holds it.
pub(super) struct Handover {
    pub(super) me: Identity,
    /// The end this process reads: its successor's hello and datagrams.
    mine: UnixDatagram,
    /// The other end, in the table for a successor (kept open).
    _theirs: std::os::unix::net::UnixDatagram,
    /// The predecessor's channel and identity, when it answered.
    predecessor: Option<(UnixDatagram, Identity)>,
    /// The successor's identity, once it said hello, until it confirms.
    greeted: Mutex<Option<Identity>>,
    /// The successor's identity, once it confirmed.
    successor: arc_swap::ArcSwapOption<Identity>,
}

/// The channel's key in the upgrade's table for the socket keyed `key`.
pub(super) fn channel_key(key: &str) -> String {
    key.replacen("udp://", "udp-fwd://", 1)
}

impl Handover {
    /// The channel for the socket keyed `key` in `fds`: a new pair, one end
    /// put in the table for a successor; and if the table held an end of
    /// a predecessor's, hello said on it and its answer awaited.
    pub(super) async fn new(key: &str, fds: Option<&ListenFds>) -> io::Result<Handover> {
        let me = Identity::random();
        let (mine, theirs) = std::os::unix::net::UnixDatagram::pair()?;
        mine.set_nonblocking(true)?;
        let mine = UnixDatagram::from_std(mine)?;
        let channel = channel_key(key);
        let handed = fds.and_then(|fds| fds.lock().get(&channel).copied());
        if let Some(fds) = fds {
            fds.lock().add(channel, theirs.as_raw_fd());
        }
        let predecessor = match handed {
            None => None,
            Some(fd) => {
                // SAFETY: the table's entry under this key is the channel
                // end a predecessor put there, handed to this process.
                let theirs = unsafe { std::os::unix::net::UnixDatagram::from_raw_fd(fd) };
                theirs.set_nonblocking(true)?;
                greet(UnixDatagram::from_std(theirs)?, me).await
            }
        };
        Ok(Handover {
            me,
            mine,
            _theirs: theirs,
            predecessor,
            greeted: Mutex::new(None),
            successor: arc_swap::ArcSwapOption::empty(),
        })
    }

    /// Where a datagram goes: `None` here, else the channel to send it on.
    /// This process's own first, then the predecessor's: with two upgrades
    /// under way (A, then B, then C), B sends A's to A, and C's to C. (C knows nothing of A:
    /// what of A's comes to C is lost, a second upgrade should wait for
    /// the first old process to exit.)
    fn route(&self, datagram: &[u8]) -> Option<&UnixDatagram> {
        let cid = destination_cid(datagram)?;
        if self.me.owns(cid) {
            return None;
        }
        if let Some((channel, them)) = &self.predecessor {
            if them.owns(cid) {
                return Some(channel);
            }
        }
        self.successor.load().is_some().then_some(&self.mine)
    }

    /// The predecessor's identity, if it answered.
    pub(super) fn predecessor(&self) -> Option<Identity> {
        self.predecessor.as_ref().map(|(_, them)| *them)
    }

    /// Whether anything is passed on at all (the usual case: no).
    fn routing(&self) -> bool {
        self.predecessor.is_some() || self.successor.load().is_some()
    }
}

/// Says hello to the predecessor on `channel` and waits for its answer
/// (none in time: an older process, or one gone; nothing is passed on).
async fn greet(channel: UnixDatagram, me: Identity) -> Option<(UnixDatagram, Identity)> {
    let mut hello = vec![HELLO];
    hello.extend_from_slice(&me.encode());
    if channel.send(&hello).await.is_err() {
        return None;
    }
    let mut buf = [0u8; 64];
    let answer = tokio::time::timeout(HELLO_WAIT, channel.recv(&mut buf)).await;
    match answer {
        Ok(Ok(n)) if n > 0 && buf[0] == ANSWER => {
            let them = Identity::decode(&buf[1..n])?;
            let mut confirm = vec![CONFIRM];
            confirm.extend_from_slice(&me.encode());
            channel.send(&confirm).await.ok()?;
            log::info!("quic: the old process answered; its connections stay with it");
            Some((channel, them))
        }
        _ => {
            log::warn!("quic: no answer from the old process; its connections will not reach it");
            None
        }
    }
}

/// A QUIC packet's destination connection ID (a short header's is ours,
/// of [`CID_LEN`]).
fn destination_cid(packet: &[u8]) -> Option<&[u8]> {
    let first = *packet.first()?;
    if first & 0x80 != 0 {
        let len = *packet.get(5)? as usize;
        packet.get(6..6 + len)
    } else {
        packet.get(1..1 + CID_LEN)
    }
}

/// A datagram as the channel carries it: where it came from, where it
/// went, its ECN bits, and its bytes.
fn datagram_message(meta: &RecvMeta, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + bytes.len());
    out.push(DATAGRAM);
    put_ip(&mut out, Some(meta.addr.ip()));
    out.extend_from_slice(&meta.addr.port().to_be_bytes());
    put_ip(&mut out, meta.dst_ip);
    out.push(meta.ecn.map_or(0, |e| e as u8));
    out.extend_from_slice(bytes);
    out
}

fn put_ip(out: &mut Vec<u8>, ip: Option<IpAddr>) {
    let (family, octets) = match ip {
        None => (0, [0u8; 16]),
        Some(IpAddr::V4(v4)) => (4, v4.to_ipv6_mapped().octets()),
        Some(IpAddr::V6(v6)) => (6, v6.octets()),
    };
    out.push(family);
    out.extend_from_slice(&octets);
}

fn take_ip(bytes: &[u8]) -> Option<Option<IpAddr>> {
    let octets: [u8; 16] = bytes.get(1..17)?.try_into().ok()?;
    let v6 = std::net::Ipv6Addr::from(octets);
    match bytes.first()? {
        0 => Some(None),
        4 => Some(Some(IpAddr::V4(v6.to_ipv4_mapped()?))),
        6 => Some(Some(IpAddr::V6(v6))),
        _ => None,
    }
}

/// A datagram message read back: its meta (for `len` bytes) and where
/// its bytes start.
fn read_datagram(message: &[u8]) -> Option<(RecvMeta, usize)> {
    let from = take_ip(message.get(1..)?)??;
    let port = u16::from_be_bytes(message.get(18..20)?.try_into().ok()?);
    let dst_ip = take_ip(message.get(20..)?)?;
    let ecn = EcnCodepoint::from_bits(*message.get(37)?);
    let start = 38;
    let len = message.len().checked_sub(start)?;
    let meta = RecvMeta {
        addr: SocketAddr::new(from, port),
        len,
        stride: len,
        ecn,
        dst_ip,
    };
    Some((meta, start))
}

/// The endpoint's socket: the UDP socket, with what the channel brings.
#[derive(Debug)]
pub(super) struct Routed {
    inner: Arc<dyn AsyncUdpSocket>,
    handover: Arc<Handover>,
    /// A message read off a channel.
    scratch: Mutex<Vec<u8>>,
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handover").field("me", &self.me).finish()
    }
}

impl Routed {
    pub(super) fn new(inner: Arc<dyn AsyncUdpSocket>, handover: Arc<Handover>) -> Routed {
        Routed {
            inner,
            handover,
            scratch: Mutex::new(vec![0u8; MESSAGE]),
        }
    }

    /// A datagram a channel brought, into `buf` and `meta`; control
    /// messages are acted on.
    fn poll_channels(
        &self,
        cx: &mut Context,
        buf: &mut IoSliceMut<'_>,
        meta: &mut RecvMeta,
    ) -> Poll<usize> {
        let h = &self.handover;
        let mut scratch = self.scratch.lock();
        let channels = std::iter::once(&h.mine).chain(h.predecessor.as_ref().map(|(c, _)| c));
        for channel in channels {
            while let Poll::Ready(Ok(n)) = poll_message(channel, cx, &mut scratch) {
                let message = &scratch[..n];
                match message.first() {
                    Some(&HELLO) => self.answer_hello(message),
                    Some(&CONFIRM) => self.confirmed(message),
                    Some(&DATAGRAM) => {
                        let Some((read, start)) = read_datagram(message) else {
                            continue;
                        };
                        if read.len > buf.len() {
                            continue;
                        }
                        buf[..read.len].copy_from_slice(&message[start..]);
                        *meta = read;
                        return Poll::Ready(1);
                    }
                    _ => {}
                }
            }
        }
        Poll::Pending
    }

    /// A successor said hello: it gets this process's identity.
    fn answer_hello(&self, message: &[u8]) {
        let Some(them) = Identity::decode(&message[1..]) else {
            return;
        };
        let mut answer = vec![ANSWER];
        answer.extend_from_slice(&self.handover.me.encode());
        if self.handover.mine.try_send(&answer).is_ok() {
            *self.handover.greeted.lock() = Some(them);
        }
    }

    /// The successor got the answer: it gets every datagram not this
    /// process's from now on.
    fn confirmed(&self, message: &[u8]) {
        let them = Identity::decode(&message[1..]);
        if them.is_some() && *self.handover.greeted.lock() == them {
            log::info!("quic: a new process took over; this one keeps its own connections");
            self.handover.successor.store(them.map(Arc::new));
        }
    }

    /// Sends on what is another process's, keeps the rest (GRO's batches
    /// split as needed); how many entries are left.
    fn route(&self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta], n: usize) -> usize {
        let mut kept = 0;
        for i in 0..n {
            let m = meta[i];
            let stride = if m.stride == 0 { m.len } else { m.stride };
            let buf = &mut bufs[i][..m.len];
            let (mut write, mut at) = (0, 0);
            while at < m.len {
                let end = (at + stride).min(m.len);
                match self.handover.route(&buf[at..end]) {
                    Some(channel) => {
                        // A full channel drops it: QUIC sends it again.
                        let _ = channel.try_send(&datagram_message(&m, &buf[at..end]));
                    }
                    None => {
                        buf.copy_within(at..end, write);
                        write += end - at;
                    }
                }
                at = end;
            }
            if write == 0 {
                continue;
            }
            meta[kept] = RecvMeta { len: write, ..m };
            if kept != i {
                let (to, from) = bufs.split_at_mut(i);
                to[kept][..write].copy_from_slice(&from[0][..write]);
            }
            kept += 1;
        }
        kept
    }
}

/// One message off `channel` into `buf`.
fn poll_message(
    channel: &UnixDatagram,
    cx: &mut Context,
    buf: &mut [u8],
) -> Poll<io::Result<usize>> {
    loop {
        ready!(channel.poll_recv_ready(cx))?;
        match channel.try_recv(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            read => return Poll::Ready(read),
        }
    }
}

impl AsyncUdpSocket for Routed {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Arc::clone(&self.inner).create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        if let (Some(buf), Some(m)) = (bufs.first_mut(), meta.first_mut()) {
            if let Poll::Ready(n) = self.poll_channels(cx, buf, m) {
                return Poll::Ready(Ok(n));
            }
        }
        loop {
            let n = ready!(self.inner.poll_recv(cx, bufs, meta))?;
            if !self.handover.routing() {
                return Poll::Ready(Ok(n));
            }
            let kept = self.route(bufs, meta, n);
            if kept > 0 {
                return Poll::Ready(Ok(kept));
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::{datagram_message, destination_cid, read_datagram, Identity, Issuer, CID_LEN};
    use quinn::udp::RecvMeta;
    use quinn::ConnectionIdGenerator;

    #[test]
    fn each_process_knows_its_own_connection_ids_and_no_other() {
        let (a, b) = (Identity::random(), Identity::random());
        let mut issue_a = Issuer {
            me: a,
            predecessor: None,
        };
        for _ in 0..1000 {
            let cid = issue_a.generate_cid();
            assert!(a.owns(&cid));
        }
        // b, after a: none of b's reads as a's.
        let mut issue_b = Issuer {
            me: b,
            predecessor: Some(a),
        };
        for _ in 0..200_000 {
            let cid = issue_b.generate_cid();
            assert!(b.owns(&cid) && !a.owns(&cid));
        }
        assert_eq!(Identity::decode(&a.encode()), Some(a));
    }

    #[test]
    fn a_packet_names_its_destination_in_either_header() {
        let mut short = vec![0x40];
        short.extend_from_slice(&[7; CID_LEN]);
        short.extend_from_slice(b"payload");
        assert_eq!(destination_cid(&short), Some(&[7u8; CID_LEN][..]));
        let mut long = vec![0xc0, 0, 0, 0, 1, 4, 1, 2, 3, 4, 0];
        long.extend_from_slice(b"rest");
        assert_eq!(destination_cid(&long), Some(&[1u8, 2, 3, 4][..]));
        assert_eq!(destination_cid(&[0xc0, 0, 0]), None);
    }

    #[test]
    fn a_datagram_crosses_the_channel_with_its_addresses() {
        for addr in ["192.0.2.7:443", "[2001:db8::1]:8443"] {
            let meta = RecvMeta {
                addr: addr.parse().unwrap(),
                len: 5,
                stride: 5,
                ecn: quinn::udp::EcnCodepoint::from_bits(0b10),
                dst_ip: Some("127.0.0.1".parse().unwrap()),
            };
            let message = datagram_message(&meta, b"bytes");
            let (read, start) = read_datagram(&message).unwrap();
            assert_eq!(read.addr, meta.addr);
            assert_eq!(read.dst_ip, meta.dst_ip);
            assert_eq!(read.ecn, meta.ecn);
            assert_eq!(&message[start..], b"bytes");
            assert_eq!(read.len, 5);
        }
    }
}
