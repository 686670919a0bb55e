//! Where and how to reach one shard: its resolved address, the fast
//! transport's pool key, and the Pingora peer template. `Control` keeps
//! one per shard; both transports read it, and the TCP keep-alive here is
//! the one on every shard socket and every client socket.

use crate::config::Config;
use crate::routing::{Shard, ShardProtocol};
use pingora::tls::ServerName;
use pingora::upstreams::peer::{HttpPeer, ALPN};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// Streams one HTTP/2 connection to a shard carries at most (fewer if
/// the shard says so) before another is opened.
pub const MAX_H2_STREAMS: usize = 100;

/// Where and how to reach one shard.
#[derive(Clone, Debug)]
pub struct ShardPeer {
    /// The resolved address (also what liveness and health probes dial).
    pub addr: SocketAddr,
    /// The fast transport's endpoint: the address, and for an `https`
    /// shard the name its certificate is verified for (sent as SNI).
    pub key: UpstreamKey,
    /// The Pingora peer template, cloned per request.
    pub peer: HttpPeer,
    /// How the shard is spoken to (DESIGN §8).
    pub protocol: ShardProtocol,
    /// Each connection opens with a PROXY v2 header naming the client, and
    /// serves that one request (DESIGN §10).
    pub proxy_protocol: bool,
}

/// Which pooled connections may serve a shard: the same address, and for
/// TLS the same verified name.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct UpstreamKey {
    pub addr: SocketAddr,
    /// The name TLS verifies and sends as SNI; `None` for plain HTTP.
    pub tls: Option<ServerName<'static>>,
}

/// Resolves a shard's URL into a Pingora peer.
pub fn build_peer(config: &Config, shard: &Shard) -> Result<ShardPeer, String> {
    let (_, host, port) = crate::config::parse_shard_url(&shard.url)?;
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("shard `{}`: cannot resolve `{host}`: {e}", shard.id))?
        .next()
        .ok_or_else(|| format!("shard `{}`: `{host}` has no address", shard.id))?;
    peer_at(config, shard, addr)
}

/// The peer of `shard` at the address `addr` (its host resolved).
pub fn peer_at(config: &Config, shard: &Shard, addr: SocketAddr) -> Result<ShardPeer, String> {
    let (tls, host, _) = crate::config::parse_shard_url(&shard.url)?;
    crate::config::shard_protocol(Some(shard.protocol.as_str()), tls)
        .map_err(|e| format!("shard `{}`: protocol: {e}", shard.id))?;
    // Whatever brought the shard (a state file, the cluster): a PROXY
    // header names one client, an HTTP/2 connection carries many.
    let proxied = shard.proxy_protocol.then_some("v2");
    crate::config::shard_proxy_protocol(proxied, shard.protocol, true)
        .map_err(|e| format!("shard `{}`: proxy_protocol: {e}", shard.id))?;
    let name = match tls {
        true => {
            // An IP literal in brackets is verified as that address.
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            let name = pingora::tls::ServerName::try_from(bare.to_string())
                .map_err(|e| format!("shard `{}`: `{host}` is no TLS name: {e}", shard.id))?;
            Some(name)
        }
        false => None,
    };
    let mut peer = HttpPeer::new(addr, tls, host);
    let options = &mut peer.options;
    options.connection_timeout = Some(config.upstream.connect_timeout);
    // The handshake fits in the connect timeout with the TCP connect.
    options.total_connection_timeout = Some(config.upstream.connect_timeout);
    options.verify_cert = config.upstream.tls_verify;
    options.verify_hostname = config.upstream.tls_verify;
    // Response headers are watched by our own deadline, a body's silence
    // by the same watch (`upstream.read_timeout_ms`), which a WebSocket
    // tunnel skips; Pingora's per-read timeout would cut tunnels and slow
    // uploads alike.
    options.read_timeout = None;
    options.idle_timeout = Some(config.upstream.keepalive_timeout);
    // As on the fast transport's shard sockets.
    options.tcp_keepalive = Some(keepalive());
    options.alpn = match shard.protocol {
        ShardProtocol::Http1 => ALPN::H1,
        // Cleartext: prior knowledge (HTTP/2 is the least version, so no
        // HTTP/1 session is made); TLS: ALPN `h2` only.
        ShardProtocol::H2 => ALPN::H2,
        ShardProtocol::Auto => ALPN::H2H1,
    };
    // Streams per HTTP/2 connection before another opens (the shard's own
    // SETTINGS_MAX_CONCURRENT_STREAMS lowers it), and a ping on idle ones:
    // a vanished host is found by its silence.
    options.max_h2_streams = MAX_H2_STREAMS;
    options.h2_ping_interval = config.upstream.liveness.as_ref().map(|l| l.after);
    Ok(ShardPeer {
        addr,
        key: UpstreamKey { addr, tls: name },
        peer,
        protocol: shard.protocol,
        proxy_protocol: shard.proxy_protocol,
    })
}

/// TCP keep-alive on a tunnel's sockets (clients get it from the
/// listener, TLS or not): a peer that vanished
/// without a FIN (a host powered off, a NAT entry expired) is found out
/// within about two minutes of silence, and its admission freed; an idle
/// tunnel has no timer of its own. The same bound holds bytes sent and
/// never acknowledged (`TCP_USER_TIMEOUT`), which keep-alive probes do
/// not cover.
const TUNNEL_KEEPALIVE: (Duration, Duration, usize) =
    (Duration::from_secs(60), Duration::from_secs(10), 6);
const TUNNEL_USER_TIMEOUT: Duration = Duration::from_secs(120);

/// The keep-alive of every client socket (set by the listener, see
/// `server.rs`) and of every shard socket (a shard host that vanishes
/// without a FIN frees what waits on it).
pub fn keepalive() -> pingora::protocols::l4::ext::TcpKeepalive {
    let (idle, interval, count) = TUNNEL_KEEPALIVE;
    pingora::protocols::l4::ext::TcpKeepalive {
        idle,
        interval,
        count,
        #[cfg(target_os = "linux")]
        user_timeout: TUNNEL_USER_TIMEOUT,
    }
}
