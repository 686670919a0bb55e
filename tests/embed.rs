//! The embedding example (`examples/embed.rs`) as a user runs it: its own
//! `ProxyHttp` wrapping shardgate's `Gateway`, built with shardgate's
//! builder and started with shardgate's flags, over real sockets, on the
//! default configuration (fast transport on in the file). Every phase of
//! the wrapper runs on every request, and the product around the proxy
//! (head limits, health checks, admin API) is all there.

mod common;

use common::*;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The example's binary: `cargo test` builds examples beside the tests
/// (`target/<profile>/examples/embed`).
fn embed_program() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let program = profile_dir.join("examples").join("embed");
    assert!(
        program.exists(),
        "{} missing: `cargo test` builds it (or `cargo build --example embed`)",
        program.display()
    );
    program
}

fn start(shards: &[(&str, String)], extra: &str) -> Gateway {
    let yaml = config_yaml(
        "listen: [{ addr: \"127.0.0.1:{port}\" }]\nadmin: { addr: \"127.0.0.1:{admin}\" }\nstate: false\n",
        shards,
        extra,
    );
    Gateway::start_program(&embed_program(), &yaml)
}

#[test]
fn every_proxied_response_passes_the_wrappers_response_filter() {
    let a = Backend::start("a");
    let gw = start(&[("a", a.url())], "");
    for method in ["GET", "HEAD", "OPTIONS", "DELETE"] {
        let raw =
            format!("{method} /x HTTP/1.1\r\nHost: acme.localhost\r\nConnection: close\r\n\r\n");
        // A HEAD answer has a length but no body: read until the close.
        let (statuses, text) = exchange(gw.port, raw.as_bytes(), Duration::from_secs(5));
        assert_eq!(statuses, [200], "{method}: {text}");
        assert!(
            text.to_ascii_lowercase().contains("\r\nx-embedded: 1\r\n"),
            "{method} took the wrapper: {text}"
        );
    }
    let r = gw.send(
        "POST /upload HTTP/1.1\r\nHost: acme.localhost\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-embedded"), Some("1"));
    assert_eq!(r.json()["tenant"], "acme", "shardgate's phases ran too");
    // Keep-alive: the second request on a connection runs the phases too.
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
    for _ in 0..2 {
        conn.write_all(b"GET / HTTP/1.1\r\nHost: acme.localhost\r\n\r\n")
            .unwrap();
        let r = read_response(&mut reader).unwrap();
        assert_eq!(r.header("x-embedded"), Some("1"));
    }
}

#[test]
fn the_wrappers_request_filter_answers_before_shardgate_routes() {
    let a = Backend::start("a");
    let gw = start(&[("a", a.url())], "");
    let r = gw.send(
        "GET / HTTP/1.1\r\nHost: acme.localhost\r\nx-embed-teapot: yes\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 418);
    assert_eq!(r.json()["error"], "teapot");
    assert_eq!(a.count(), 0, "nothing went upstream");
}

#[test]
fn the_embedders_hooks_run_refusing_and_adding_fields() {
    let a = Backend::start("a");
    let gw = start(&[("a", a.url())], "");
    let r = gw.get("expired-corp.localhost", "/");
    assert_eq!(r.status, 403, "the allow hook refused");
    assert_eq!(r.json()["decision"], "denied");
    let r = gw.get("trial-co.localhost", "/");
    assert_eq!(r.status, 200);
    let seen = a.requests();
    let last = seen.last().expect("the request reached the shard");
    assert_eq!(last.header("x-platform-plan"), Some("trial"));
    assert_eq!(last.header("x-tenant-id"), Some("trial-co"));
}

#[test]
fn a_head_that_never_ends_gets_408_from_the_head_limits() {
    let a = Backend::start("a");
    let gw = start(&[("a", a.url())], "limits: { header_timeout_ms: 500 }\n");
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nHost: acme.localhost\r\nX-Slow: ")
        .unwrap();
    let started = Instant::now();
    let mut text = String::new();
    let _ = conn.read_to_string(&mut text);
    assert!(text.starts_with("HTTP/1.1 408"), "{text:?}");
    assert!(text.contains("\r\ndate: "), "dated: {text:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(a.count(), 0);
}

#[test]
fn the_admin_api_answers_and_health_probes_bring_a_shard_back() {
    let a = Backend::start("a");
    let gw = start(
        &[("a", a.url())],
        "health: { interval_ms: 100, timeout_ms: 500, fall: 2, rise: 2 }\n",
    );
    let r = gw.admin("GET", "/v1/shards", None, None);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()[0]["id"], "a");
    assert_eq!(
        gw.admin("POST", "/v1/shards/a/unhealthy", None, None)
            .status,
        200
    );
    // Marked down (as the failure hook does): the probes bring it back.
    assert!(
        eventually(Duration::from_secs(5), || {
            gw.admin("GET", "/v1/shards", None, None).json()[0]["healthy"] == true
        }),
        "health probes brought the shard back"
    );
    assert_eq!(gw.get("acme.localhost", "/").status, 200);
    let metrics = send_raw(
        gw.admin_port,
        b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n",
    );
    assert!(metrics.text().contains("shardgate_routes_total"));
}

#[test]
fn a_websocket_handshake_goes_through_the_wrapper() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;
    let ws = WsBackend::start("ws");
    let gw = start(&[("ws", ws.url())], "");
    runtime().block_on(async {
        let mut req = format!("ws://127.0.0.1:{}/socket", gw.port)
            .into_client_request()
            .unwrap();
        req.headers_mut()
            .insert("host", "acme.localhost".parse().unwrap());
        let (mut client, resp) = tokio_tungstenite::connect_async(req)
            .await
            .expect("websocket handshake");
        assert_eq!(resp.status(), 101);
        assert_eq!(
            resp.headers().get("x-embedded").map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
        client.send(Message::Text("hi".into())).await.unwrap();
        assert_eq!(
            client.next().await.unwrap().unwrap(),
            Message::Text("ws:hi".into())
        );
    });
}

#[test]
fn the_embedder_takes_shardgates_flags() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "shards: []\nlisten: [{ addr: nowhere }]\n").unwrap();
    let out = std::process::Command::new(embed_program())
        .args(["-t", "-c"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("listen[0].addr"), "{err}");
}
