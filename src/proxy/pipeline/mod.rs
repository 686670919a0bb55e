//! The request pipeline: every rule of DESIGN §3, written once and called
//! by both transports (shardgate's own HTTP/1.1 forwarding in
//! [`super::fast`] and Pingora's proxy in `super::pingora`). A transport
//! only moves bytes; each decision is made here:
//!
//! - [`plan`]: resolve the host, the embedder's request check, the route
//!   prefix, channel and region, route and admit; route again for a retry;
//!   the request's end;
//! - [`fields`]: the hop-by-hop table (both directions), the forwarding
//!   fields shardgate owns, WebSocket detection, the unrequested-101 check;
//! - [`message`]: what RFC 9112 lets through in a request head (checked
//!   by the front end for every HTTP/1 head, before either transport);
//! - [`framing`]: where an HTTP/1 body ends (length, chunks, close), for
//!   responses and request bodies alike;
//! - [`edge`]: what the edge answers before routing (ACME challenges, the
//!   https redirect);
//! - [`answer`]: shardgate's own answers, one encoder (with `Date`);
//! - [`compression`]: which responses are compressed, with which coding;
//! - [`grpc`]: what a gRPC call is, its statuses and its deadline;
//! - [`body`]: the embedder's body phase over a request's body;
//! - [`watch`]: the headers deadline and liveness probes;
//! - [`failure`]: what a failed attempt means (resend, retry, 502/504);
//! - [`request_id`]: each request's ID (made, or a trusted client's kept);
//! - [`retry`], [`routes`]: the retry budget and the route prefixes.

pub mod answer;
pub mod body;
pub mod compression;
pub mod edge;
pub mod failure;
pub mod fields;
pub mod framing;
pub mod grpc;
pub mod message;
pub mod plan;
pub mod request_id;
pub mod retry;
pub mod routes;
pub mod watch;
