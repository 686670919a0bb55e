//! Embedding shardgate in your own Pingora proxy, for those who need
//! Pingora's `Session`: a `ProxyHttp` of ours wraps [`Gateway`], adds
//! phases of its own around shardgate's, and runs with everything the
//! `shardgate` binary has around it (head limits, health checks, admin
//! API, Prometheus, state file, TLS listeners, graceful restarts) and the
//! same flags. `examples/embed.rs` does the same with hooks alone, at the
//! binary's speed; this one forwards every request through Pingora's
//! proxy (3-4x nginx's CPU per request, README "Embedding").
//!
//! ```sh
//! cargo run --example embed_wrapper -- -c conf/quickstart.yaml
//! curl -i http://acme.localhost:8080/                    # x-embedded: 1
//! curl -i -H 'x-embed-teapot: 1' http://acme.localhost:8080/   # 418
//! ```
//!
//! Ours: `request_filter` answers 418 to any request with an
//! `x-embed-teapot` header, `response_filter` stamps `x-embedded: 1` on
//! every proxied response, `logging` logs each request. The rest delegates
//! to shardgate — every phase `Gateway` implements: `new_ctx`,
//! `request_filter`, `upstream_peer`, `connected_to_upstream`,
//! `request_body_filter`, `upstream_request_filter`,
//! `upstream_response_filter`, `response_filter`, `fail_to_connect`,
//! `error_while_proxy`, `fail_to_proxy`, `logging`. A wrapped build
//! forwards every request through Pingora's proxy, so every phase runs on
//! every request (`Builder::fast_transport(true)` would trade that for the
//! fast transport's CPU, and skip the wrapper's phases on HTTP/1 requests
//! and HTTP/2 streams alike).
//!
//! The platform rules that need no phase of their own are hooks
//! ([`GatewayHooks`]): here, tenants whose trial ran out are refused, and
//! requests of trial tenants carry their plan upstream.

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::protocols::Digest;
use pingora::upstreams::peer::HttpPeer;
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use shardgate::proxy::ctx::RequestCtx;
use shardgate::proxy::hooks::{GatewayHooks, RequestCheck, RequestView};
use shardgate::proxy::Gateway;
use shardgate::server::run_cli;
use std::process::ExitCode;
use std::sync::Arc;

/// Platform rules as hooks: they run on every request whichever way its
/// bytes travel.
pub struct PlatformHooks;

impl GatewayHooks for PlatformHooks {
    fn allow(&self, tenant: &str) -> bool {
        !tenant.starts_with("expired-")
    }

    fn check_request(&self, tenant: &str, _request: &RequestView<'_>) -> RequestCheck {
        if tenant.starts_with("trial-") {
            RequestCheck::AddFields(vec![(
                HeaderName::from_static("x-platform-plan"),
                HeaderValue::from_static("trial"),
            )])
        } else {
            RequestCheck::Proceed
        }
    }
}

/// Our proxy: shardgate plus phases of our own.
pub struct EmbeddingProxy {
    inner: Gateway,
}

pub struct EmbedCtx {
    inner: RequestCtx,
}

#[async_trait]
impl ProxyHttp for EmbeddingProxy {
    type CTX = EmbedCtx;

    fn new_ctx(&self) -> EmbedCtx {
        EmbedCtx {
            inner: self.inner.new_ctx(),
        }
    }

    /// Ours first: a teapot is answered here, before shardgate routes (so
    /// it spends no token); everything else goes on to shardgate.
    async fn request_filter(&self, session: &mut Session, ctx: &mut EmbedCtx) -> Result<bool> {
        if session.req_header().headers.contains_key("x-embed-teapot") {
            let body = Bytes::from_static(b"{\"error\":\"teapot\"}");
            let mut resp = ResponseHeader::build(418, Some(3))?;
            resp.insert_header("content-type", "application/json")?;
            resp.insert_header("content-length", body.len().to_string())?;
            session.write_response_header(Box::new(resp), false).await?;
            session.write_response_body(Some(body), true).await?;
            return Ok(true);
        }
        self.inner.request_filter(session, &mut ctx.inner).await
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut EmbedCtx,
    ) -> Result<Box<HttpPeer>> {
        self.inner.upstream_peer(session, &mut ctx.inner).await
    }

    async fn connected_to_upstream(
        &self,
        session: &mut Session,
        reused: bool,
        peer: &HttpPeer,
        fd: std::os::unix::io::RawFd,
        digest: Option<&Digest>,
        ctx: &mut EmbedCtx,
    ) -> Result<()> {
        self.inner
            .connected_to_upstream(session, reused, peer, fd, digest, &mut ctx.inner)
            .await
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut EmbedCtx,
    ) -> Result<()> {
        self.inner
            .request_body_filter(session, body, end_of_stream, &mut ctx.inner)
            .await
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut EmbedCtx,
    ) -> Result<()> {
        self.inner
            .upstream_request_filter(session, upstream_request, &mut ctx.inner)
            .await
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut EmbedCtx,
    ) -> Result<()> {
        self.inner
            .upstream_response_filter(session, upstream_response, &mut ctx.inner)
            .await
    }

    /// Ours: every proxied response says it went through us.
    async fn response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut EmbedCtx,
    ) -> Result<()> {
        self.inner
            .response_filter(session, upstream_response, &mut ctx.inner)
            .await?;
        upstream_response.insert_header("x-embedded", "1")?;
        Ok(())
    }

    fn fail_to_connect(
        &self,
        session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut EmbedCtx,
        e: Box<Error>,
    ) -> Box<Error> {
        self.inner.fail_to_connect(session, peer, &mut ctx.inner, e)
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut EmbedCtx,
        client_reused: bool,
    ) -> Box<Error> {
        self.inner
            .error_while_proxy(peer, session, e, &mut ctx.inner, client_reused)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut EmbedCtx,
    ) -> FailToProxy {
        self.inner.fail_to_proxy(session, e, &mut ctx.inner).await
    }

    /// Ours: one line per request, then shardgate's end of the request
    /// (its access log, metrics and the admission's release).
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut EmbedCtx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        log::info!(
            "embed: {} {} -> {status} tenant={} shard={}",
            session.req_header().method,
            session.req_header().uri,
            ctx.inner.tenant.as_deref().unwrap_or("-"),
            ctx.inner.shard_id().map_or("-", |s| s.as_str()),
        );
        self.inner.logging(session, e, &mut ctx.inner).await
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    run_cli(|builder| {
        builder
            .hooks(Arc::new(PlatformHooks))
            .build_with(|gateway| EmbeddingProxy { inner: gateway })
    })
}
