//! DESIGN §7 over real sockets: request IDs on every answer and on the
//! upstream request, the JSON access log (its file, its reopen on SIGUSR1).
//! Both transports (`SHARDGATE_TEST_FAST_PATH=off` runs these on Pingora's).

mod common;

use common::*;
use std::collections::HashSet;
use std::time::Duration;

fn config(shards: &[(&str, String)], extra: &str) -> String {
    config_yaml(
        "listen: [{ addr: \"127.0.0.1:{port}\" }]\nadmin: { addr: \"127.0.0.1:{admin}\" }\nstate: false\n",
        shards,
        extra,
    )
}

/// Ours: 22 base64url characters.
fn looks_like_ours(id: &str) -> bool {
    id.len() == 22
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[test]
fn one_request_id_goes_to_the_shard_and_back_and_on_every_own_answer() {
    let a = Backend::with("a", |_| {
        // A shard that sets the field itself is overruled.
        Reply::Full(
            200,
            vec![("X-Request-Id".into(), "shards-own".into())],
            b"ok".to_vec(),
        )
    });
    let gw = Gateway::start(&config(&[("a", a.url())], ""));
    let mut ids = HashSet::new();
    for _ in 0..20 {
        let r = gw.send(
            "GET / HTTP/1.1\r\nHost: acme.localhost\r\nX-Request-Id: client-chosen\r\n\
             X_Request_Id: look-alike\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(r.status, 200);
        let id = r.header("x-request-id").expect("an ID").to_string();
        assert!(looks_like_ours(&id), "{id}");
        assert_eq!(
            r.headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case("x-request-id"))
                .count(),
            1
        );
        let seen = a.requests().last().cloned().expect("forwarded");
        assert_eq!(
            seen.header("x-request-id"),
            Some(id.as_str()),
            "the shard saw the same"
        );
        assert_eq!(seen.header_count("x-request-id"), 1);
        assert_eq!(
            seen.header("x_request_id"),
            None,
            "look-alikes never reach it"
        );
        ids.insert(id);
    }
    assert_eq!(ids.len(), 20, "unique");
    // shardgate's own answers: a refusal, a head it refuses to read.
    let r = gw.get("nobody.example.org", "/");
    assert_eq!(r.status, 404);
    assert!(
        looks_like_ours(r.header("x-request-id").unwrap_or("")),
        "{:?}",
        r.headers
    );
    let r = gw.send("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
    assert_eq!(r.status, 400);
    assert!(
        looks_like_ours(r.header("x-request-id").unwrap_or("")),
        "{:?}",
        r.headers
    );
    for (raw, status) in [
        (
            "CONNECT acme.localhost:443 HTTP/1.1\r\nHost: acme.localhost:443\r\n\r\n",
            405,
        ),
        (
            "GET http://u@acme.localhost/ HTTP/1.1\r\nHost: acme.localhost\r\n\r\n",
            400,
        ),
        ("GET / HTTP/1.1\r\nHost: u@acme.localhost\r\n\r\n", 400),
    ] {
        let r = gw.send(raw);
        assert_eq!(r.status, status, "{raw}");
        assert!(
            looks_like_ours(r.header("x-request-id").unwrap_or("")),
            "{raw}: {:?}",
            r.headers
        );
    }
    let long = "x".repeat(70_000);
    let r = gw.send(&format!(
        "GET / HTTP/1.1\r\nHost: acme.localhost\r\nX-Big: {long}\r\n\r\n"
    ));
    assert_eq!(r.status, 431);
    assert!(
        looks_like_ours(r.header("x-request-id").unwrap_or("")),
        "{:?}",
        r.headers
    );
}

#[test]
fn a_trusted_clients_id_is_kept_only_when_well_formed() {
    let a = Backend::start("a");
    let gw = Gateway::start(&config(
        &[("a", a.url())],
        "request_id: { header: x-correlation-id, trust_incoming: true }\n",
    ));
    let r = gw.send(
        "GET / HTTP/1.1\r\nHost: acme.localhost\r\nX-Correlation-Id: upstream.lb-42_x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.header("x-correlation-id"), Some("upstream.lb-42_x"));
    assert_eq!(r.header("x-request-id"), None, "the configured field only");
    let seen = a.requests().last().cloned().expect("forwarded");
    assert_eq!(seen.header("x-correlation-id"), Some("upstream.lb-42_x"));
    for bad in ["has space", "semi;colon", &"y".repeat(129)] {
        let r = gw.send(&format!(
            "GET / HTTP/1.1\r\nHost: acme.localhost\r\nX-Correlation-Id: {bad}\r\nConnection: close\r\n\r\n"
        ));
        let id = r.header("x-correlation-id").unwrap_or("").to_string();
        assert!(looks_like_ours(&id), "{bad:?} replaced: {id}");
        let seen = a.requests().last().cloned().expect("forwarded");
        assert_eq!(seen.header("x-correlation-id"), Some(id.as_str()));
    }
    // A refused request keeps the trusted ID too.
    let r = gw.send(
        "GET / HTTP/1.1\r\nHost: nobody.example.org\r\nX-Correlation-Id: abc\r\nConnection: close\r\n\r\n",
    );
    assert_eq!((r.status, r.header("x-correlation-id")), (404, Some("abc")));
}

#[test]
fn a_retried_request_keeps_one_id_over_its_attempts() {
    let resetter = Resetter::start();
    let b = Backend::start("b");
    let gw = Gateway::start(&config(
        &[("r", resetter.url()), ("b", b.url())],
        "health: { interval_ms: 60000 }\nretry: { attempts: 2 }\n",
    ));
    // A tenant placed on the resetter: its GET is reset there, retried on b.
    let r = retried_after_a_reset(&gw, &resetter);
    assert_eq!(r.status, 200, "retried on b");
    let id = r.header("x-request-id").expect("an ID").to_string();
    let seen = b.requests().last().cloned().expect("retried to b");
    assert_eq!(seen.header("x-request-id"), Some(id.as_str()));
}

/// The access log's JSON lines in `path` (those there so far).
fn json_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // A line the writer is still writing is not there yet.
    let whole = text.rfind('\n').map_or("", |end| &text[..end]);
    whole
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn json_access_lines_parse_match_the_answer_and_survive_a_rename() {
    let a = Backend::start("a");
    let gw = Gateway::start(&config(
        &[("a", a.url())],
        "log: { access: info, access_format: json, access_path: \"{dir}/access.log\" }\n",
    ));
    let path = gw.dir.path().join("access.log");
    let r = gw.send(
        "POST /up?x=1 HTTP/1.1\r\nHost: acme.localhost\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    assert_eq!(r.status, 200);
    let id = r.header("x-request-id").expect("an ID").to_string();
    let refused = gw.get("nobody.example.org", "/missing");
    assert_eq!(refused.status, 404);
    let refused_id = refused.header("x-request-id").expect("an ID").to_string();
    assert!(
        eventually(Duration::from_secs(5), || json_lines(&path).len() >= 2),
        "lines: {:?}",
        std::fs::read_to_string(&path)
    );
    let lines = json_lines(&path);
    let line = lines
        .iter()
        .find(|l| l["request_id"] == id.as_str())
        .expect("the POST's line");
    assert_eq!(line["method"], "POST");
    assert_eq!(line["path"], "/up?x=1");
    assert_eq!(line["host"], "acme.localhost");
    assert_eq!(line["tenant"], "acme");
    assert_eq!(line["shard"], "a");
    assert_eq!(line["decision"], "allow");
    assert_eq!(line["status"], 200);
    assert_eq!(line["bytes_in"], 5);
    assert_eq!(line["bytes_out"], r.body.len() as u64);
    assert_eq!(line["attempts"], 1);
    assert_eq!(line["protocol"], "HTTP/1.1");
    assert!(line["trace_id"].is_null());
    assert!(line["duration_ms"].as_f64().is_some_and(|d| d >= 0.0));
    assert!(line["client"]
        .as_str()
        .is_some_and(|c| c.starts_with("127.0.0.1:")));
    let time = line["time"].as_str().expect("time");
    assert!(
        time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "{time}"
    );
    let line = lines
        .iter()
        .find(|l| l["request_id"] == refused_id.as_str())
        .expect("the refusal's line");
    assert_eq!(line["status"], 404);
    assert!(line["shard"].is_null() && line["tenant"].is_null());
    // logrotate: the file is moved away, SIGUSR1, and lines go to a new one.
    let rotated = gw.dir.path().join("access.log.1");
    std::fs::rename(&path, &rotated).expect("rename");
    let pid = gw.pid().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-USR1", &pid])
        .status();
    assert!(killed.is_ok_and(|s| s.success()));
    std::thread::sleep(Duration::from_millis(300));
    let r = gw.get("acme.localhost", "/after");
    assert_eq!(r.status, 200, "SIGUSR1 does not stop the gateway");
    let id = r.header("x-request-id").expect("an ID").to_string();
    assert!(
        eventually(Duration::from_secs(5), || json_lines(&path)
            .iter()
            .any(|l| l["request_id"] == id.as_str())),
        "the new file gets the line: {:?}",
        std::fs::read_to_string(&path)
    );
    assert!(json_lines(&rotated)
        .iter()
        .all(|l| l["request_id"] != id.as_str()));
    let text = metrics_text(gw.admin_port);
    assert!(
        text.lines()
            .any(|l| l == "shardgate_access_log_dropped_total 0"),
        "{text}"
    );
}

#[test]
fn a_full_disk_costs_requests_nothing_and_its_lines_are_counted() {
    // /dev/full refuses every write with ENOSPC.
    if !std::path::Path::new("/dev/full").exists() {
        eprintln!("skipped: no /dev/full on this machine");
        return;
    }
    let a = Backend::start("a");
    let gw = Gateway::start(&config(
        &[("a", a.url())],
        "log: { access_format: json, access_path: /dev/full }\n",
    ));
    for _ in 0..20 {
        assert_eq!(gw.get("acme.localhost", "/").status, 200);
    }
    let text = metrics_reaching(gw.admin_port, "shardgate_access_log_dropped_total", 20);
    assert!(
        metric_value(&text, "shardgate_access_log_dropped_total") >= 20,
        "{text}"
    );
    // The count is taken before the line is logged: wait for the line.
    assert!(
        eventually(Duration::from_secs(3), || gw
            .log()
            .contains("lines lost writing /dev/full")),
        "{}",
        gw.log()
    );
}

#[test]
fn a_websockets_101_says_the_id_its_handshake_took_to_the_shard() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let ws = WsBackend::start("ws");
    let gw = Gateway::start(&config(&[("ws", ws.url())], ""));
    let id = runtime().block_on(async {
        let mut req = format!("ws://127.0.0.1:{}/socket", gw.port)
            .into_client_request()
            .expect("request");
        let headers = req.headers_mut();
        headers.insert("host", "acme.localhost".parse().expect("host"));
        headers.insert("x-request-id", "client-chosen".parse().expect("id"));
        let (mut client, resp) = tokio_tungstenite::connect_async(req).await.expect("101");
        let _ = client.close(None).await;
        assert_eq!(resp.status().as_u16(), 101);
        let ids: Vec<_> = resp.headers().get_all("x-request-id").iter().collect();
        assert_eq!(ids.len(), 1, "{:?}", resp.headers());
        ids[0].to_str().expect("text").to_string()
    });
    assert!(looks_like_ours(&id), "{id}");
    let handshake = ws.handshakes.lock().expect("handshakes")[0].clone();
    assert_eq!(handshake.get("x-request-id"), Some(&id));
}

/// A WebSocket's access line counts what went through its tunnel: the
/// client's frames in (the first sent with its handshake), every byte
/// the client got after the 101 out.
#[test]
fn a_websockets_line_counts_its_tunnels_bytes_each_way() {
    use std::io::{Read, Write};
    let ws = WsBackend::start("ws");
    let gw = Gateway::start(&config(
        &[("ws", ws.url())],
        "log: { access: info, access_format: json, access_path: \"{dir}/access.log\" }\n",
    ));
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let handshake = "GET /socket HTTP/1.1\r\nHost: acme.localhost\r\nUpgrade: websocket\r\n\
                     Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                     Sec-WebSocket-Version: 13\r\n\r\n";
    // A masked text frame (11 bytes) right behind the handshake: read
    // with it, sent to the shard after its 101. Then a masked close (6).
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut first = handshake.as_bytes().to_vec();
    first.extend_from_slice(&[0x81, 0x85]);
    first.extend_from_slice(&mask);
    first.extend(b"hello".iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    tcp.write_all(&first).expect("handshake");
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = tcp.read(&mut chunk).expect("the 101");
        assert!(n > 0, "closed before the 101: {got:?}");
        got.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).into_owned();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let id = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("x-request-id")
                .then(|| value.trim().to_string())
        })
        .expect("an ID");
    let mut close = vec![0x88, 0x80];
    close.extend_from_slice(&mask);
    tcp.write_all(&close).expect("close");
    let mut out = got.len() - head_end;
    loop {
        match tcp.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => out += n,
            Err(e) => panic!("the tunnel did not end: {e}"),
        }
    }
    // The echo ("ws:hello", 10 bytes) at least (the test shard leaves at
    // a close without answering it).
    assert!(out >= 10, "{out} bytes after the 101");
    let path = gw.dir.path().join("access.log");
    let line = || {
        json_lines(&path)
            .into_iter()
            .find(|l| l["request_id"] == id.as_str())
    };
    assert!(
        eventually(Duration::from_secs(10), || line().is_some()),
        "{:?}",
        std::fs::read_to_string(&path)
    );
    let line = line().expect("the tunnel's line");
    assert_eq!(line["status"], 101, "{line}");
    assert_eq!(line["bytes_in"], 17, "{line}");
    assert_eq!(line["bytes_out"], out as u64, "{line}");
}

#[test]
fn without_tracing_a_traceparent_reaches_the_shard_unchanged() {
    let a = Backend::start("a");
    let gw = Gateway::start(&config(&[("a", a.url())], ""));
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let r = gw.send(&format!(
        "GET / HTTP/1.1\r\nHost: acme.localhost\r\ntraceparent: {parent}\r\n\
         tracestate: vendor=abc\r\nConnection: close\r\n\r\n"
    ));
    assert_eq!(r.status, 200);
    let seen = a.requests().last().cloned().expect("forwarded");
    assert_eq!(seen.header("traceparent"), Some(parent));
    assert_eq!(seen.header("tracestate"), Some("vendor=abc"));
}
