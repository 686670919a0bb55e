//! WebSockets over HTTP/2 (RFC 8441, DESIGN §8) with a real HTTP/2 client
//! library (the h2 crate): the listener announces
//! `SETTINGS_ENABLE_CONNECT_PROTOCOL`, an extended CONNECT reaches an
//! HTTP/1.1 WebSocket shard as an Upgrade, is answered 200, and frames go
//! both ways as the stream's DATA; refusals are answered as any request's.

mod common;

use bytes::{Buf, Bytes, BytesMut};
use common::gateway_with_protocols as gateway;
use common::*;
use std::time::Duration;

/// An extended CONNECT for a WebSocket as `host`: the answer's status,
/// and the stream's two halves.
async fn connect(port: u16, host: &str) -> (u16, h2::SendStream<Bytes>, h2::RecvStream, bool) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (send, conn) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut send = send.ready().await.expect("ready");
    // The server's SETTINGS come with its preface: wait until they did.
    for _ in 0..100 {
        if send.is_extended_connect_protocol_enabled() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let announced = send.is_extended_connect_protocol_enabled();
    let mut request = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(format!("http://{host}/chat?room=1"))
        .header("sec-websocket-version", "13")
        .body(())
        .expect("request");
    request
        .extensions_mut()
        .insert(h2::ext::Protocol::from_static("websocket"));
    let (response, stream) = send.send_request(request, false).expect("send");
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("answered in time")
        .expect("response");
    let status = response.status().as_u16();
    (status, stream, response.into_body(), announced)
}

/// A client's masked text frame (RFC 6455 §5.2), short payloads only.
fn text_frame(text: &str) -> Bytes {
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut frame = vec![0x81, 0x80 | text.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    Bytes::from(frame)
}

/// Reads a server's unmasked text frame from the stream's DATA.
async fn read_text(body: &mut h2::RecvStream) -> String {
    let mut buf = BytesMut::new();
    loop {
        if buf.len() >= 2 && buf.len() >= 2 + (buf[1] & 0x7f) as usize {
            let len = (buf[1] & 0x7f) as usize;
            assert_eq!(buf[0], 0x81, "a text frame");
            buf.advance(2);
            return String::from_utf8_lossy(&buf[..len]).into_owned();
        }
        let data = tokio::time::timeout(Duration::from_secs(10), body.data())
            .await
            .expect("a frame in time")
            .expect("data")
            .expect("no error");
        let _ = body.flow_control().release_capacity(data.len());
        buf.extend_from_slice(&data);
    }
}

/// The handshake reaches the shard as an HTTP/1.1 Upgrade with a key of
/// the gateway's own and the forwarding fields; the client gets 200; a
/// frame goes up and its echo comes back; the access log says CONNECT
/// over HTTP/2, 200, and counts the tunnel's bytes each way (the two
/// 11-byte frames sent, the two echoes of 11 bytes received).
#[test]
fn a_websocket_over_http2_reaches_an_http1_shard() {
    let ws = WsBackend::start("ws1");
    let gw = gateway(
        &[("w1", ws.url(), "http1")],
        "log: { access: info, access_format: json, access_path: \"{dir}/access.log\" }\n",
    );
    runtime().block_on(async {
        let (status, mut up, mut down, announced) = connect(gw.port, "t.localhost").await;
        assert!(announced, "SETTINGS_ENABLE_CONNECT_PROTOCOL");
        assert_eq!(status, 200);
        up.send_data(text_frame("hello"), false).expect("send");
        assert_eq!(read_text(&mut down).await, "ws1:hello");
        up.send_data(text_frame("again"), false).expect("send");
        assert_eq!(read_text(&mut down).await, "ws1:again");
        up.send_data(Bytes::new(), true).expect("end");
    });
    let seen = ws.handshakes.lock().unwrap().clone();
    let first = seen.first().expect("a handshake at the shard");
    assert_eq!(first.get("upgrade").map(String::as_str), Some("websocket"));
    assert_eq!(first.get("sec-websocket-key").map(String::len), Some(24));
    assert_eq!(
        first.get("x-forwarded-for").map(String::as_str),
        Some("127.0.0.1")
    );
    let log = gw.dir.path().join("access.log");
    let tunnel = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let line = text.lines().find(|l| {
            l.contains("\"method\":\"CONNECT\"")
                && l.contains("\"protocol\":\"HTTP/2\"")
                && l.contains("\"status\":200")
        });
        line.and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    };
    assert!(
        eventually(Duration::from_secs(10), || tunnel().is_some()),
        "{:?}",
        std::fs::read_to_string(&log)
    );
    let line = tunnel().expect("the tunnel's line");
    assert_eq!(line["bytes_in"], 22, "{line}");
    // The shard may close with a frame of its own once the client ends.
    assert!(
        line["bytes_out"].as_u64().is_some_and(|n| n >= 22),
        "{line}"
    );
}

/// A refused handshake is answered as any request is (403 for a denied
/// tenant), and reaches no shard.
#[test]
fn a_refused_websocket_over_http2_is_answered() {
    let ws = WsBackend::start("ws1");
    let gw = gateway(&[("w1", ws.url(), "http1")], "limits: { deny: [banned] }\n");
    runtime().block_on(async {
        let (status, ..) = connect(gw.port, "banned.localhost").await;
        assert_eq!(status, 403);
    });
    assert!(ws.handshakes.lock().unwrap().is_empty());
}

/// An HTTP/2 WebSocket shard (RFC 8441 on its side, `enable_connect_protocol`
/// as its SETTINGS say) that answers each text frame with `h2ws:` and its
/// text, unmasked; `:protocol` and the method of each handshake recorded.
fn h2_websocket_shard(seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    listener.set_nonblocking(true).expect("nonblocking");
    runtime().spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        while let Ok((socket, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut builder = h2::server::Builder::new();
                builder.enable_connect_protocol();
                let Ok(mut conn) = builder.handshake::<_, Bytes>(socket).await else {
                    return;
                };
                while let Some(Ok((request, respond))) = conn.accept().await {
                    let protocol = request.extensions().get::<h2::ext::Protocol>();
                    let protocol = protocol.map(|p| p.as_str().to_string()).unwrap_or_default();
                    seen.lock()
                        .unwrap()
                        .push(format!("{} {protocol}", request.method()));
                    tokio::spawn(echo_frames(request.into_body(), respond));
                }
            });
        }
    });
    format!("http://{addr}")
}

/// Answers 200, then each client text frame with a server one.
async fn echo_frames(mut body: h2::RecvStream, mut respond: h2::server::SendResponse<Bytes>) {
    let answer = http::Response::builder()
        .status(200)
        .body(())
        .expect("answer");
    let Ok(mut send) = respond.send_response(answer, false) else {
        return;
    };
    let mut buf = BytesMut::new();
    while let Some(Ok(data)) = body.data().await {
        let _ = body.flow_control().release_capacity(data.len());
        buf.extend_from_slice(&data);
        // Whole masked frames with short payloads (as the tests send).
        while buf.len() >= 6 && buf.len() >= 6 + (buf[1] & 0x7f) as usize {
            let len = (buf[1] & 0x7f) as usize;
            let mask = [buf[2], buf[3], buf[4], buf[5]];
            let text: Vec<u8> = (0..len).map(|i| buf[6 + i] ^ mask[i % 4]).collect();
            buf.advance(6 + len);
            let reply = format!("h2ws:{}", String::from_utf8_lossy(&text));
            let mut frame = vec![0x81, reply.len() as u8];
            frame.extend_from_slice(reply.as_bytes());
            let _ = send.send_data(Bytes::from(frame), false);
        }
    }
    let _ = send.send_data(Bytes::new(), true);
}

/// To an `h2` shard a handshake goes as an extended CONNECT, from an
/// HTTP/2 client (RFC 8441 on both sides) and from an HTTP/1.1 one (a real
/// WebSocket client, which checks the 101's `Sec-WebSocket-Accept` the
/// gateway computes); frames go both ways.
#[test]
fn a_websocket_reaches_an_h2_shard_as_an_extended_connect() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let shard = h2_websocket_shard(seen.clone());
    let gw = gateway(&[("w2", shard, "h2")], "");
    runtime().block_on(async {
        let (status, mut up, mut down, _) = connect(gw.port, "t.localhost").await;
        assert_eq!(status, 200);
        up.send_data(text_frame("over h2"), false).expect("send");
        assert_eq!(read_text(&mut down).await, "h2ws:over h2");
        let mut req = format!("ws://127.0.0.1:{}/chat", gw.port)
            .into_client_request()
            .expect("request");
        req.headers_mut()
            .insert("host", "t.localhost".parse().expect("host"));
        let connected = tokio::time::timeout(
            Duration::from_secs(10),
            tokio_tungstenite::connect_async(req),
        );
        let (mut ws, response) = connected.await.expect("in time").expect("handshake");
        assert_eq!(response.status(), 101);
        ws.send(Message::Text("over h1".into()))
            .await
            .expect("send");
        let echoed = tokio::time::timeout(Duration::from_secs(10), ws.next()).await;
        let echoed = echoed.expect("in time").expect("a message").expect("ok");
        assert_eq!(echoed.into_text().expect("text").as_str(), "h2ws:over h1");
    });
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, ["CONNECT websocket", "CONNECT websocket"]);
}
