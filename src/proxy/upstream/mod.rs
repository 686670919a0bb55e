//! The shard side, beside the client-side protocols and around
//! `pipeline/`: a connection to a shard, plain or TLS (`conn.rs`); the
//! pooled, multiplexed HTTP/2 connections to `h2` and `auto` shards
//! (`h2.rs`) and one request's stream on them (`h2_stream.rs`). The fast
//! transport's HTTP/1.1 pool and exchange use these.

pub(crate) mod conn;
pub(crate) mod h2;
mod h2_message;
pub(crate) mod h2_stream;
