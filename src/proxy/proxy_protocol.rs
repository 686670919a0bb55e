//! The PROXY protocol (HAProxy's, versions 1 and 2) on a listener behind
//! a balancer (DESIGN §10): each connection opens with a header naming
//! the client, read before anything else (a TLS handshake included) and
//! put in the connection's socket digest, where every use of the client's
//! address looks (forwarding fields, logs, traces, limits, the admin's top
//! lists), on both transports and every protocol.
//!
//! Only peers in `proxy_protocol_from` may send one. A connection from
//! any other peer, without a header, with a malformed one, or whose header
//! is not whole within the head's deadline is closed. A v2 `LOCAL` header
//! (the balancer's own health check), a v1 `UNKNOWN` one, or one of an
//! address family other than TCP/UDP over IP keeps the peer's address.
//! Parsing is the `ppp` crate's; the header is bounded here (a v1 line is
//! 107 bytes at most, a v2 header [`MAX_V2`] with its TLVs).

use super::head::HEAD_READ;
use crate::config::Cidr;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::{SocketDigest, Stream};
use ppp::{v1, v2, HeaderResult, PartialResult};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// A v1 header's longest line (the specification's bound).
const MAX_V1: usize = 107;

/// The longest v2 header taken: its 16 bytes and 4 KiB of addresses and
/// TLVs (balancers add a few dozen bytes: a VPC endpoint, a TLS summary).
const MAX_V2: usize = 16 + 4096;

/// The 12 bytes that open a v2 header.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// Why a connection was closed before its first request.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The peer is not in `proxy_protocol_from`.
    Peer(SocketAddr),
    /// No whole header within the head's deadline.
    Timeout,
    /// The connection closed (or failed) before the header ended.
    Closed,
    /// Not a PROXY header, or a malformed one.
    Malformed,
    /// Longer than a header may be.
    TooLong,
}

/// Reads the PROXY header that opens `stream` (accepted on a listener
/// taking them from `from`) within `deadline`; the stream back, its
/// socket digest naming the client the header names, the bytes that came
/// after the header put back in front.
pub async fn accept(
    mut stream: Stream,
    from: &[Cidr],
    deadline: Duration,
) -> Result<Stream, Refused> {
    let digest = stream.get_socket_digest();
    let peer = (digest.as_ref())
        .and_then(|d| d.peer_addr())
        .and_then(|a| a.as_inet())
        .copied()
        .ok_or(Refused::Closed)?;
    if !from.iter().any(|block| block.contains(peer.ip())) {
        return Err(Refused::Peer(peer));
    }
    let mut buf = Vec::new();
    let read = tokio::time::timeout(deadline, read_header(&mut stream, &mut buf)).await;
    let (client, used) = read.map_err(|_| Refused::Timeout)??;
    if let Some(client) = client {
        let named = SocketDigest::from_raw_fd(stream.id());
        let _ = named.peer_addr.set(Some(client.into()));
        if let Some(local) = digest.as_ref().and_then(|d| d.local_addr()) {
            let _ = named.local_addr.set(Some(local.clone()));
        }
        stream.set_socket_digest(named);
    }
    put_back(stream, &buf[used..])
}

/// `stream` with `rest` to be read first, in the TCP stream's own rewind
/// buffer: it stays the TCP stream a TLS handshake takes.
fn put_back(stream: Stream, rest: &[u8]) -> Result<Stream, Refused> {
    if rest.is_empty() {
        return Ok(stream);
    }
    match stream.into_any().downcast::<L4Stream>() {
        Ok(mut tcp) => {
            tcp.rewind(rest);
            Ok(tcp)
        }
        Err(_) => {
            log::error!("PROXY protocol: a listener's connection is not a TCP stream");
            Err(Refused::Closed)
        }
    }
}

/// Reads until `buf` starts with a whole header: the client it names (if
/// it names one) and the header's length.
async fn read_header(
    stream: &mut Stream,
    buf: &mut Vec<u8>,
) -> Result<(Option<SocketAddr>, usize), Refused> {
    loop {
        if let Some(parsed) = parse(buf)? {
            return Ok(parsed);
        }
        if buf.len() >= MAX_V2 {
            return Err(Refused::TooLong);
        }
        // No more a read than the head reader reads: what came after the
        // header goes back in the stream's rewind buffer, which its first
        // read must empty (a tunnel later takes the socket itself).
        // Into spare room, not zeroed first.
        let room = HEAD_READ.min(MAX_V2 - buf.len());
        buf.reserve_exact(room);
        let n = stream
            .read_buf(&mut bytes::BufMut::limit(&mut *buf, room))
            .await;
        if !matches!(n, Ok(1..)) {
            return Err(Refused::Closed);
        }
    }
}

/// The header at the start of `buf`: `Ok(None)` while it may still
/// become one.
pub fn parse(buf: &[u8]) -> Result<Option<(Option<SocketAddr>, usize)>, Refused> {
    // A v2 header says its length at once: one longer than taken is
    // refused before it is read.
    if let (Some(V2_SIGNATURE), Some(&[high, low])) = (buf.first_chunk(), buf.get(14..16)) {
        if 16 + usize::from(u16::from_be_bytes([high, low])) > MAX_V2 {
            return Err(Refused::TooLong);
        }
    }
    let header = HeaderResult::parse(buf);
    if header.is_incomplete() {
        let v1 = buf.len() >= 5 && buf.starts_with(b"PROXY");
        return match v1 && buf.len() > MAX_V1 {
            true => Err(Refused::TooLong),
            false => Ok(None),
        };
    }
    match header {
        HeaderResult::V1(Ok(header)) => {
            let client = match header.addresses {
                v1::Addresses::Tcp4(a) => Some((a.source_address, a.source_port).into()),
                v1::Addresses::Tcp6(a) => Some((a.source_address, a.source_port).into()),
                v1::Addresses::Unknown => None,
            };
            Ok(Some((client, header.header.len())))
        }
        HeaderResult::V2(Ok(header)) => {
            let client = match (header.command, header.addresses) {
                (v2::Command::Local, _) => None,
                (_, v2::Addresses::IPv4(a)) => Some((a.source_address, a.source_port).into()),
                (_, v2::Addresses::IPv6(a)) => Some((a.source_address, a.source_port).into()),
                (_, v2::Addresses::Unspecified | v2::Addresses::Unix(_)) => None,
            };
            Ok(Some((client, header.header.len())))
        }
        HeaderResult::V1(Err(_)) | HeaderResult::V2(Err(_)) => Err(Refused::Malformed),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse, Refused, MAX_V1};

    fn v2(command: u8, family: u8, addresses: &[u8]) -> Vec<u8> {
        let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        h.push(0x20 | command);
        h.push(family);
        h.extend_from_slice(&(addresses.len() as u16).to_be_bytes());
        h.extend_from_slice(addresses);
        h
    }

    #[test]
    fn both_versions_name_the_client_and_their_length() {
        let line = b"PROXY TCP4 203.0.113.7 10.0.0.1 5555 443\r\nGET /";
        let (client, len) = parse(line).unwrap().unwrap();
        assert_eq!(client.unwrap().to_string(), "203.0.113.7:5555");
        assert_eq!(&line[len..], b"GET /");
        let line = b"PROXY TCP6 2001:db8::1 2001:db8::2 5555 443\r\n";
        let (client, _) = parse(line).unwrap().unwrap();
        assert_eq!(client.unwrap().to_string(), "[2001:db8::1]:5555");
        assert_eq!(parse(b"PROXY UNKNOWN\r\n").unwrap(), Some((None, 15)));
        // v2, TCP over IPv4: addresses, ports, then a TLV (type 1, "h2").
        let mut addrs = vec![198, 51, 100, 9, 10, 0, 0, 1, 0x1f, 0x90, 1, 187];
        addrs.extend_from_slice(&[1, 0, 2, b'h', b'2']);
        let mut h = v2(1, 0x11, &addrs);
        let whole = h.len();
        h.extend_from_slice(b"\x16\x03\x01");
        let (client, len) = parse(&h).unwrap().unwrap();
        assert_eq!(
            (client.unwrap().to_string().as_str(), len),
            ("198.51.100.9:8080", whole)
        );
        // LOCAL: the balancer's own connection, no client named.
        let local = v2(0, 0x00, &[]);
        assert_eq!(parse(&local).unwrap(), Some((None, 16)));
    }

    #[test]
    fn a_partial_header_waits_and_anything_else_is_refused() {
        assert_eq!(parse(b"PROX").unwrap(), None);
        assert_eq!(parse(b"PROXY TCP4 203.0.113.7 10.0.").unwrap(), None);
        assert_eq!(parse(&v2(1, 0x11, &[0; 12])[..20]).unwrap(), None);
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(Refused::Malformed));
        assert_eq!(
            parse(b"PROXY TCP4 999.0.0.1 10.0.0.1 1 2\r\n"),
            Err(Refused::Malformed)
        );
        // A line without its end, past where it must end.
        let long = [b"PROXY UNKNOWN ".as_slice(), &[b'x'; MAX_V1]].concat();
        assert!(parse(&long).is_err());
        // A v2 header longer than taken, refused at its length.
        let mut long = v2(1, 0x11, &[0; 12]);
        long[14..16].copy_from_slice(&5000u16.to_be_bytes());
        assert_eq!(parse(&long[..16]), Err(Refused::TooLong));
        // A v2 header of an unknown version.
        let mut bad = v2(1, 0x11, &[0; 12]);
        bad[12] = 0x31;
        assert_eq!(parse(&bad), Err(Refused::Malformed));
    }
}
