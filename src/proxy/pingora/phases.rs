//! The phase ledger: which of `Gateway`'s phases ran for a request, so a
//! wrapper that forgets to forward one is caught (500, logged once)
//! instead of its rule silently disappearing.

use crate::proxy::ctx::RequestCtx;
use pingora::prelude::*;
use pingora::ErrorType;
use pingora_proxy::Session;

/// The phases of `Gateway` whose rules nothing else holds, as bits of
/// `RequestCtx::phases` (each phase sets its own). A `ProxyHttp` wrapping
/// `Gateway` that does not forward one is caught where a later phase
/// depends on it: the request fails (500) and the log names the phase,
/// instead of its rule (the headers deadline, the forwarding fields, the
/// hop-by-hop table, the 413, the JSON refusals, HTTP/1.0 framing)
/// silently disappearing.
pub(super) mod phase {
    pub const REQUEST_FILTER: u8 = 1;
    pub const UPSTREAM_PEER: u8 = 1 << 1;
    pub const CONNECTED_TO_UPSTREAM: u8 = 1 << 2;
    pub const REQUEST_BODY_FILTER: u8 = 1 << 3;
    pub const UPSTREAM_RESPONSE_FILTER: u8 = 1 << 4;
    pub const RESPONSE_FILTER: u8 = 1 << 5;
    pub const RESPONSE_BODY_FILTER: u8 = 1 << 6;
    pub const NAMES: [(u8, &str); 7] = [
        (REQUEST_FILTER, "request_filter"),
        (UPSTREAM_PEER, "upstream_peer"),
        (CONNECTED_TO_UPSTREAM, "connected_to_upstream"),
        (REQUEST_BODY_FILTER, "request_body_filter"),
        (UPSTREAM_RESPONSE_FILTER, "upstream_response_filter"),
        (RESPONSE_FILTER, "response_filter"),
        (RESPONSE_BODY_FILTER, "response_body_filter"),
    ];
}

/// The phases in `needed` that did not run for this request, named.
pub(super) fn missing_phases(ctx: &RequestCtx, needed: u8) -> Option<String> {
    let missing = needed & !ctx.phases;
    (missing != 0).then(|| {
        let names: Vec<&str> = (phase::NAMES.iter())
            .filter(|(bit, _)| missing & bit != 0)
            .map(|(_, name)| *name)
            .collect();
        names.join(", ")
    })
}

/// Logs (once per process) that a wrapper does not forward `names`.
pub(super) fn report_unforwarded(names: &str) {
    static REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !REPORTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        log::error!(
            "the ProxyHttp wrapping shardgate's Gateway does not forward {names} to it: \
             requests that need it fail (every phase Gateway implements must be forwarded)"
        );
    }
}

/// At the request's end, names (in the log) what no later phase could
/// catch: a shard's response sent without the response phase, a
/// compressed head without the body phase, a body sent upstream without
/// the body phase (its size limit).
pub(super) fn report_unforwarded_at_end(session: &Session, ctx: &RequestCtx) {
    let mut needed = 0;
    let shards_head_sent = ctx.phases & phase::UPSTREAM_RESPONSE_FILTER != 0
        && ctx.answered.is_none()
        && session.response_written().is_some();
    if shards_head_sent {
        needed |= phase::RESPONSE_FILTER;
    }
    if ctx.encoder.is_some() && session.as_ref().body_bytes_sent() > 0 {
        needed |= phase::RESPONSE_BODY_FILTER;
    }
    let connected = ctx.phases & phase::CONNECTED_TO_UPSTREAM != 0;
    if connected && session.as_ref().body_bytes_read() > 0 {
        needed |= phase::REQUEST_BODY_FILTER;
    }
    if let Some(names) = missing_phases(ctx, needed) {
        report_unforwarded(&names);
    }
}

/// Fails the request unless the phases in `needed` ran.
pub(super) fn require_phases(ctx: &RequestCtx, needed: u8) -> Result<()> {
    match missing_phases(ctx, needed) {
        None => Ok(()),
        Some(names) => {
            report_unforwarded(&names);
            Err(Error::explain(
                ErrorType::InternalError,
                format!("Gateway's {names} was not forwarded by its wrapper"),
            ))
        }
    }
}
