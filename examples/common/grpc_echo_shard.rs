//! A gRPC echo shard over HTTP/2 with prior knowledge: every call
//! answered with its own message back (headers, one DATA frame, trailers
//! `grpc-status: 0`), whatever its method. Built on the h2 crate alone.
//! Used by `grpc_echo.rs` (the load comparison's backend) and by the
//! quickstart (its `grpc-1` shard).

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Response};

/// Serves every connection `listener` accepts.
pub async fn serve(listener: tokio::net::TcpListener) {
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
