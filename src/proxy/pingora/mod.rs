//! The Pingora transport: [`Gateway`] as a [`ProxyHttp`]. Each phase moves
//! one step of a request through Pingora and calls the pipeline for the
//! decision:
//!
//! `request_filter` plans (resolve, check, route, admit) or answers the
//! refusal; `upstream_peer` names the shard, routing again for a retry;
//! `connected_to_upstream` starts the headers watch; the header filters
//! apply the forwarding fields and the hop-by-hop table; `fail_to_connect`
//! and `error_while_proxy` say how the attempt failed and let the pipeline
//! decide what follows; `fail_to_proxy` writes shardgate's own answer;
//! `logging` ends the request.

mod compress;
mod phases;
mod session;

use super::ctx::RequestCtx;
use super::hooks::{RequestView, UpstreamFailure};
use super::pipeline::answer::Refusal;
use super::pipeline::failure::AttemptFailure;
use super::pipeline::fields::{
    accepts_trailers, joined_cookie, strip_response_hop_by_hop, unrequested_switch, Forwarding,
    Owned,
};
use super::pipeline::grpc;
use super::pipeline::message::{content_length, declared_framing, length_allowed};
use super::pipeline::plan::host_from;
use super::pipeline::watch::{quiet, Verdict, Watch};
use super::Gateway;
use async_trait::async_trait;
use http::header::HOST;
use phases::{phase, report_unforwarded_at_end, require_phases};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::protocols::Digest;
use pingora::upstreams::peer::HttpPeer;
use pingora::{ErrorSource, ErrorType};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use session::{final_status, is_websocket, no_body, refusal_for, request_line};

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    /// Plans the request (resolve, check, route, admit); any refusal is
    /// answered here (`Ok(true)`: nothing goes upstream).
    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        ctx.phases |= phase::REQUEST_FILTER;
        ctx.tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
        let outcome = self
            .plan(
                &RequestView::from_pingora(session.req_header()),
                session.client_addr(),
                ctx,
            )
            .map(|_| ());
        let limits = &self.control.config.limits;
        // Our idle limit, for a connection the request lets stay open (an
        // HTTP/1.0 request or `Connection: close` turned it off already).
        if session.get_keepalive().is_some() {
            session.set_keepalive(Some(limits.keepalive_timeout.as_secs().max(1)));
        }
        session.set_write_timeout(Some(limits.send_timeout));
        match outcome {
            Ok(()) => {
                ctx.body_phase = self.body_phase(ctx);
                if is_websocket(session) {
                    // An idle WebSocket is not an idle request: no read
                    // timeout on the client side of the tunnel.
                    session.set_read_timeout(None);
                } else {
                    session.set_read_timeout(Some(limits.body_timeout));
                }
                Ok(false)
            }
            Err(refusal) => {
                let refusal = self.identified(refusal, ctx);
                ctx.answered_with(&refusal);
                refusal.send(session).await?;
                if session.req_header().version == http::Version::HTTP_2 {
                    // As the fast transport: the body still coming is read
                    // off a while, so that the stream ends without a reset
                    // that some clients take for a failed answer.
                    let drain = session.as_mut().drain_request_body();
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drain).await;
                }
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
        ctx.phases |= phase::UPSTREAM_PEER;
        if ctx.attempts > 0 && !std::mem::take(&mut ctx.shard_chosen) {
            if let Err(refusal) = self.readmit(ctx) {
                let status = refusal.status;
                ctx.refusal = Some(refusal);
                return Err(Error::explain(
                    ErrorType::HTTPStatus(status),
                    "no shard left to retry on",
                ));
            }
        }
        self.attempt_started(ctx);
        ctx.headers_received = false;
        ctx.verdict = Verdict::None;
        match &ctx.peer {
            // This path cannot open a connection with a PROXY header (the
            // configuration refuses such shards here; a state file, the
            // cluster or an embedder without the fast transport may still
            // bring one): never sent without its header.
            Some(peer) if peer.proxy_protocol => {
                ctx.refusal = Some(Refusal::error(502, "upstream-unreachable"));
                log::error!("a proxy_protocol shard needs the fast transport");
                Err(Error::explain(
                    ErrorType::HTTPStatus(502),
                    "proxy_protocol shard",
                ))
            }
            Some(peer) => {
                let h2 = peer.protocol.may_be_h2();
                let mut peer = peer.peer.clone();
                if h2 {
                    // Its connection is shared: a deadline is the stream's
                    // own (Pingora's read timeout resets the stream), never
                    // the socket's (the watch would shut it for all).
                    peer.options.read_timeout = Some(self.stream_deadline(ctx));
                }
                if std::mem::take(&mut ctx.fresh_connection) {
                    // A group of its own: no pooled connection matches.
                    static FRESH: std::sync::atomic::AtomicU64 =
                        std::sync::atomic::AtomicU64::new(1);
                    peer.group_key = FRESH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(Box::new(peer))
            }
            None => Err(Error::explain(ErrorType::InternalError, "no shard chosen")),
        }
    }

    /// Starts watching for response headers (timeout and liveness). A
    /// reused plain connection with anything to read (closed by the shard,
    /// or bytes no request asked for) is refused before the request goes
    /// out: bytes from before a request must never answer it. It counts as
    /// a stale pooled connection (sent again on a fresh one).
    async fn connected_to_upstream(
        &self,
        _session: &mut Session,
        reused: bool,
        peer: &HttpPeer,
        fd: std::os::unix::io::RawFd,
        digest: Option<&Digest>,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.phases |= phase::CONNECTED_TO_UPSTREAM;
        // (An HTTP/2 connection is shared: other streams' bytes are its
        // own reader's, never this request's answer.)
        let http1 = ctx.peer.as_ref().is_none_or(|p| !p.protocol.may_be_h2());
        if reused && http1 && !peer.is_tls() && !quiet(fd) {
            return Err(Error::create(
                ErrorType::ConnectionClosed,
                ErrorSource::Upstream,
                Some("a pooled connection had bytes to read or was closed".into()),
                None,
            ));
        }
        // The connection's local address is cached per connection: pooled
        // connections cost nothing here.
        let local = digest
            .and_then(|d| d.socket_digest.as_ref())
            .and_then(|s| s.local_addr())
            .and_then(|a| a.as_inet())
            .copied();
        match (&ctx.peer, local) {
            // (An HTTP/2 shard's deadline is its stream's: `upstream_peer`.)
            (Some(peer), Some(local)) if !peer.protocol.may_be_h2() => {
                ctx.watch = Watch::start(fd, local, peer.addr, self.watch_settings());
            }
            _ => {}
        }
        Ok(())
    }

    /// Request body going out: the headers deadline counts from the last
    /// progress, so a slow upload is not mistaken for a slow shard. A body
    /// that crosses `limits.max_body_bytes` is 413 (a length over it was
    /// refused with the head): the upstream request is aborted.
    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.phases |= phase::REQUEST_BODY_FILTER;
        if let Some(watch) = &ctx.watch {
            watch.touch();
        }
        // What Pingora read of the body (a retry's replay is not read
        // again); a WebSocket's frames after its 101 are not a body.
        let read = session.as_ref().body_bytes_read() as u64;
        // The tenant's own limit once planned (the head reader applied
        // the largest any tenant has).
        let max_body = match ctx.tenant {
            Some(_) => ctx.max_body,
            None => self.control.config.largest_max_body(),
        };
        if let (Some(max), false) = (max_body, session.was_upgraded()) {
            if read > max {
                ctx.refusal = Some(Refusal::error(413, "body-too-large"));
                return Err(Error::explain(
                    ErrorType::HTTPStatus(413),
                    "request body over limits.max_body_bytes",
                ));
            }
        }
        // The embedder's body phase, on what was read since it last saw
        // the body: a retry resends the body it saw, unread.
        if let (Some(phase), false) = (&mut ctx.body_phase, session.was_upgraded()) {
            let fresh = read > ctx.body_seen;
            ctx.body_seen = read;
            let data = body.as_deref().filter(|_| fresh).unwrap_or_default();
            // The last piece of a length completes the shard's request
            // (HTTP/2 may say its end only in an empty frame after it).
            let lengths = (session.req_header().headers)
                .get_all(http::header::CONTENT_LENGTH)
                .iter()
                .map(|v| v.as_bytes());
            let length = content_length(lengths).unwrap_or_default();
            let end = end_of_stream || length.is_some_and(|n| read >= n);
            if let Err(refusal) = phase.piece(data, end) {
                let status = refusal.status;
                ctx.refusal = Some(refusal);
                return Err(Error::explain(
                    ErrorType::HTTPStatus(status),
                    "request body refused by the body phase",
                ));
            }
        }
        Ok(())
    }

    /// The upstream head: the embedder's extra fields, the forwarding
    /// fields (never trusted from the client), the hop-by-hop table.
    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // Every phase before this one sets what this request relies on:
        // the plan, the shard, the headers deadline.
        require_phases(
            ctx,
            phase::REQUEST_FILTER | phase::UPSTREAM_PEER | phase::CONNECTED_TO_UPSTREAM,
        )?;
        let config = &self.control.config;
        let req = session.req_header();
        let hosts = req.headers.get_all(HOST).iter().map(|v| v.as_bytes());
        let host = host_from(req.uri.authority().map(|a| a.as_str()), hosts)
            .unwrap_or_default()
            .to_string();
        let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
        let forwarding = Forwarding {
            host: &host,
            proto: self.scheme_of(tls),
            peer_ip: ctx.client,
            owned: Owned::of(config).for_trace(ctx.trace.as_ref()),
            tenant: ctx.tenant.as_deref().unwrap_or_default(),
            request_id: &ctx.request_id,
            traceparent: ctx.trace.as_ref().map(|t| t.traceparent()),
        };
        // The embedder's edit (checked by the plan): its fields replace
        // the client's, look-alikes with `_` for `-` included.
        let edit = &ctx.upstream_edit;
        if !edit.is_empty() {
            let replaced: Vec<http::HeaderName> = (upstream_request.headers.keys())
                .filter(|k| edit.replaces(k.as_str()))
                .cloned()
                .collect();
            for name in &replaced {
                upstream_request.remove_header(name);
            }
            for (name, value) in &edit.add {
                upstream_request.append_header(name.clone(), value.clone())?;
            }
        }
        let te = session.req_header().headers.get_all(http::header::TE);
        let trailers = accepts_trailers(te.iter().map(|v| v.as_bytes()));
        forwarding.apply(upstream_request)?;
        if trailers && ctx.peer.as_ref().is_some_and(|p| p.protocol.may_be_h2()) {
            upstream_request.insert_header(http::header::TE, "trailers")?;
        }
        if session.req_header().version == http::Version::HTTP_2 {
            let cookies = upstream_request.headers.get_all(http::header::COOKIE);
            if let Some(joined) = joined_cookie(cookies.iter().map(|v| v.as_bytes())) {
                upstream_request.insert_header(http::header::COOKIE, joined)?;
            }
        }
        let http1 = ctx.peer.as_ref().is_none_or(|p| !p.protocol.may_be_h2());
        if upstream_request.method == http::Method::HEAD && http1 {
            // A HEAD answer that announces a body cannot be told from one a
            // shard then sends anyway, which would answer the connection's
            // next request: its connection is not reused (the fast
            // transport drops it after such an answer; here Pingora decides
            // before the answer is seen, so every HEAD asks for a close).
            upstream_request.insert_header(http::header::CONNECTION, "close")?;
        }
        Ok(())
    }

    /// Response headers arrived: disarm the watch, refuse a 101 nobody
    /// asked for, strip hop-by-hop fields, let the hooks edit the head.
    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let status = upstream_response.status.as_u16();
        ctx.phases &= !phase::UPSTREAM_RESPONSE_FILTER;
        self.attempt_answered(ctx, status);
        if unrequested_switch(status, is_websocket(session)) {
            return Err(Error::create(
                ErrorType::InvalidHTTPHeader,
                ErrorSource::Upstream,
                Some("101 to a request that asked for no upgrade".into()),
                None,
            ));
        }
        // The rule a request's framing fields are read by (a coding other
        // than `chunked`, a length that is no length: the shard's framing
        // cannot be trusted, nor its connection kept). Pingora drops a
        // `Content-Length` beside `Transfer-Encoding` before any phase
        // sees the head: that one case is Pingora's reading here.
        let fields = (upstream_response.headers.iter()).map(|(n, v)| (n.as_str(), v.as_bytes()));
        let http10 = upstream_response.version == http::Version::HTTP_10;
        let Ok(declared) = declared_framing(fields, http10) else {
            return Err(Error::create(
                ErrorType::InvalidHTTPHeader,
                ErrorSource::Upstream,
                Some("a response whose framing fields break RFC 9112 §6".into()),
                None,
            ));
        };
        // The length as read, once (`5, 5` is a length, not one every
        // client reads), where a response may have one at all.
        upstream_response.remove_header(&http::header::CONTENT_LENGTH);
        if let (Some(length), true) = (declared.length, length_allowed(status)) {
            upstream_response.insert_header(http::header::CONTENT_LENGTH, length)?;
        }
        // Passed: the response phase may see this head (one refused here,
        // the 101 above or a failed edit below, never reaches it).
        ctx.phases |= phase::UPSTREAM_RESPONSE_FILTER;
        if ctx.grpc {
            // A trailers-only answer's status is in its head.
            ctx.grpc_status = grpc::status_in(&upstream_response.headers);
        }
        if (100..200).contains(&status) && status != 101 {
            return Ok(());
        }
        if let Some(watch) = ctx.watch.take() {
            // A body's reads are watched (`upstream.read_timeout_ms`); a
            // tunnel keeps its own rules, and no body means no wait.
            if status == 101 || no_body(session, upstream_response) {
                ctx.verdict = watch.disarm();
            } else {
                (ctx.verdict, ctx.watch) = watch.body(self.watch_settings().read_timeout);
            }
        }
        ctx.headers_received = true;
        strip_response_hop_by_hop(upstream_response);

        if let Some(edit) = self.response_edit(status, ctx) {
            if let Err(e) = edit.apply(upstream_response) {
                ctx.phases &= !phase::UPSTREAM_RESPONSE_FILTER;
                return Err(e);
            }
        }
        // The request's ID, over the shard's and the edit's.
        let id_header = self.control.config.request_id.header.clone();
        upstream_response.insert_header(id_header, ctx.request_id.as_str())
    }

    /// The shard's trailers: a gRPC call's status is there (for the access
    /// log and the span).
    fn upstream_response_trailer_filter(
        &self,
        _session: &mut Session,
        trailers: &mut http::HeaderMap,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if ctx.grpc {
            ctx.grpc_status = grpc::status_in(trailers).or(ctx.grpc_status);
        }
        Ok(())
    }

    /// A piece of the body to the client, compressed if the body is.
    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<std::time::Duration>> {
        ctx.phases |= phase::RESPONSE_BODY_FILTER;
        compress::compress_body(body, end_of_stream, ctx)?;
        Ok(None)
    }

    /// Response body bytes came: the shard is not silent. Its end drops
    /// the watch before the connection can go back to the pool.
    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        _body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<std::time::Duration>> {
        match end_of_stream {
            true => ctx.watch = None,
            false => ctx.watch.iter().for_each(Watch::touch),
        }
        Ok(None)
    }

    /// The head the client gets. Pingora sends a body framed by the
    /// shard's close in chunks (a cut body then shows), to HTTP/1.0 clients
    /// too, which RFC 9112 §7 forbids: theirs stays framed by the close.
    async fn response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.phases |= phase::RESPONSE_FILTER;
        // A shard's head reaches this phase only through the one that
        // strips its hop-by-hop fields and disarms the headers deadline
        // (a wrapper's cache hit has no shard's head: not checked).
        if !session.cache.enabled() {
            require_phases(ctx, phase::UPSTREAM_RESPONSE_FILTER)?;
        }
        // Here, next to the body's phase (a cache keeps the shard's head).
        compress::compress_head(self, session, upstream_response, ctx)?;
        if session.req_header().version == http::Version::HTTP_10
            && upstream_response
                .remove_header(&http::header::TRANSFER_ENCODING)
                .is_some()
        {
            // Framed by the close now.
            session.set_keepalive(None);
        }
        Ok(())
    }

    /// The connection could not be made: the pipeline decides (nothing was
    /// sent, so any listed method may retry).
    fn fail_to_connect(
        &self,
        session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        ctx.watch = None;
        let retry = self.follow(
            session,
            ctx,
            AttemptFailure::Shard(UpstreamFailure::Connect),
        );
        e.set_retry(retry);
        e
    }

    /// An attempt failed after connecting. The watch's verdict says why if
    /// it concluded; otherwise a break before any response byte is a reset
    /// — or, on a reused pooled connection, maybe only a stale one.
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
        // An HTTP/2 stream's own deadline (no watch: `upstream_peer`).
        let stream_timed_out = *e.etype() == ErrorType::ReadTimedout
            && *e.esource() == ErrorSource::Upstream
            && ctx.peer.as_ref().is_some_and(|p| p.protocol.may_be_h2());
        if ctx.headers_received && (verdict == Verdict::TimedOut || stream_timed_out) {
            // The shard fell silent during the body.
            self.response_timed_out(ctx);
        }
        let failure = match verdict {
            // Once the response head arrived (it may be on its way to the
            // client already) nothing is retried: another shard's response
            // would be spliced onto it.
            _ if ctx.headers_received => None,
            Verdict::TimedOut => Some(AttemptFailure::Shard(UpstreamFailure::Timeout)),
            Verdict::Unreachable => Some(AttemptFailure::Shard(UpstreamFailure::Liveness)),
            Verdict::None if stream_timed_out => {
                Some(AttemptFailure::Shard(UpstreamFailure::Timeout))
            }
            Verdict::None if *e.esource() != ErrorSource::Upstream => None,
            Verdict::None if *e.etype() == ErrorType::InvalidHTTPHeader => {
                Some(AttemptFailure::Invalid)
            }
            Verdict::None if client_reused => Some(AttemptFailure::Stale),
            Verdict::None => Some(AttemptFailure::Reset),
        };
        if failure.is_none() && !ctx.headers_received && *e.esource() == ErrorSource::Downstream {
            // The client went away, stalled or was refused (its body)
            // before the shard answered.
            self.attempt_failed(ctx, "client");
        }
        let retry = failure.is_some_and(|failure| self.follow(session, ctx, failure));
        e.set_retry(retry);
        e
    }

    /// shardgate's own answer for a request that could not be proxied: the
    /// pipeline's (retry refused, 502, 504), or one for Pingora's own
    /// errors (a malformed request, a client timeout).
    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let refusal = ctx.refusal.take().or_else(|| refusal_for(e));
        let mut code = 0;
        if let Some(refusal) = refusal {
            // The connection closes after it, and the answer says so.
            session.set_keepalive(None);
            let refusal = self.identified(refusal, ctx);
            if final_status(session).is_none() && refusal.send(session).await.is_ok() {
                code = refusal.status;
                ctx.answered_with(&refusal);
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
        report_unforwarded_at_end(session, ctx);
        let status = ctx.answered.or_else(|| final_status(session)).unwrap_or(0);
        // A WebSocket's tunnel counts as its body, each way (as on the
        // fast transport).
        ctx.bytes_in = session.as_ref().body_bytes_read() as u64;
        ctx.bytes_out = session.as_ref().body_bytes_sent() as u64;
        self.finish(ctx, &request_line(session), status);
    }
}
