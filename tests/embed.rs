//! The embedding examples as a user runs them, over real sockets, on the
//! default configuration (fast transport on in the file):
//! `examples/embed.rs` (hooks: the binary's own proxy and transports) and
//! `examples/embed_wrapper.rs` (its own `ProxyHttp` wrapping shardgate's
//! `Gateway`, every request through Pingora's proxy). Both are built with
//! shardgate's builder and take shardgate's flags; every phase runs on
//! every request, and the product around the proxy (head limits, health
//! checks, admin API) is all there.

mod common;

use common::*;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The examples: hooks alone, and a `ProxyHttp` wrapper.
const EXAMPLES: [&str; 2] = ["embed", "embed_wrapper"];

/// An example's binary: `cargo test` builds examples beside the tests
/// (`target/<profile>/examples/<name>`).
fn program(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let program = profile_dir.join("examples").join(name);
    assert!(
        program.exists(),
        "{} missing: `cargo test` builds it (or `cargo build --example {name}`)",
        program.display()
    );
    program
}

/// The examples' own log lines (at info) in the gateway's log.
fn log_examples() {
    std::env::set_var("SHARDGATE_TEST_LOG", "warn,embed=info,embed_wrapper=info");
}

fn start(example: &str, shards: &[(&str, String)], extra: &str) -> Gateway {
    let yaml = config_yaml(
        "listen: [{ addr: \"127.0.0.1:{port}\" }]\nadmin: { addr: \"127.0.0.1:{admin}\" }\nstate: false\n",
        shards,
        extra,
    );
    Gateway::start_program(&program(example), &yaml)
}

#[test]
fn every_proxied_response_passes_the_embedders_response_phase() {
    for example in EXAMPLES {
        let a = Backend::start("a");
        let gw = start(example, &[("a", a.url())], "");
        for method in ["GET", "HEAD", "OPTIONS", "DELETE"] {
            let raw = format!(
                "{method} /x HTTP/1.1\r\nHost: acme.localhost\r\nConnection: close\r\n\r\n"
            );
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
}

#[test]
fn the_embedders_request_phase_answers_before_shardgate_routes() {
    for example in EXAMPLES {
        let a = Backend::start("a");
        let gw = start(example, &[("a", a.url())], "");
        let r = gw.send(
            "GET / HTTP/1.1\r\nHost: acme.localhost\r\nx-embed-teapot: yes\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(r.status, 418);
        assert_eq!(r.json()["error"], "teapot");
        assert_eq!(a.count(), 0, "nothing went upstream");
    }
}

#[test]
fn the_embedders_hooks_run_refusing_and_adding_fields() {
    for example in EXAMPLES {
        let a = Backend::start("a");
        let gw = start(example, &[("a", a.url())], "");
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
}

#[test]
fn a_head_that_never_ends_gets_408_from_the_head_limits() {
    for example in EXAMPLES {
        let a = Backend::start("a");
        let gw = start(
            example,
            &[("a", a.url())],
            "limits: { header_timeout_ms: 500 }\n",
        );
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
}

#[test]
fn the_admin_api_answers_and_health_probes_bring_a_shard_back() {
    for example in EXAMPLES {
        let a = Backend::start("a");
        let gw = start(
            example,
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
            b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        );
        assert!(metrics.text().contains("shardgate_routes_total"));
    }
}

/// A WebSocket handshake passes every phase: the request check (a trial
/// tenant's field upstream), the response stamp, and the logging phase
/// once its tunnel closes.
#[test]
fn a_websocket_handshake_goes_through_the_embedders_phases() {
    log_examples();
    for example in EXAMPLES {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::Message;
        let ws = WsBackend::start("ws");
        let gw = start(example, &[("ws", ws.url())], "");
        runtime().block_on(async {
            let mut req = format!("ws://127.0.0.1:{}/socket", gw.port)
                .into_client_request()
                .unwrap();
            req.headers_mut()
                .insert("host", "trial-co.localhost".parse().unwrap());
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
            client.close(None).await.unwrap();
        });
        let handshakes = ws.handshakes.lock().unwrap().clone();
        assert_eq!(
            handshakes.last().and_then(|h| h.get("x-platform-plan")),
            Some(&"trial".to_string()),
            "{example}: {handshakes:?}"
        );
        let line = "embed: GET /socket -> 101 tenant=trial-co shard=ws";
        assert!(
            eventually(Duration::from_secs(5), || gw.log().contains(line)),
            "{example}: `{line}` logged:\n{}",
            gw.log()
        );
    }
}

#[test]
fn the_embedder_takes_shardgates_flags() {
    for example in EXAMPLES {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "shards: []\nlisten: [{ addr: nowhere }]\n").unwrap();
        let out = std::process::Command::new(program(example))
            .args(["-t", "-c"])
            .arg(&bad)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("listen[0].addr"), "{err}");
    }
}

/// The logging phase sees every request once it is over, refusals too,
/// with its tenant, shard and status (the example logs a line each).
#[test]
fn the_logging_phase_sees_proxied_requests_and_refusals() {
    log_examples();
    for example in EXAMPLES {
        let a = Backend::start("a");
        let gw = start(example, &[("a", a.url())], "");
        assert_eq!(gw.get("acme.localhost", "/logged").status, 200);
        assert_eq!(gw.get("expired-corp.localhost", "/refused").status, 403);
        let teapot = gw.send(
            "GET /teapot HTTP/1.1\r\nHost: acme.localhost\r\nx-embed-teapot: 1\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(teapot.status, 418);
        for line in [
            "embed: GET /logged -> 200 tenant=acme shard=a",
            "embed: GET /refused -> 403 tenant=expired-corp shard=-",
            // (The wrapper answers before shardgate resolves the tenant.)
            "embed: GET /teapot -> 418 tenant=",
        ] {
            assert!(
                eventually(Duration::from_secs(3), || gw.log().contains(line)),
                "{example}: `{line}` logged:\n{}",
                gw.log()
            );
        }
    }
}

/// Over TLS with HTTP/2 (curl), each example's phases run as on HTTP/1.1:
/// the teapot answered before routing, the response stamped, the request
/// logged.
#[test]
fn the_embedders_phases_run_on_http2_over_tls() {
    log_examples();
    let certs = tempfile::tempdir().expect("dir");
    let key = rcgen::generate_simple_self_signed(vec!["*.localhost".to_string()]).expect("cert");
    std::fs::write(certs.path().join("edge.crt"), key.cert.pem()).expect("crt");
    std::fs::write(certs.path().join("edge.key"), key.key_pair.serialize_pem()).expect("key");
    for example in EXAMPLES {
        let a = Backend::start("a");
        let yaml = config_yaml(
            &format!(
                "listen: [{{ addr: \"127.0.0.1:{{port}}\", tls: true }}]\n\
                 admin: {{ addr: \"127.0.0.1:{{admin}}\" }}\nstate: false\n\
                 tls: {{ certs: \"{}\", default_cert: edge }}\n",
                certs.path().display()
            ),
            &[("a", a.url())],
            "",
        );
        let gw = Gateway::start_program(&program(example), &yaml);
        let curl = |path: &str, extra: &[&str]| {
            let out = std::process::Command::new("curl")
                .args(["-s", "-k", "-i", "--http2", "--max-time", "10"])
                .args(extra)
                .args([
                    "--resolve",
                    &format!("acme.localhost:{}:127.0.0.1", gw.port),
                ])
                .arg(format!("https://acme.localhost:{}{path}", gw.port))
                .output()
                .expect("curl (installed by scripts/prereqs.sh)");
            String::from_utf8_lossy(&out.stdout).to_ascii_lowercase()
        };
        let proxied = curl("/h2", &[]);
        assert!(proxied.starts_with("http/2 200"), "{example}: {proxied}");
        assert!(
            proxied.contains("\r\nx-embedded: 1\r\n"),
            "{example}: {proxied}"
        );
        let teapot = curl("/h2-teapot", &["-H", "x-embed-teapot: 1"]);
        assert!(teapot.starts_with("http/2 418"), "{example}: {teapot}");
        assert_eq!(a.count(), 1, "{example}: the teapot did not go upstream");
        // (The target as HTTP/2 carries it: the URI, scheme and authority
        // included.)
        let line = "/h2 -> 200 tenant=acme shard=a";
        assert!(
            eventually(Duration::from_secs(3), || gw.log().contains(line)),
            "{example}: `{line}` logged:\n{}",
            gw.log()
        );
    }
}
