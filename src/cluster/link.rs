//! A link to Redis: one connection, opened on demand and again with
//! backoff while Redis cannot be reached, and the errors that say it
//! cannot. The sync loop and the heartbeat each hold their own, so a slow
//! settle never delays a heartbeat. Only the heartbeat's says whether
//! Redis is up: one slow settle does not switch the node's limits to
//! `on_redis_down`.

use super::conn::{Conn, TIMEOUT};
use super::shared::Shared;
use redis::{Cmd, FromRedisValue, RedisError, ScriptInvocation};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) struct Link {
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

    fn outcome<T>(
        &mut self,
        what: &str,
        reply: Result<Result<T, RedisError>, tokio::time::error::Elapsed>,
    ) -> Option<T> {
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
