//! What a failed upstream attempt means, for both transports (DESIGN §2
//! "When an upstream fails"): send it again on a fresh connection (a stale
//! pooled one), route it again elsewhere (within the retry rules and
//! budget), or answer 502/504. The transports only say how the attempt
//! failed; the failure hook, the metrics and the retry budget are called
//! from here.

use super::answer::Refusal;
use super::retry::RetryVerdict;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::hooks::UpstreamFailure;
use crate::proxy::Gateway;
use http::Method;

/// How many times a request the shards did not process is sent again.
const MAX_UNPROCESSED_RESENDS: u32 = 3;

/// How an upstream attempt failed, as a transport saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptFailure {
    /// A reused pooled connection broke before any response byte: maybe
    /// only closed by the shard while it idled.
    Stale,
    /// The connection broke after the request was sent, before any
    /// response byte: the shard is probed before it is judged.
    Reset,
    /// The shard said it did not process the request: an HTTP/2 stream it
    /// refused (`REFUSED_STREAM`), or above its GOAWAY's last stream id.
    /// Sent again whatever the method (RFC 9113 §8.7), a few times at most.
    Unprocessed,
    /// The shard failed (connect, timeout, liveness).
    Shard(UpstreamFailure),
    /// The shard answered with something that is not an HTTP/1.x response
    /// shardgate forwards (malformed, over the head limits, a 101 nobody
    /// asked for): it is reachable (no hook: one tenant's broken app must
    /// not take a shared shard out of rotation) and the request was
    /// delivered (no retry).
    Invalid,
}

impl AttemptFailure {
    /// The failure's name (an attempt span's `error.type`).
    pub fn as_str(&self) -> &'static str {
        match self {
            AttemptFailure::Stale => "stale-connection",
            AttemptFailure::Reset => "reset",
            AttemptFailure::Unprocessed => "unprocessed",
            AttemptFailure::Shard(kind) => kind.as_str(),
            AttemptFailure::Invalid => "invalid-response",
        }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, PartialEq)]
pub enum Next {
    /// Send it again to the same shard, on a fresh connection, still
    /// admitted (not routed again).
    Resend,
    /// Route it again with the failed shard excluded (the transport calls
    /// [`Gateway::readmit`] when it starts the attempt).
    Retry,
    /// Stop, and answer this.
    Answer(Refusal),
}

impl Gateway {
    /// The rules after a failed attempt of a request with `method`;
    /// `replayable`: its body (if any) can be sent again.
    pub(crate) fn after_failure(
        &self,
        failure: AttemptFailure,
        method: &Method,
        replayable: bool,
        ctx: &mut RequestCtx,
    ) -> Next {
        self.attempt_failed(ctx, failure.as_str());
        if failure == AttemptFailure::Shard(UpstreamFailure::Timeout) && ctx.clients_deadline {
            // The call's own deadline (`grpc-timeout`) ran out: answered
            // 504 (DEADLINE_EXCEEDED), not counted against the shard.
            return Next::Answer(Refusal::error(504, "upstream-timeout"));
        }
        let kind = match failure {
            AttemptFailure::Unprocessed => {
                return match replayable && ctx.unprocessed_resends < MAX_UNPROCESSED_RESENDS {
                    true => {
                        ctx.unprocessed_resends += 1;
                        self.control.metrics.retry();
                        Next::Resend
                    }
                    false => Next::Answer(Refusal::error(502, "upstream-unreachable")),
                };
            }
            AttemptFailure::Stale if ctx.stale_retries == 0 => {
                return match self.may_resend_stale(method, replayable, ctx) {
                    true => Next::Resend,
                    false => Next::Answer(Refusal::error(502, "upstream-unreachable")),
                };
            }
            AttemptFailure::Stale | AttemptFailure::Reset => {
                self.record_reset(ctx);
                None
            }
            AttemptFailure::Shard(kind) => Some(kind),
            AttemptFailure::Invalid => {
                return Next::Answer(Refusal::error(502, "upstream-invalid-response"))
            }
        };
        if let Some(kind) = kind {
            self.record_failure(ctx, kind);
        }
        if kind == Some(UpstreamFailure::Timeout) {
            // Slow is not dead: never retried.
            return Next::Answer(Refusal::error(504, "upstream-timeout"));
        }
        let sent = kind != Some(UpstreamFailure::Connect);
        match self.may_retry(method, replayable, ctx, sent) {
            true => Next::Retry,
            false => Next::Answer(Refusal::error(502, "upstream-unreachable")),
        }
    }

    /// A shard fell silent for `upstream.read_timeout_ms` once its head
    /// came (or stopped taking the request body for as long): the response
    /// is cut, never retried (part of it may be with the client), counted
    /// as `kind="timeout"` like a late head (slow or stuck, not known dead).
    pub(crate) fn response_timed_out(&self, ctx: &mut RequestCtx) {
        self.attempt_failed(ctx, UpstreamFailure::Timeout.as_str());
        self.record_failure(ctx, UpstreamFailure::Timeout);
    }

    /// Whether to try again after a failed attempt (taking a place in the
    /// retry budget if so).
    fn may_retry(
        &self,
        method: &Method,
        replayable: bool,
        ctx: &mut RequestCtx,
        sent: bool,
    ) -> bool {
        // A resend after a stale pooled connection does not count: it says
        // nothing about the shard.
        let attempts = ctx.attempts - ctx.stale_retries - ctx.unprocessed_resends;
        match self.retry.check(method, attempts, sent, replayable) {
            RetryVerdict::Allowed => match self.retry.admit_retry(self.requests_in_flight()) {
                Some(ticket) => {
                    ctx.retry_ticket = Some(ticket);
                    self.control.metrics.retry();
                    true
                }
                None => false,
            },
            _ => false,
        }
    }

    /// Whether to send the request again after a reused pooled connection
    /// broke before any response byte: once per request, for idempotent
    /// methods, outside the retry rules and budget. It may say nothing
    /// about the shard (it closed an idle connection just as we reused it);
    /// a shard that is really gone fails the fresh connection the resend
    /// opens, and that failure is judged by the rules. (Counted against
    /// the budget, a dying shard's in-flight requests spent it twice and
    /// some were answered 502.)
    fn may_resend_stale(&self, method: &Method, replayable: bool, ctx: &mut RequestCtx) -> bool {
        if ctx.stale_retries > 0 || !method.is_idempotent() || !replayable {
            return false;
        }
        ctx.stale_retries += 1;
        self.control.metrics.retry();
        true
    }

    /// Requests (and sockets) in flight: the admissions counted on shards.
    /// Read only when deciding a retry, so the request path counts nothing
    /// extra.
    fn requests_in_flight(&self) -> u64 {
        let set = self.control.router.shard_set();
        set.all.iter().map(|e| e.active().max(0) as u64).sum()
    }
}
