//! Embedding shardgate in your own Pingora proxy, for those who need
//! Pingora's `Session`: a [`GatewayWrapper`] of ours adds phases of its own
//! around shardgate's, and runs with everything the `shardgate` binary has
//! around it (head limits, health checks, admin API, Prometheus, state
//! file, TLS listeners, graceful restarts) and the same flags.
//! `examples/embed.rs` does the same with hooks alone, at the binary's
//! speed; this one forwards every request through Pingora's proxy (3-4x
//! nginx's CPU per request, README "Embedding").
//!
//! ```sh
//! cargo run --example embed_wrapper -- -c conf/quickstart.yaml
//! curl -i http://acme.localhost:8080/                    # x-embedded: 1
//! curl -i -H 'x-embed-teapot: 1' http://acme.localhost:8080/   # 418
//! ```
//!
//! Ours: `request_filter` answers 418 to any request with an
//! `x-embed-teapot` header, `response_filter` stamps `x-embedded: 1` on
//! every proxied response, `logging` logs each request. Every other phase
//! is shardgate's by default (`GatewayWrapper` forwards each phase
//! `Gateway` implements), and ours call shardgate's where they want it: a
//! phase of ours that forgets to fails its requests (500, the log names
//! it) rather than losing one of shardgate's rules. A wrapped build
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
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora_proxy::{ProxyHttp, Session};
use shardgate::proxy::hooks::{GatewayHooks, RequestCheck, RequestView};
use shardgate::proxy::wrap::{GatewayWrapper, WrapperCtx};
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
    gateway: Gateway,
}

#[async_trait]
impl GatewayWrapper for EmbeddingProxy {
    type Ctx = ();

    fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// Ours first: a teapot is answered here, before shardgate routes (so
    /// it spends no token); everything else goes on to shardgate.
    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        if session.req_header().headers.contains_key("x-embed-teapot") {
            let body = Bytes::from_static(b"{\"error\":\"teapot\"}");
            let mut resp = ResponseHeader::build(418, Some(3))?;
            resp.insert_header("content-type", "application/json")?;
            resp.insert_header("content-length", body.len().to_string())?;
            session.write_response_header(Box::new(resp), false).await?;
            session.write_response_body(Some(body), true).await?;
            return Ok(true);
        }
        self.gateway.request_filter(session, &mut ctx.gateway).await
    }

    /// Ours: every proxied response says it went through us.
    async fn response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        (self.gateway)
            .response_filter(session, upstream_response, &mut ctx.gateway)
            .await?;
        upstream_response.insert_header("x-embedded", "1")?;
        Ok(())
    }

    /// Ours: one line per request, then shardgate's end of the request
    /// (its access log, metrics and the admission's release).
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        log::info!(
            "embed: {} {} -> {status} tenant={} shard={} id={}",
            session.req_header().method,
            session.req_header().uri,
            ctx.gateway.tenant.as_deref().unwrap_or("-"),
            ctx.gateway.shard_id().map_or("-", |s| s.as_str()),
            ctx.gateway.request_id,
        );
        self.gateway.logging(session, e, &mut ctx.gateway).await
    }
}

type Ctx = WrapperCtx<()>;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    run_cli(|builder| {
        builder
            .hooks(Arc::new(PlatformHooks))
            .build_wrapped(|gateway| EmbeddingProxy { gateway })
    })
}
