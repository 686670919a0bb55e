//! RFC 9112 and RFC 9110, walked rule by rule for an intermediary: one
//! test per MUST, over real sockets, against the real binary. Run with
//! `SHARDGATE_TEST_FAST_PATH=off` as well (scripts/test.sh does), so both
//! transports are held to each rule.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn config(shards: &[(&str, String)], extra: &str) -> String {
    config_yaml(
        "listen: [{ addr: \"127.0.0.1:{port}\" }]\nadmin: { addr: \"127.0.0.1:{admin}\" }\nstate: false\n",
        shards,
        extra,
    )
}

/// A shard that answers each request with its method, path and body
/// length (`GET /a 0`), after a pause for paths starting with `/slow`.
fn echo() -> Backend {
    Backend::with("echo", |seen| {
        let text = format!("{} {} {}", seen.method, seen.uri, seen.body.len());
        match seen.uri.starts_with("/slow") {
            true => Reply::After(Duration::from_millis(300), Box::new(Reply::ok(&text))),
            false => Reply::ok(&text),
        }
    })
}

/// The bodies of the responses in `text`, in order (each response's body
/// is one line from `echo`).
fn bodies(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("HTTP/1.1 ") {
        rest = &rest[at..];
        let Some(end) = rest.find("\r\n\r\n") else {
            break;
        };
        let head = &rest[..end];
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        let body = rest.get(end + 4..end + 4 + length).unwrap_or_default();
        out.push(body.to_string());
        rest = &rest[end + 4 + length.min(rest.len() - end - 4)..];
    }
    out
}

// RFC 9112 §9.3.2: a server MAY process pipelined requests in parallel
// only if they are all safe; it MUST send the responses in the order the
// requests were received. shardgate forwards one at a time.

fn pipelined(raw: &str) -> (Vec<u16>, Vec<String>) {
    let shard = echo();
    let gw = Gateway::start(&config(&[("a", shard.url())], ""));
    let (statuses, text) = exchange(gw.port, raw.as_bytes(), Duration::from_millis(1500));
    (statuses, bodies(&text))
}

#[test]
fn pipelined_gets_are_all_answered_in_order() {
    let (statuses, bodies) = pipelined(
        "GET /1 HTTP/1.1\r\nHost: t.localhost\r\n\r\nGET /2 HTTP/1.1\r\nHost: t.localhost\r\n\r\n",
    );
    assert_eq!(statuses, [200, 200]);
    assert_eq!(bodies, ["GET /1 0", "GET /2 0"]);
}

#[test]
fn a_get_then_a_pipelined_post_are_both_answered() {
    let (statuses, bodies) = pipelined(
        "GET /1 HTTP/1.1\r\nHost: t.localhost\r\n\r\nPOST /2 HTTP/1.1\r\nHost: t.localhost\r\nContent-Length: 5\r\n\r\nhello",
    );
    assert_eq!(statuses, [200, 200]);
    assert_eq!(bodies, ["GET /1 0", "POST /2 5"]);
}

#[test]
fn a_post_then_a_pipelined_get_are_both_answered() {
    let (statuses, bodies) = pipelined(
        "POST /1 HTTP/1.1\r\nHost: t.localhost\r\nContent-Length: 5\r\n\r\nhelloGET /2 HTTP/1.1\r\nHost: t.localhost\r\n\r\n",
    );
    assert_eq!(statuses, [200, 200]);
    assert_eq!(bodies, ["POST /1 5", "GET /2 0"]);
}

#[test]
fn a_chunked_post_then_a_pipelined_get_are_both_answered() {
    let (statuses, bodies) = pipelined(
        "POST /1 HTTP/1.1\r\nHost: t.localhost\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /2 HTTP/1.1\r\nHost: t.localhost\r\n\r\n",
    );
    assert_eq!(statuses, [200, 200]);
    assert_eq!(bodies, ["POST /1 5", "GET /2 0"]);
}

#[test]
fn three_pipelined_requests_are_answered_in_order_and_the_last_closes() {
    let (statuses, bodies) = pipelined(
        "GET /1 HTTP/1.1\r\nHost: t.localhost\r\n\r\nDELETE /2 HTTP/1.1\r\nHost: t.localhost\r\n\r\nGET /3 HTTP/1.1\r\nHost: t.localhost\r\nConnection: close\r\n\r\nGET /never HTTP/1.1\r\nHost: t.localhost\r\n\r\n",
    );
    assert_eq!(statuses, [200, 200, 200]);
    assert_eq!(bodies, ["GET /1 0", "DELETE /2 0", "GET /3 0"]);
}

#[test]
fn a_request_sent_while_the_first_is_in_flight_waits_its_turn() {
    let shard = echo();
    let gw = Gateway::start(&config(&[("a", shard.url())], ""));
    let mut conn = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    conn.write_all(b"GET /slow HTTP/1.1\r\nHost: t.localhost\r\n\r\n")
        .expect("write");
    std::thread::sleep(Duration::from_millis(100));
    conn.write_all(b"GET /fast HTTP/1.1\r\nHost: t.localhost\r\nConnection: close\r\n\r\n")
        .expect("write");
    conn.set_read_timeout(Some(Duration::from_secs(3))).ok();
    let mut text = String::new();
    let _ = conn.read_to_string(&mut text);
    assert_eq!(bodies(&text), ["GET /slow 0", "GET /fast 0"], "{text}");
    // Forwarded one at a time: the shard saw /fast after /slow.
    let seen: Vec<String> = shard.requests().iter().map(|s| s.uri.clone()).collect();
    assert_eq!(seen, ["/slow", "/fast"]);
}

// DESIGN §2 step 6: a body over `limits.max_body_bytes` is 413 — at once
// when Content-Length says so, else when the limit is crossed, and the
// upstream request is aborted.

#[test]
fn a_content_length_over_the_limit_is_413_at_once() {
    let shard = echo();
    let gw = Gateway::start(&config(
        &[("a", shard.url())],
        "limits: { max_body_bytes: 10 }\n",
    ));
    // Only the head is sent: the answer must not wait for the body.
    let (statuses, text) = exchange(
        gw.port,
        b"POST / HTTP/1.1\r\nHost: t.localhost\r\nContent-Length: 11\r\n\r\n",
        Duration::from_millis(800),
    );
    assert_eq!(statuses, [413], "{text}");
    assert!(
        text.contains("Connection: close") || text.contains("connection: close"),
        "{text}"
    );
    assert_eq!(shard.count(), 0);
    let (statuses, _) = exchange(
        gw.port,
        b"POST / HTTP/1.1\r\nHost: t.localhost\r\nContent-Length: 10\r\nConnection: close\r\n\r\n0123456789",
        Duration::from_millis(800),
    );
    assert_eq!(statuses, [200]);
}

#[test]
fn a_chunked_body_crossing_the_limit_is_413_and_aborted_upstream() {
    let shard = RawBackend::start();
    let gw = Gateway::start(&config(
        &[("a", shard.url())],
        "limits: { max_body_bytes: 1000 }\n",
    ));
    let mut conn = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    conn.write_all(b"POST / HTTP/1.1\r\nHost: t.localhost\r\nTransfer-Encoding: chunked\r\n\r\n")
        .expect("write");
    let chunk = format!("200\r\n{}\r\n", "x".repeat(0x200));
    for _ in 0..3 {
        if conn.write_all(chunk.as_bytes()).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    conn.set_read_timeout(Some(Duration::from_secs(3))).ok();
    let mut got = Vec::new();
    let _ = conn.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    std::thread::sleep(Duration::from_millis(200));
    // The shard never got a complete request: the body was cut short.
    assert!(shard.seen().is_empty(), "{:?}", shard.seen().len());
}

#[test]
fn max_body_bytes_null_is_unlimited() {
    let shard = echo();
    let gw = Gateway::start(&config(
        &[("a", shard.url())],
        "limits: { max_body_bytes: null }\n",
    ));
    let raw = format!(
        "POST / HTTP/1.1\r\nHost: t.localhost\r\nContent-Length: 200000000\r\nConnection: close\r\n\r\n{}",
        "x".repeat(10)
    );
    // Not refused at the head: the request waits for its body.
    let (statuses, _) = exchange(gw.port, raw.as_bytes(), Duration::from_millis(500));
    assert!(statuses.is_empty(), "{statuses:?}");
}

// RFC 9112 §6.3 and §7: a response whose body ends with the connection
// goes to an HTTP/1.1 client in chunks, so a shard that fails mid-body
// leaves a visibly incomplete body (no last chunk), never one that looks
// whole.

#[test]
fn a_body_cut_short_by_the_shard_reaches_the_client_incomplete() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    // Detached: it serves until the test process ends (health probes
    // connect too, and send nothing).
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else {
                return;
            };
            let mut buf = [0u8; 4096];
            let n = conn.read(&mut buf).unwrap_or(0);
            if n == 0 {
                continue;
            }
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\n\r\npart of it");
            std::thread::sleep(Duration::from_millis(100));
            if head.contains("/cut") {
                // Reset: the body is not over, it failed.
                let _ = socket2::SockRef::from(&conn).set_linger(Some(Duration::ZERO));
            }
        }
    });
    let gw = Gateway::start(&config(&[("a", format!("http://{addr}"))], ""));
    let (statuses, text) = exchange(
        gw.port,
        b"GET /whole HTTP/1.1\r\nHost: t.localhost\r\n\r\n",
        Duration::from_millis(800),
    );
    assert_eq!(statuses, [200]);
    assert!(text.contains("part of it\r\n0\r\n\r\n"), "ended: {text:?}");
    let (statuses, text) = exchange(
        gw.port,
        b"GET /cut HTTP/1.1\r\nHost: t.localhost\r\n\r\n",
        Duration::from_millis(800),
    );
    assert_eq!(statuses, [200]);
    assert!(text.contains("part of it"), "{text:?}");
    assert!(
        !text.contains("\r\n0\r\n\r\n"),
        "a cut body looked whole: {text:?}"
    );
}

// RFC 9112 §9.6 and DESIGN §2 step 3: a client that closes ends its
// request, which releases its admission at once — also when it sent a
// byte more first (kept for its next head, never mistaken for its close)
// and on a TLS listener (where a peek sees nothing).

fn active(gw: &Gateway) -> i64 {
    let shards = gw.admin("GET", "/v1/shards", None, None).json();
    shards
        .as_array()
        .expect("shards")
        .iter()
        .filter_map(|s| s["active"].as_i64())
        .sum()
}

fn slow_shard() -> Backend {
    Backend::with("slow", |_| {
        Reply::After(Duration::from_secs(4), Box::new(Reply::ok("late")))
    })
}

#[test]
fn a_client_that_leaves_after_one_byte_more_frees_its_admission() {
    let shard = slow_shard();
    let gw = Gateway::start(&config(&[("a", shard.url())], ""));
    let mut conn = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    conn.write_all(b"GET /slow HTTP/1.1\r\nHost: t.localhost\r\n\r\nG")
        .expect("write");
    assert!(eventually(Duration::from_secs(2), || active(&gw) == 1));
    drop(conn);
    assert!(
        eventually(Duration::from_millis(1500), || active(&gw) == 0),
        "still admitted after the client left"
    );
}

#[test]
fn a_client_that_leaves_a_tls_listener_frees_its_admission() {
    use tokio_rustls::rustls;
    let dir = tempfile::tempdir().expect("dir");
    let (cert, crt, key) = self_signed_files(dir.path());
    let shard = slow_shard();
    let yaml = config_yaml(
        &format!(
            "listen: [{{ addr: \"127.0.0.1:{{port}}\", tls: {{ cert: \"{}\", key: \"{}\" }} }}]\nadmin: {{ addr: \"127.0.0.1:{{admin}}\" }}\nstate: false\n",
            crt.display(),
            key.display()
        ),
        &[("a", shard.url())],
        "",
    );
    let gw = Gateway::start(&yaml);
    let connector = connector_trusting(&cert);
    let port = gw.port;
    let stream = runtime().block_on(async move {
        use tokio::io::AsyncWriteExt;
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let mut tls = connector.connect(name, tcp).await.expect("handshake");
        tls.write_all(b"GET /slow HTTP/1.1\r\nHost: t.localhost\r\n\r\n")
            .await
            .expect("write");
        tls.flush().await.expect("flush");
        tls
    });
    assert!(eventually(Duration::from_secs(2), || active(&gw) == 1));
    drop(stream);
    assert!(
        eventually(Duration::from_millis(1500), || active(&gw) == 0),
        "still admitted after the client left"
    );
}

// RFC 9112 §9.3 (persistence) and §9.6 (tear-down), upstream side: a
// pooled connection is reused only when nothing from before a request can
// answer it, and idle ones do not outlive the shard's close or
// `upstream.keepalive_timeout_ms`.

/// A raw shard: `HEAD` gets a framed bodiless answer followed at once, in
/// a write of its own, by an unsolicited response; anything else gets
/// `real`. It closes a connection after `close_idle_after` of idleness (if
/// given), and counts the connections that ended after serving a request
/// (health probes connect too).
fn forging_shard(
    close_idle_after: Option<Duration>,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = runtime()
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let ended = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&ended);
    runtime().spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let _ = conn.set_nodelay(true);
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let mut served = false;
                loop {
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break Some(i + 4);
                        }
                        let read = match close_idle_after {
                            Some(after) if buf.is_empty() => {
                                match tokio::time::timeout(after, conn.read(&mut chunk)).await {
                                    Ok(read) => read,
                                    Err(_) => break None,
                                }
                            }
                            _ => conn.read(&mut chunk).await,
                        };
                        match read {
                            Ok(0) | Err(_) => break None,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let Some(end) = end else { break };
                    let head: Vec<u8> = buf.drain(..end).collect();
                    let ok = if head.starts_with(b"HEAD ") {
                        conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n")
                            .await
                            .is_ok()
                            && conn
                                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged")
                                .await
                                .is_ok()
                    } else {
                        conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal")
                            .await
                            .is_ok()
                    };
                    if !ok {
                        break;
                    }
                    served = true;
                }
                // Closed before it is counted: a test that waits for the
                // count knows the FIN is on its way.
                drop(conn);
                if served {
                    count.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    (addr, ended)
}

#[test]
fn bytes_a_shard_sent_before_a_request_never_answer_it_under_load() {
    let (addr, _) = forging_shard(None);
    let gw = Gateway::start(&config(&[("a", format!("http://{addr}"))], ""));
    let port = gw.port;
    let clients: Vec<_> = (0..8)
        .map(|c| {
            std::thread::spawn(move || {
                let conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
                let mut reader = std::io::BufReader::new(conn.try_clone().expect("clone"));
                let mut conn = conn;
                let mut wrong = Vec::new();
                for i in 0..150 {
                    let method = if i % 2 == 0 { "HEAD" } else { "GET" };
                    let raw = format!("{method} /{c}/{i} HTTP/1.1\r\nHost: t{c}.localhost\r\n\r\n");
                    if conn.write_all(raw.as_bytes()).is_err() {
                        break;
                    }
                    let Ok(mut r) = read_response_to(&mut reader, method == "HEAD") else {
                        break;
                    };
                    if method == "GET" && r.body != b"real" {
                        wrong.push(
                            String::from_utf8_lossy(&std::mem::take(&mut r.body)).to_string(),
                        );
                    }
                }
                wrong
            })
        })
        .collect();
    let wrong: Vec<String> = clients
        .into_iter()
        .flat_map(|c| c.join().expect("client"))
        .collect();
    assert!(
        wrong.is_empty(),
        "answered with another response's bytes: {wrong:?}"
    );
}

/// Connections in CLOSE_WAIT whose peer is `port` (the gateway's side of
/// connections a shard on `port` closed).
fn close_wait_to(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            cols.len() > 3
                && cols[3] == "08"
                && cols[2].rsplit(':').next() == Some(&format!("{port:04X}"))
        })
        .count()
}

#[test]
fn idle_upstream_connections_the_shard_closed_do_not_linger() {
    let (addr, ended) = forging_shard(Some(Duration::from_millis(200)));
    let gw = Gateway::start(&config(
        &[("a", format!("http://{addr}"))],
        "upstream: { keepalive_timeout_ms: 60000 }\n",
    ));
    for i in 0..20 {
        assert_eq!(gw.get(&format!("t{i}.localhost"), "/").status, 200);
    }
    assert!(eventually(Duration::from_secs(2), || ended
        .load(std::sync::atomic::Ordering::SeqCst)
        > 0));
    assert!(
        eventually(Duration::from_secs(8), || close_wait_to(addr.port()) == 0),
        "{} connections left in CLOSE_WAIT",
        close_wait_to(addr.port())
    );
}

#[test]
fn an_idle_connection_the_shard_closed_is_not_reused() {
    // The shard closes each connection 100 ms after it fell idle. By the
    // next request the gateway has seen the close: it opens a fresh
    // connection instead of trying the closed one (which would cost a
    // stale attempt and a resend, counted as a retry).
    let (addr, ended) = forging_shard(Some(Duration::from_millis(100)));
    let gw = Gateway::start(&config(
        &[("a", format!("http://{addr}"))],
        "server: { threads: 1 }\nupstream: { keepalive_timeout_ms: 60000 }\n",
    ));
    for i in 1..=5 {
        assert_eq!(gw.get("t.localhost", "/").status, 200);
        assert!(eventually(Duration::from_secs(2), || ended
            .load(std::sync::atomic::Ordering::SeqCst)
            >= i));
        std::thread::sleep(Duration::from_millis(50));
    }
    let metrics = metrics_text(gw.admin_port);
    assert!(
        metrics.lines().any(|l| l == "shardgate_retries_total 0"),
        "{metrics}"
    );
}

#[test]
fn idle_upstream_connections_close_at_the_keepalive_timeout() {
    let (addr, ended) = forging_shard(None);
    let gw = Gateway::start(&config(
        &[("a", format!("http://{addr}"))],
        "upstream: { keepalive_timeout_ms: 500 }\n",
    ));
    assert_eq!(gw.get("t.localhost", "/").status, 200);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        ended.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "kept while young"
    );
    assert!(
        eventually(Duration::from_secs(3), || ended
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 1),
        "the idle connection outlived upstream.keepalive_timeout_ms"
    );
}

// RFC 9112 §9.6: a server that closes after a response sends
// `Connection: close` in it. DESIGN §2 step 6 holds every answer shardgate
// writes itself to that, on both transports.

#[test]
fn answers_after_which_the_connection_closes_say_so() {
    let slow = Backend::with("slow", |_| {
        Reply::After(Duration::from_secs(3), Box::new(Reply::ok("late")))
    });
    let gone = free_port();
    let gw = Gateway::start(&config(
        &[
            ("slow", slow.url()),
            ("gone", format!("http://127.0.0.1:{gone}")),
        ],
        "upstream: { headers_timeout_ms: 400, liveness: false }\nretry: false\n",
    ));
    // Tenants spread over both shards: a 504 from the slow one, a 502 from
    // the one nobody listens on (then marked down: later ones time out).
    let mut seen = Vec::new();
    for i in 0..40 {
        let raw = format!("GET /{i} HTTP/1.1\r\nHost: t{i}.localhost\r\n\r\nGET /next HTTP/1.1\r\nHost: t{i}.localhost\r\n\r\n");
        let (statuses, text) = exchange(gw.port, raw.as_bytes(), Duration::from_millis(900));
        if let Some(&status) = statuses.first() {
            if status == 502 || status == 504 {
                assert_eq!(
                    statuses.len(),
                    1,
                    "answered after a closing {status}: {text}"
                );
                assert!(
                    text.to_ascii_lowercase()
                        .contains("\r\nconnection: close\r\n"),
                    "{status} without Connection: close: {text}"
                );
                seen.push(status);
            }
        }
        if seen.contains(&502) && seen.contains(&504) {
            break;
        }
    }
    assert!(seen.contains(&502) && seen.contains(&504), "{seen:?}");
}

// RFC 9112 §7: chunked is never sent to an HTTP/1.0 recipient; a body
// framed by the close stays so for it.

#[test]
fn an_http_10_client_never_gets_chunks() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut buf = [0u8; 4096];
            if conn.read(&mut buf).unwrap_or(0) == 0 {
                continue;
            }
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\n\r\nuntil the close");
        }
    });
    let gw = Gateway::start(&config(&[("a", format!("http://{addr}"))], ""));
    let (statuses, text) = exchange(
        gw.port,
        b"GET / HTTP/1.0\r\nHost: t.localhost\r\n\r\n",
        Duration::from_millis(800),
    );
    assert_eq!(statuses, [200], "{text}");
    assert!(
        !text.to_ascii_lowercase().contains("transfer-encoding"),
        "{text}"
    );
    assert!(text.ends_with("\r\n\r\nuntil the close"), "{text:?}");
}

#[test]
fn a_413_reaches_a_client_still_uploading() {
    let shard = echo();
    let gw = Gateway::start(&config(
        &[("a", shard.url())],
        "limits: { max_body_bytes: 1000 }\n",
    ));
    let mut conn = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    conn.write_all(b"POST / HTTP/1.1\r\nHost: t.localhost\r\nContent-Length: 300000\r\n\r\n")
        .expect("write");
    // Keep uploading while the answer comes: closing on unread bytes would
    // reset the connection and could destroy the 413.
    let mut writer = conn.try_clone().expect("clone");
    let uploader = std::thread::spawn(move || {
        let chunk = vec![b'x'; 16 * 1024];
        for _ in 0..18 {
            if writer.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    conn.set_read_timeout(Some(Duration::from_secs(3))).ok();
    let mut got = [0u8; 64];
    let n = conn.read(&mut got).unwrap_or(0);
    let text = String::from_utf8_lossy(&got[..n]);
    assert!(text.starts_with("HTTP/1.1 413"), "{text:?}");
    let _ = uploader.join();
    assert_eq!(shard.count(), 0);
}

// RFC 9112 §9.3: an HTTP/1.0 request without keep-alive, or one that says
// `Connection: close`, is the connection's last — shardgate's own answers
// (refusals) included, not only proxied ones.
#[test]
fn a_refusal_to_an_http_10_or_closing_request_closes_the_connection() {
    let shard = Backend::start("a");
    let gw = Gateway::start(&config(&[("a", shard.url())], ""));
    for raw in [
        &b"GET / HTTP/1.0\r\n\r\n"[..],
        b"GET / HTTP/1.0\r\nHost: nowhere.example\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: nowhere.example\r\nConnection: close\r\n\r\n",
    ] {
        let mut conn = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
        conn.set_read_timeout(Some(Duration::from_secs(3)))
            .expect("timeout");
        conn.write_all(raw).expect("write");
        let mut out = Vec::new();
        let read = conn.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out);
        assert!(read.is_ok(), "not closed after the answer: {text}");
        assert!(text.starts_with("HTTP/1.1 4"), "{text}");
    }
}
