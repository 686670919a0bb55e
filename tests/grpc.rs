//! gRPC through the gateway (DESIGN §8), with a real gRPC server and
//! client (grpcio, `tests/peers/grpc_peer.py`): every kind of call over
//! HTTP/2 with prior knowledge on a plain listener, status and metadata
//! both ways, deadlines, and shardgate's own refusals as a gRPC client
//! decodes them.

mod common;

use common::gateway_with_protocols as gateway;
use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

const PEER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/peers/grpc_peer.py");

/// A gRPC server (`test.Echo`), killed when dropped.
struct GrpcShard {
    child: Child,
    port: u16,
}

impl GrpcShard {
    fn start(name: &str) -> GrpcShard {
        GrpcShard::serve(name, &[])
    }

    /// A shard over TLS with `dir/NAME.crt` and `dir/NAME.key`.
    fn start_tls(name: &str, dir: &Path) -> GrpcShard {
        let pem = |ext: &str| dir.join(format!("{name}.{ext}")).display().to_string();
        GrpcShard::serve(name, &[pem("crt"), pem("key")])
    }

    fn serve(name: &str, tls: &[String]) -> GrpcShard {
        let port = free_port();
        let mut child = Command::new("python3")
            .args([PEER, "server", &port.to_string(), name])
            .args(tls)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 with grpcio (scripts/prereqs.sh installs it)");
        let mut ready = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout).read_line(&mut ready).expect("ready");
        assert_eq!(ready.trim(), "ready", "the gRPC server did not start");
        GrpcShard { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn tls_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }
}

impl Drop for GrpcShard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One call of `case` through the gateway, as `authority`.
fn call_as(gw: &Gateway, case: &str, authority: &str) -> Value {
    call_over(gw.port, case, authority, &[])
}

/// One call of `case` to `port`, as `authority`, over TLS trusting the
/// CA `tls` names if it names one.
fn call_over(port: u16, case: &str, authority: &str, tls: &[String]) -> Value {
    let target = format!("127.0.0.1:{port}");
    let out = Command::new("python3")
        .args([PEER, "client", &target, case, authority])
        .args(tls)
        .output()
        .expect("python3");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim())
        .unwrap_or_else(|_| panic!("{case}: {text}\n{}", String::from_utf8_lossy(&out.stderr)))
}

fn call(gw: &Gateway, case: &str) -> Value {
    call_as(gw, case, "t.localhost")
}

#[test]
fn every_kind_of_grpc_call_passes_through_over_h2c() {
    let shard = GrpcShard::start("g1");
    let gw = gateway(&[("g1", shard.url(), "h2")], "");
    every_kind_passes(|case| call(&gw, case));
}

/// The same calls over TLS end to end: the client to a TLS listener (ALPN
/// h2), the gateway to a shard that speaks gRPC over TLS only, trusting
/// the CA of `server.ca_file`.
#[test]
fn every_kind_of_grpc_call_passes_through_over_tls() {
    let dir = tempfile::tempdir().expect("dir");
    let ca = dir.path().join("ca.pem");
    let leaf = rcgen::generate_simple_self_signed(vec!["t.localhost".into(), "127.0.0.1".into()]);
    let leaf = leaf.expect("certificate");
    std::fs::write(&ca, leaf.cert.pem()).expect("ca");
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).expect("certs");
    for at in [&certs, dir.path()] {
        std::fs::write(at.join("g1.crt"), leaf.cert.pem()).expect("crt");
        std::fs::write(at.join("g1.key"), leaf.key_pair.serialize_pem()).expect("key");
    }
    let shard = GrpcShard::start_tls("g1", dir.path());
    // The shard refuses a client that does not speak TLS.
    let ca = ca.display().to_string();
    let direct = call_over(shard.port, "unary", "t.localhost", &[]);
    assert_eq!(direct["code"], "UNAVAILABLE", "{direct}");
    let gw = Gateway::start(&format!(
        "listen: [{{ addr: \"127.0.0.1:{{port}}\", tls: true }}]\n\
         admin: {{ addr: \"127.0.0.1:{{admin}}\" }}\nstate: false\n\
         tls: {{ certs: \"{}\" }}\nserver: {{ ca_file: \"{ca}\" }}\n\
         shards: [{{ id: g1, url: \"{}\", protocol: h2 }}]\n\
         domains: {{ fallback_suffix: .localhost }}\n",
        certs.display(),
        shard.tls_url(),
    ));
    let tls = [ca];
    every_kind_passes(|case| call_over(gw.port, case, "t.localhost", &tls));
}

/// Every kind of call, made by `call`, gets through whole.
fn every_kind_passes(call: impl Fn(&str) -> Value) {
    let unary = call("unary");
    assert_eq!(unary["code"], "OK", "{unary}");
    assert_eq!(unary["reply"], "hello");
    // The shard's metadata both ways: initial (headers) and trailing
    // (trailers), and the request's own metadata reached it.
    assert_eq!(unary["initial"]["shard"], "g1", "{unary}");
    assert_eq!(unary["trailing"]["echo-trailer"], "t1", "{unary}");
    // The shard's status and message, as it sent them.
    let failed = call("fail:5 not here");
    assert_eq!(
        (failed["code"].as_str(), failed["details"].as_str()),
        (Some("NOT_FOUND"), Some("not here"))
    );
    let streamed = call("server-stream");
    assert_eq!(
        streamed["replies"],
        serde_json::json!(["0", "1", "2", "3", "4"])
    );
    assert_eq!(call("client-stream")["reply"], "a,b,c");
    // Full duplex: each answer reached the client before its next request
    // went (the client sends it only then).
    let bidi = call("bidi");
    assert_eq!(
        bidi["replies"],
        serde_json::json!(["m0", "m1", "m2"]),
        "{bidi}"
    );
    // Many calls in flight on one client connection.
    let many = call("many:64");
    assert_eq!(many["ok"], 64, "{many}");
}

#[test]
fn shardgates_own_refusals_reach_a_grpc_client_as_grpc_statuses() {
    let shard = GrpcShard::start("g1");
    let gw = gateway(
        &[("g1", shard.url(), "h2")],
        "limits:\n  deny: [suspended]\n  rate: { tokens: 1, refill_per_second: 0.01 }\n",
    );
    let denied = call_as(&gw, "unary", "suspended.localhost");
    assert_eq!(
        (denied["code"].as_str(), denied["details"].as_str()),
        (Some("PERMISSION_DENIED"), Some("denied")),
        "{denied}"
    );
    assert_eq!(call(&gw, "unary")["code"], "OK");
    let limited = call(&gw, "unary");
    assert_eq!(limited["code"], "RESOURCE_EXHAUSTED", "{limited}");
    assert_eq!(limited["details"], "rate-limited");
    let pushback: u64 = (limited["trailing"]["grpc-retry-pushback-ms"].as_str())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("a pushback: {limited}"));
    assert!(pushback >= 1000, "{pushback}");
    let r = call_as(&gw, "unary", "nobody.example");
    assert_eq!(
        (r["code"].as_str(), r["details"].as_str()),
        (Some("UNIMPLEMENTED"), Some("unknown-domain")),
        "{r}"
    );
}

#[test]
fn a_grpc_call_routed_to_an_http1_shard_is_unavailable_naming_why() {
    let http1 = Backend::start("a");
    let gw = gateway(&[("a", http1.url(), "http1")], "");
    let r = call(&gw, "unary");
    assert_eq!(
        (r["code"].as_str(), r["details"].as_str()),
        (Some("UNAVAILABLE"), Some("grpc-to-http1-shard")),
        "{r}"
    );
    assert_eq!(http1.count(), 0, "nothing reached the shard");
}

/// curl to the gateway over HTTP/2 with prior knowledge, as tenant `t`,
/// printing the response head.
fn h2c_curl(gw: &Gateway, path: &str, extra: &[String]) -> Command {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--http2-prior-knowledge", "--max-time", "10"])
        .args(["-D", "-", "-o", "/dev/null", "-H", "Host: t.localhost"])
        .args(extra)
        .arg(format!("http://127.0.0.1:{}{path}", gw.port));
    cmd
}

/// A gRPC call's fields for curl, with `deadline` as its `grpc-timeout`.
fn grpc_call(deadline: &str) -> Vec<String> {
    ["content-type: application/grpc", "te: trailers"]
        .iter()
        .map(|h| h.to_string())
        .chain([format!("grpc-timeout: {deadline}")])
        .flat_map(|h| ["-H".to_string(), h])
        .chain(["--data-binary".to_string(), "x".to_string()])
        .collect()
}

/// An HTTP/2 shard that answers every request after `delay` (or
/// `/fast…` at once), whatever its `grpc-timeout` says (a gRPC server
/// would enforce the deadline itself, and hide whether shardgate did):
/// 200, `grpc-status: 0`, no body.
fn deaf_h2_shard(delay: std::time::Duration) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    listener.set_nonblocking(true).expect("nonblocking");
    runtime().spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(socket).await else {
                    return;
                };
                while let Some(Ok((request, mut respond))) = conn.accept().await {
                    let fast = request.uri().path().starts_with("/fast");
                    tokio::spawn(async move {
                        if !fast {
                            tokio::time::sleep(delay).await;
                        }
                        let answer = http::Response::builder()
                            .header("content-type", "application/grpc")
                            .header("grpc-status", "0")
                            .body(())
                            .expect("answer");
                        let _ = respond.send_response(answer, true);
                    });
                }
            });
        }
    });
    format!("http://{addr}")
}

/// A call's own deadline (`grpc-timeout`) shortens its headers deadline:
/// a shard slower than the call's deadline is answered DEADLINE_EXCEEDED
/// by shardgate then, not after `upstream.headers_timeout_ms`. (curl
/// sends the call: it keeps waiting whatever `grpc-timeout` says.)
#[test]
fn a_calls_grpc_timeout_shortens_its_headers_deadline() {
    let deaf = deaf_h2_shard(std::time::Duration::from_secs(3));
    let gw = gateway(
        &[("deaf", deaf, "h2")],
        "upstream: { headers_timeout_ms: 20000, liveness: false }\n",
    );
    let started = std::time::Instant::now();
    let out = h2c_curl(&gw, "/test.Echo/Slow", &grpc_call("300m"))
        .output()
        .expect("curl");
    let took = started.elapsed();
    let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(head.contains("grpc-status: 4"), "{head}");
    assert!(head.contains("grpc-message: upstream-timeout"), "{head}");
    assert!(
        took < std::time::Duration::from_millis(2500),
        "took {took:?}"
    );
}

/// The access log carries each call's gRPC status: the shard's, from its
/// trailers, and shardgate's own.
#[test]
fn the_access_log_has_every_calls_grpc_status() {
    let shard = GrpcShard::start("g1");
    let gw = gateway(
        &[("g1", shard.url(), "h2")],
        "limits: { deny: [suspended] }\nlog: { access_format: json, access_path: \"{dir}/access.log\" }\n",
    );
    assert_eq!(call(&gw, "unary")["code"], "OK");
    assert_eq!(call(&gw, "fail:5 not here")["code"], "NOT_FOUND");
    assert_eq!(
        call_as(&gw, "slow:1:5", "suspended.localhost")["code"],
        "PERMISSION_DENIED"
    );
    let log = gw.dir.path().join("access.log");
    assert!(
        eventually(std::time::Duration::from_secs(3), || {
            std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() >= 3)
        }),
        "three lines in the access log"
    );
    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .expect("log")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let status_of = |method: &str| {
        let line = lines
            .iter()
            .find(|l| l["path"].as_str().is_some_and(|p| p.ends_with(method)));
        line.map(|l| (l["status"].as_u64(), l["grpc_status"].as_u64()))
    };
    assert_eq!(status_of("/Unary"), Some((Some(200), Some(0))), "{lines:?}");
    assert_eq!(status_of("/Fail"), Some((Some(200), Some(5))), "{lines:?}");
    assert_eq!(status_of("/Slow"), Some((Some(200), Some(7))), "{lines:?}");
}

/// One stream's deadline is the stream's: a call whose own deadline runs
/// out on a shared HTTP/2 connection to the shard does not take the
/// other streams on it down (a review finding: the headers watch once
/// shut the shared socket), and is not counted against the shard.
#[test]
fn a_streams_deadline_leaves_the_shared_connection_alone() {
    let deaf = deaf_h2_shard(std::time::Duration::from_millis(1500));
    let gw = gateway(&[("deaf", deaf, "h2")], "upstream: { liveness: false }\n");
    // Warm the pool: one HTTP/2 connection to the shard.
    let warm = h2c_curl(&gw, "/fast", &[]).output().expect("curl");
    assert!(String::from_utf8_lossy(&warm.stdout).starts_with("HTTP/2 200"));
    let patient = h2c_curl(&gw, "/slow", &[])
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let hasty = h2c_curl(&gw, "/hasty", &grpc_call("200m")).output();
    let hasty = hasty.expect("curl");
    let hasty = String::from_utf8_lossy(&hasty.stdout).to_lowercase();
    assert!(hasty.contains("grpc-status: 4"), "{hasty}");
    let patient = patient.wait_with_output().expect("curl");
    let patient = String::from_utf8_lossy(&patient.stdout).to_string();
    assert!(
        patient.starts_with("HTTP/2 200"),
        "the other stream lives on: {patient}"
    );
    let text = metrics_text(gw.admin_port);
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("shardgate_upstream_failures_total")
                && l.contains("timeout")
                && !l.ends_with(" 0")),
        "the call's own deadline is no shard timeout: {text}"
    );
}

/// Plain HTTP through an HTTP/2 shard: GET, HEAD (a review finding: a
/// `Connection: close` meant for HTTP/1.1 shards made the h2 crate refuse
/// every HEAD) and POST.
#[test]
fn plain_http_passes_through_an_http2_shard() {
    let shard = deaf_h2_shard(std::time::Duration::ZERO);
    let gw = gateway(&[("h2", shard, "h2")], "");
    for args in [
        &["-i"][..],
        &["-I"][..],
        &["-i", "--data-binary", "hello"][..],
    ] {
        let out = Command::new("curl")
            .args(["-s", "--http1.1", "--max-time", "10"])
            .args(args)
            .args(["-H", "Host: t.localhost"])
            .arg(format!("http://127.0.0.1:{}/fast", gw.port))
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("HTTP/1.1 200"), "{args:?}: {text}");
    }
}
