//! Embedding shardgate in your own Pingora server: a proxy that wraps
//! [`Gateway`], delegates every phase shardgate uses, and adds its own —
//! here, stamping a header on every response and refusing one tenant
//! through the hooks trait.
//!
//! ```sh
//! cargo run --example embed -- conf/quickstart.yaml   # then curl http://acme.localhost:8080/
//! ```
//!
//! Phases shardgate implements (delegate all of them): `new_ctx`,
//! `request_filter`, `upstream_peer`, `connected_to_upstream`,
//! `request_body_filter`, `upstream_request_filter`,
//! `upstream_response_filter`, `fail_to_connect`, `error_while_proxy`,
//! `fail_to_proxy`, `logging`.

use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::protocols::Digest;
use pingora::server::Server;
use pingora::upstreams::peer::HttpPeer;
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use shardgate::config::Config;
use shardgate::control::Control;
use shardgate::proxy::ctx::RequestCtx;
use shardgate::proxy::hooks::{GatewayHooks, UpstreamFailure};
use shardgate::proxy::Gateway;
use shardgate::routing::{Router, ShardId};
use std::sync::Arc;

/// Platform rules: tenants on a trial that ran out are refused, and every
/// shard failure is logged before the default handling.
pub struct PlatformHooks;

impl GatewayHooks for PlatformHooks {
    fn allow(&self, tenant: &str) -> bool {
        !tenant.starts_with("expired-")
    }

    fn on_upstream_failure(&self, router: &Router, shard: &ShardId, failure: UpstreamFailure) {
        log::warn!("platform: shard {shard} failed ({failure})");
        if failure.is_unreachable() {
            router.mark_unhealthy(shard.as_str());
        }
    }
}

/// Our proxy: shardgate plus one phase of our own.
pub struct StampingProxy {
    inner: Gateway,
}

pub struct StampCtx {
    inner: RequestCtx,
}

#[async_trait]
impl ProxyHttp for StampingProxy {
    type CTX = StampCtx;

    fn new_ctx(&self) -> StampCtx {
        StampCtx {
            inner: self.inner.new_ctx(),
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut StampCtx) -> Result<bool> {
        self.inner.request_filter(session, &mut ctx.inner).await
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut StampCtx,
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
        ctx: &mut StampCtx,
    ) -> Result<()> {
        self.inner
            .connected_to_upstream(session, reused, peer, fd, digest, &mut ctx.inner)
            .await
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut StampCtx,
    ) -> Result<()> {
        self.inner
            .request_body_filter(session, body, end_of_stream, &mut ctx.inner)
            .await
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut StampCtx,
    ) -> Result<()> {
        self.inner
            .upstream_request_filter(session, upstream_request, &mut ctx.inner)
            .await
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut StampCtx,
    ) -> Result<()> {
        self.inner
            .upstream_response_filter(session, upstream_response, &mut ctx.inner)
            .await
    }

    /// Our own phase: every proxied response says who served it.
    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut StampCtx,
    ) -> Result<()> {
        upstream_response.insert_header("x-served-by", "my-platform")?;
        if let Some(shard) = ctx.inner.shard_id() {
            upstream_response.insert_header("x-shard", shard.as_str())?;
        }
        Ok(())
    }

    fn fail_to_connect(
        &self,
        session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut StampCtx,
        e: Box<Error>,
    ) -> Box<Error> {
        self.inner.fail_to_connect(session, peer, &mut ctx.inner, e)
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut StampCtx,
        client_reused: bool,
    ) -> Box<Error> {
        self.inner
            .error_while_proxy(peer, session, e, &mut ctx.inner, client_reused)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut StampCtx,
    ) -> FailToProxy {
        self.inner.fail_to_proxy(session, e, &mut ctx.inner).await
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut StampCtx) {
        self.inner.logging(session, e, &mut ctx.inner).await
    }
}

/// Our server: Pingora settings from shardgate's config, our proxy on its
/// listeners.
pub fn build_server(config: Config) -> std::result::Result<Server, String> {
    let conf = shardgate::server::server_conf(&config.server, config.retry.attempts);
    let control = Arc::new(Control::new(config, Arc::new(PlatformHooks))?);
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let proxy = StampingProxy {
        inner: Gateway::new(Arc::clone(&control)),
    };
    let mut service = pingora_proxy::http_proxy_service(&server.configuration, proxy);
    for l in &control.config.listen {
        service.add_tcp(&l.addr.to_string());
    }
    server.add_service(service);
    Ok(server)
}

#[allow(dead_code)]
fn main() {
    env_logger::init();
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/conf/quickstart.yaml").to_string()
    });
    let config = Config::load(&path).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    match build_server(config) {
        Ok(server) => server.run_forever(),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1)
        }
    }
}
