//! Demo shards: small HTTP servers that answer every request with who they
//! are and what they saw. Used by the quickstart, and on their own (as the
//! backend of the load scripts in `benches/`):
//!
//! ```sh
//! cargo run --release --example demo_shards -- 3001 3002 3003
//! ```

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;

/// A demo shard: answers every request with who it is and what it saw.
pub async fn demo_shard(name: &'static str, port: u16) -> std::io::Result<()> {
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

/// Runs the shards until one of them fails (then exits the process).
pub async fn serve(shards: &[(&'static str, u16)]) {
    let tasks: Vec<_> = shards
        .iter()
        .map(|&(name, port)| tokio::spawn(demo_shard(name, port)))
        .collect();
    for t in tasks {
        if let Ok(Err(e)) = t.await {
            eprintln!("demo shard failed: {e} (is the port in use?)");
            std::process::exit(1);
        }
    }
}

#[allow(dead_code)]
fn main() {
    let ports: Vec<u16> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ports = if ports.is_empty() {
        vec![3001, 3002, 3003]
    } else {
        ports
    };
    let shards: Vec<(&'static str, u16)> = ports
        .iter()
        .enumerate()
        .map(|(i, &p)| (&*Box::leak(format!("shard-{}", i + 1).into_boxed_str()), p))
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    println!("demo shards on {ports:?}");
    rt.block_on(serve(&shards));
}
