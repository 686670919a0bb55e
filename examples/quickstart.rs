//! A ready-made local setup: three demo shards and shardgate in front of
//! them, with `conf/quickstart.yaml`. Run it, then:
//!
//! ```sh
//! curl http://acme.localhost:8080/          # which shard and tenant answered
//! curl http://beta.localhost:8080/hello
//! curl -i http://suspended.localhost:8080/  # 403 denied
//! curl -i http://nope.example:8080/ --resolve nope.example:8080:127.0.0.1  # 404
//! ```

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use shardgate::config::Config;
use shardgate::proxy::hooks::DefaultHooks;
use shardgate::server::Shardgate;
use std::convert::Infallible;
use std::sync::Arc;

/// A demo shard: answers every request with who it is and what it saw.
async fn demo_shard(name: &'static str, port: u16) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<hyper::body::Incoming>| async move {
                let header = |n: &str| {
                    req.headers()
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string()
                };
                let body = serde_json::json!({
                    "shard": name,
                    "tenant": header("x-tenant-id"),
                    "host": header("host"),
                    "path": req.uri().to_string(),
                    "forwarded_for": header("x-forwarded-for"),
                    "forwarded_proto": header("x-forwarded-proto"),
                });
                let mut text = body.to_string();
                text.push('\n');
                Ok::<_, Infallible>(
                    Response::builder()
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(text)))
                        .expect("response"),
                )
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/quickstart.yaml");
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    // The demo shards run on their own runtime beside the gateway's.
    std::thread::spawn(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("demo runtime");
        rt.block_on(async {
            let shards = [("shard-1", 3001), ("shard-2", 3002), ("shard-3", 3003)];
            let tasks: Vec<_> = shards
                .into_iter()
                .map(|(name, port)| tokio::spawn(demo_shard(name, port)))
                .collect();
            for t in tasks {
                if let Ok(Err(e)) = t.await {
                    eprintln!("demo shard failed: {e} (is the port in use?)");
                    std::process::exit(1);
                }
            }
        });
    });
    println!("shardgate quickstart: demo shards on 127.0.0.1:3001-3003, gateway on http://127.0.0.1:8080");
    println!("try:  curl http://acme.localhost:8080/   (Ctrl-C to stop)");
    match Shardgate::build(config, None, Arc::new(DefaultHooks)) {
        Ok(gateway) => gateway.run(),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
