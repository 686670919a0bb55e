//! Per-request state, carried through Pingora's phases.

use super::hooks::UpstreamFailure;
use super::pipeline::answer::Refusal;
use super::pipeline::request_id::{self, RequestId};
use super::pipeline::routes::RouteMatch;
use super::pipeline::watch::{Verdict, Watch};
use crate::control::ShardPeer;
use crate::counters::GaugeTicket;
use crate::limits::AdmissionGuard;
use crate::routing::{ShardEntry, ShardId};
use crate::trace::{AttemptSpan, TraceContext};
use compact_str::CompactString;
use smallvec::SmallVec;
use std::sync::Arc;
use std::time::Instant;

pub struct RequestCtx {
    pub started: Instant,
    /// The request's ID (DESIGN §7): made with the context, a trusted
    /// client's in its place once planned.
    pub request_id: RequestId,
    /// The resolved tenant (after the domain map).
    pub tenant: Option<CompactString>,
    /// The coding the client accepts best, of `compression.algorithms`
    /// (`None`: none, or compression off).
    pub(crate) coding: Option<crate::wire::compress::Coding>,
    /// The response body's encoder (Pingora's path; the fast path keeps
    /// its own with the body it relays).
    pub(crate) encoder: Option<crate::proxy::pipeline::compression::BodyEncoder>,
    /// The client's address (the PROXY header's, if its listener takes
    /// one): its forwarding fields and its own bucket (`per_client`).
    pub client: Option<std::net::IpAddr>,
    /// The client's connection is TLS (HTTPS, HTTP/3): its responses
    /// advertise HTTP/3 when a `quic` listener does (`Alt-Svc`).
    pub tls: bool,
    /// Index of the matched route prefix.
    pub(crate) route: RouteMatch,
    pub(crate) channel: Option<String>,
    pub(crate) region: Option<String>,
    /// The shard of the current attempt.
    pub shard: Option<Arc<ShardEntry>>,
    pub(crate) peer: Option<Arc<ShardPeer>>,
    /// The live admission: dropped when the request ends, or before a
    /// retry routes again.
    pub(crate) admission: Option<AdmissionGuard>,
    /// Shards that failed this request (excluded from retries).
    pub(crate) failed: SmallVec<[ShardId; 2]>,
    /// Upstream attempts started.
    pub attempts: u32,
    /// Retries after a stale pooled connection (at most one; not counted
    /// against `retry.attempts`).
    pub(crate) stale_retries: u32,
    /// Resends of a request the shard did not process (HTTP/2).
    pub(crate) unprocessed_resends: u32,
    /// The next attempt's shard is chosen already (Pingora's path: a
    /// stale resend goes to the same shard, not routed again).
    pub(crate) shard_chosen: bool,
    /// The next attempt must open a new connection (Pingora's path).
    pub(crate) fresh_connection: bool,
    pub(crate) watch: Option<Watch>,
    /// The watch's verdict if it concluded while headers were arriving.
    pub(crate) verdict: Verdict,
    pub(crate) headers_received: bool,
    /// The last upstream failure (a reset reads `shard_answered: true`
    /// here: the probe that decides it runs after the request moved on).
    pub failure: Option<UpstreamFailure>,
    /// The router's last decision for this request.
    pub decision: Option<crate::routing::Decision>,
    /// What to answer instead of proxying (set by a phase, sent by another).
    pub(crate) refusal: Option<Refusal>,
    /// Status of the answer shardgate wrote itself, if it did.
    pub answered: Option<u16>,
    /// A gRPC call (`content-type: application/grpc…`): shardgate's own
    /// answers to it are gRPC answers (DESIGN §8).
    pub grpc: bool,
    /// The gRPC status of the answer, when it had one (shardgate's, or the
    /// shard's in its head or trailers): the access log's and the span's
    /// `grpc_status`.
    pub grpc_status: Option<u8>,
    /// A gRPC call's own deadline (`grpc-timeout`): it shortens the
    /// headers deadline.
    pub(crate) grpc_timeout: Option<std::time::Duration>,
    /// The attempt's deadline is the call's own (a `grpc-timeout` shorter
    /// than the gateway's): its running out is no shard's fault.
    pub(crate) clients_deadline: bool,
    pub(crate) retry_ticket: Option<GaugeTicket>,
    /// The largest body this request may have: its tenant's plan's (or
    /// `limits`'), once planned.
    pub(crate) max_body: Option<u64>,
    /// The embedder's edit of the upstream head (its request check).
    pub(crate) upstream_edit: crate::proxy::hooks::UpstreamEdit,
    /// The embedder's body phase (Pingora's path), and how much of the
    /// body it saw (a retry's replay is not shown again).
    pub(crate) body_phase: Option<crate::proxy::pipeline::body::BodyPhase>,
    pub(crate) body_seen: u64,
    /// The phases of `Gateway` that ran (Pingora's path), one bit each: a
    /// wrapper that did not forward one is caught (`pingora/phases.rs`).
    pub(crate) phases: u8,
    /// Body bytes read from the client and sent to it (set by the
    /// transport before the request's end).
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// The request's trace (DESIGN §7), once planned with tracing on.
    pub trace: Option<TraceContext>,
    /// A sampled request's upstream attempts, for their spans.
    pub(crate) attempt_spans: Vec<AttemptSpan>,
}

impl Default for RequestCtx {
    fn default() -> Self {
        RequestCtx {
            started: Instant::now(),
            request_id: request_id::new_id(),
            tenant: None,
            coding: None,
            encoder: None,
            client: None,
            tls: false,
            route: RouteMatch::default(),
            channel: None,
            region: None,
            shard: None,
            peer: None,
            admission: None,
            failed: SmallVec::new(),
            attempts: 0,
            stale_retries: 0,
            unprocessed_resends: 0,
            shard_chosen: false,
            fresh_connection: false,
            watch: None,
            verdict: Verdict::None,
            headers_received: false,
            failure: None,
            decision: None,
            refusal: None,
            answered: None,
            grpc: false,
            grpc_status: None,
            grpc_timeout: None,
            clients_deadline: false,
            retry_ticket: None,
            max_body: None,
            upstream_edit: Default::default(),
            body_phase: None,
            body_seen: 0,
            phases: 0,
            bytes_in: 0,
            bytes_out: 0,
            trace: None,
            attempt_spans: Vec::new(),
        }
    }
}

impl RequestCtx {
    /// Notes the answer shardgate wrote itself (as sent: a gRPC call's is
    /// HTTP 200 with its `grpc-status`).
    pub(crate) fn answered_with(&mut self, answer: &Refusal) {
        self.answered = Some(answer.status);
        self.grpc_status = answer.grpc_status;
    }

    /// The shard of the current (or last) attempt.
    pub fn shard_id(&self) -> Option<&ShardId> {
        self.shard.as_ref().map(|s| s.id())
    }

    /// Whether the request holds an admission right now.
    pub fn is_admitted(&self) -> bool {
        self.admission.is_some()
    }
}
