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

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Response};

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
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let _ = socket.set_nodelay(true);
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(socket).await else {
                    return;
                };
                while let Some(Ok((request, respond))) = conn.accept().await {
                    tokio::spawn(echo(request.into_body(), respond));
                }
            });
        }
    });
}

/// Reads the call's message(s) and sends them back, then `grpc-status: 0`.
async fn echo(mut body: h2::RecvStream, mut respond: h2::server::SendResponse<Bytes>) {
    let mut message = BytesMut::new();
    while let Some(Ok(data)) = body.data().await {
        let _ = body.flow_control().release_capacity(data.len());
        message.extend_from_slice(&data);
    }
    let head = Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .expect("head");
    let Ok(mut stream) = respond.send_response(head, false) else {
        return;
    };
    let _ = stream.send_data(message.freeze(), false);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let _ = stream.send_trailers(trailers);
}
