//! The request-routing path: arbitrary request lines and headers go
//! through `Gateway::plan` (host → domain map → route prefix → channel →
//! region → per-client bucket → admission) against a fixed configuration. It never panics, a
//! refusal is a 4xx/5xx with a JSON body, and an admission always names a
//! shard the tenant may use.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use pingora::http::RequestHeader;
use pingora::protocols::l4::socket::SocketAddr;
use shardgate::config::Config;
use shardgate::control::Control;
use shardgate::proxy::ctx::RequestCtx;
use shardgate::proxy::hooks::{DefaultHooks, RequestView};
use shardgate::proxy::Gateway;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

const CONFIG: &str = r#"
listen: [{ addr: "127.0.0.1:1" }]
state: false
shards:
  - { id: a, url: "http://127.0.0.1:1", region: us }
  - { id: b, url: "http://127.0.0.1:2", region: eu }
  - { id: vip, url: "http://127.0.0.1:3", tenants: [acme] }
routing: { channel_header: x-channel-id, balance: sticky }
limits:
  connection_cap: 3
  rate: { tokens: 5, refill_per_second: 1 }
  routes:
    /api/export: { tokens: 1, refill_per_second: 0.5 }
    /api/: { tokens: 3, refill_per_second: 1 }
  deny: [blocked]
  per_client: { rate: { tokens: 2, refill_per_second: 1 } }
  max_tracked_clients: 64
regions: [{ id: us }, { id: eu, weight: 2 }]
domains:
  map: { app.acme.com: acme, "*.beta.io": beta }
  fallback_suffix: .localhost
"#;

fn gateway() -> &'static Gateway {
    static GATEWAY: OnceLock<Gateway> = OnceLock::new();
    GATEWAY.get_or_init(|| {
        let config = Config::parse(CONFIG, None).expect("fuzz config");
        Gateway::new(Arc::new(Control::new(config, Arc::new(DefaultHooks)).expect("control")))
    })
}

#[derive(Arbitrary, Debug)]
struct Input {
    method: String,
    target: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
    /// The connection's peer: none, an IPv4 or an IPv6 address.
    client: Option<Result<[u8; 4], [u8; 16]>>,
}

fuzz_target!(|input: Input| {
    let Ok(mut req) = RequestHeader::build(input.method.as_str(), &input.target, None) else {
        return;
    };
    for (name, value) in &input.headers {
        let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) else {
            continue;
        };
        let _ = req.append_header(name, value);
    }
    let gw = gateway();
    let mut ctx = RequestCtx::default();
    let client = input.client.map(|ip| {
        let ip = match ip {
            Ok(v4) => IpAddr::from(v4),
            Err(v6) => IpAddr::from(v6),
        };
        SocketAddr::Inet(std::net::SocketAddr::new(ip, 40000))
    });
    match gw.plan(&RequestView::from_pingora(&req), client.as_ref(), &mut ctx) {
        Ok(_) => {
            let shard = ctx.shard.as_ref().expect("an admission names a shard");
            let tenant = ctx.tenant.as_deref().expect("and a tenant");
            assert!(shard.admits_tenant(tenant));
            assert!(ctx.is_admitted());
        }
        Err(refusal) => {
            assert!((400..600).contains(&refusal.status));
            assert!(serde_json_ok(&refusal.body), "{}", refusal.body);
        }
    }
    // Dropping the context releases the admission.
});

fn serde_json_ok(body: &str) -> bool {
    body.starts_with('{') && body.ends_with('}')
}
