//! A native gRPC unary backend for the gRPC load comparison
//! (`benches/load/grpc.sh`): HTTP/2 with prior knowledge, every call
//! answered with its own message back (headers, one DATA frame, trailers
//! `grpc-status: 0`), whatever its method. Built on the h2 crate alone,
//! so that the backend costs little and the same for every proxy in front
//! of it (a Python server would be the bottleneck).
//!
//! ```sh
//! cargo run --release --example grpc_echo -- 127.0.0.1:18201 1
//! ```
//! (listen address, threads)

#[path = "common/grpc_echo_shard.rs"]
mod grpc_echo_shard;

fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:18201".into());
    let threads = args.next().and_then(|t| t.parse().ok()).unwrap_or(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        grpc_echo_shard::serve(listener).await;
    });
}
