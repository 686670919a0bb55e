//! ACME in cluster mode: what the nodes share through Redis so that one
//! node orders at a time and every node serves what any of them got.
//!
//! - `{prefix}acme:lock`: the node ordering now (expires on its own if the
//!   node dies mid-order).
//! - `{prefix}acme:challenges`: HTTP-01 token → `<expiry ms>|<key
//!   authorization>`, so the CA's validation may reach any node's plain
//!   listener.
//! - `{prefix}acme:certs`: host → stamp of its latest certificate, and
//!   `{prefix}acme:certs:v`, bumped on every new one, so a node reads the
//!   index only when it changed; `{prefix}acme:cert:{<host>}` the chain and
//!   key (a hash, fields `crt` and `key`), the key sealed with
//!   `cluster.secret_file` (`seal.rs`).
//! - `{prefix}acme:fail:{<host>}`: the last failed order (its backoff holds
//!   for the whole cluster).
//! - `{prefix}acme:orders:<hour>`: orders started in that hour, for
//!   `orders_per_hour` across the cluster.
//!
//! Each command names one key, so a Redis Cluster needs no cross-slot
//! command. While Redis is unreachable nothing is ordered; certificates
//! already received stay on disk and keep being served.

use super::conn::{Conn, TIMEOUT};
use super::link::all_at_once;
use super::seal::{Opened, Sealer};
use crate::config::ClusterConfig;
use redis::{Cmd, FromRedisValue, Script};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long the ordering lock lasts: well past what an order may take
/// (the holder also checks it still holds it before publishing).
pub const LOCK_TTL: Duration = Duration::from_secs(300);
/// Certificates read from Redis at once (one `HMGET` each, concurrent on
/// the shared connection: pipelined to one server, spread over a
/// cluster's nodes).
const CERTS_AT_ONCE: usize = 64;
/// How long a published challenge lives if its node dies before
/// withdrawing it.
const CHALLENGE_TTL: Duration = Duration::from_secs(600);

const UNLOCK_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// Extends the lock if this holder still holds it.
const EXTEND_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
";

/// A certificate another node stored.
pub struct Stored {
    pub host: String,
    pub chain: String,
    pub key: String,
}

/// A failed order, as every node sees it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Failure {
    pub failures: u32,
    pub last_error: String,
    /// Unix seconds: no node orders for the host before.
    pub retry_at: u64,
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// This node's side of the shared ACME state.
pub struct AcmeRedis {
    config: ClusterConfig,
    conn: Option<Conn>,
    retry_at: Instant,
    /// `certs:v` when the index was last read.
    version: Option<i64>,
    /// host → stamp of the certificate this node has.
    have: HashMap<String, String>,
    unlock: Script,
    extend: Script,
    /// This holder's lock value: the node, the process and when it was
    /// taken (two processes with one `node_id` never free each other's).
    token: String,
    /// The last error, logged once until Redis answers again.
    down: bool,
    /// Seals keys for Redis (`None`: no `cluster.secret_file`, which the
    /// config allows only without ACME; then no key is stored).
    sealer: Option<Sealer>,
}

impl AcmeRedis {
    pub fn new(config: ClusterConfig) -> Self {
        let sealer = config.secret.as_ref().map(|s| Sealer::new(&s.0));
        AcmeRedis {
            sealer,
            config,
            conn: None,
            retry_at: Instant::now(),
            version: None,
            have: HashMap::new(),
            unlock: Script::new(UNLOCK_LUA),
            extend: Script::new(EXTEND_LUA),
            token: String::new(),
            down: false,
        }
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}acme:{suffix}", self.config.key_prefix)
    }

    async fn connection(&mut self) -> Option<Conn> {
        if let Some(conn) = &self.conn {
            return Some(conn.clone());
        }
        if Instant::now() < self.retry_at {
            return None;
        }
        match tokio::time::timeout(TIMEOUT, Conn::open(&self.config.redis)).await {
            Ok(Ok(conn)) => {
                self.conn = Some(conn.clone());
                Some(conn)
            }
            Ok(Err(e)) => self.unreachable(&e),
            Err(_) => self.unreachable(&"connect timed out"),
        }
    }

    fn unreachable<T>(&mut self, e: &dyn std::fmt::Display) -> Option<T> {
        if !self.down {
            log::warn!("ACME: Redis unreachable ({e}); no orders until it answers");
        }
        self.down = true;
        self.conn = None;
        self.version = None;
        self.retry_at = Instant::now() + Duration::from_secs(1);
        None
    }

    async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Option<T> {
        let mut conn = self.connection().await?;
        let answer = tokio::time::timeout(TIMEOUT, cmd.query_async::<T>(&mut conn)).await;
        self.answered(answer)
    }

    /// A command's answer, or `None` (logged; Redis marked unreachable if
    /// it is).
    fn answered<T>(
        &mut self,
        answer: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
    ) -> Option<T> {
        match answer {
            Ok(Ok(v)) => {
                if self.down {
                    log::info!("ACME: Redis reachable again");
                    self.down = false;
                }
                Some(v)
            }
            Ok(Err(e)) => {
                if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
                    return self.unreachable(&e);
                }
                log::warn!("ACME: Redis: {e}");
                None
            }
            Err(_) => self.unreachable(&"timed out"),
        }
    }

    /// The challenges every node has published (expired ones are
    /// dropped: a node that died mid-order never withdrew its own).
    pub async fn challenges(&mut self) -> Option<HashMap<String, String>> {
        let key = self.key("challenges");
        let cmd = redis::cmd("HGETALL").arg(&key).to_owned();
        let all: HashMap<String, String> = self.query(&cmd).await?;
        let now = wall_ms();
        let mut live = HashMap::new();
        for (token, value) in all {
            match value.split_once('|') {
                Some((until, answer)) if until.parse::<u64>().is_ok_and(|t| t > now) => {
                    live.insert(token, answer.to_string());
                }
                _ => {
                    let drop = redis::cmd("HDEL").arg(&key).arg(&token).to_owned();
                    let _ = self.query::<i64>(&drop).await;
                }
            }
        }
        Some(live)
    }

    pub async fn publish_challenge(&mut self, token: &str, key_authorization: &str) -> bool {
        let until = wall_ms() + CHALLENGE_TTL.as_millis() as u64;
        let set = redis::cmd("HSET")
            .arg(self.key("challenges"))
            .arg(token)
            .arg(format!("{until}|{key_authorization}"))
            .to_owned();
        self.query::<i64>(&set).await.is_some()
    }

    pub async fn withdraw_challenge(&mut self, token: &str) {
        let cmd = redis::cmd("HDEL")
            .arg(self.key("challenges"))
            .arg(token)
            .to_owned();
        let _ = self.query::<i64>(&cmd).await;
    }

    /// Certificates stored by other nodes since the last call (all of them
    /// on the first); `None` while Redis cannot be read. What a failure
    /// midway leaves unread is read on a later call.
    pub async fn new_certs(&mut self) -> Option<Vec<Stored>> {
        let version_cmd = redis::cmd("GET").arg(self.key("certs:v")).to_owned();
        let version: Option<i64> = self.query(&version_cmd).await?;
        let version = version.unwrap_or(0);
        if self.version == Some(version) {
            return Some(Vec::new());
        }
        let index_cmd = redis::cmd("HGETALL").arg(self.key("certs")).to_owned();
        let index: HashMap<String, String> = self.query(&index_cmd).await?;
        let wanted: Vec<(String, String)> = index
            .into_iter()
            .filter(|(host, stamp)| self.have.get(host) != Some(stamp))
            .collect();
        let mut out = Vec::new();
        let mut resealed: Vec<(String, String)> = Vec::new();
        // Many at once on the shared connection (a node starting in a
        // cluster with thousands of certificates would otherwise wait a
        // round trip for each), each command still naming one key.
        let conn = self.connection().await?;
        for batch in wanted.chunks(CERTS_AT_ONCE) {
            let answers = all_at_once(&conn, batch, |(host, _), mut conn| {
                let cmd = redis::cmd("HMGET")
                    .arg(self.key(&format!("cert:{{{host}}}")))
                    .arg("crt")
                    .arg("key")
                    .to_owned();
                async move {
                    cmd.query_async::<(Option<String>, Option<String>)>(&mut conn)
                        .await
                }
            })
            .await;
            for ((host, stamp), answer) in batch.iter().zip(answers) {
                let Some(pair) = self.answered(answer) else {
                    // Read again from the index next time.
                    return Some(out);
                };
                self.have.insert(host.clone(), stamp.clone());
                let (Some(chain), Some(stored)) = pair else {
                    continue;
                };
                let Some(sealer) = &self.sealer else {
                    continue;
                };
                let key = match sealer.open(host, &stored) {
                    Opened::Sealed(key) => key,
                    Opened::Plain(key) => {
                        // Left by a version that stored keys in the clear:
                        // sealed in place now.
                        resealed.extend(sealer.seal(host, &key).map(|s| (host.clone(), s)));
                        key
                    }
                    Opened::Unreadable => {
                        log::warn!(
                            "acme: the key of `{host}` in Redis does not open with cluster.secret_file (another secret on the node that stored it?); not served from Redis"
                        );
                        continue;
                    }
                };
                out.push(Stored {
                    host: host.clone(),
                    chain,
                    key,
                });
            }
        }
        for (host, sealed) in resealed {
            let put = redis::cmd("HSET")
                .arg(self.key(&format!("cert:{{{host}}}")))
                .arg("key")
                .arg(sealed)
                .to_owned();
            let _ = self.query::<i64>(&put).await;
        }
        self.version = Some(version);
        Some(out)
    }

    /// Stores a certificate this node got, for the others.
    pub async fn put_cert(&mut self, host: &str, chain: &str, key: &str) -> bool {
        let Some(key) = self.sealer.as_ref().and_then(|s| s.seal(host, key)) else {
            return false;
        };
        let stamp = format!("{}:{}", self.config.node_id, wall_ms());
        let cert = redis::cmd("HSET")
            .arg(self.key(&format!("cert:{{{host}}}")))
            .arg("crt")
            .arg(chain)
            .arg("key")
            .arg(&key)
            .to_owned();
        let index = redis::cmd("HSET")
            .arg(self.key("certs"))
            .arg(host)
            .arg(&stamp)
            .to_owned();
        let bump = redis::cmd("INCR").arg(self.key("certs:v")).to_owned();
        let stored = self.query::<i64>(&cert).await.is_some()
            && self.query::<i64>(&index).await.is_some()
            && self.query::<i64>(&bump).await.is_some();
        if stored {
            self.have.insert(host.to_string(), stamp);
        }
        stored
    }

    /// Takes the ordering lock; `false` if another node holds it or Redis
    /// cannot be reached.
    pub async fn lock(&mut self) -> bool {
        self.token = format!(
            "{}:{}:{}",
            self.config.node_id,
            std::process::id(),
            wall_ms()
        );
        let cmd = redis::cmd("SET")
            .arg(self.key("lock"))
            .arg(&self.token)
            .arg("NX")
            .arg("PX")
            .arg(LOCK_TTL.as_millis() as u64)
            .to_owned();
        self.query::<Option<String>>(&cmd).await.flatten().is_some()
    }

    pub async fn unlock(&mut self) {
        let Some(mut conn) = self.connection().await else {
            return;
        };
        let mut invocation = self.unlock.key(self.key("lock"));
        invocation.arg(&self.token);
        let _ = tokio::time::timeout(TIMEOUT, invocation.invoke_async::<i64>(&mut conn)).await;
    }

    /// Whether this node still holds the lock (extended for another
    /// [`LOCK_TTL`] if so).
    pub async fn still_locked(&mut self) -> bool {
        let Some(mut conn) = self.connection().await else {
            return false;
        };
        let mut invocation = self.extend.key(self.key("lock"));
        invocation.arg(&self.token).arg(LOCK_TTL.as_millis() as u64);
        matches!(
            tokio::time::timeout(TIMEOUT, invocation.invoke_async::<i64>(&mut conn)).await,
            Ok(Ok(1))
        )
    }

    /// The last failed order for `host`, if one is remembered; `Err` if
    /// Redis could not say.
    pub async fn failure(&mut self, host: &str) -> Result<Option<Failure>, ()> {
        let cmd = redis::cmd("GET")
            .arg(self.key(&format!("fail:{{{host}}}")))
            .to_owned();
        let json: Option<String> = self.query(&cmd).await.ok_or(())?;
        match json {
            None => Ok(None),
            Some(json) => serde_json::from_str(&json).map(Some).map_err(|e| {
                log::warn!("ACME: the failure recorded in Redis for {host} does not parse: {e}");
            }),
        }
    }

    /// Remembers a failed order until well past its retry time (the count
    /// of failures in a row sets the next backoff).
    pub async fn set_failure(&mut self, host: &str, failure: &Failure, wait: Duration) {
        let Ok(json) = serde_json::to_string(failure) else {
            return;
        };
        let cmd = redis::cmd("SET")
            .arg(self.key(&format!("fail:{{{host}}}")))
            .arg(json)
            .arg("PX")
            .arg((wait * 2 + Duration::from_secs(3600)).as_millis() as u64)
            .to_owned();
        let _ = self.query::<()>(&cmd).await;
    }

    pub async fn clear_failure(&mut self, host: &str) {
        let cmd = redis::cmd("DEL")
            .arg(self.key(&format!("fail:{{{host}}}")))
            .to_owned();
        let _ = self.query::<i64>(&cmd).await;
    }

    /// Counts an order against `per_hour` for the whole cluster (a window
    /// per clock hour); `false` when the hour's orders are spent.
    pub async fn count_order(&mut self, per_hour: u32, unix_now: u64) -> bool {
        let key = self.key(&format!("orders:{}", unix_now / 3600));
        let incr = redis::cmd("INCR").arg(&key).to_owned();
        let Some(n) = self.query::<i64>(&incr).await else {
            return false;
        };
        if n == 1 {
            let expire = redis::cmd("EXPIRE").arg(&key).arg(7200).to_owned();
            let _ = self.query::<i64>(&expire).await;
        }
        n <= i64::from(per_hour)
    }
}
