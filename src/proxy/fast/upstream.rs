//! Upstream attempts and the per-thread pool: a request head sent on a
//! pooled or new connection, its response head awaited under the
//! pipeline's headers watch, and idle connections kept per shard for the
//! next request of the same worker thread.

use super::response::{parse_response, ParsedResponse, MAX_RESPONSE_HEAD};
use super::FastPath;
use crate::proxy::hooks::UpstreamFailure;
use crate::proxy::pipeline::failure::AttemptFailure;
use crate::proxy::pipeline::watch::{quiet, Verdict, Waiting};
use bytes::BytesMut;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use thread_local::ThreadLocal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How often idle connections are swept at most (and at least): a closed
/// one is dropped within this much of its shard closing it, an expired one
/// within this much of `upstream.keepalive_timeout_ms`.
const SWEEP_MIN: Duration = Duration::from_millis(250);
const SWEEP_MAX: Duration = Duration::from_secs(5);

/// Idle upstream connections of one worker thread, per shard address.
#[derive(Default)]
pub(super) struct Pool {
    idle: HashMap<SocketAddr, Vec<(TcpStream, Instant)>>,
}

/// Every worker thread's pool. A thread's own requests take and return
/// connections under its lock (never contended but by the sweep).
pub(super) type Pools = Arc<ThreadLocal<Mutex<Pool>>>;

impl FastPath {
    fn pool(&self) -> parking_lot::MutexGuard<'_, Pool> {
        self.pools.get_or(Mutex::default).lock()
    }

    /// A pooled connection to `addr`, if any: the most recently used one
    /// that is neither expired nor has anything to read. Every reuse costs
    /// one non-blocking read: a connection with bytes on it (the shard
    /// closed it, or sent bytes no request asked for) is dropped, so bytes
    /// from before a request never answer it. Trusting the reactor's
    /// readiness instead was cheaper but not exact: bytes that arrived
    /// since its last turn went unseen. One closed too recently for even
    /// the read to see is resent once on a fresh connection (see
    /// `after_failure`).
    fn pooled(&self, addr: SocketAddr) -> Option<TcpStream> {
        let mut pool = self.pool();
        let idle = pool.idle.get_mut(&addr)?;
        while let Some((conn, since)) = idle.pop() {
            if since.elapsed() < self.idle_timeout && nothing_to_read(&conn) {
                return Some(conn);
            }
        }
        None
    }

    /// Drops this thread's idle connections to `addr` (one was found
    /// closed: the shard may have restarted).
    pub(super) fn forget(&self, addr: SocketAddr) {
        self.pool().idle.remove(&addr);
    }

    /// Keeps `conn` for the next request to `addr` (up to
    /// `upstream.pool_per_shard` per shard and thread). The first release
    /// starts the sweep.
    pub(super) fn release(&self, addr: SocketAddr, conn: TcpStream) {
        self.sweeping.call_once(|| {
            let every = (self.idle_timeout / 4).clamp(SWEEP_MIN, SWEEP_MAX);
            tokio::spawn(sweep(Arc::downgrade(&self.pools), self.idle_timeout, every));
        });
        let mut pool = self.pool();
        let idle = pool.idle.entry(addr).or_default();
        if idle.len() < self.pool_per_shard {
            idle.push((conn, Instant::now()));
        }
    }

    /// Sends the request on a pooled or new connection and reads the
    /// response head, within the headers deadline and with liveness probes.
    pub(super) async fn attempt(
        &self,
        addr: SocketAddr,
        request: &[u8],
        head_only: bool,
        websocket: bool,
    ) -> Result<Upstream, AttemptFailure> {
        let (mut conn, broken) = match self.pooled(addr) {
            Some(conn) => (conn, AttemptFailure::Stale),
            None => {
                let connect = tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr));
                let Ok(Ok(conn)) = connect.await else {
                    return Err(AttemptFailure::Shard(UpstreamFailure::Connect));
                };
                let _ = conn.set_nodelay(true);
                (conn, AttemptFailure::Reset)
            }
        };
        let settings = self.gateway.watch_settings();
        let started = tokio::time::Instant::now();
        let deadline = started + settings.headers_timeout;
        match tokio::time::timeout_at(deadline, conn.write_all(request)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(broken),
            Err(_) => return Err(AttemptFailure::Shard(UpstreamFailure::Timeout)),
        }
        let mut waiting = Waiting::new(settings, started);
        let mut buf = BytesMut::with_capacity(8192);
        let mut received = false;
        loop {
            tokio::select! {
                read = conn.read_buf(&mut buf) => {
                    match read {
                        // Nothing came back on a pooled connection: stale.
                        Ok(0) | Err(_) if !received => return Err(broken),
                        Ok(0) | Err(_) => return Err(AttemptFailure::Reset),
                        Ok(_) => received = true,
                    }
                    match parse_response(&buf, head_only, websocket) {
                        Ok(Some(parsed)) => return Ok(Upstream { conn, buf, parsed }),
                        Ok(None) if buf.len() <= MAX_RESPONSE_HEAD => {}
                        _ => return Err(AttemptFailure::Invalid),
                    }
                }
                _ = tokio::time::sleep_until(waiting.wake(deadline)) => {
                    match waiting.look(deadline, addr).await {
                        Verdict::None => {}
                        Verdict::TimedOut => return Err(AttemptFailure::Shard(UpstreamFailure::Timeout)),
                        Verdict::Unreachable => return Err(AttemptFailure::Shard(UpstreamFailure::Liveness)),
                    }
                }
            }
        }
    }
}

/// Drops idle connections that expired or that their shard closed (or
/// sent to), on every thread — a quiet thread's too, which no request
/// would visit — so none lingers in CLOSE_WAIT. Costs one non-blocking
/// read per idle connection per round, nothing when there are none.
/// Ends with the pools (the fast transport is gone).
async fn sweep(pools: Weak<ThreadLocal<Mutex<Pool>>>, timeout: Duration, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pools) = pools.upgrade() else {
            return;
        };
        for pool in pools.iter() {
            pool.lock().idle.retain(|_, idle| {
                idle.retain(|(conn, since)| since.elapsed() < timeout && nothing_to_read(conn));
                !idle.is_empty()
            });
        }
    }
}

/// Whether an idle connection has neither been closed nor sent anything.
fn nothing_to_read(conn: &TcpStream) -> bool {
    quiet(conn.as_raw_fd())
}

/// An attempt that got a response head.
pub(super) struct Upstream {
    pub(super) conn: TcpStream,
    pub(super) buf: BytesMut,
    pub(super) parsed: ParsedResponse,
}
