//! Upstream attempts and the per-thread pool: a request head sent on a
//! pooled or new connection, its response head awaited under the
//! pipeline's headers watch, and idle connections kept per shard for the
//! next request of the same worker thread.

use super::response::{parse_response, ParsedResponse, MAX_RESPONSE_HEAD};
use super::FastPath;
use crate::proxy::hooks::UpstreamFailure;
use crate::proxy::pipeline::failure::AttemptFailure;
use crate::proxy::pipeline::watch::{Verdict, Waiting};
use bytes::BytesMut;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::task::Context;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Idle upstream connections kept per shard and worker thread.
const POOL_PER_SHARD: usize = 256;
/// Every this many releases, a thread's pool drops expired connections to
/// every shard (removed shards included).
const POOL_SWEEP_EVERY: u32 = 1024;
/// Pooled connections idle for longer are checked before reuse.
const CHECK_IDLE_AFTER: Duration = Duration::from_secs(1);

/// Idle upstream connections of one worker thread, per shard address.
#[derive(Default)]
pub(super) struct Pool {
    idle: HashMap<SocketAddr, Vec<(TcpStream, Instant)>>,
    releases: u32,
}

impl FastPath {
    fn pool(&self) -> std::cell::RefMut<'_, Pool> {
        self.pools.get_or(RefCell::default).borrow_mut()
    }

    /// A pooled connection to `addr`, if any: the most recently used one.
    /// A connection the reactor has seen become readable while idle (the
    /// shard closed it, or sent bytes no request asked for — reused, they
    /// would answer the next request) is checked with a read and dropped
    /// unless that finds nothing; so is one idle for longer than
    /// [`CHECK_IDLE_AFTER`]. A quiet young one costs no syscall (a peek
    /// on every reuse was one syscall in five under load); one closed too
    /// recently for the reactor to know is retried once on a fresh
    /// connection (see `after_failure`).
    fn pooled(&self, addr: SocketAddr) -> Option<TcpStream> {
        let mut pool = self.pool();
        let idle = pool.idle.get_mut(&addr)?;
        while let Some((conn, since)) = idle.pop() {
            let idle_for = since.elapsed();
            if idle_for >= self.idle_timeout {
                continue;
            }
            let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
            let quiet = conn.poll_read_ready(&mut cx).is_pending();
            if (quiet && idle_for < CHECK_IDLE_AFTER) || nothing_to_read(&conn) {
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

    pub(super) fn release(&self, addr: SocketAddr, conn: TcpStream) {
        let timeout = self.idle_timeout;
        let mut pool = self.pool();
        pool.releases = pool.releases.wrapping_add(1);
        if pool.releases % POOL_SWEEP_EVERY == 0 {
            pool.idle.retain(|_, idle| {
                idle.retain(|(_, since)| since.elapsed() < timeout);
                !idle.is_empty()
            });
        }
        let idle = pool.idle.entry(addr).or_default();
        if idle.len() < POOL_PER_SHARD {
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

/// Whether an idle connection has neither been closed nor sent anything:
/// a non-blocking read must find nothing (it also clears the reactor's
/// readiness, so a quiet connection reads as quiet next time). A byte it
/// does read condemns the connection anyway.
fn nothing_to_read(conn: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(conn.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// An attempt that got a response head.
pub(super) struct Upstream {
    pub(super) conn: TcpStream,
    pub(super) buf: BytesMut,
    pub(super) parsed: ParsedResponse,
}
