//! One framing rule for every message, against a raw shard that records
//! each connection and every request head on it: a broken chunked body
//! whose start came with its head is refused before any shard hears of
//! it; a shard's response whose framing fields break the rule a request's
//! are read by (both fields, a coding other than `chunked`) is a 502 and
//! its connection is not kept; a response's trailers reach an HTTP/1
//! client only as valid field lines a trailer may carry. Run with
//! `SHARDGATE_TEST_FAST_PATH=off` as well: both transports hold to it.

mod common;

use common::{config_yaml, read_response, runtime, Gateway, Response};
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The request targets each accepted connection carried, in order.
type Connections = Arc<Mutex<Vec<Vec<String>>>>;

/// A raw shard answering each request head with `reply(target)` (it reads
/// no body: the tests here send none it must take).
struct Shard {
    addr: std::net::SocketAddr,
    connections: Connections,
    task: tokio::task::JoinHandle<()>,
}

impl Shard {
    fn start(reply: fn(&str) -> Vec<u8>) -> Shard {
        let listener = runtime()
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let connections = Connections::default();
        let seen = Arc::clone(&connections);
        let task = runtime().spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let index = {
                    let mut all = seen.lock().unwrap();
                    all.push(Vec::new());
                    all.len() - 1
                };
                tokio::spawn(serve(stream, Arc::clone(&seen), index, reply));
            }
        });
        Shard {
            addr,
            connections,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The targets each connection carried (connections that carried
    /// none, such as a health probe's, left out).
    fn seen(&self) -> Vec<Vec<String>> {
        let all = self.connections.lock().unwrap();
        all.iter().filter(|c| !c.is_empty()).cloned().collect()
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    mut stream: tokio::net::TcpStream,
    seen: Connections,
    index: usize,
    reply: fn(&str) -> Vec<u8>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut pending = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") else {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&pending[..end]).to_string();
        pending.drain(..end + 4);
        let target = head.split(' ').nth(1).unwrap_or_default().to_string();
        if !target.starts_with('/') {
            // A body's bytes taken for a head: not a request.
            continue;
        }
        seen.lock().unwrap()[index].push(target.clone());
        if stream.write_all(&reply(&target)).await.is_err() {
            return;
        }
    }
}

fn gateway(shard: &Shard, extra: &str) -> Gateway {
    Gateway::start(&config_yaml(
        "listen: [{ addr: \"127.0.0.1:{port}\" }]\nadmin: { addr: \"127.0.0.1:{admin}\" }\nstate: false\n",
        &[("raw", shard.url())],
        // No probes during a test: they would connect to the shard too.
        &format!("server: {{ threads: 2 }}\nhealth: {{ interval_ms: 60000 }}\n{extra}"),
    ))
}

fn ok(_: &str) -> Vec<u8> {
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec()
}

/// Sends `raw` on a new connection; the answer.
fn send(gw: &Gateway, raw: &str) -> Response {
    let mut stream = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).ok();
    stream.write_all(raw.as_bytes()).expect("send");
    read_response(&mut BufReader::new(stream)).expect("an answer")
}

#[test]
fn a_broken_chunked_body_in_hand_is_refused_before_any_shard_hears_of_it() {
    let shard = Shard::start(ok);
    let gw = gateway(&shard, "limits: { max_body_bytes: 1024 }\n");
    let head =
        "POST /refused HTTP/1.1\r\nHost: acme.localhost\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (size_line, status) in [
        ("zz\r\n", 400),
        ("10000000000000000\r\nabc\r\n", 400), // 2^64
        ("FFFFFFFFFFFFFFFFFFFF3\r\nabc\r\n", 400),
        ("100000400\r\nabc\r\n", 413), // 2^32 past the limit
        ("401\r\nabc\r\n", 413),       // one past the limit
        ("3\r\nabc\r\n3FF\r\n", 413),
        ("FFFFFF", 413), // a size line still coming, already too large
    ] {
        let r = send(&gw, &format!("{head}{size_line}"));
        assert_eq!(r.status, status, "{size_line:?}: {}", r.text());
    }
    // A body that keeps its framing still goes through (so the shard above
    // would have heard of the others).
    let r = send(
        &gw,
        &format!("{head}3\r\nabc\r\n0\r\n\r\n").replace("/refused", "/fine"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let targets: Vec<String> = shard.seen().concat();
    assert_eq!(targets, ["/fine"], "the shard heard of a refused request");
}

#[test]
fn an_endless_chunk_size_line_is_refused() {
    let shard = Shard::start(ok);
    let gw = gateway(&shard, "");
    let head =
        "POST /endless HTTP/1.1\r\nHost: acme.localhost\r\nTransfer-Encoding: chunked\r\n\r\n";
    for line in [
        format!("{}3\r\nabc\r\n0\r\n\r\n", "0".repeat(5000)),
        format!("3;{}\r\nabc\r\n0\r\n\r\n", "x".repeat(5000)),
    ] {
        let r = send(&gw, &format!("{head}{line}"));
        assert_eq!(r.status, 400, "{}", r.text());
    }
    if !common::fast_path_on() {
        // Pingora's own chunk parser takes at most 16 digits, zeros too.
        return;
    }
    // Leading zeros within the bound are a chunk size (DESIGN §2).
    let r = send(
        &gw,
        &format!("{head}{}3\r\nabc\r\n0\r\n\r\n", "0".repeat(100)),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn chunk_framing_that_outgrows_the_body_limit_is_refused_on_both_transports() {
    // A shard that does not answer before the body's end: one that
    // answers at the head (as `ok` does) has its answer relayed, legitimately,
    // before the budget runs out (a 200 one run in a few).
    let shard = Shard::start(|target| match target {
        "/ext" => Vec::new(),
        other => ok(other),
    });
    let gw = gateway(&shard, "limits: { max_body_bytes: 8192 }\n");
    let head = "POST /ext HTTP/1.1\r\nHost: acme.localhost\r\nTransfer-Encoding: chunked\r\n\r\n";
    let mut stream = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).ok();
    stream.write_all(head.as_bytes()).expect("head");
    // A byte of data per size line of 4 000 bytes of extensions: 64 KiB
    // of framing for 16 bytes of body, past 8 192 + one size line.
    let chunk = format!("1;{}\r\na\r\n", "x".repeat(4000));
    for _ in 0..16 {
        if stream.write_all(chunk.as_bytes()).is_err() {
            break; // refused and closed already
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n");
    let sent = std::time::Instant::now();
    let status = read_response(&mut BufReader::new(stream)).map_or(0, |r| r.status);
    // Refused (or the connection reset under the refusal) at once, never
    // left to wait for the silent shard.
    let refused =
        matches!(status, 400 | 413) || (status == 0 && sent.elapsed() < Duration::from_secs(5));
    assert!(
        refused,
        "framing past the budget answered {status} after {:?}",
        sent.elapsed()
    );
}

/// The shard's answers for the response framing tests, by target.
fn framed(target: &str) -> Vec<u8> {
    let text: &str = match target {
        "/both" => "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        "/gzip" => "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        "/twice" => "HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nContent-Length: 2\r\n\r\nok",
        "/trailers" => "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Sum: 1\r\nSet-Cookie: session=stolen\r\nContent-Length: 40\r\n\r\n",
        "/no-content" => "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nX-Kind: empty\r\n\r\n",
        "/bad-trailers" => "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Sum: 1\r\nHTTP/1.1 200 OK\r\n folded: x\r\n\r\n",
        _ => "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    };
    text.as_bytes().to_vec()
}

#[test]
fn a_response_with_both_framing_fields_is_a_502_and_its_connection_is_not_kept() {
    if !common::fast_path_on() {
        // Pingora's client drops the `Content-Length` before any phase
        // sees the head: there, `Transfer-Encoding` wins and the
        // connection is Pingora's to keep.
        eprintln!("skipped: fast transport only (Pingora reads both fields itself)");
        return;
    }
    let shard = Shard::start(framed);
    let gw = gateway(&shard, "");
    let (mut stream, mut reader) = connect(&gw);
    let mut get = |target: &str| {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: acme.localhost\r\n\r\n");
        stream.write_all(raw.as_bytes()).expect("send");
        let r = read_response(&mut reader).expect("an answer");
        (r.status, r.text())
    };
    assert_eq!(get("/a"), (200, "ok".into()));
    assert_eq!(get("/b"), (200, "ok".into()));
    let (status, _) = get("/both");
    assert_eq!(status, 502);
    // A new client connection: the 502 may have closed the first one.
    let (mut stream, mut reader) = connect(&gw);
    stream
        .write_all(b"GET /after HTTP/1.1\r\nHost: acme.localhost\r\n\r\n")
        .expect("send");
    assert_eq!(read_response(&mut reader).expect("an answer").status, 200);
    let seen = shard.seen();
    let both = seen
        .iter()
        .find(|c| c.iter().any(|t| t == "/both"))
        .expect("a connection carried /both");
    assert_eq!(
        both.last().map(String::as_str),
        Some("/both"),
        "the connection was kept after it: {seen:?}"
    );
    assert!(
        seen.iter().any(|c| c.len() > 1),
        "connections are pooled at all (else this test proves nothing): {seen:?}"
    );
}

#[test]
fn a_coding_other_than_chunked_is_refused_never_dropped() {
    let shard = Shard::start(framed);
    let gw = gateway(&shard, "");
    let r = send(&gw, "GET /gzip HTTP/1.1\r\nHost: acme.localhost\r\n\r\n");
    assert_eq!(r.status, 502, "{:?} {}", r.headers, r.text());
    // A length said twice is one length.
    let r = send(&gw, "GET /twice HTTP/1.1\r\nHost: acme.localhost\r\n\r\n");
    assert_eq!((r.status, r.text()), (200, "ok".into()));
}

/// The raw bytes of the answer to `GET target` (the connection closes
/// after it).
fn raw_answer(gw: &Gateway, target: &str) -> String {
    use std::io::Read;
    let mut stream = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).ok();
    let raw = format!(
        "GET {target} HTTP/1.1\r\nHost: acme.localhost\r\nTE: trailers\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(raw.as_bytes()).expect("send");
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn response_trailers_reach_an_http1_client_only_as_fields_a_trailer_may_carry() {
    let shard = Shard::start(framed);
    let gw = gateway(&shard, "");
    let answer = raw_answer(&gw, "/trailers");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let trailer = answer.split("\r\n0\r\n").nth(1).unwrap_or_default();
    if common::fast_path_on() {
        // (Pingora's path drops a shard's trailers altogether.)
        assert_eq!(trailer, "X-Sum: 1\r\n\r\n", "{answer}");
    }
    assert!(!answer.contains("stolen") && !answer.contains("Content-Length: 40"));
    let answer = raw_answer(&gw, "/bad-trailers");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(answer.matches("HTTP/1.1").count(), 1, "{answer}");
    assert!(!answer.contains("folded"), "{answer}");
}

#[test]
fn a_204_carries_no_framing_field() {
    let shard = Shard::start(framed);
    let gw = gateway(&shard, "");
    let r = send(
        &gw,
        "GET /no-content HTTP/1.1\r\nHost: acme.localhost\r\n\r\n",
    );
    assert_eq!((r.status, r.header("x-kind")), (204, Some("empty")));
    assert_eq!(r.header("content-length"), None, "{:?}", r.headers);
    assert_eq!(r.header("transfer-encoding"), None, "{:?}", r.headers);
}

fn connect(gw: &Gateway) -> (TcpStream, BufReader<TcpStream>) {
    let stream = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).ok();
    let reader = BufReader::new(stream.try_clone().expect("clone"));
    (stream, reader)
}
