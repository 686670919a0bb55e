//! Embedding shardgate with phases of your own, at the binary's speed: the
//! hooks below run on every request on every transport (HTTP/1.1 on
//! shardgate's fast transport or Pingora's proxy, HTTP/2, TLS, WebSocket
//! handshakes), and everything the `shardgate` binary has runs around
//! them (head limits, health checks, admin API, Prometheus, state file,
//! TLS listeners, graceful restarts), with the same flags:
//!
//! ```sh
//! cargo run --example embed -- -c conf/quickstart.yaml   # -t checks, -d daemonizes, -u upgrades
//! curl -i http://acme.localhost:8080/                    # x-embedded: 1
//! curl -i -H 'x-embed-teapot: 1' http://acme.localhost:8080/   # 418
//! ```
//!
//! A teapot is answered before routing (it spends no token), every
//! proxied response says `x-embedded: 1`, each request is logged (refusals
//! too), tenants whose trial ran out are refused, and trial tenants'
//! requests carry their plan upstream. `examples/embed_wrapper.rs` does
//! the same with a `ProxyHttp` of its own, for those who need Pingora's
//! `Session`.

use http::{HeaderName, HeaderValue};
use shardgate::proxy::hooks::{
    GatewayHooks, RequestCheck, RequestSummary, RequestView, ResponseEdit,
};
use shardgate::routing::ShardId;
use shardgate::server::run_cli;
use std::process::ExitCode;
use std::sync::Arc;

pub struct Platform;

impl GatewayHooks for Platform {
    fn allow(&self, tenant: &str) -> bool {
        !tenant.starts_with("expired-")
    }

    fn check_request(&self, tenant: &str, request: &RequestView<'_>) -> RequestCheck {
        if request.header("x-embed-teapot").is_some() {
            let body = r#"{"error":"teapot"}"#.to_string();
            return RequestCheck::Refuse { status: 418, body };
        }
        if !tenant.starts_with("trial-") {
            return RequestCheck::Proceed;
        }
        let plan = HeaderName::from_static("x-platform-plan");
        RequestCheck::AddFields(vec![(plan, HeaderValue::from_static("trial"))])
    }

    fn edit_response(&self, _tenant: &str, _shard: &ShardId, response: &mut ResponseEdit) {
        response.insert(
            HeaderName::from_static("x-embedded"),
            HeaderValue::from_static("1"),
        );
    }

    fn logging(&self, r: &RequestSummary<'_>) {
        let shard = r.shard.map_or("-", |s| s.as_str());
        let tenant = r.tenant.unwrap_or("-");
        log::info!(
            "embed: {} {} -> {} tenant={tenant} shard={shard} id={}",
            r.method,
            r.target,
            r.status,
            r.request_id
        );
    }
}

// The binary's allocator (Pingora allocates per request).
#[global_allocator]
static ALLOCATOR: shardgate::allocator::Mimalloc = shardgate::allocator::Mimalloc;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    run_cli(|builder| builder.hooks(Arc::new(Platform)).build())
}
