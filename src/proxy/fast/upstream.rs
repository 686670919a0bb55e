//! Connections to shards: opened (TCP, and TLS for `https` shards, both
//! within `upstream.connect_timeout_ms`) or taken from the per-thread
//! pool, and given back to it after a response that leaves them clean.

use super::exchange::Request;
use super::FastPath;
use crate::control::ShardPeer;
use crate::proxy::hooks::UpstreamFailure;
use crate::proxy::pipeline::failure::AttemptFailure;
use crate::proxy::upstream::conn::{Conn, UpstreamKey};
use crate::proxy::upstream::h2::{FieldRules, Opened};
use crate::routing::ShardProtocol;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;
use thread_local::ThreadLocal;
use tokio::net::TcpStream;

/// How often idle connections are swept at most (and at least): a closed
/// one is dropped within this much of its shard closing it, an expired one
/// within this much of `upstream.keepalive_timeout_ms`.
const SWEEP_MIN: Duration = Duration::from_millis(250);
const SWEEP_MAX: Duration = Duration::from_secs(5);

/// Idle upstream connections of one worker thread, per shard endpoint.
#[derive(Default)]
pub(super) struct Pool {
    idle: HashMap<UpstreamKey, Vec<(Conn, Idle)>, foldhash::fast::RandomState>,
}

/// Since when a connection is idle, on the coarse clock (a few
/// nanoseconds a read; a keep-alive timeout needs no finer).
#[derive(Clone, Copy)]
pub(super) struct Idle(coarsetime::Instant);

impl Idle {
    fn now() -> Idle {
        Idle(coarsetime::Instant::now_without_cache_update())
    }

    /// Idle for less than `timeout`.
    fn fresh(self, timeout: Duration) -> bool {
        let now = coarsetime::Instant::now_without_cache_update();
        Duration::from(now - self.0) < timeout
    }
}

/// Every worker thread's pool. A thread's own requests take and return
/// connections under its lock (never contended but by the sweep).
pub(super) type Pools = Arc<ThreadLocal<Mutex<Pool>>>;

/// A connection for an attempt, and whether it came from the pool (a
/// reused one may have been closed by the shard just as it was taken).
pub(super) struct Connection {
    pub conn: Conn,
    pub reused: bool,
}

impl FastPath {
    fn pool(&self) -> parking_lot::MutexGuard<'_, Pool> {
        self.pools.get_or(Mutex::default).lock()
    }

    /// A connection to `peer`: the most recently used pooled one that is
    /// neither expired nor has anything to read (see [`Conn::is_quiet`]),
    /// else a new one. One closed too recently for even that check to see
    /// is resent once on a fresh connection (see `after_failure`).
    pub(super) async fn connection(
        &self,
        peer: &ShardPeer,
        request: &Request<'_>,
    ) -> Result<Connection, AttemptFailure> {
        // A WebSocket handshake to an `auto` shard goes in HTTP/1.1 (it
        // speaks both); to an `h2` shard as an extended CONNECT.
        let h2 = match peer.protocol {
            ShardProtocol::H2 => true,
            ShardProtocol::Auto => !request.websocket,
            ShardProtocol::Http1 => false,
        };
        if h2 {
            let rules = FieldRules {
                te_trailers: request.te_trailers,
                request_id: self.gateway.control().config.request_id.header.clone(),
            };
            match self.h2.open(peer, &self.tls, rules).await? {
                Opened::Stream(stream, reused) => {
                    let conn = Conn::H2(stream);
                    return Ok(Connection { conn, reused });
                }
                Opened::Http1(conn) => {
                    return Ok(Connection {
                        conn,
                        reused: false,
                    })
                }
                Opened::UseHttp1 => {}
            }
        }
        // A PROXY header opens each connection (none is pooled, and one
        // pooled before the shard asked for them has none).
        if !peer.proxy_protocol {
            if let Some(conn) = self.pooled(&peer.key) {
                return Ok(Connection { conn, reused: true });
            }
        }
        let connect = async {
            let mut tcp = TcpStream::connect(peer.addr).await?;
            let _ = tcp.set_nodelay(true);
            super::tunnel::keep_alive(&tcp);
            if peer.proxy_protocol {
                use tokio::io::AsyncWriteExt;
                tcp.write_all(&proxy_header(request.ends)?).await?;
            }
            match &peer.key.tls {
                None => Ok(Conn::Plain(tcp)),
                Some(name) => self.tls.connect(name.clone(), tcp).await,
            }
        };
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(conn)) => Ok(Connection {
                conn,
                reused: false,
            }),
            Ok(Err(e)) => {
                log::debug!("connecting to {} failed: {e}", peer.addr);
                Err(AttemptFailure::Shard(UpstreamFailure::Connect))
            }
            Err(_) => Err(AttemptFailure::Shard(UpstreamFailure::Connect)),
        }
    }

    fn pooled(&self, key: &UpstreamKey) -> Option<Conn> {
        let mut pool = self.pool();
        let idle = pool.idle.get_mut(key)?;
        while let Some((mut conn, since)) = idle.pop() {
            if since.fresh(self.idle_timeout) && conn.is_quiet() {
                return Some(conn);
            }
        }
        None
    }

    /// Drops this thread's idle connections to `key` (one was found
    /// closed: the shard may have restarted).
    pub(super) fn forget(&self, key: &UpstreamKey) {
        self.pool().idle.remove(key);
    }

    /// Keeps `conn` for the next request to `key` (up to
    /// `upstream.pool_per_shard` per shard and thread). The first release
    /// starts the sweep.
    pub(super) fn release(&self, peer: &ShardPeer, conn: Conn) {
        // A stream ends here; its connection stays in the HTTP/2 pool. A
        // connection that opened with a PROXY header named its client: it
        // serves no other request.
        if matches!(conn, Conn::H2(_)) || peer.proxy_protocol {
            return;
        }
        let key = &peer.key;
        self.sweeping.call_once(|| {
            let every = (self.idle_timeout / 4).clamp(SWEEP_MIN, SWEEP_MAX);
            let control = Arc::downgrade(self.gateway.control());
            tokio::spawn(sweep(
                Arc::downgrade(&self.pools),
                control,
                self.idle_timeout,
                every,
            ));
        });
        let mut pool = self.pool();
        let idle = match pool.idle.get_mut(key) {
            Some(idle) => idle,
            None => pool.idle.entry(key.clone()).or_default(),
        };
        if idle.len() < self.pool_per_shard {
            idle.push((conn, Idle::now()));
        }
    }
}

/// The PROXY v2 header that opens a connection to a shard for a client at
/// `ends` (its address, and the one it connected to): `LOCAL` when they
/// are not known (the shard then takes the gateway for the client).
fn proxy_header(ends: super::exchange::Ends) -> std::io::Result<Vec<u8>> {
    use ppp::v2::{Addresses, Builder, Command, Protocol, Version};
    let (command, addresses) = match ends {
        Some((client, local)) => {
            let client = std::net::SocketAddr::new(client.ip().to_canonical(), client.port());
            let local = std::net::SocketAddr::new(local.ip().to_canonical(), local.port());
            // One family for both: a client a balancer named may be of
            // the other family than the socket it reached us on; the
            // local end is then its family's unspecified address.
            let local = match (client.is_ipv4(), local.is_ipv4()) {
                (true, false) => (std::net::Ipv4Addr::UNSPECIFIED, local.port()).into(),
                (false, true) => (std::net::Ipv6Addr::UNSPECIFIED, local.port()).into(),
                _ => local,
            };
            (Command::Proxy, Addresses::from((client, local)))
        }
        None => (Command::Local, Addresses::Unspecified),
    };
    Builder::with_addresses(Version::Two | command, Protocol::Stream, addresses).build()
}

/// Drops idle connections that expired, that their shard closed (or sent
/// to), or whose endpoint no shard has any more (removed, or its name now
/// resolves elsewhere), on every thread — a quiet thread's too, which no
/// request would visit — so none lingers in CLOSE_WAIT. Costs one
/// non-blocking read per idle connection per round, nothing when there
/// are none. Ends with the pools (the fast transport is gone).
async fn sweep(
    pools: Weak<ThreadLocal<Mutex<Pool>>>,
    control: Weak<crate::control::Control>,
    timeout: Duration,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (Some(pools), Some(control)) = (pools.upgrade(), control.upgrade()) else {
            return;
        };
        let current: HashSet<UpstreamKey> = control.peer_keys();
        drop(control);
        for pool in pools.iter() {
            pool.lock().idle.retain(|key, idle| {
                let known = current.contains(key);
                idle.retain_mut(|(conn, since)| known && since.fresh(timeout) && conn.is_quiet());
                !idle.is_empty()
            });
        }
    }
}
