//! A bare Pingora 0.9 reverse proxy with no logic — the floor shardgate is
//! measured against (`benches/load/compare.sh` runs it as `pingora`):
//! every request goes to one of the given backends, picked by a hash of the
//! Host header, over pooled keep-alive connections.
//!
//! ```sh
//! cargo run --release --example bare_pingora -- 127.0.0.1:18083 1 127.0.0.1:18101 127.0.0.1:18102
//! ```
//! (listen address, threads, backends)

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::upstreams::peer::HttpPeer;
use pingora_proxy::{ProxyHttp, Session};
use std::hash::{Hash, Hasher};

// The same allocator as the shardgate binary, for a like-for-like floor.
#[global_allocator]
static ALLOCATOR: shardgate::allocator::Mimalloc = shardgate::allocator::Mimalloc;

struct Bare {
    backends: Vec<std::net::SocketAddr>,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(&self, session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        session
            .req_header()
            .headers
            .get("host")
            .map(|v| v.as_bytes())
            .hash(&mut h);
        let addr = self.backends[h.finish() as usize % self.backends.len()];
        Ok(Box::new(HttpPeer::new(addr, false, String::new())))
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:18083".into());
    let threads: usize = args.next().and_then(|t| t.parse().ok()).unwrap_or(1);
    let backends: Vec<std::net::SocketAddr> = args.filter_map(|a| a.parse().ok()).collect();
    if backends.is_empty() {
        eprintln!("usage: bare_pingora LISTEN THREADS BACKEND...");
        std::process::exit(2);
    }
    let conf = ServerConf {
        threads,
        pid_file: format!("/tmp/bare-pingora-{}.pid", std::process::id()),
        upgrade_sock: format!("/tmp/bare-pingora-{}.sock", std::process::id()),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = pingora_proxy::http_proxy_service(&server.configuration, Bare { backends });
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run_forever();
}
