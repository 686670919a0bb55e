//! A finished request, as every reader of it sees it: the access log
//! line, the request's span and the hooks' logging phase read the same
//! [`RequestSummary`], and with it how its last upstream attempt failed
//! ([`UpstreamFailure`], which the hooks and the metrics see too).

use crate::routing::{Decision, ShardId};
use std::fmt;

/// How an upstream attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UpstreamFailure {
    /// The TCP (or TLS) connection could not be made.
    Connect,
    /// The connection broke (reset or closed) after the request was sent,
    /// before any response byte. The gateway then probes the shard at once
    /// (a TCP connect): `shard_answered` says whether it accepted. A shard
    /// that accepted is alive — one tenant's app may be broken — and the
    /// default hook leaves it in rotation (DESIGN §2 "When an upstream
    /// fails").
    Reset { shard_answered: bool },
    /// No response headers within `upstream.headers_timeout_ms` (slow, not
    /// dead: the default hook leaves the shard alone).
    Timeout,
    /// A liveness probe found the shard gone while headers were awaited.
    Liveness,
}

impl UpstreamFailure {
    pub fn as_str(&self) -> &'static str {
        match self {
            UpstreamFailure::Connect => "connect",
            UpstreamFailure::Reset { .. } => "reset",
            UpstreamFailure::Timeout => "timeout",
            UpstreamFailure::Liveness => "liveness",
        }
    }

    /// Whether the failure means the shard cannot be reached (as opposed to
    /// being slow, or to one app dropping a request on a shard that still
    /// accepts connections).
    pub fn is_unreachable(&self) -> bool {
        !matches!(
            self,
            UpstreamFailure::Timeout
                | UpstreamFailure::Reset {
                    shard_answered: true
                }
        )
    }

    /// Every kind, as the metrics label them.
    pub const KINDS: [&'static str; 4] = ["connect", "reset", "timeout", "liveness"];
}

impl fmt::Display for UpstreamFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A finished request, as [`crate::hooks::GatewayHooks::logging`] sees it: what the
/// access log line says, on every transport, refusals included.
pub struct RequestSummary<'a> {
    /// The request's ID (DESIGN §7), as the client and the shard saw it.
    pub request_id: &'a str,
    /// The client's address (empty if unknown).
    pub client: &'a dyn fmt::Display,
    pub method: &'a str,
    /// The request target (HTTP/2: the URI).
    pub target: &'a dyn fmt::Display,
    /// The tenant, once resolved (none: refused before, e.g. 400 or 404).
    pub tenant: Option<&'a str>,
    /// The shard of the last attempt.
    pub shard: Option<&'a ShardId>,
    /// The router's decision (none: not routed).
    pub decision: Option<Decision>,
    /// The status the client got (0: none, the client or shard went away
    /// first; 101: a WebSocket, logged when its tunnel closes).
    pub status: u16,
    /// From the request's head to its end.
    pub duration: std::time::Duration,
    /// Upstream attempts started.
    pub attempts: u32,
    /// The last upstream failure, if an attempt failed.
    pub failure: Option<UpstreamFailure>,
    /// The client's `Host` (or authority), as sent.
    pub host: Option<&'a str>,
    /// Body bytes read from the client, and sent to it.
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// `HTTP/1.0`, `HTTP/1.1` or `HTTP/2`.
    pub protocol: &'static str,
    /// The trace the request is part of (32 hex digits), when traced.
    pub trace_id: Option<&'a str>,
    /// A gRPC call's status, when its answer had one (DESIGN §8).
    pub grpc_status: Option<u8>,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A summary whose every client-chosen string is `long`.
    pub(crate) fn client_strings(long: &String) -> RequestSummary<'_> {
        RequestSummary {
            request_id: long,
            client: &"127.0.0.1:5000",
            method: long,
            target: long,
            host: Some(long),
            tenant: Some(long),
            shard: None,
            decision: None,
            status: 200,
            duration: std::time::Duration::ZERO,
            attempts: 1,
            failure: None,
            bytes_in: 0,
            bytes_out: 0,
            protocol: "HTTP/1.1",
            trace_id: None,
            grpc_status: None,
        }
    }
}
