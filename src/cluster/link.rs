//! A link to Redis: one connection, opened on demand and again with
//! backoff while Redis cannot be reached, and the errors that say it
//! cannot. The sync loop and the heartbeat each hold their own, so a slow
//! settle never delays a heartbeat. Only the heartbeat's says whether
//! Redis is up: one slow settle does not switch the node's limits to
//! `on_redis_down`.

use super::conn::{Conn, TIMEOUT};
use super::shared::Shared;
use redis::{Cmd, FromRedisValue, RedisError, RedisResult, ScriptInvocation};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Calls in flight at once on one connection (pipelined to one server,
/// spread over a cluster's nodes).
pub const BATCH: usize = 256;

/// An answer within [`TIMEOUT`], or the timeout.
pub type Timed<T> = Result<RedisResult<T>, tokio::time::error::Elapsed>;

/// Runs `call` for every item at once on the connection, each within
/// [`TIMEOUT`]; the answers in the items' order. Callers keep `items` to a
/// [`BATCH`].
pub async fn all_at_once<'a, I, T, F, Fut>(conn: &Conn, items: &'a [I], call: F) -> Vec<Timed<T>>
where
    F: Fn(&'a I, Conn) -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    let calls = (items.iter()).map(|item| tokio::time::timeout(TIMEOUT, call(item, conn.clone())));
    futures_util::future::join_all(calls).await
}

pub(crate) struct Link {
    pub shared: Arc<Shared>,
    conn: Option<Conn>,
    retry_at: Instant,
    backoff: Duration,
    /// Set when this link found Redis unreachable; its owner takes it to
    /// forget what it believed Redis holds.
    lost: bool,
    /// This link's failures say Redis is down (the heartbeat's).
    decides: bool,
}

impl Link {
    pub fn new(shared: Arc<Shared>, decides: bool) -> Self {
        Link {
            shared,
            conn: None,
            retry_at: Instant::now(),
            backoff: Duration::from_millis(100),
            lost: false,
            decides,
        }
    }

    /// Whether Redis was found unreachable since the last call.
    pub fn take_lost(&mut self) -> bool {
        std::mem::take(&mut self.lost)
    }

    /// A connection, opening one if it is time to try again.
    pub async fn connection(&mut self) -> Option<Conn> {
        if let Some(conn) = &self.conn {
            return Some(conn.clone());
        }
        if Instant::now() < self.retry_at {
            return None;
        }
        match tokio::time::timeout(TIMEOUT, Conn::open(&self.shared.config.redis)).await {
            Ok(Ok(conn)) => {
                self.backoff = Duration::from_millis(100);
                self.conn = Some(conn.clone());
                Some(conn)
            }
            Ok(Err(e)) => {
                self.unreachable("connect", &e);
                None
            }
            Err(_) => {
                self.unreachable("connect", &"timed out");
                None
            }
        }
    }

    /// Redis cannot be reached on this link: the next attempt waits (100 ms
    /// doubling to 2 s); for the heartbeat's, limits follow `on_redis_down`.
    pub fn unreachable(&mut self, what: &str, e: &dyn std::fmt::Display) {
        self.shared.sync_error(what, e);
        self.conn = None;
        if self.decides {
            if self.shared.redis_up() {
                log::warn!(
                    "cluster: Redis unreachable ({what}: {e}); limits now {}",
                    self.shared.config.on_redis_down.as_str()
                );
            }
            self.shared.set_redis_up(false);
        }
        self.lost = true;
        self.retry_at = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(Duration::from_secs(2));
    }

    /// A command's error: the link's loss if it is the connection's.
    pub fn failed(&mut self, what: &str, e: &RedisError) {
        if e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
        {
            self.unreachable(what, e);
        } else {
            self.shared.sync_error(what, e);
        }
    }

    /// Whether the link holds a connection (a failed command left it).
    pub fn connected(&self) -> bool {
        self.conn.is_some()
    }

    /// One call per item, [`BATCH`] in flight at once; each item's answer,
    /// `None` where it failed (recorded on the link) or no connection
    /// could be had.
    pub async fn each<'a, I, T, F, Fut>(
        &mut self,
        what: &str,
        items: &'a [I],
        call: F,
    ) -> Vec<Option<T>>
    where
        F: Fn(&'a I, Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let mut out = Vec::with_capacity(items.len());
        for batch in items.chunks(BATCH) {
            let Some(conn) = self.connection().await else {
                out.extend(batch.iter().map(|_| None));
                continue;
            };
            for answer in all_at_once(&conn, batch, &call).await {
                out.push(self.outcome(what, answer));
            }
        }
        out
    }

    pub async fn query<T: FromRedisValue>(&mut self, what: &str, cmd: &Cmd) -> Option<T> {
        let mut conn = self.connection().await?;
        let reply = tokio::time::timeout(TIMEOUT, cmd.query_async::<T>(&mut conn)).await;
        self.outcome(what, reply)
    }

    pub async fn invoke<T: FromRedisValue>(
        &mut self,
        what: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Option<T> {
        let mut conn = self.connection().await?;
        let reply = tokio::time::timeout(TIMEOUT, invocation.invoke_async::<T>(&mut conn)).await;
        self.outcome(what, reply)
    }

    fn outcome<T>(&mut self, what: &str, reply: Timed<T>) -> Option<T> {
        match reply {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                self.failed(what, &e);
                None
            }
            Err(_) => {
                self.unreachable(what, &"timed out");
                None
            }
        }
    }
}
