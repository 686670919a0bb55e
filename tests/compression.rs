//! Response compression (DESIGN §10): bodies a shard did not encode, of a
//! listed type and size, go to a client that accepts gzip, brotli or zstd
//! compressed as they stream, decoded here by real decoders (and curl's);
//! the exclusions are left as the shard sent them. (scripts/test.sh runs
//! these on both transports.)

mod common;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An HTML page of about 9 KiB.
fn page() -> Vec<u8> {
    (0..200)
        .map(|i| format!("<li class=\"entry\">item {i} of the page</li>\n"))
        .collect::<String>()
        .into_bytes()
}

const FIRST: &str = "first part of a streamed body, sent before the rest is made\n";

/// A shard whose answers depend on the path (see each arm). `/stream`
/// sends its first chunk, then waits for `go` before the rest.
struct Shard {
    port: u16,
    go: Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>>,
    _stop: tokio::sync::watch::Sender<()>,
}

impl Shard {
    fn start() -> Shard {
        let go: Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>> = Arc::default();
        let slot = Arc::clone(&go);
        let (port, stop) = serve_each(0, move |tcp| serve(tcp, Arc::clone(&slot)));
        Shard {
            port,
            go,
            _stop: stop,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Lets `/stream` send the rest of its body.
    fn release(&self) {
        if let Some(go) = self.go.lock().expect("lock").take() {
            let _ = go.send(());
        }
    }
}

async fn serve(
    mut tcp: tokio::net::TcpStream,
    go: Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>>,
) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tcp.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
    let body = page();
    let fixed = |status: &str, fields: &str, body: &[u8]| {
        let mut out = format!(
            "HTTP/1.1 {status}\r\n{fields}Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body);
        out
    };
    let answer = match path.as_str() {
        "/page" => fixed(
            "200 OK",
            "Content-Type: text/html; charset=utf-8\r\nETag: \"v1\"\r\nAccept-Ranges: bytes\r\nVary: Origin\r\n",
            &body,
        ),
        "/small" => fixed("200 OK", "Content-Type: text/html\r\n", &body[..100]),
        "/image" => fixed("200 OK", "Content-Type: image/png\r\n", &body),
        "/encoded" => fixed("200 OK", "Content-Type: text/html\r\nContent-Encoding: br\r\n", &body),
        "/no-transform" => fixed(
            "200 OK",
            "Content-Type: text/html\r\nCache-Control: public, no-transform\r\n",
            &body,
        ),
        "/partial" => fixed(
            "206 Partial Content",
            "Content-Type: text/html\r\nContent-Range: bytes 0-99/9000\r\n",
            &body[..100],
        ),
        "/none" => b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n".to_vec(),
        "/identity" => fixed("200 OK", "Content-Type: text/html\r\nContent-Encoding: identity\r\n", &body),
        // No length, no chunks: the body ends with the shard's close.
        "/close" => {
            let mut out = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n\r\n".to_vec();
            out.extend_from_slice(&body);
            out
        }
        "/stream" => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            *go.lock().expect("lock") = Some(tx);
            let start = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{FIRST}\r\n",
                FIRST.len()
            );
            if tcp.write_all(start.as_bytes()).await.is_err() {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_secs(20), rx).await;
            let rest = String::from_utf8_lossy(&body).to_string();
            format!("{:x}\r\n{rest}\r\n0\r\n\r\n", rest.len()).into_bytes()
        }
        _ => fixed("404 Not Found", "Content-Type: text/plain\r\n", b"no such page"),
    };
    let _ = tcp.write_all(&answer).await;
    let _ = tcp.shutdown().await;
}

fn gateway(shard: &Shard, compression: &str) -> Gateway {
    let extra = format!("compression: {compression}\n");
    gateway_with_fields(&[("a", shard.url(), "weight: 1")], &extra)
}

fn get(gw: &Gateway, path: &str, fields: &str) -> Response {
    gw.send(&format!(
        "GET {path} HTTP/1.1\r\nHost: t.localhost\r\n{fields}Connection: close\r\n\r\n"
    ))
}

fn decode(coding: &str, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        "gzip" => flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut out)
            .map(|_| ()),
        "br" => brotli::Decompressor::new(bytes, 4096)
            .read_to_end(&mut out)
            .map(|_| ()),
        "zstd" => zstd::stream::copy_decode(bytes, &mut out),
        other => panic!("no decoder for {other}"),
    }
    .unwrap_or_else(|e| panic!("{coding} does not decode: {e}"));
    out
}

#[test]
fn each_coding_decodes_to_the_shards_body() {
    let shard = Shard::start();
    let gw = gateway(&shard, "{ algorithms: [zstd, br, gzip] }");
    for coding in ["gzip", "br", "zstd"] {
        let r = get(&gw, "/page", &format!("Accept-Encoding: {coding}\r\n"));
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-encoding"), Some(coding));
        assert_eq!(r.header("content-length"), None);
        assert_eq!(r.header("transfer-encoding"), Some("chunked"));
        assert_eq!(
            r.header("accept-ranges"),
            None,
            "ranges of the shard's bytes"
        );
        assert_eq!(r.header("etag"), Some("W/\"v1\""));
        let vary: Vec<&str> = (r.headers.iter())
            .filter(|(n, _)| n.eq_ignore_ascii_case("vary"))
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(vary, ["Origin", "Accept-Encoding"]);
        assert!(
            r.body.len() * 4 < page().len(),
            "{coding}: {} bytes",
            r.body.len()
        );
        assert_eq!(decode(coding, &r.body), page(), "{coding}");
        // HTTP/1.0: no chunks, the body ends with the connection.
        let old = gw.send(&format!(
            "GET /page HTTP/1.0\r\nHost: t.localhost\r\nAccept-Encoding: {coding}\r\n\r\n"
        ));
        assert_eq!(
            (
                old.header("content-length"),
                old.header("transfer-encoding")
            ),
            (None, None)
        );
        assert_eq!(decode(coding, &old.body), page(), "{coding} to HTTP/1.0");
        // A body the shard ended with its close, and one it called
        // `identity` (that coding is replaced, not listed beside).
        for path in ["/close", "/identity"] {
            let r = get(&gw, path, &format!("Accept-Encoding: {coding}\r\n"));
            let codings: Vec<&str> = (r.headers.iter())
                .filter(|(n, _)| n.eq_ignore_ascii_case("content-encoding"))
                .map(|(_, v)| v.as_str())
                .collect();
            assert_eq!(codings, [coding], "{path}");
            assert_eq!(decode(coding, &r.body), page(), "{coding} {path}");
        }
    }
}

#[test]
fn the_clients_weights_then_the_configured_order_choose() {
    let shard = Shard::start();
    let gw = gateway(&shard, "{ algorithms: [br, gzip] }");
    let coding = |accept: &str| {
        let r = get(&gw, "/page", &format!("Accept-Encoding: {accept}\r\n"));
        assert_eq!(r.status, 200);
        r.header("content-encoding").map(str::to_string)
    };
    assert_eq!(coding("gzip, deflate, br, zstd").as_deref(), Some("br"));
    assert_eq!(coding("gzip, br;q=0.5").as_deref(), Some("gzip"));
    assert_eq!(coding("zstd").as_deref(), None, "not configured");
    // Not compressed for this client, but another would get it so.
    let plain = get(&gw, "/page", "Accept-Encoding: identity\r\n");
    assert_eq!(
        plain.header("content-length"),
        Some(page().len().to_string().as_str())
    );
    assert_eq!(plain.header("etag"), Some("\"v1\""));
    assert!(plain
        .headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("vary") && v == "Accept-Encoding"));
    assert_eq!(plain.body, page());
}

#[test]
fn what_must_not_be_compressed_is_not() {
    let shard = Shard::start();
    let gw = gateway(&shard, "{ min_bytes: 1024 }");
    let accept = "Accept-Encoding: gzip, br, zstd\r\n";
    for path in ["/small", "/image", "/no-transform", "/partial"] {
        let r = get(&gw, path, accept);
        assert_eq!(r.header("content-encoding"), None, "{path}");
        assert!(r.header("content-length").is_some(), "{path}");
    }
    let encoded = get(&gw, "/encoded", accept);
    assert_eq!(
        encoded.header("content-encoding"),
        Some("br"),
        "the shard's own"
    );
    assert_eq!(encoded.body, page(), "passed as it came");
    let none = get(&gw, "/none", accept);
    assert_eq!((none.status, none.header("content-encoding")), (204, None));
    let mut stream = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    let request =
        format!("HEAD /page HTTP/1.1\r\nHost: t.localhost\r\n{accept}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("write");
    let head = read_response_to(&mut BufReader::new(stream), true).expect("an answer to HEAD");
    assert_eq!(head.header("content-encoding"), None);
    assert_eq!(
        head.header("content-length"),
        Some(page().len().to_string().as_str())
    );
    // Compression off: nothing changes, not even `Vary`.
    let off = gateway_with_fields(&[("a", shard.url(), "weight: 1")], "");
    let r = get(&off, "/page", accept);
    assert_eq!(
        (r.header("content-encoding"), r.header("vary")),
        (None, Some("Origin"))
    );
}

/// Asks for `/stream` (gzip) and reads the response head (lowercased);
/// the body is left to read.
fn open_stream(gw: &Gateway) -> (BufReader<TcpStream>, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(15))).ok();
    let request = "GET /stream HTTP/1.1\r\nHost: t.localhost\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).expect("write");
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    while !head.ends_with("\r\n\r\n") {
        let read = reader.read_line(&mut head).expect("head");
        assert!(read > 0, "closed before the head ended: {head}");
    }
    (reader, head.to_ascii_lowercase())
}

#[test]
fn a_streamed_body_arrives_compressed_as_it_is_made() {
    let shard = Shard::start();
    let gw = gateway(&shard, "{ algorithms: [gzip] }");
    let (mut reader, head) = open_stream(&gw);
    assert!(!head.contains("content-length"), "{head}");
    let mut line = String::new();
    // Chunks until the first part decodes: the shard holds the rest
    // until then, so a gateway that waited for the body would never get
    // here (the read times out).
    let mut sent = Vec::new();
    let mut decoded = Vec::new();
    while !String::from_utf8_lossy(&decoded).contains(FIRST) {
        line.clear();
        reader
            .read_line(&mut line)
            .expect("a chunk's size before the rest is made");
        let size = usize::from_str_radix(line.trim(), 16).expect("chunk size");
        assert!(size > 0, "the body ended before its first part decoded");
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk).expect("chunk");
        sent.extend_from_slice(&chunk[..size]);
        decoded.clear();
        // An unended stream: the decoder gives what it has, then says so.
        let _ = flate2::read::GzDecoder::new(&sent[..]).read_to_end(&mut decoded);
    }
    shard.release();
    // The rest, then the whole body decodes (its end included).
    loop {
        line.clear();
        reader.read_line(&mut line).expect("a chunk's size");
        let size = usize::from_str_radix(line.trim(), 16).expect("chunk size");
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk).expect("chunk");
        if size == 0 {
            break;
        }
        sent.extend_from_slice(&chunk[..size]);
    }
    let whole = decode("gzip", &sent);
    assert_eq!(whole, [FIRST.as_bytes(), &page()].concat());
}

#[test]
fn curl_decodes_each_coding_over_http2_too() {
    let shard = Shard::start();
    let gw = gateway(&shard, "{ algorithms: [zstd, br, gzip] }");
    for (coding, http) in [
        ("gzip", "--http1.1"),
        ("br", "--http2-prior-knowledge"),
        ("zstd", "--http2-prior-knowledge"),
    ] {
        let out = Command::new("curl")
            .args([
                "-s",
                "--compressed",
                http,
                "-H",
                &format!("Accept-Encoding: {coding}"),
            ])
            .args(["-H", "Host: t.localhost", "-D", "-"])
            .arg(format!("http://127.0.0.1:{}/page", gw.port))
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (head, body) = text.split_once("\r\n\r\n").expect("a head");
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("content-encoding: {coding}")),
            "{head}"
        );
        assert_eq!(body.as_bytes(), page(), "{coding} over {http}");
    }
}

#[test]
fn past_max_streams_bodies_go_as_they_are() {
    let shard = Shard::start();
    let gw = gateway(&shard, "{ algorithms: [gzip], max_streams: 1 }");
    // A streamed body holds the one stream while the shard makes it.
    let (mut reader, head) = open_stream(&gw);
    assert!(
        head.contains("content-encoding: gzip"),
        "the first body takes the stream"
    );
    let meanwhile = get(&gw, "/page", "Accept-Encoding: gzip\r\n");
    assert_eq!(meanwhile.header("content-encoding"), None, "no stream left");
    assert_eq!(meanwhile.header("vary"), Some("Origin"));
    assert!(meanwhile
        .headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("vary") && v == "Accept-Encoding"));
    assert_eq!(meanwhile.body, page());
    shard.release();
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).expect("the rest");
    // The stream is given back with the body's end.
    assert!(eventually(Duration::from_secs(5), || {
        get(&gw, "/page", "Accept-Encoding: gzip\r\n").header("content-encoding") == Some("gzip")
    }));
}
