//! The gateway as a Pingora [`ProxyHttp`]: each phase does one step of
//! DESIGN §2 and leaves the decisions to `routing`/`limits`.
//!
//! `request_filter` resolves and admits (or answers the refusal);
//! `upstream_peer` names the shard, routing again for a retry;
//! `connected_to_upstream` starts the headers watch; the header filters
//! forward and strip; `fail_to_connect`/`error_while_proxy` classify a
//! failure, call the failure hook and decide the retry; `fail_to_proxy`
//! writes shardgate's own error answers. The admission lives in the
//! request's context and is released when the context drops — after the
//! response body is fully sent, the client went away, or (for a WebSocket)
//! the tunnel closed — or before a retry routes again.
//!
//! Embedding: [`Gateway`] is a plain library type; another Pingora server
//! can run it as its `ProxyHttp`, or wrap it and delegate each phase (see
//! `examples/embed.rs`).

pub mod ctx;
pub mod fast;
pub mod forward;
pub mod head;
pub mod hooks;
pub mod respond;
pub mod retry;
pub mod routes;
pub mod watch;

use crate::control::Control;
use crate::routing::{Decision, RouteRequest};
use async_trait::async_trait;
use ctx::RequestCtx;
use forward::{is_websocket, strip_response_hop_by_hop, Forwarding};
use hooks::UpstreamFailure;
use http::header::{HOST, UPGRADE};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::protocols::Digest;
use pingora::upstreams::peer::HttpPeer;
use pingora::{ErrorSource, ErrorType};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use respond::Refusal;
use retry::{RetryPolicy, RetryVerdict};
use routes::RoutePrefixes;
use std::sync::Arc;
use watch::{Verdict, Watch, WatchSettings};

/// shardgate's proxy logic. Cloning shares everything (the retry budget
/// included): the fast path and the Pingora path run the same gateway.
#[derive(Clone)]
pub struct Gateway {
    control: Arc<Control>,
    routes: Arc<RoutePrefixes>,
    retry: Arc<RetryPolicy>,
    watch: WatchSettings,
}

impl Gateway {
    pub fn new(control: Arc<Control>) -> Self {
        let config = &control.config;
        Gateway {
            routes: Arc::new(RoutePrefixes::new(
                config.limits.routes.iter().map(|(p, _)| p.clone()),
            )),
            retry: Arc::new(RetryPolicy::new(config.retry.clone())),
            watch: WatchSettings {
                headers_timeout: config.upstream.headers_timeout,
                liveness: config.upstream.liveness,
            },
            control,
        }
    }

    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// Routes and admits the request in `ctx`; on success the context
    /// holds the shard, its peer and the admission.
    pub(crate) fn admit(&self, ctx: &mut RequestCtx) -> Result<(), Refusal> {
        let tenant = ctx.tenant.as_deref().unwrap_or_default();
        let request = RouteRequest {
            tenant,
            channel: ctx.channel.as_deref(),
            route: ctx.route.map(|i| self.routes.name(i)),
            region: ctx.region.as_deref(),
            balance: None,
            exclude: &ctx.failed,
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
        ctx.admission = routed.admission.take();
        ctx.shard = shard;
        ctx.peer = Some(peer);
        Ok(())
    }

    /// `request_filter`'s decision, without I/O: the host through the domain
    /// map, the route prefix, the channel, the region, then the admission.
    /// On `Ok` the context holds the tenant, the shard and the admission.
    /// (Public for the fuzz target that drives it with arbitrary requests.)
    pub fn plan(&self, req: &RequestHeader, ctx: &mut RequestCtx) -> Result<(), Refusal> {
        let channel = self
            .control
            .config
            .routing
            .channel_header
            .as_ref()
            .and_then(|name| req.headers.get(name))
            .map(|v| v.as_bytes());
        self.plan_parts(client_host(req), req.uri.path(), channel, ctx)
    }

    /// [`Gateway::plan`] from the parts it reads: the client's host (or why
    /// it is unusable), the path, and the channel header's raw value.
    pub(crate) fn plan_parts(
        &self,
        host: Result<&str, &'static str>,
        path: &str,
        channel: Option<&[u8]>,
        ctx: &mut RequestCtx,
    ) -> Result<(), Refusal> {
        let host = host.map_err(|what| Refusal::error(400, what))?;
        let resolved = self
            .control
            .domains
            .resolve(host)
            .ok_or_else(|| Refusal::error(404, "unknown-domain"))?;
        ctx.tenant = Some(resolved.tenant);
        ctx.route = self.routes.route_for(path);
        ctx.channel = match channel.map(std::str::from_utf8) {
            None | Some(Ok("")) => None,
            Some(Ok(channel))
                if channel
                    .bytes()
                    .all(|b| b == b'\t' || (b' '..=b'~').contains(&b)) =>
            {
                Some(channel.to_string())
            }
            Some(_) => return Err(Refusal::error(400, "invalid-channel")),
        };
        if let (Some(directory), Some(tenant)) = (&self.control.regions, &ctx.tenant) {
            ctx.region = Some(directory.region_for(tenant));
        }
        self.admit(ctx)
    }

    /// Notes a failed attempt: the failure hook, and the shard excluded
    /// from the rest of this request if it is unreachable.
    pub(crate) fn record_failure(&self, ctx: &mut RequestCtx, failure: UpstreamFailure) {
        ctx.failure = Some(failure);
        if let Some(shard) = ctx.shard.as_ref().map(|s| s.id().clone()) {
            self.control
                .metrics
                .upstream_failure(shard.as_str(), failure);
            self.control
                .hooks
                .on_upstream_failure(&self.control.router, &shard, failure);
            if failure.is_unreachable() && !ctx.failed.contains(&shard) {
                ctx.failed.push(shard);
            }
        }
    }

    /// Whether to try again after a failed attempt (taking a place in the
    /// retry budget if so).
    fn may_retry(&self, session: &Session, ctx: &mut RequestCtx, sent: bool) -> bool {
        let replayable = !session.as_ref().retry_buffer_truncated();
        self.may_retry_request(&session.req_header().method, replayable, ctx, sent)
    }

    /// [`Gateway::may_retry`] from the request's method and whether its
    /// body can be replayed.
    pub(crate) fn may_retry_request(
        &self,
        method: &http::Method,
        replayable: bool,
        ctx: &mut RequestCtx,
        sent: bool,
    ) -> bool {
        // A retry after a stale pooled connection does not count: it says
        // nothing about the shard.
        let attempts = ctx.attempts - ctx.stale_retries;
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
    pub(crate) fn may_resend_stale(
        &self,
        method: &http::Method,
        replayable: bool,
        ctx: &mut RequestCtx,
    ) -> bool {
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

    /// The `X-Forwarded-Proto` to advertise for this session.
    fn scheme(&self, session: &Session) -> &'static str {
        self.scheme_of(session.digest().is_some_and(|d| d.ssl_digest.is_some()))
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
}

tokio::task_local! {
    /// A request the fast path planned but hands to Pingora's path (its
    /// shard speaks https): picked up by `new_ctx`, so it is not routed,
    /// admitted or charged twice.
    static PLANNED: std::cell::RefCell<Option<RequestCtx>>;
}

/// Runs `serve` (one Pingora session) with `ctx` as its planned context.
pub(crate) async fn with_planned<F: std::future::Future>(ctx: RequestCtx, serve: F) -> F::Output {
    PLANNED
        .scope(std::cell::RefCell::new(Some(ctx)), serve)
        .await
}

/// The client's host: the absolute-form authority if the target has one,
/// else the single `Host` header.
fn client_host(req: &RequestHeader) -> Result<&str, &'static str> {
    let hosts = req.headers.get_all(HOST).iter().map(|v| v.as_bytes());
    host_from(req.uri.authority().map(|a| a.as_str()), hosts)
}

/// The client's host from an absolute-form target's authority, else from
/// the `Host` values: exactly one, a valid authority without user info.
pub(crate) fn host_from<'a>(
    authority: Option<&'a str>,
    mut hosts: impl Iterator<Item = &'a [u8]>,
) -> Result<&'a str, &'static str> {
    if let Some(authority) = authority {
        return Ok(authority);
    }
    let host = match (hosts.next(), hosts.next()) {
        (None, _) => return Err("missing-host"),
        (Some(_), Some(_)) => return Err("duplicate-host"),
        (Some(h), None) => std::str::from_utf8(h).map_err(|_| "invalid-host")?,
    };
    if host.is_empty() {
        return Err("missing-host");
    }
    // Host must be a valid authority (no spaces, no user info, no path).
    match http::uri::Authority::try_from(host) {
        Ok(a) if !a.as_str().contains('@') => Ok(host),
        _ => Err("invalid-host"),
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        PLANNED
            .try_with(|planned| planned.borrow_mut().take())
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Resolves the tenant, matches the route and admits the request; any
    /// refusal is answered here (`Ok(true)`: nothing goes upstream).
    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        // Planned already if the fast path handed it over.
        let outcome = match ctx.peer {
            Some(_) => Ok(()),
            None => self.plan(session.req_header(), ctx),
        };
        let limits = &self.control.config.limits;
        session.set_keepalive(Some(limits.keepalive_timeout.as_secs().max(1)));
        session.set_write_timeout(Some(limits.send_timeout));
        match outcome {
            Ok(()) => {
                if session.is_upgrade_req()
                    && is_websocket(session.req_header().headers.get(UPGRADE))
                {
                    // An idle WebSocket is not an idle request: no read
                    // timeout on the client side of the tunnel.
                    session.set_read_timeout(None);
                } else {
                    session.set_read_timeout(Some(limits.body_timeout));
                }
                Ok(false)
            }
            Err(refusal) => {
                ctx.answered = Some(refusal.status);
                refusal.send(session).await?;
                Ok(true)
            }
        }
    }

    /// The shard to send this attempt to. A retry first releases the failed
    /// attempt's admission, then routes again with the failed shards
    /// excluded: balanced, capped and rate limited like any route.
    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        if ctx.attempts > 0 && !std::mem::take(&mut ctx.rerouted) {
            if let Err(refusal) = self.readmit(ctx) {
                let status = refusal.status;
                ctx.refusal = Some(refusal);
                return Err(Error::explain(
                    ErrorType::HTTPStatus(status),
                    "no shard left to retry on",
                ));
            }
        }
        ctx.attempts += 1;
        ctx.headers_received = false;
        ctx.verdict = Verdict::None;
        match &ctx.peer {
            Some(peer) => Ok(Box::new(peer.peer.clone())),
            None => Err(Error::explain(ErrorType::InternalError, "no shard chosen")),
        }
    }

    /// Starts watching for response headers (timeout and liveness).
    async fn connected_to_upstream(
        &self,
        _session: &mut Session,
        _reused: bool,
        _peer: &HttpPeer,
        fd: std::os::unix::io::RawFd,
        digest: Option<&Digest>,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // The connection's local address is cached per connection: pooled
        // connections cost nothing here.
        let local = digest
            .and_then(|d| d.socket_digest.as_ref())
            .and_then(|s| s.local_addr())
            .and_then(|a| a.as_inet())
            .copied();
        if let (Some(peer), Some(local)) = (&ctx.peer, local) {
            ctx.watch = Watch::start(fd, local, peer.addr, self.watch);
        }
        Ok(())
    }

    /// Request body going out: the headers deadline counts from the last
    /// progress, so a slow upload is not mistaken for a slow shard.
    async fn request_body_filter(
        &self,
        _session: &mut Session,
        _body: &mut Option<bytes::Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let Some(watch) = &ctx.watch {
            watch.touch();
        }
        Ok(())
    }

    /// Forwarding fields (never trusted from the client) and the tenant.
    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let config = &self.control.config;
        let host = client_host(session.req_header())
            .unwrap_or_default()
            .to_string();
        let peer_ip = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        Forwarding {
            host: &host,
            proto: self.scheme(session),
            peer_ip,
            trust_forwarded_for: config.trust_forwarded_for,
            tenant_header: &config.tenant_header,
            tenant: ctx.tenant.as_deref().unwrap_or_default(),
        }
        .apply(upstream_request)
    }

    /// Response headers arrived: disarm the watch, strip hop-by-hop fields.
    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let status = upstream_response.status;
        if status == http::StatusCode::SWITCHING_PROTOCOLS && !session.is_upgrade_req() {
            // Nobody asked to switch: the shard's answer is not HTTP we
            // forward (502, no hook, no retry: see `error_while_proxy`).
            return Err(Error::create(
                ErrorType::InvalidHTTPHeader,
                ErrorSource::Upstream,
                Some("101 to a request that asked for no upgrade".into()),
                None,
            ));
        }
        if status.is_informational() && status != http::StatusCode::SWITCHING_PROTOCOLS {
            return Ok(());
        }
        if let Some(watch) = ctx.watch.take() {
            ctx.verdict = watch.disarm();
        }
        ctx.headers_received = true;
        strip_response_hop_by_hop(upstream_response);
        Ok(())
    }

    /// The connection could not be made: the failure hook, then a retry if
    /// the rules allow (nothing was sent, so any listed method may retry).
    fn fail_to_connect(
        &self,
        session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        ctx.watch = None;
        self.record_failure(ctx, UpstreamFailure::Connect);
        let retry = self.may_retry(session, ctx, false);
        e.set_retry(retry);
        e
    }

    /// An attempt failed after connecting. The watch's verdict says why if
    /// it concluded; otherwise a break before any response byte is an
    /// unreachable shard — except on a reused pooled connection, which the
    /// shard may simply have closed (retried without blaming the shard).
    fn error_while_proxy(
        &self,
        _peer: &HttpPeer,
        session: &mut Session,
        mut e: Box<Error>,
        ctx: &mut RequestCtx,
        client_reused: bool,
    ) -> Box<Error> {
        let verdict = match ctx.watch.take() {
            Some(watch) => watch.verdict(),
            None => ctx.verdict,
        };
        let retry = match verdict {
            // The watch ruled just as the response head arrived: the head
            // may be on its way to the client already, so nothing is
            // retried (another shard's response would be spliced onto it).
            Verdict::TimedOut | Verdict::Unreachable if ctx.headers_received => false,
            Verdict::TimedOut => {
                self.record_failure(ctx, UpstreamFailure::Timeout);
                false
            }
            Verdict::Unreachable => {
                self.record_failure(ctx, UpstreamFailure::Liveness);
                self.may_retry(session, ctx, true)
            }
            Verdict::None if ctx.headers_received || *e.esource() != ErrorSource::Upstream => false,
            // The shard answered, but not in HTTP/1.x: reachable, so no
            // hook (one tenant's broken app must not take a shared shard
            // out of rotation), and the request was delivered: no retry.
            Verdict::None if *e.etype() == ErrorType::InvalidHTTPHeader => false,
            Verdict::None if client_reused && ctx.stale_retries == 0 => {
                let replayable = !session.as_ref().retry_buffer_truncated();
                let resend = self.may_resend_stale(&session.req_header().method, replayable, ctx);
                // To the same shard, still admitted: not routed again.
                ctx.rerouted = resend;
                resend
            }
            Verdict::None => {
                self.record_failure(ctx, UpstreamFailure::Reset);
                self.may_retry(session, ctx, true)
            }
        };
        e.set_retry(retry);
        e
    }

    /// shardgate's own answer for a request that could not be proxied:
    /// the retry's refusal, 504 after the headers timeout, 502 for an
    /// unreachable shard, Pingora's status for a malformed request.
    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let refusal = ctx
            .refusal
            .take()
            .or_else(|| match (ctx.failure, e.etype()) {
                (Some(UpstreamFailure::Timeout), _) => {
                    Some(Refusal::error(504, "upstream-timeout"))
                }
                (_, ErrorType::HTTPStatus(code)) if *code >= 400 => Some(Refusal::error(
                    *code,
                    if *code < 500 {
                        "bad-request"
                    } else {
                        "upstream-error"
                    },
                )),
                (_, ErrorType::InvalidHTTPHeader) if *e.esource() == ErrorSource::Upstream => {
                    Some(Refusal::error(502, "upstream-invalid-response"))
                }
                _ => match e.esource() {
                    ErrorSource::Upstream => Some(Refusal::error(502, "upstream-unreachable")),
                    ErrorSource::Downstream => match e.etype() {
                        ErrorType::ReadTimedout => Some(Refusal::error(408, "request-timeout")),
                        ErrorType::WriteError
                        | ErrorType::ReadError
                        | ErrorType::ConnectionClosed => None,
                        _ => Some(Refusal::error(400, "bad-request")),
                    },
                    _ => Some(Refusal::error(500, "internal-error")),
                },
            });
        let mut code = 0;
        if let Some(refusal) = refusal {
            if session.response_written().is_none() && refusal.send(session).await.is_ok() {
                code = refusal.status;
                ctx.answered = Some(code);
            }
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    /// The request is over (response sent, client gone, or socket closed):
    /// its duration, the access log line, and — dropping the context right
    /// after — the admission's release.
    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut RequestCtx) {
        let status = ctx
            .answered
            .or_else(|| session.response_written().map(|r| r.status.as_u16()))
            .unwrap_or(0);
        let req = session.req_header();
        let client = fast::OrEmpty(session.client_addr());
        self.finish(ctx, &client, req.method.as_str(), &req.uri, status);
    }
}

impl Gateway {
    /// The request is over: its duration, the admission's release, the
    /// access log line.
    pub(crate) fn finish(
        &self,
        ctx: &mut RequestCtx,
        client: &dyn std::fmt::Display,
        method: &str,
        target: &dyn std::fmt::Display,
        status: u16,
    ) {
        let elapsed = ctx.started.elapsed();
        self.control.metrics.request_finished(elapsed.as_secs_f64());
        ctx.admission = None;
        if let Some(level) = self.control.config.log.access {
            if log::log_enabled!(target: "shardgate::access", level) {
                log::log!(
                    target: "shardgate::access",
                    level,
                    "{client} {method} {target} tenant={} shard={} decision={} status={status} duration_ms={:.3} attempts={}",
                    ctx.tenant.as_deref().unwrap_or("-"),
                    ctx.shard_id().map_or("-", |s| s.as_str()),
                    ctx.decision.map_or("-", |d| d.as_str()),
                    elapsed.as_secs_f64() * 1000.0,
                    ctx.attempts,
                );
            }
        }
    }

    pub(crate) fn scheme_of(&self, tls: bool) -> &'static str {
        match self.control.config.public_protocol {
            Some(s) => s.as_str(),
            None if tls => "https",
            None => "http",
        }
    }

    pub(crate) fn watch_settings(&self) -> WatchSettings {
        self.watch
    }
}
