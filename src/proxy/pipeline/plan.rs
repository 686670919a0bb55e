//! Planning a request, for both transports: the host through the domain
//! map, the embedder's request check, the route prefix, the channel, the
//! region, then routing and admission (DESIGN §2 "Per request", steps 1–3);
//! routing again for a retry; and the request's end (duration, release,
//! access log).

use super::answer::Refusal;
use super::body::BodyPhase;
use super::fields::{is_hop_by_hop, is_text, Owned};
use super::grpc;
use super::message::{check_host, content_length};
use super::request_id;
use super::watch::probe;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::hooks::{
    RequestCheck, RequestLine, RequestSummary, RequestView, UpstreamEdit, UpstreamFailure,
};
use crate::proxy::Gateway;
use crate::routing::{Decision, RouteRequest, ShardId};
use crate::trace::{AttemptSpan, Finished};
use http::header::{HeaderName, ACCEPT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use pingora::protocols::l4::socket::SocketAddr;
use std::sync::Arc;

/// Fields the plan reads, as names an HTTP/2 head's map finds at once.
const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// The longest channel id (DESIGN §2 "Bounded by design"): what the router
/// keys on and a log line shows of a client's string is bounded in bytes.
const MAX_CHANNEL: usize = 128;

impl Gateway {
    /// Resolves, checks, routes and admits the request `req` from
    /// `client`. On `Ok` the context holds the tenant, the shard, its peer
    /// and the admission, and the client's host (verbatim, validated) is
    /// returned; on `Err` the answer to give (nothing was admitted).
    pub fn plan<'r>(
        &self,
        req: &RequestView<'r>,
        client: Option<&SocketAddr>,
        ctx: &mut RequestCtx,
    ) -> Result<&'r str, Refusal> {
        ctx.client = client.and_then(|a| a.as_inet()).map(|a| a.ip());
        ctx.grpc = req.header_of(&CONTENT_TYPE).is_some_and(grpc::is_grpc);
        if ctx.grpc {
            ctx.grpc_timeout = req.header_of(&GRPC_TIMEOUT).and_then(grpc::timeout);
        }
        // `limits.max_headers`, for every protocol: an HTTP/1 head's
        // reader counts as it reads, an HTTP/2 or HTTP/3 head is bounded
        // only in bytes by its decoder (a field costs 32 of them). (After
        // the gRPC look: a gRPC call is refused in gRPC's terms.)
        if req.field_count() > self.control.config.limits.max_headers {
            return Err(Refusal::error(431, "header-too-large"));
        }
        if self.control.tracer.is_on() {
            ctx.trace = self.control.tracer.start(req.values_of(&TRACEPARENT));
        }
        let ids = &self.control.config.request_id;
        if ids.trust_incoming {
            let incoming = req.header_of(&ids.header);
            if let Some(id) = incoming.and_then(request_id::trusted) {
                ctx.request_id = id;
            }
        }
        let host = host_from(req.authority, req.values_of(&HOST))
            .map_err(|what| Refusal::error(400, what))?;
        let resolved = self
            .control
            .domains
            .resolve(host)
            .ok_or_else(|| Refusal::error(404, "unknown-domain"))?;
        ctx.max_body = self.max_body_for(&resolved.tenant);
        let view = req
            .with_request_id(&ctx.request_id)
            .with_trace(ctx.trace.as_ref());
        let check = self.control.hooks.check_request(&resolved.tenant, &view);
        let checked = self.apply_check(check, ctx);
        ctx.tenant = Some(resolved.tenant);
        checked?;
        // A declared length over the tenant's own limit (the head reader
        // knew only the largest any tenant has): 413, no token spent. A
        // length that is no length is 400 here too, for every protocol
        // and transport (the h2 crate reads only an HTTP/2 request's
        // first `Content-Length`, and Pingora's path reads none).
        match content_length(req.values_of(&CONTENT_LENGTH)) {
            Err(_) => return Err(Refusal::error(400, "invalid-content-length")),
            Ok(Some(length)) if ctx.max_body.is_some_and(|max| length > max) => {
                return Err(Refusal::error(413, "body-too-large"))
            }
            Ok(_) => {}
        }
        self.negotiate_coding(ctx, req.values_of(&ACCEPT_ENCODING));
        ctx.route = self.routes.route_for(req.path);
        ctx.channel = self.channel_of(req)?;
        if let (Some(directory), Some(tenant)) = (&self.control.regions, &ctx.tenant) {
            ctx.region = Some(directory.region_for(tenant));
        }
        self.admit(ctx).map(|()| host)
    }

    /// Applies the embedder's check of the request: its edit of the
    /// upstream head (checked), or its refusal or answer.
    fn apply_check(&self, check: RequestCheck, ctx: &mut RequestCtx) -> Result<(), Refusal> {
        match check {
            RequestCheck::Proceed => Ok(()),
            RequestCheck::AddFields(add) => {
                let edit = UpstreamEdit {
                    add,
                    remove: vec![],
                };
                ctx.upstream_edit = self.checked_edit(ctx.trace.as_ref(), edit);
                Ok(())
            }
            RequestCheck::Edit(edit) => {
                ctx.upstream_edit = self.checked_edit(ctx.trace.as_ref(), edit);
                Ok(())
            }
            RequestCheck::Refuse { status, body } => Err(Refusal::custom(status, body)),
            RequestCheck::Answer {
                status,
                fields,
                body,
            } => Err(Refusal::answer(status, fields, body)),
        }
    }

    /// The request's channel (`routing.channel_header`): one field at most,
    /// text, at most [`MAX_CHANNEL`] bytes; an empty one is none.
    fn channel_of(&self, req: &RequestView<'_>) -> Result<Option<String>, Refusal> {
        let mut channels = (self.control.config.routing.channel_header.as_ref())
            .map(|name| req.values_of(name))
            .into_iter()
            .flatten();
        let channel = channels.next();
        // A second channel field: the app might read the other one and
        // place the channel apart from where it was routed.
        let repeated = channels.next().is_some();
        match channel.map(std::str::from_utf8) {
            _ if repeated => Err(Refusal::error(400, "invalid-channel")),
            None | Some(Ok("")) => Ok(None),
            Some(Ok(channel)) if channel.len() <= MAX_CHANNEL && is_text(channel.as_bytes()) => {
                Ok(Some(channel.to_string()))
            }
            Some(_) => Err(Refusal::error(400, "invalid-channel")),
        }
    }

    /// Routes and admits the request in `ctx`; on success the context
    /// holds the shard, its peer and the admission.
    pub(crate) fn admit(&self, ctx: &mut RequestCtx) -> Result<(), Refusal> {
        let tenant = ctx.tenant.as_deref().unwrap_or_default();
        let request = RouteRequest {
            tenant,
            channel: ctx.channel.as_deref(),
            route: ctx.route.longest.map(|i| self.routes.name(i)),
            route_also: ctx.route.other.map(|i| self.routes.name(i)),
            region: ctx.region.as_deref(),
            balance: None,
            exclude: &ctx.failed,
            client: ctx.client,
        };
        let mut routed = self.control.router.admit(&request);
        ctx.decision = Some(routed.decision);
        if routed.decision != Decision::Allow {
            return Err(Refusal::decision(
                routed.decision,
                routed.bucket.as_ref().map(|b| b.name()),
                routed.retry_after_secs,
            ));
        }
        let shard = routed.shard_entry().cloned();
        let peer = shard.as_ref().and_then(|s| self.control.peer(s.id()));
        let Some(peer) = peer else {
            // Removed between the decision and now.
            return Err(Refusal::decision(Decision::NoShards, None, None));
        };
        if ctx.grpc && !peer.protocol.may_be_h2() {
            // gRPC needs HTTP/2 to the shard (its status is in trailers):
            // UNAVAILABLE, naming why (DESIGN §8); the admission is dropped.
            ctx.shard = shard;
            return Err(Refusal::error(502, "grpc-to-http1-shard"));
        }
        ctx.admission = routed.admission.take();
        ctx.shard = shard;
        ctx.peer = Some(peer);
        Ok(())
    }

    /// Routes a retry: the failed attempt's admission goes first, then the
    /// request is routed again with the failed shards excluded — balanced,
    /// capped and rate limited like any route. No shard left is a 502.
    pub(crate) fn readmit(&self, ctx: &mut RequestCtx) -> Result<(), Refusal> {
        ctx.admission = None;
        ctx.shard = None;
        ctx.peer = None;
        self.admit(ctx).map_err(|refusal| match refusal.decision {
            Some(Decision::NoShards | Decision::NoTenantShards | Decision::NoRegionShards) => {
                Refusal::error(502, "upstream-unreachable")
            }
            _ => refusal,
        })
    }

    /// Notes a failed attempt: the failure hook, and the shard excluded
    /// from the rest of this request if it is unreachable.
    pub(crate) fn record_failure(&self, ctx: &mut RequestCtx, failure: UpstreamFailure) {
        ctx.failure = Some(failure);
        if let Some(shard) = ctx.shard.as_ref().map(|s| s.id().clone()) {
            self.control
                .hooks
                .on_upstream_failure(&self.control.router, &shard, failure);
            self.count_failure(ctx, &shard, failure.as_str(), failure.is_unreachable());
        }
    }

    /// Counts a failed attempt on `shard` (`kind` as the metrics label it)
    /// and, if `exclude`, keeps the rest of this request off the shard.
    fn count_failure(
        &self,
        ctx: &mut RequestCtx,
        shard: &ShardId,
        kind: &'static str,
        exclude: bool,
    ) {
        self.control.metrics.upstream_failure(shard.as_str(), kind);
        if exclude && !ctx.failed.contains(shard) {
            ctx.failed.push(shard.clone());
        }
    }

    /// Notes a connection that broke after the request was sent, before
    /// any response byte. One tenant's app may have dropped it on a shard
    /// many tenants share, so the shard is not judged by it: a TCP connect
    /// probes it at once, in a task of its own, and the failure hook hears
    /// the outcome (refused or timed out → unreachable, marked down by the
    /// default hook; accepted → it stays in rotation). This request does
    /// not go back to it either way.
    pub(crate) fn record_reset(&self, ctx: &mut RequestCtx) {
        let (Some(shard), Some(peer)) = (ctx.shard.as_ref(), ctx.peer.as_ref()) else {
            return;
        };
        let (shard, addr) = (shard.id().clone(), peer.addr);
        ctx.failure = Some(UpstreamFailure::Reset {
            shard_answered: true,
        });
        self.count_failure(ctx, &shard, "reset", true);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            log::warn!("a reset outside a runtime: shard {addr} not probed");
            return;
        };
        // One probe per shard at a time: resets while it runs wait for its
        // verdict (an app resetting every request must not become a
        // connection storm against the shard).
        {
            let mut probing = self.probing.lock();
            if let Some(waiting) = probing.get_mut(&shard) {
                *waiting += 1;
                return;
            }
            probing.insert(shard.clone(), 1);
        }
        let control = Arc::clone(&self.control);
        let probing = Arc::clone(&self.probing);
        let timeout = self.probe_timeout();
        drop(runtime.spawn(async move {
            let shard_answered = probe(addr, timeout).await;
            let failure = UpstreamFailure::Reset { shard_answered };
            let resets = probing.lock().remove(&shard).unwrap_or(1);
            for _ in 0..resets {
                control
                    .hooks
                    .on_upstream_failure(&control.router, &shard, failure);
            }
        }));
    }

    /// How long a failure probe waits for the shard to accept: the
    /// liveness probe's timeout, or the health checks' when liveness is off.
    fn probe_timeout(&self) -> std::time::Duration {
        match self.watch.liveness {
            Some(liveness) => liveness.probe_timeout,
            None => self.control.config.health.timeout,
        }
    }

    /// The request is over: its duration, the admission's release, the
    /// access log line, the hooks' logging phase.
    pub(crate) fn finish(&self, ctx: &mut RequestCtx, line: &RequestLine<'_>, status: u16) {
        self.control
            .metrics
            .request_finished(ctx.started.elapsed().as_secs_f64());
        self.log_request(ctx, line, status);
    }

    /// A request's access log line and the hooks' logging phase, its
    /// admission released first (without [`Gateway::finish`]'s duration
    /// metric: the front end's own answers are logged only).
    pub(crate) fn log_request(&self, ctx: &mut RequestCtx, line: &RequestLine<'_>, status: u16) {
        let ended = std::time::Instant::now();
        let elapsed = ended.saturating_duration_since(ctx.started);
        ctx.admission = None;
        let client = crate::proxy::fast::OrEmpty(line.client);
        let trace_id = ctx.trace.as_ref().map(|t| t.trace_id_hex());
        let summary = RequestSummary {
            request_id: &ctx.request_id,
            client: &client,
            method: line.method,
            target: line.target,
            tenant: ctx.tenant.as_deref(),
            shard: ctx.shard_id(),
            decision: ctx.decision,
            status,
            duration: elapsed,
            attempts: ctx.attempts,
            failure: ctx.failure,
            host: line.host,
            bytes_in: ctx.bytes_in,
            bytes_out: ctx.bytes_out,
            protocol: line.protocol,
            trace_id: trace_id.as_ref().map(|t| t.as_str()),
            grpc_status: ctx.grpc_status,
        };
        self.control.access_log.write(&summary, line.client, ended);
        self.control.hooks.logging(&summary);
        if let Some(trace) = ctx.trace.as_ref().filter(|t| t.sampled) {
            let route = ctx.route.longest.map(|i| self.routes.name(i));
            self.control.tracer.record(&Finished {
                trace,
                summary: &summary,
                route,
                attempts: &ctx.attempt_spans,
                started: ctx.started,
                ended,
            });
        }
    }

    /// An upstream attempt starts (both transports): counted and, with
    /// tracing, given a span of its own: the first attempt's ID was made
    /// with the trace (the head the fast transport writes before it
    /// carries it), a retry's is new.
    pub(crate) fn attempt_started(&self, ctx: &mut RequestCtx) {
        ctx.attempts += 1;
        let Some(trace) = &mut ctx.trace else {
            return;
        };
        if ctx.attempts > 1 {
            trace.attempt_id = crate::trace::new_span_id();
        }
        if trace.sampled {
            ctx.attempt_spans.push(AttemptSpan {
                id: trace.attempt_id,
                started: std::time::Instant::now(),
                ended: None,
                shard: ctx.shard.as_ref().map(|s| s.id().clone()),
                failure: None,
                status: None,
            });
        }
    }

    /// The current attempt's shard answered with `status` (its head; an
    /// interim 1xx is not the answer).
    pub(crate) fn attempt_answered(&self, ctx: &mut RequestCtx, status: u16) {
        if let Some(attempt) = ctx.attempt_spans.last_mut() {
            if attempt.ended.is_none()
                && attempt.status.is_none()
                && (status >= 200 || status == 101)
            {
                attempt.status = Some(status);
            }
        }
    }

    /// The current attempt failed (`why`): its span ends now.
    pub(crate) fn attempt_failed(&self, ctx: &mut RequestCtx, why: &'static str) {
        if let Some(attempt) = ctx.attempt_spans.last_mut() {
            if attempt.ended.is_none() {
                attempt.ended = Some(std::time::Instant::now());
                attempt.failure = Some(why);
            }
        }
    }

    /// `refusal` as the request's client is answered: in gRPC to a gRPC
    /// call, saying the request's ID.
    pub(crate) fn identified(&self, refusal: Refusal, ctx: &RequestCtx) -> Refusal {
        let refusal = match ctx.grpc {
            true => refusal.for_grpc(),
            false => refusal,
        };
        refusal.with_request_id(&self.control.config.request_id.header, &ctx.request_id)
    }

    /// The `X-Forwarded-Proto` to advertise: `public_protocol`, else the
    /// listener's scheme.
    pub(crate) fn scheme_of(&self, tls: bool) -> &'static str {
        match self.control.config.public_protocol {
            Some(s) => s.as_str(),
            None if tls => "https",
            None => "http",
        }
    }
}

impl Gateway {
    /// The largest body `tenant` may send: its plan's, else `limits`'.
    fn max_body_for(&self, tenant: &str) -> Option<u64> {
        let plan = self.control.router.plans().plan_of(tenant);
        self.control.config.max_body_of(plan)
    }

    /// The body phase of a planned request, if the hooks inspect bodies.
    pub(crate) fn body_phase(&self, ctx: &RequestCtx) -> Option<BodyPhase> {
        let tenant = ctx.tenant.as_ref().filter(|_| self.inspect_bodies)?;
        Some(BodyPhase::new(
            Arc::clone(&self.control.hooks),
            tenant.clone(),
        ))
    }

    /// The embedder's upstream edit without the fields it may not touch.
    fn checked_edit(
        &self,
        trace: Option<&crate::trace::TraceContext>,
        mut edit: UpstreamEdit,
    ) -> UpstreamEdit {
        let owned = Owned::of(&self.control.config).for_trace(trace);
        let allowed = |name: &http::HeaderName| may_edit(name, owned);
        edit.add.retain(|(name, _)| allowed(name));
        edit.remove.retain(allowed);
        edit
    }
}

/// Whether an embedder's request check may set or remove the upstream
/// field `name`: not a hop-by-hop or framing field (the transports frame
/// the request), not `Host`, not a field shardgate owns. Others are left
/// alone (and logged at debug level).
fn may_edit(name: &http::HeaderName, owned: Owned<'_>) -> bool {
    let name = name.as_str();
    let allowed =
        !is_hop_by_hop(name) && name != "content-length" && name != "host" && !owned.owns(name);
    if !allowed {
        log::debug!("a request check's field {name} is left alone: shardgate owns it");
    }
    allowed
}

/// The client's host from an absolute-form target's authority, else from
/// the `Host` values: exactly one, a valid authority without user info. A
/// `Host` beside an authority must name the same host (RFC 9112 §3.2.2
/// lets a server ignore it; a shard that reads it instead could pick
/// another tenant than the gateway did).
pub(crate) fn host_from<'a>(
    authority: Option<&'a str>,
    mut hosts: impl Iterator<Item = &'a [u8]>,
) -> Result<&'a str, &'static str> {
    if let Some(authority) = authority {
        return match (hosts.next(), hosts.next()) {
            (Some(h), None) if !h.eq_ignore_ascii_case(authority.as_bytes()) => {
                Err("host-mismatch")
            }
            (Some(_), Some(_)) => Err("duplicate-host"),
            _ if authority.is_empty() => Err("missing-host"),
            _ => check_host(authority),
        };
    }
    let host = match (hosts.next(), hosts.next()) {
        (None, _) => return Err("missing-host"),
        (Some(_), Some(_)) => return Err("duplicate-host"),
        (Some(h), None) => crate::wire::text::text(h).ok_or("invalid-host")?,
    };
    if host.is_empty() {
        return Err("missing-host");
    }
    check_host(host)
}
