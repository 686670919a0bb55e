//! HTTP/2 to shards on the fast transport (DESIGN §8;
//! `src/proxy/upstream/h2.rs`, `h2_stream.rs`): many calls on a few
//! pooled connections, streams the shard did not process sent again,
//! GOAWAY and restarts, bodies and trailers between an HTTP/1.1 client and
//! an HTTP/2 shard, TLS and ALPN, idle connections closed, and the bounds
//! a hostile shard meets (its frames written by hand).

mod common;

use bytes::Bytes;
use common::gateway_with_fields as gateway;
use common::*;
use h2::server::SendResponse;
use h2::{Reason, RecvStream};
use http::Request;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::{rustls, TlsAcceptor};

/// What an HTTP/2 shard saw: its connections (TCP ones without a
/// handshake, such as the health checks' connects, are none), and each
/// stream's path, body and `x-checksum` trailer (empty if it reset it).
#[derive(Default)]
struct Seen {
    opened: AtomicUsize,
    ended: AtomicUsize,
    streams: Mutex<Vec<[String; 3]>>,
}

/// An HTTP/2 shard (the `h2` crate's server, cleartext or TLS); it and
/// its connections stop when dropped. It refuses the first `/refused`
/// stream (`REFUSED_STREAM`) and resets every `/internal` one
/// (`INTERNAL_ERROR`); it answers the others, once their body came and
/// `delay` passed, 200 with the request's `:scheme` as the body and an
/// `x-answer-sum: 7` trailer.
struct H2Shard {
    url: String,
    seen: Arc<Seen>,
    _stop: watch::Sender<()>,
}

impl H2Shard {
    fn start(delay: Duration) -> H2Shard {
        H2Shard::serve(0, None, usize::MAX, delay)
    }

    /// On `port` (0: any); each connection sends a graceful GOAWAY once
    /// it took `goaway_after` requests.
    fn serve(port: u16, tls: Option<TlsAcceptor>, goaway_after: usize, delay: Duration) -> H2Shard {
        let seen = Arc::<Seen>::default();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let shared = Arc::clone(&seen);
        let (port, _stop) = serve_each(port, move |tcp| {
            let (tls, seen) = (tls.clone(), Arc::clone(&shared));
            async move {
                let io: Box<dyn TunnelIo> = match tls {
                    None => Box::new(tcp),
                    Some(tls) => match tls.accept(tcp).await {
                        Ok(io) => Box::new(io),
                        Err(_) => return,
                    },
                };
                let Ok(mut conn) = h2::server::handshake(io).await else {
                    return;
                };
                seen.opened.fetch_add(1, SeqCst);
                let mut taken = 0;
                while let Some(Ok((call, respond))) = conn.accept().await {
                    taken += 1;
                    if taken == goaway_after {
                        conn.graceful_shutdown();
                    }
                    tokio::spawn(answer(call, respond, Arc::clone(&seen), delay));
                }
                seen.ended.fetch_add(1, SeqCst);
            }
        });
        let url = format!("{scheme}://127.0.0.1:{port}");
        H2Shard { url, seen, _stop }
    }

    fn opened(&self) -> usize {
        self.seen.opened.load(SeqCst)
    }

    fn streams(&self) -> Vec<[String; 3]> {
        self.seen.streams.lock().unwrap().clone()
    }
}

type Call = Request<RecvStream>;

/// An [`H2Shard`]'s answer to one request.
async fn answer(call: Call, mut respond: SendResponse<Bytes>, seen: Arc<Seen>, delay: Duration) {
    let record = |stream: [String; 3]| seen.streams.lock().unwrap().push(stream);
    let path = call.uri().path().to_string();
    let scheme = call.uri().scheme_str().unwrap_or_default().to_string();
    let again = seen.streams.lock().unwrap().iter().any(|s| s[0] == path);
    let reset = match path.as_str() {
        "/refused" if !again => Some(Reason::REFUSED_STREAM),
        "/internal" => Some(Reason::INTERNAL_ERROR),
        _ => None,
    };
    if let Some(reason) = reset {
        record([path, String::new(), String::new()]);
        return respond.send_reset(reason);
    }
    if path == "/early" {
        return answer_early(respond).await;
    }
    let mut body = call.into_body();
    let mut data = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.ok().flatten().unwrap_or_default();
    let checksum = trailers.get("x-checksum").and_then(|v| v.to_str().ok());
    let data = String::from_utf8_lossy(&data).into();
    record([path, data, checksum.unwrap_or("").into()]);
    tokio::time::sleep(delay).await;
    let Ok(mut send) = respond.send_response(http::Response::new(()), false) else {
        return;
    };
    let _ = send.send_data(Bytes::from(scheme), false);
    let mut fields = http::HeaderMap::new();
    fields.insert("x-answer-sum", http::HeaderValue::from_static("7"));
    let _ = send.send_trailers(fields);
}

/// An answer before the request's body: 200 KiB and a trailer, then the
/// request's side reset with `NO_ERROR` (as hyper and tonic servers do:
/// "the rest of your body is not needed").
async fn answer_early(mut respond: SendResponse<Bytes>) {
    let Ok(mut send) = respond.send_response(http::Response::new(()), false) else {
        return;
    };
    let _ = send.send_data(Bytes::from(vec![b'e'; 200 * 1024]), false);
    let mut fields = http::HeaderMap::new();
    fields.insert("x-answer-sum", http::HeaderValue::from_static("7"));
    let _ = send.send_trailers(fields);
    // Once the answer went (a reset would drop what is still queued).
    tokio::time::sleep(Duration::from_millis(300)).await;
    send.send_reset(Reason::NO_ERROR);
}

/// A gateway in front of `shard` alone (as `h2`), with `upstream`'s
/// fields.
fn before(shard: &H2Shard, upstream: &str, extra: &str) -> Gateway {
    let extra = format!("upstream: {{ {upstream} }}\n{extra}");
    gateway(&[("h2", shard.url.clone(), "protocol: h2")], &extra)
}

/// `count` GETs, started `gap` apart, all in flight together: their
/// statuses, and the longest any took.
fn gets_in_flight(gw: &Gateway, count: usize, gap: Duration) -> (Vec<u16>, Duration) {
    let timed = |i: usize| {
        let (started, path) = (Instant::now(), format!("/call/{i}"));
        (gw.get("t.localhost", &path).status, started.elapsed())
    };
    let (statuses, took): (Vec<u16>, Vec<Duration>) = std::thread::scope(|s| {
        let calls: Vec<_> = (0..count)
            .map(|i| {
                std::thread::sleep(gap);
                s.spawn(move || timed(i))
            })
            .collect();
        calls.into_iter().map(|c| c.join().expect("call")).unzip()
    });
    (statuses, took.into_iter().max().unwrap_or_default())
}

/// Many calls in flight share a few connections: 60 calls at once to a
/// shard that answers each after 300 ms, with `pool_per_shard: 2`: every
/// one 200, over at most two connections, in about one answer's time.
#[test]
fn many_calls_in_flight_share_at_most_pool_per_shard_connections() {
    if !fast_path_on() {
        return eprintln!("skipped: the fast transport's HTTP/2 pool");
    }
    let shard = H2Shard::start(Duration::from_millis(300));
    let gw = before(&shard, "pool_per_shard: 2, liveness: false", "");
    let (statuses, longest) = gets_in_flight(&gw, 60, Duration::ZERO);
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert!(longest < Duration::from_secs(3), "together: {longest:?}");
    let opened = shard.opened();
    assert!((1..=2).contains(&opened), "{opened} connections");
}

fn strings<const N: usize>(fields: [&str; N]) -> [String; N] {
    fields.map(String::from)
}

/// A stream the shard refused (`REFUSED_STREAM`: it did not process it,
/// RFC 9113 §8.7) is sent again whatever its method: a POST is answered
/// 200, in two attempts, and the shard got its body. A stream reset for
/// another reason (`INTERNAL_ERROR`) may have been processed: a POST is
/// not sent again (502, one attempt).
#[test]
fn a_refused_stream_is_sent_again_whatever_the_method() {
    if !fast_path_on() {
        return eprintln!("skipped: the fast transport's resending of refused streams");
    }
    let shard = H2Shard::start(Duration::ZERO);
    let log = "log: { access_format: json, access_path: \"{dir}/access.log\" }\n";
    let gw = before(&shard, "liveness: false", log);
    let post = |path: &str| {
        let head = format!("POST {path} HTTP/1.1\r\nHost: t.localhost\r\nContent-Length: 11\r\n");
        gw.send(&format!("{head}Connection: close\r\n\r\nhello world"))
    };
    let answered = [post("/refused"), post("/internal")];
    assert_eq!(answered.map(|r| r.status), [200, 502]);
    let (refused, internal) = (["/refused", "", ""], ["/internal", "", ""]);
    let expected = [refused, ["/refused", "hello world", ""], internal];
    assert_eq!(shard.streams(), expected.map(strings));
    let path = gw.dir.path().join("access.log");
    let read = || std::fs::read_to_string(&path).unwrap_or_default();
    eventually(Duration::from_secs(3), || read().lines().count() >= 2);
    let lines: Vec<serde_json::Value> = read().lines().flat_map(serde_json::from_str).collect();
    let of = |path: &str| {
        let line = lines.iter().find(|l| l["path"] == path);
        line.map(|l| (l["status"].as_u64(), l["attempts"].as_u64()))
    };
    assert_eq!(of("/refused"), Some((Some(200), Some(2))), "{lines:?}");
    assert_eq!(of("/internal"), Some((Some(502), Some(1))), "{lines:?}");
}

/// A shard that goes away gracefully (GOAWAY) after every 5 requests on a
/// connection, 60 calls coming 25 ms apart, each answered after 300 ms:
/// every call is answered 200 at once (one the connection can no longer
/// take goes on a new one), and the shard was reached on new connections
/// as each went away.
#[test]
fn calls_outlive_a_shard_going_away_gracefully() {
    let shard = H2Shard::serve(0, None, 5, Duration::from_millis(300));
    let gw = before(&shard, "liveness: false, headers_timeout_ms: 5000", "");
    let (statuses, longest) = gets_in_flight(&gw, 60, Duration::from_millis(25));
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert!(longest < Duration::from_secs(2), "the longest: {longest:?}");
    assert!(shard.opened() >= 3, "{} connections", shard.opened());
}

/// A shard stopped with calls in flight and started again on its port:
/// the calls in flight end (502: the connection broke) long before any
/// deadline; once the health checks see the shard again (its reset was
/// probed while it was down), calls are answered 200 on a new
/// connection, the broken one never handed out again.
#[test]
fn calls_in_flight_end_when_the_shard_restarts() {
    let (port, mut again) = (free_port(), None);
    let shard = H2Shard::serve(port, None, usize::MAX, Duration::from_secs(2));
    let gw = before(&shard, "liveness: false", "health: { interval_ms: 200 }\n");
    let (in_flight, longest) = std::thread::scope(|s| {
        let calls = s.spawn(|| gets_in_flight(&gw, 10, Duration::ZERO));
        std::thread::sleep(Duration::from_millis(500));
        drop(shard);
        again = Some(H2Shard::serve(port, None, usize::MAX, Duration::ZERO));
        calls.join().expect("calls")
    });
    let ended = in_flight.iter().all(|s| [200, 502].contains(s));
    assert!(ended, "{in_flight:?}");
    assert!(longest < Duration::from_secs(3), "{longest:?}");
    let healthy = eventually(Duration::from_secs(5), || gw.shard_healthy("h2"));
    assert!(healthy, "the shard is healthy again");
    let (after, _) = gets_in_flight(&gw, 5, Duration::ZERO);
    assert_eq!(after, [200; 5]);
}

/// An HTTP/1.1 client and an HTTP/2 shard exchange bodies and trailers
/// both ways: a chunked POST's trailer section (its body still coming
/// after the head) becomes the stream's trailing HEADERS, and the shard's
/// trailers the chunked response's trailer section.
#[test]
fn trailers_pass_between_an_http1_client_and_an_http2_shard() {
    if !fast_path_on() {
        return eprintln!("skipped: the fast transport's trailers (Pingora's path drops them)");
    }
    let shard = H2Shard::start(Duration::ZERO);
    let gw = before(&shard, "liveness: false", "");
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let head = "POST /up HTTP/1.1\r\nHost: t.localhost\r\nTransfer-Encoding: chunked\r\nTE: trailers\r\nConnection: close\r\n\r\n5\r\nhello\r\n";
    tcp.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let rest = b"6\r\n world\r\n0\r\nx-checksum: 42\r\n\r\n";
    tcp.write_all(rest).unwrap();
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    assert!(answer.starts_with("http/1.1 200"), "{answer}");
    for part in ["transfer-encoding: chunked\r\n", "\r\nhttp\r\n"] {
        assert!(answer.contains(part), "{part:?} in {answer}");
    }
    let trailer = "\r\n0\r\nx-answer-sum: 7\r\n\r\n";
    assert!(answer.ends_with(trailer), "{answer}");
    assert_eq!(shard.streams(), [strings(["/up", "hello world", "42"])]);
}

/// A shard that answers before the body ended, then resets the request's
/// side (`NO_ERROR`): the client still gets the whole answer and its
/// trailers (on Pingora's path, which forwards no response trailers, the
/// whole answer), though the rest of its body can no longer go up (a
/// review finding: that failed write once threw away the response it was
/// reading).
#[test]
fn an_early_answer_is_relayed_whole_after_the_shard_stops_the_upload() {
    let shard = H2Shard::start(Duration::ZERO);
    let gw = before(&shard, "liveness: false", "");
    // A small receive buffer: the answer waits in the gateway (in the
    // stream's window) while the client sends the rest of its body.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", gw.port).parse().unwrap();
    socket.connect(&addr.into()).expect("connect");
    let mut tcp: std::net::TcpStream = socket.into();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let head = "POST /early HTTP/1.1\r\nHost: t.localhost\r\nTransfer-Encoding: chunked\r\nTE: trailers\r\nConnection: close\r\n\r\n5\r\nhello\r\n";
    tcp.write_all(head.as_bytes()).unwrap();
    // The answer's head, then more body while its data is on its way.
    let mut first = [0u8; 300];
    let n = tcp.read(&mut first).expect("the answer starts");
    assert!(
        first[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first[..n])
    );
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..20 {
        let _ = tcp.write_all(b"400\r\n");
        let _ = tcp.write_all(&[b'x'; 1024]);
        let _ = tcp.write_all(b"\r\n");
    }
    let _ = tcp.write_all(b"0\r\n\r\n");
    let mut answer = first[..n].to_vec();
    let _ = tcp.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    // Pingora's path forwards no response trailers (security-and-bounds.md):
    // there the answer ends with an empty trailer section, whole all the same.
    let end = match fast_path_on() {
        true => "\r\n0\r\nx-answer-sum: 7\r\n\r\n",
        false => "\r\n0\r\n\r\n",
    };
    assert!(
        answer.ends_with(end),
        "{}",
        &answer[answer.len().saturating_sub(200)..]
    );
    let body: usize = answer.bytes().filter(|&b| b == b'e').count();
    assert!(body >= 200 * 1024, "{body} bytes of the body");
}

// Frame types and flags (RFC 9113 §6).
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const ACK: u8 = 0x1;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A frame's type, flags, stream and payload.
async fn read_frame(r: &mut (impl AsyncRead + Unpin)) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head).await?;
    let mut payload = vec![0; u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize];
    r.read_exact(&mut payload).await?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Ok((head[3], head[4], stream, payload))
}

/// How a hostile shard misbehaves once the gateway sent it a request.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Misbehaviour {
    /// HEADERS without END_HEADERS, then CONTINUATION frames without end.
    EndlessHead,
    PingFlood,
    SettingsFlood,
}

/// What a hostile shard saw of the gateway.
#[derive(Clone, Debug, Default)]
struct Observed {
    /// Frames of the misbehaviour written (not all read, maybe).
    sent: usize,
    /// A write waited: the gateway stopped reading (its answers unread).
    stalled: bool,
    /// PING or SETTINGS acknowledgements.
    answers: usize,
    goaway: Option<u32>,
    closed: bool,
}

/// A fake HTTP/2 shard over raw TCP, misbehaving; stopped when dropped.
struct Hostile {
    url: String,
    seen: Arc<Mutex<Observed>>,
    _stop: watch::Sender<()>,
}

impl Hostile {
    fn start(how: Misbehaviour) -> Hostile {
        let seen = Arc::<Mutex<Observed>>::default();
        let shared = Arc::clone(&seen);
        let (port, _stop) = serve_each(0, move |tcp| misbehave(tcp, how, Arc::clone(&shared)));
        let url = format!("http://127.0.0.1:{port}");
        Hostile { url, seen, _stop }
    }

    fn observed(&self) -> Observed {
        self.seen.lock().unwrap().clone()
    }
}

/// Reads what the gateway sends, a second after it starts (its answers
/// unread meanwhile), until it closes.
async fn watch_gateway(read: OwnedReadHalf, seen: Arc<Mutex<Observed>>) {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut read = tokio::io::BufReader::new(read);
    while let Ok((kind, flags, _, payload)) = read_frame(&mut read).await {
        let mut seen = seen.lock().unwrap();
        match (kind, flags) {
            (PING, ACK) | (SETTINGS, ACK) => seen.answers += 1,
            (GOAWAY, _) => seen.goaway = payload[4..8].try_into().ok().map(u32::from_be_bytes),
            _ => {}
        }
    }
    seen.lock().unwrap().closed = true;
}

/// Takes the gateway's preface, sends SETTINGS, acknowledges its SETTINGS
/// and PINGs, then misbehaves as `how` says on its first request for 3 s
/// (a million frames at most); after a flood, answers the request 200 (if
/// the connection still stands). The connection stands until the gateway
/// closes it.
async fn misbehave(mut tcp: TcpStream, how: Misbehaviour, seen: Arc<Mutex<Observed>>) {
    let mut preface = [0u8; 24];
    let _ = tcp.read_exact(&mut preface).await;
    let _ = tcp.write_all(&frame(SETTINGS, 0, 0, &[])).await;
    let stream = loop {
        let _ = match read_frame(&mut tcp).await {
            Ok((HEADERS, _, stream, _)) => break stream,
            Ok((SETTINGS, 0, _, _)) => tcp.write_all(&frame(SETTINGS, ACK, 0, &[])).await,
            Ok((PING, 0, _, data)) => tcp.write_all(&frame(PING, ACK, 0, &data)).await,
            Ok(_) => Ok(()),
            Err(_) => return,
        };
    };
    let (read, mut write) = tcp.into_split();
    let watching = tokio::spawn(watch_gateway(read, Arc::clone(&seen)));
    let (one, per_batch) = match how {
        // `:status: 200`, then fields `x-a: b` (literal, new name).
        Misbehaviour::EndlessHead => {
            let _ = write.write_all(&frame(HEADERS, 0, stream, &[0x88])).await;
            let fields = b"\x00\x03x-a\x01b".repeat(100);
            (frame(CONTINUATION, 0, stream, &fields), 1)
        }
        Misbehaviour::PingFlood => (frame(PING, 0, 0, b"hostile!"), 1000),
        Misbehaviour::SettingsFlood => (frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0xff, 0xff]), 1000),
    };
    let batch = one.repeat(per_batch);
    let (ends, mut flooded) = (Instant::now() + Duration::from_secs(3), Ok(()));
    while flooded.is_ok() && Instant::now() < ends && seen.lock().unwrap().sent < 1_000_000 {
        let started = Instant::now();
        flooded = write.write_all(&batch).await;
        let mut seen = seen.lock().unwrap();
        seen.stalled |= started.elapsed() > Duration::from_millis(200);
        seen.sent += per_batch;
    }
    if flooded.is_ok() && how != Misbehaviour::EndlessHead {
        let answer = frame(HEADERS, END_HEADERS | END_STREAM, stream, &[0x88]);
        let _ = write.write_all(&answer).await;
    }
    let _ = watching.await;
}

/// A gateway in front of a healthy HTTP/1.1 shard (tenant `good`) and a
/// hostile HTTP/2 one (tenant `evil`).
fn beside_a_good_shard(evil: &Hostile, good: &Backend) -> Gateway {
    gateway(
        &[
            ("good", good.url(), "tenants: [good]"),
            ("evil", evil.url.clone(), "protocol: h2, tenants: [evil]"),
        ],
        "upstream: { liveness: false, headers_timeout_ms: 10000 }\n",
    )
}

/// A response head without end (HEADERS without END_HEADERS, then
/// CONTINUATION frames without end) is cut off: the client gets 502
/// within seconds (not the headers deadline's 504 after 10 s), the
/// gateway closes the connection, and it serves another shard afterwards.
#[test]
fn a_response_head_without_end_is_cut_off() {
    let evil = Hostile::start(Misbehaviour::EndlessHead);
    let good = Backend::start("good");
    let gw = beside_a_good_shard(&evil, &good);
    let started = Instant::now();
    let r = gw.get("evil.localhost", "/");
    let took = started.elapsed();
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(took < Duration::from_secs(3), "{took:?}");
    let closed = eventually(Duration::from_secs(3), || evil.observed().closed);
    assert!(closed, "{:?}", evil.observed());
    assert_eq!(gw.get("good.localhost", "/").status, 200);
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix(" kB"));
    rss.and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// While a hostile shard floods the gateway, its good shard is asked
/// every 50 ms: the slowest answer, the gateway's RSS growth (KiB), the
/// status of the request to the hostile shard, and what that shard saw.
fn under_flood(how: Misbehaviour) -> (Duration, u64, u16, Observed) {
    let (good, evil) = (Backend::start("good"), Hostile::start(how));
    let gw = beside_a_good_shard(&evil, &good);
    assert_eq!(gw.get("good.localhost", "/").status, 200);
    let rss_before = rss_kib(gw.pid());
    let (mut slowest, mut rss_most) = (Duration::ZERO, rss_before);
    let status = std::thread::scope(|s| {
        let evil_call = s.spawn(|| gw.get("evil.localhost", "/").status);
        let ends = Instant::now() + Duration::from_secs(15);
        while !evil_call.is_finished() && Instant::now() < ends {
            let asked = Instant::now();
            assert_eq!(gw.get("good.localhost", "/").status, 200);
            slowest = slowest.max(asked.elapsed());
            rss_most = rss_most.max(rss_kib(gw.pid()));
            std::thread::sleep(Duration::from_millis(50));
        }
        evil_call.join().expect("the hostile shard's call")
    });
    let _ = eventually(Duration::from_secs(5), || evil.observed().closed);
    (slowest, rss_most - rss_before, status, evil.observed())
}

/// A PING flood and a SETTINGS flood (up to a million frames each, their
/// answers left unread a while) leave the gateway responsive to the other
/// shards' clients, and its memory bounded; the flooding shard is cut off
/// once its credit for frames carrying nothing runs out (10 000, see
/// `wire::h2_frames`), its call failed (502).
#[test]
fn floods_leave_the_gateway_responsive_and_bounded() {
    if !fast_path_on() {
        return eprintln!(
            "skipped: Pingora's own path to h2 shards is not watched for floods (security-and-bounds.md)"
        );
    }
    for how in [Misbehaviour::PingFlood, Misbehaviour::SettingsFlood] {
        let (slowest, grown, status, seen) = under_flood(how);
        eprintln!("{how:?}: slowest {slowest:?}, RSS +{grown} KiB, the call {status}, {seen:?}");
        assert!(seen.sent >= 10_000, "{how:?}: {seen:?}");
        assert!(slowest < Duration::from_secs(1), "{how:?}: {slowest:?}");
        assert!(grown < 50 * 1024, "{how:?}: RSS grew {grown} KiB");
        assert_eq!(status, 502, "{how:?}");
        assert!(seen.closed, "{how:?}: not cut off: {seen:?}");
        // 10 000 credits, and 100 a second (a 502 comes within the
        // headers deadline, 10 s).
        assert!(seen.answers < 12_000, "{how:?}: {seen:?}");
    }
}

/// A TLS acceptor for `cert` offering `alpn`.
fn tls_offering(cert: &rcgen::CertifiedKey, alpn: &[&[u8]]) -> TlsAcceptor {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.key_pair.serialize_der());
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key.expect("key"))
        .expect("tls config");
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsAcceptor::from(Arc::new(config))
}

/// An HTTPS shard in HTTP/1.1 only (hyper), answering with the request's
/// version; its URL, and its stop.
fn http1_tls_shard(tls: TlsAcceptor) -> (String, watch::Sender<()>) {
    use hyper::service::service_fn;
    let (port, stop) = serve_each(0, move |tcp| {
        let tls = tls.clone();
        async move {
            let Ok(io) = tls.accept(tcp).await else {
                return;
            };
            let service = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                let body = http_body_util::Full::new(Bytes::from(format!("{:?}", req.version())));
                Ok::<_, std::convert::Infallible>(hyper::Response::new(body))
            });
            let io = hyper_util::rt::TokioIo::new(io);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        }
    });
    (format!("https://127.0.0.1:{port}"), stop)
}

/// `https` shards: an `h2` one (ALPN `h2`) gets the request over HTTP/2
/// (`:scheme` https), an `auto` one whose server offers only `http/1.1`
/// through ALPN gets it over HTTP/1.1; both answered 200.
#[test]
fn https_shards_are_spoken_to_as_alpn_chose() {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).expect("cert");
    let dir = tempfile::tempdir().expect("dir");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, cert.cert.pem()).expect("ca");
    let tls = Some(tls_offering(&cert, &[b"h2"]));
    let h2 = H2Shard::serve(0, tls, usize::MAX, Duration::ZERO);
    let (http1, _stop) = http1_tls_shard(tls_offering(&cert, &[b"http/1.1"]));
    let gw = gateway(
        &[
            ("h2tls", h2.url.clone(), "protocol: h2, tenants: [a]"),
            ("auto", http1, "protocol: auto, tenants: [b]"),
        ],
        &format!("server: {{ ca_file: \"{}\" }}\n", ca.display()),
    );
    let r = gw.get("a.localhost", "/");
    assert_eq!((r.status, r.text().as_str()), (200, "https"));
    let r = gw.get("b.localhost", "/");
    assert_eq!((r.status, r.text().as_str()), (200, "HTTP/1.1"));
    assert_eq!(h2.opened(), 1);
}

/// An HTTP/2 connection to a shard idle for `upstream.keepalive_timeout_ms`
/// is closed (idle time is counted at the connection's pings, every
/// `liveness.after_ms`), not before; the next call opens another.
#[test]
fn an_idle_http2_connection_to_a_shard_is_closed() {
    let shard = H2Shard::start(Duration::ZERO);
    let upstream = "keepalive_timeout_ms: 1000, liveness: { after_ms: 200 }";
    let gw = before(&shard, upstream, "");
    assert_eq!(gw.get("t.localhost", "/").status, 200);
    let answered = Instant::now();
    let ended = || shard.seen.ended.load(SeqCst) == 1;
    assert!(eventually(Duration::from_secs(5), ended), "closed");
    let idle = answered.elapsed();
    assert!(idle >= Duration::from_millis(700), "closed after {idle:?}");
    assert_eq!(gw.get("t.localhost", "/").status, 200);
    assert_eq!(shard.opened(), 2);
}
