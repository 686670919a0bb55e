//! One connection type over a single Redis and a Redis Cluster, so the
//! service's commands and scripts are written once.

use crate::config::RedisTarget;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use std::time::Duration;

#[derive(Clone)]
pub enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// How long a connection attempt or a reply may take.
pub const TIMEOUT: Duration = Duration::from_millis(1000);

/// Fields and values read from Redis as bytes (a hash, a scan step), as
/// text. A pair that is not text was written by no node (a damaged or
/// foreign entry): it is skipped, so it cannot stop the read of the rest.
pub type Raw = Vec<(Vec<u8>, Vec<u8>)>;

pub fn text_pairs(raw: Raw) -> impl Iterator<Item = (String, String)> {
    raw.into_iter()
        .filter_map(|(k, v)| Some((String::from_utf8(k).ok()?, String::from_utf8(v).ok()?)))
}

impl Conn {
    pub async fn open(target: &RedisTarget) -> RedisResult<Conn> {
        match target {
            RedisTarget::Single(url) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(TIMEOUT))
                    .set_response_timeout(Some(TIMEOUT));
                let client = redis::Client::open(url.as_str())?;
                Ok(Conn::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                ))
            }
            RedisTarget::Cluster(urls) => {
                let client =
                    redis::cluster::ClusterClient::builder(urls.iter().map(String::as_str))
                        .connection_timeout(TIMEOUT)
                        .response_timeout(TIMEOUT)
                        .retries(1)
                        .build()?;
                Ok(Conn::Cluster(client.get_async_connection().await?))
            }
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
