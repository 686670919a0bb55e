//! `GatewayHooks`' request check and response-head edit run on every
//! request, on both transports: the server is built in-process with the
//! builder, as an embedder that only needs hooks would, and each test runs
//! once with the fast transport and once through Pingora's proxy.

mod common;

use common::*;
use http::{HeaderName, HeaderValue};
use pingora::server::RunArgs;
use pingora_proxy::ProxyHttp;
use shardgate::config::Config;
use shardgate::proxy::hooks::{
    BodyCheck, GatewayHooks, RequestCheck, RequestSummary, RequestView, ResponseEdit, UpstreamEdit,
};
use shardgate::proxy::wrap::{GatewayWrapper, WrapperCtx};
use shardgate::routing::ShardId;
use shardgate::server::{Builder, Shardgate};
use std::sync::Arc;
use std::time::Duration;

struct TestHooks;

/// What the logging phase saw, one line per request.
static LOGGED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Fails unless the logging phase saw `line` (within 2 s: it runs as the
/// request ends, after the answer went out).
fn assert_logged(line: &str) {
    let seen = eventually(Duration::from_secs(2), || {
        LOGGED.lock().unwrap().iter().any(|l| l == line)
    });
    assert!(seen, "`{line}` not logged: {:?}", LOGGED.lock().unwrap());
}

impl GatewayHooks for TestHooks {
    fn check_request(&self, tenant: &str, request: &RequestView<'_>) -> RequestCheck {
        if request.header("x-forbidden").is_some() {
            return RequestCheck::Refuse {
                status: 451,
                body: format!("{{\"error\":\"forbidden\",\"tenant\":\"{tenant}\"}}"),
            };
        }
        if request.path.starts_with("/nocontent") {
            return RequestCheck::Answer {
                status: 204,
                fields: Vec::new(),
                body: "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_string(),
            };
        }
        if request.path.starts_with("/answer") {
            let field = |name: &'static str, value: &'static str| {
                (
                    HeaderName::from_static(name),
                    HeaderValue::from_static(value),
                )
            };
            return RequestCheck::Answer {
                status: 202,
                fields: vec![
                    field("content-type", "text/plain"),
                    field("x-answered", "yes"),
                    field("set-cookie", "a=1"),
                    field("set-cookie", "b=2"),
                    field("cache-control", "max-age=5"),
                    // The transports' own: dropped.
                    field("content-length", "999"),
                    field("connection", "upgrade"),
                    field("transfer-encoding", "chunked"),
                ],
                body: format!("answered for {tenant}"),
            };
        }
        if request.path.starts_with("/trace") {
            // An embedder's own span would take these as its parent.
            let seen = match request.trace() {
                Some(t) => format!(
                    "{}-{:016x}-{}",
                    t.trace_id_hex().as_str(),
                    t.span_id,
                    t.sampled
                ),
                None => "none".to_string(),
            };
            return RequestCheck::AddFields(vec![(
                HeaderName::from_static("x-seen-trace"),
                HeaderValue::from_str(&seen).expect("text"),
            )]);
        }
        if request.path.starts_with("/plan") {
            return RequestCheck::AddFields(vec![
                (
                    HeaderName::from_static("x-plan"),
                    HeaderValue::from_static("gold"),
                ),
                // Owned by shardgate: ignored.
                (
                    HeaderName::from_static("x-tenant-id"),
                    HeaderValue::from_static("someone-else"),
                ),
            ]);
        }
        if request.path.starts_with("/edit") {
            return RequestCheck::Edit(
                UpstreamEdit::default()
                    .insert(
                        HeaderName::from_static("x-plan"),
                        HeaderValue::from_static("silver"),
                    )
                    .remove(HeaderName::from_static("x-client-secret"))
                    // shardgate's own: left alone.
                    .remove(HeaderName::from_static("x-tenant-id"))
                    .remove(http::header::HOST)
                    .remove(http::header::CONTENT_LENGTH),
            );
        }
        RequestCheck::Proceed
    }

    fn logging(&self, r: &RequestSummary<'_>) {
        if let Some(trace_id) = r.trace_id {
            LOGGED.lock().unwrap().push(format!("trace {trace_id}"));
        }
        LOGGED.lock().unwrap().push(format!(
            "{} {} status={} tenant={} shard={} decision={} attempts={}",
            r.method,
            r.target,
            r.status,
            r.tenant.unwrap_or("-"),
            r.shard.map_or("-", |s| s.as_str()),
            r.decision.map_or("-", |d| d.as_str()),
            r.attempts,
        ));
    }

    fn edit_response(&self, tenant: &str, shard: &ShardId, response: &mut ResponseEdit) {
        response.insert(
            HeaderName::from_static("x-served"),
            HeaderValue::from_str(&format!("{tenant}@{shard}:{}", response.status()))
                .expect("text"),
        );
        response.remove(HeaderName::from_static("x-internal"));
        // Framing is the transports' to write: an edit of it is refused.
        let framing = [
            response.insert(http::header::CONTENT_LENGTH, HeaderValue::from_static("1")),
            response.insert(
                http::header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            ),
            response.remove(http::header::CONTENT_LENGTH),
            response.insert(http::header::CONNECTION, HeaderValue::from_static("close")),
        ];
        let refused = if framing.iter().any(|&done| done) {
            "no"
        } else {
            "yes"
        };
        response.insert(
            HeaderName::from_static("x-framing-edit-refused"),
            HeaderValue::from_static(refused),
        );
    }
}

/// The in-process server on `backend`, fast transport as the test run
/// says (`SHARDGATE_TEST_FAST_PATH`).
fn start(backend: &Backend) -> u16 {
    start_with(backend, "")
}

/// [`start`] with `extra` configuration.
fn start_with(backend: &Backend, extra: &str) -> u16 {
    start_on(backend.url(), extra)
}

/// The in-process server on the shard at `url`, with `extra`
/// configuration.
fn start_on(url: String, extra: &str) -> u16 {
    serve(url, extra, |builder| {
        builder.hooks(Arc::new(TestHooks)).build()
    })
}

/// The server `build` makes of a builder on the shard at `url` (fast
/// transport as the test run says), with `extra` configuration, running.
fn serve(
    url: String,
    extra: &str,
    build: impl FnOnce(Builder) -> Result<Shardgate, String>,
) -> u16 {
    serve_listening(None, &[("a", url)], extra, build)
}

/// [`serve`], its listener TLS with the certificate `edge` in `certs` if
/// given.
fn serve_listening(
    certs: Option<&std::path::Path>,
    shards: &[(&str, String)],
    extra: &str,
    build: impl FnOnce(Builder) -> Result<Shardgate, String>,
) -> u16 {
    let port = free_port();
    let (tls, tls_section) = match certs {
        Some(dir) => (
            ", tls: true",
            format!(
                "tls: {{ certs: \"{}\", default_cert: edge }}\n",
                dir.display()
            ),
        ),
        None => ("", String::new()),
    };
    let yaml = config_yaml(
        &format!(
            "listen: [{{ addr: \"127.0.0.1:{port}\"{tls} }}]\nadmin: {{ addr: \"127.0.0.1:{}\" }}\nstate: false\n\
             server: {{ fast_path: {} }}\n{tls_section}",
            free_port(),
            fast_path_on()
        ),
        shards,
        extra,
    );
    let config = Config::parse(&yaml, None).expect("config");
    let gateway = build(Shardgate::builder(config)).expect("build");
    std::thread::spawn(move || gateway.server.run(RunArgs::default()));
    assert!(eventually(Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    }));
    port
}

#[test]
fn a_request_check_refuses_before_routing_on_both_transports() {
    let a = Backend::with("a", |_| Reply::ok("fine"));
    let port = start(&a);
    let r = send_raw(
        port,
        b"GET / HTTP/1.1\r\nHost: acme.localhost\r\nX-Forbidden: 1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 451);
    assert_eq!(r.json()["tenant"], "acme");
    assert!(r.header("date").is_some());
    assert_eq!(a.count(), 0, "nothing went upstream");
}

#[test]
fn a_request_check_adds_upstream_fields_but_not_owned_ones() {
    let a = Backend::start("a");
    let port = start(&a);
    let r = send_raw(
        port,
        b"GET /plan HTTP/1.1\r\nHost: acme.localhost\r\nX-Plan: client\r\nX_Plan: look-alike\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    let seen = a.requests();
    let req = seen.last().expect("reached the shard");
    assert_eq!(req.header("x-plan"), Some("gold"), "{:?}", req.headers);
    assert_eq!(req.header_count("x-plan"), 1, "the client's is replaced");
    assert_eq!(req.header("x_plan"), None, "and so is its look-alike");
    assert_eq!(req.header_count("x-tenant-id"), 1);
    assert_eq!(req.header("x-tenant-id"), Some("acme"));
}

#[test]
fn a_request_check_removes_upstream_fields_but_not_owned_ones() {
    let a = Backend::start("a");
    let port = start(&a);
    for raw in [
        &b"GET /edit HTTP/1.1\r\nHost: acme.localhost\r\nX-Client-Secret: s\r\nX_Client_Secret: s\r\nX-Kept: k\r\nConnection: close\r\n\r\n"[..],
        b"POST /edit HTTP/1.1\r\nHost: acme.localhost\r\nX-Client-Secret: s\r\nX-Plan: client\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    ] {
        let r = send_raw(port, raw);
        assert_eq!(r.status, 200, "{}", r.text());
        let seen = a.requests();
        let req = seen.last().expect("reached the shard");
        assert_eq!(req.header("x-client-secret"), None, "{:?}", req.headers);
        assert_eq!(req.header("x_client_secret"), None, "look-alike removed too");
        assert_eq!(req.header("x-plan"), Some("silver"));
        assert_eq!(req.header_count("x-plan"), 1);
        assert_eq!(req.header("x-tenant-id"), Some("acme"), "shardgate's own kept");
        assert_eq!(req.header("host"), Some("acme.localhost"));
        if req.method == "POST" {
            assert_eq!(req.body, b"hi", "the body's framing kept");
        } else {
            assert_eq!(req.header("x-kept"), Some("k"));
        }
    }
}

/// The edit holds for a chunked body's trailers too: a field it removes
/// does not reach the shard as a trailer either.
#[test]
fn a_field_the_edit_removes_does_not_come_back_as_a_trailer() {
    use std::io::Write;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = Arc::clone(&seen);
    let (url, _) = raw_shard(move |mut conn| {
        let got = read_until(&mut conn, |got| {
            got.windows(5).any(|w| w == b"\r\n0\r\n") && got.ends_with(b"\r\n\r\n")
        });
        // A health probe's connection sends nothing: not a request.
        if got.is_empty() {
            return;
        }
        kept.lock()
            .unwrap()
            .push(String::from_utf8_lossy(&got).to_ascii_lowercase());
        let _ =
            conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    });
    let port = start_on(url, "");
    let r = send_raw(
        port,
        b"POST /edit HTTP/1.1\r\nHost: acme.localhost\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
          5\r\nhello\r\n0\r\nX-Client-Secret: s\r\nX_Client_Secret: s\r\nX-Plan: client\r\nX-Other: o\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = seen.lock().unwrap();
    let request = seen.last().expect("reached the shard");
    assert!(request.contains("hello"), "{request}");
    assert!(!request.contains("client-secret"), "{request}");
    assert!(!request.contains("client_secret"), "{request}");
    assert!(!request.contains("x-plan: client"), "{request}");
}

#[test]
fn a_response_edit_runs_on_every_proxied_response() {
    let a = Backend::with("a", |_| {
        Reply::Full(
            200,
            vec![("x-internal".into(), "secret".into())],
            b"fine".to_vec(),
        )
    });
    let port = start(&a);
    for raw in [
        &b"GET / HTTP/1.1\r\nHost: acme.localhost\r\nConnection: close\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nHost: acme.localhost\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    ] {
        let r = send_raw(port, raw);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-served"), Some("acme@a:200"));
        assert_eq!(r.header("x-internal"), None, "removed by the edit");
        assert_eq!(r.header("x-framing-edit-refused"), Some("yes"));
        assert_eq!(r.header("content-length"), Some("4"), "the shard's framing kept");
        assert_eq!(r.text(), "fine");
    }
}

#[test]
fn the_logging_phase_sees_every_request_refusals_included() {
    let a = Backend::start("a");
    let port = start(&a);
    let r = send_raw(
        port,
        b"GET /seen?x=1 HTTP/1.1\r\nHost: acme.localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    assert_logged("GET /seen?x=1 status=200 tenant=acme shard=a decision=allow attempts=1");
    let r = send_raw(
        port,
        b"GET /refused HTTP/1.1\r\nHost: acme.localhost\r\nX-Forbidden: 1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 451);
    assert_logged("GET /refused status=451 tenant=acme shard=- decision=- attempts=0");
    let r = send_raw(
        port,
        b"GET /nowhere HTTP/1.1\r\nHost: unknown.invalid\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 404);
    assert_logged("GET /nowhere status=404 tenant=- shard=- decision=- attempts=0");
    // What the head reader refuses before a request exists: with its
    // request line when it has one, else `-`.
    let r = send_raw(
        port,
        b"GET /future HTTP/3.0\r\nHost: acme.localhost\r\n\r\n",
    );
    assert_eq!(r.status, 505);
    assert_logged("GET /future status=505 tenant=- shard=- decision=- attempts=0");
    let r = send_raw(port, b"\x01\x02 not http\r\n\r\n");
    assert_eq!(r.status, 400);
    assert_logged("- - status=400 tenant=- shard=- decision=- attempts=0");
}

/// A shard of raw TCP on 127.0.0.1 that runs `serve` on each connection
/// (on a thread of its own), and counts them: its URL and the count.
fn raw_shard(
    serve: impl Fn(std::net::TcpStream) + Send + Sync + 'static,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let shard = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", shard.local_addr().expect("addr"));
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (serve, counted) = (Arc::new(serve), Arc::clone(&count));
    std::thread::spawn(move || {
        for conn in shard.incoming().flatten() {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let serve = Arc::clone(&serve);
            std::thread::spawn(move || serve(conn));
        }
    });
    (url, count)
}

/// Reads from `conn` until `done` says of what came (or 5 s pass).
fn read_until(conn: &mut std::net::TcpStream, done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    use std::io::Read;
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !done(&got) {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    got
}

/// A shard that answers `100 Continue` to a request expecting it, then
/// closes without a final answer: the client gets shardgate's 502 after
/// the 100, and the logging phase sees the 502, not the 100.
#[test]
fn a_shard_that_fails_after_its_100_is_logged_with_the_final_status() {
    use std::io::{Read, Write};
    let (url, _) = raw_shard(|mut conn| {
        read_until(&mut conn, |got| got.windows(4).any(|w| w == b"\r\n\r\n"));
        let _ = conn.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
        let _ = conn.read(&mut [0u8; 64]);
        // Closed with no final answer.
    });
    let port = start_on(url, "retry: false\n");
    let all = {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        s.write_all(b"POST /continued HTTP/1.1\r\nHost: acme.localhost\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
            .expect("head");
        std::thread::sleep(Duration::from_millis(200));
        let _ = s.write_all(b"hello");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    };
    assert!(
        all.contains("HTTP/1.1 502"),
        "a final answer after the 100: {all}"
    );
    assert_logged("POST /continued status=502 tenant=acme shard=a decision=allow attempts=1");
}

/// Hooks with a body phase: they record what they see of each tenant's
/// body, and refuse a piece that says `virus`.
struct BodyHooks;

/// What the body phase saw: (tenant, piece, end), in order.
static BODIES: std::sync::Mutex<Vec<(String, Vec<u8>, bool)>> = std::sync::Mutex::new(Vec::new());

impl GatewayHooks for BodyHooks {
    fn inspects_request_bodies(&self) -> bool {
        true
    }

    fn request_body(&self, tenant: &str, data: &[u8], end: bool) -> BodyCheck {
        BODIES
            .lock()
            .unwrap()
            .push((tenant.to_string(), data.to_vec(), end));
        // `signed…` tenants: refused at the end, as a check of the whole
        // body would.
        let unsigned = end && tenant.starts_with("signed");
        match unsigned || data.windows(5).any(|w| w == b"virus") {
            true => BodyCheck::Refuse {
                status: 422,
                body: format!("{{\"error\":\"infected\",\"tenant\":\"{tenant}\"}}"),
            },
            false => BodyCheck::Proceed,
        }
    }
}

/// The body `tenant`'s phase saw, and whether its last call said the end.
fn body_seen(tenant: &str) -> (Vec<u8>, Option<bool>) {
    let all = BODIES.lock().unwrap();
    let mine: Vec<_> = all.iter().filter(|(t, _, _)| t == tenant).collect();
    let body = mine.iter().flat_map(|(_, d, _)| d.clone()).collect();
    (body, mine.last().map(|(_, _, end)| *end))
}

/// The body phase sees each body once, decoded, whichever its framing,
/// on both transports; a refusal answers the client and the shard never
/// gets the whole request; a request without a body is not shown.
#[test]
fn the_body_phase_sees_each_body_and_may_refuse_it() {
    let a = Backend::start("a");
    let port = serve(a.url(), "", |builder| {
        builder.hooks(Arc::new(BodyHooks)).build()
    });
    let r = send_raw(
        port,
        b"POST / HTTP/1.1\r\nHost: length.localhost\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(body_seen("length"), (b"hello world".to_vec(), Some(true)));
    let r = send_raw(
        port,
        b"POST / HTTP/1.1\r\nHost: chunks.localhost\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(body_seen("chunks"), (b"hello world".to_vec(), Some(true)));
    assert_eq!(
        a.requests().last().map(|s| s.body.clone()),
        Some(b"hello world".to_vec()),
        "the shard got the body it was checked as"
    );
    let r = send_raw(
        port,
        b"POST / HTTP/1.1\r\nHost: sick.localhost\r\nContent-Length: 14\r\n\r\nsome virus now",
    );
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.json()["tenant"], "sick");
    assert_eq!(r.header("connection"), Some("close"));
    // (The shard may have the head: it sees the body cut short.)
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !a.requests()
            .iter()
            .any(|s| s.body.windows(5).any(|w| w == b"virus")),
        "the refused piece never reached the shard"
    );
    // A refused body that came whole with its head: a HEAD gets no body,
    // and what the client pipelined after it is not served.
    let exchange = |bytes: &[u8]| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        std::io::Write::write_all(&mut s, bytes).expect("write");
        String::from_utf8_lossy(&read_until(&mut s, |_| false)).into_owned()
    };
    let head =
        exchange(b"HEAD / HTTP/1.1\r\nHost: sick.localhost\r\nContent-Length: 5\r\n\r\nvirus");
    assert!(head.starts_with("HTTP/1.1 422"), "{head}");
    assert!(
        !head.contains("infected"),
        "a HEAD answer with a body: {head}"
    );
    let pipelined = exchange(
        b"POST / HTTP/1.1\r\nHost: sick.localhost\r\nContent-Length: 5\r\n\r\nvirus\
          GET / HTTP/1.1\r\nHost: bodiless.localhost\r\n\r\n",
    );
    assert!(pipelined.starts_with("HTTP/1.1 422"), "{pipelined}");
    assert_eq!(pipelined.matches("HTTP/1.1 ").count(), 1, "{pipelined}");
    let r = send_raw(
        port,
        b"GET / HTTP/1.1\r\nHost: bodiless.localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        body_seen("bodiless"),
        (Vec::new(), None),
        "no body: not shown"
    );
    // Refused at its end: the shard never has the whole request (the
    // length's last piece, the chunks' last chunk, held back).
    for raw in [
        &b"POST / HTTP/1.1\r\nHost: signed1.localhost\r\nContent-Length: 13\r\n\r\nwhole request"[..],
        b"POST / HTTP/1.1\r\nHost: signed2.localhost\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nwhole\r\n8\r\n request\r\n0\r\n\r\n",
    ] {
        let r = send_raw(port, raw);
        assert_eq!(r.status, 422, "{}", r.text());
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !a.requests().iter().any(|s| s.body == b"whole request"),
        "a body refused at its end reached the shard whole"
    );
}

/// A body resent on a retry (an idempotent PUT) is not shown to the body
/// phase again: each tenant's body is seen once, whichever shard it went
/// to first.
#[test]
fn the_body_phase_sees_a_retried_body_once() {
    use std::sync::atomic::Ordering;
    let good = Backend::start("good");
    // Reads the request whole (or up to a body's first half, when that
    // comes alone), then closes without an answer (a reset).
    let (bad, tried) = raw_shard(|mut conn| {
        read_until(&mut conn, |got| {
            got.ends_with(b"hello world") || got.ends_with(b"hello ")
        });
    });
    let port = serve_listening(
        None,
        &[("bad", bad), ("good", good.url())],
        "retry: { attempts: 2, methods: [PUT] }\n",
        |builder| builder.hooks(Arc::new(BodyHooks)).build(),
    );
    for i in 0..16 {
        let tenant = format!("retried{i}");
        let raw = format!(
            "PUT / HTTP/1.1\r\nHost: {tenant}.localhost\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world"
        );
        let r = send_raw(port, raw.as_bytes());
        assert_eq!(r.status, 200, "{tenant}: {}", r.text());
        assert_eq!(
            body_seen(&tenant),
            (b"hello world".to_vec(), Some(true)),
            "{tenant}"
        );
    }
    assert!(
        tried.load(Ordering::SeqCst) > 0,
        "no tenant went to the bad shard first"
    );
    // The shard fails with half the body sent: Pingora's proxy resends
    // that half (held for the retry) and reads on; the phase sees each
    // half once. The fast transport streamed that half: it answers 502.
    let mut retried = 0;
    for i in 0..16 {
        let tenant = format!("halved{i}");
        let before = tried.load(Ordering::SeqCst);
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let head = format!(
            "PUT / HTTP/1.1\r\nHost: {tenant}.localhost\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello "
        );
        std::io::Write::write_all(&mut s, head.as_bytes()).expect("head");
        std::thread::sleep(Duration::from_millis(150));
        let _ = std::io::Write::write_all(&mut s, b"world");
        let answer = read_until(&mut s, |_| false);
        let answer = String::from_utf8_lossy(&answer);
        let seen = body_seen(&tenant);
        if answer.starts_with("HTTP/1.1 200") {
            assert_eq!(seen, (b"hello world".to_vec(), Some(true)), "{tenant}");
            retried += usize::from(tried.load(Ordering::SeqCst) > before);
        } else {
            assert!(answer.starts_with("HTTP/1.1 502"), "{tenant}: {answer}");
            assert!(fast_path_on(), "Pingora's proxy resends a held body");
            assert_eq!(seen.0, b"hello ".to_vec(), "{tenant}");
        }
    }
    if !fast_path_on() {
        assert!(retried > 0, "no body was resent");
    }
}

/// Over HTTP/2 (TLS, curl), the body phase sees each DATA frame's content
/// and may refuse it, as on HTTP/1.1.
#[test]
fn the_body_phase_runs_on_http2_streams() {
    let certs = tempfile::tempdir().expect("dir");
    let key = rcgen::generate_simple_self_signed(vec!["*.localhost".to_string()]).expect("cert");
    std::fs::write(certs.path().join("edge.crt"), key.cert.pem()).expect("crt");
    std::fs::write(certs.path().join("edge.key"), key.key_pair.serialize_pem()).expect("key");
    let a = Backend::start("a");
    let port = serve_listening(Some(certs.path()), &[("a", a.url())], "", |builder| {
        builder.hooks(Arc::new(BodyHooks)).build()
    });
    let curl = |host: &str, data: &str| {
        let out = std::process::Command::new("curl")
            .args(["-s", "-k", "-i", "--http2", "--max-time", "10"])
            .args(["--data-binary", data])
            .args(["--resolve", &format!("{host}:{port}:127.0.0.1")])
            .arg(format!("https://{host}:{port}/"))
            .output()
            .expect("curl (installed by scripts/prereqs.sh)");
        String::from_utf8_lossy(&out.stdout).to_ascii_lowercase()
    };
    let ok = curl("h2len.localhost", "over http/2");
    assert!(ok.starts_with("http/2 200"), "{ok}");
    assert_eq!(body_seen("h2len"), (b"over http/2".to_vec(), Some(true)));
    let refused = curl("h2sick.localhost", "a virus");
    assert!(refused.starts_with("http/2 422"), "{refused}");
    let refused = curl("signed.localhost", "whole request");
    assert!(
        refused.starts_with("http/2 422"),
        "refused at its end: {refused}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !a.requests()
            .iter()
            .any(|s| s.body.windows(5).any(|w| w == b"virus")),
        "the refused piece never reached the shard"
    );
    assert!(
        !a.requests().iter().any(|s| s.body == b"whole request"),
        "a body refused at its end reached the shard whole"
    );
}

/// A `ProxyHttp` wrapper that forgets to forward `connected_to_upstream`
/// (and every phase after `upstream_request_filter`).
struct Forgetful(shardgate::proxy::Gateway);

#[async_trait::async_trait]
impl pingora_proxy::ProxyHttp for Forgetful {
    type CTX = shardgate::proxy::ctx::RequestCtx;

    fn new_ctx(&self) -> Self::CTX {
        self.0.new_ctx()
    }

    async fn request_filter(
        &self,
        session: &mut pingora_proxy::Session,
        ctx: &mut Self::CTX,
    ) -> pingora::Result<bool> {
        self.0.request_filter(session, ctx).await
    }

    async fn upstream_peer(
        &self,
        session: &mut pingora_proxy::Session,
        ctx: &mut Self::CTX,
    ) -> pingora::Result<Box<pingora::upstreams::peer::HttpPeer>> {
        self.0.upstream_peer(session, ctx).await
    }

    async fn upstream_request_filter(
        &self,
        session: &mut pingora_proxy::Session,
        upstream_request: &mut pingora::http::RequestHeader,
        ctx: &mut Self::CTX,
    ) -> pingora::Result<()> {
        self.0
            .upstream_request_filter(session, upstream_request, ctx)
            .await
    }
}

/// A wrapper that does not forward a phase of `Gateway` loses no rule
/// silently: the request fails before it reaches the shard (the headers
/// deadline and liveness watch start in the phase it forgot).
#[test]
fn a_wrapper_that_does_not_forward_a_phase_fails_its_requests() {
    let a = Backend::start("a");
    let port = serve(a.url(), "", |builder| builder.build_with(Forgetful));
    let r = send_raw(
        port,
        b"GET / HTTP/1.1\r\nHost: acme.localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(a.count(), 0, "nothing reached the shard");
}

/// A [`GatewayWrapper`] that writes one phase of its own (and keeps a
/// per-request state): every other phase is shardgate's.
struct StampingWrapper(shardgate::proxy::Gateway);

#[async_trait::async_trait]
impl GatewayWrapper for StampingWrapper {
    type Ctx = Option<u16>;

    fn gateway(&self) -> &shardgate::proxy::Gateway {
        &self.0
    }

    async fn response_filter(
        &self,
        session: &mut pingora_proxy::Session,
        response: &mut pingora::http::ResponseHeader,
        ctx: &mut WrapperCtx<Option<u16>>,
    ) -> pingora::Result<()> {
        self.0
            .response_filter(session, response, &mut ctx.gateway)
            .await?;
        ctx.own = Some(response.status.as_u16());
        response.insert_header("x-wrapped", format!("{:?}", ctx.own))?;
        Ok(())
    }
}

/// The in-process server with [`StampingWrapper`] around the gateway, on
/// the shard `url`, with `extra` configuration.
fn start_wrapped(url: String, extra: &str) -> u16 {
    serve(url, extra, |builder| {
        (builder.hooks(Arc::new(TestHooks))).build_wrapped(StampingWrapper)
    })
}

/// A wrapper built on `GatewayWrapper` keeps every rule of shardgate's
/// without writing its phases: the forwarding fields, the body limit's
/// 413, the JSON answer for a dead shard, the hooks' response edit.
#[test]
fn a_gateway_wrapper_that_writes_one_phase_keeps_every_rule_of_shardgate() {
    let a = Backend::start("a");
    let port = start_wrapped(a.url(), "limits:\n  max_body_bytes: 4\n");
    let r = send_raw(
        port,
        b"GET / HTTP/1.1\r\nHost: acme.localhost\r\nX-Forwarded-For: 6.6.6.6\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-wrapped"),
        Some("Some(200)"),
        "the wrapper's phase ran"
    );
    assert_eq!(
        r.header("x-served"),
        Some("acme@a:200"),
        "the hooks' edit too"
    );
    let seen = a.requests();
    let req = seen.last().expect("reached the shard");
    assert_eq!(req.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(req.header("x-tenant-id"), Some("acme"));
    let r = send_raw(
        port,
        b"POST / HTTP/1.1\r\nHost: acme.localhost\r\nContent-Length: 10\r\nConnection: close\r\n\r\n0123456789",
    );
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(a.count(), 1, "the refused body never reached the shard");
    let dead = start_wrapped(
        format!("http://127.0.0.1:{}", free_port()),
        "retry: false\n",
    );
    let r = send_raw(
        dead,
        b"GET / HTTP/1.1\r\nHost: acme.localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(
        r.json()["error"].is_string(),
        "shardgate's JSON answer: {}",
        r.text()
    );
}

/// A request the request phase answers spends no token: with a bucket of
/// two that never refills, ten answered requests leave both tokens.
#[test]
fn a_request_answered_by_the_request_phase_spends_no_token() {
    let a = Backend::start("a");
    let port = start_with(&a, "limits:\n  rate: { tokens: 2, refill_per_second: 0 }\n");
    for _ in 0..10 {
        let r = send_raw(
            port,
            b"GET / HTTP/1.1\r\nHost: acme.localhost\r\nX-Forbidden: 1\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(r.status, 451);
    }
    let get = || {
        send_raw(
            port,
            b"GET / HTTP/1.1\r\nHost: acme.localhost\r\nConnection: close\r\n\r\n",
        )
        .status
    };
    assert_eq!([get(), get(), get()], [200, 200, 429]);
    assert_eq!(a.count(), 2);
}

/// The request phase answers with its own status, fields and body; the
/// framing is shardgate's, and nothing is routed.
#[test]
fn the_request_phase_answers_with_its_own_fields_and_body() {
    let a = Backend::start("a");
    let port = start(&a);
    let r = send_raw(
        port,
        b"GET /answer HTTP/1.1\r\nHost: acme.localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 202);
    assert_eq!(r.text(), "answered for acme");
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(r.header("x-answered"), Some("yes"));
    let count = |name: &str| {
        (r.headers.iter())
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .count()
    };
    assert_eq!(count("set-cookie"), 2);
    assert_eq!(r.header("cache-control"), Some("max-age=5"));
    assert_eq!(count("cache-control"), 1);
    assert_eq!(r.header("content-length"), Some("17"));
    assert_eq!(r.header("transfer-encoding"), None);
    assert!(r.header("date").is_some());
    assert_eq!(a.count(), 0, "nothing went upstream");
}

/// A 204 answer carries no body, whatever the request phase gave it: the
/// next response on the connection is the shard's, not bytes of the body.
#[test]
fn a_204_answer_carries_no_body_on_a_kept_alive_connection() {
    use std::io::Write;
    let a = Backend::with("a", |_| Reply::ok("from the shard"));
    let port = start(&a);
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut reader = std::io::BufReader::new(conn.try_clone().expect("clone"));
    conn.write_all(
        b"GET /nocontent HTTP/1.1\r\nHost: acme.localhost\r\n\r\nGET / HTTP/1.1\r\nHost: acme.localhost\r\n\r\n",
    )
    .expect("write");
    let first = read_response(&mut reader).expect("the 204");
    assert_eq!(first.status, 204);
    assert_eq!(first.header("content-length"), None);
    let second = read_response(&mut reader).expect("the shard's answer");
    assert_eq!(second.status, 200);
    assert_eq!(second.text(), "from the shard");
}

/// Embedders see the request's trace (DESIGN §7): in the request check
/// (the trace and shardgate's span for the request) and in the logging
/// phase (the trace ID); without tracing, none.
#[test]
fn embedders_see_the_requests_trace() {
    let a = Backend::start("a");
    // A collector nobody runs: the spans are dropped, the trace is the same.
    let collector = format!("http://127.0.0.1:{}", free_port());
    let port = start_with(
        &a,
        &format!("tracing: {{ otlp_endpoint: \"{collector}\", sample_ratio: 1 }}\n"),
    );
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let r = send_raw(
        port,
        format!("GET /trace HTTP/1.1\r\nHost: acme.localhost\r\ntraceparent: {caller}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(r.status, 200);
    let seen = a.requests().last().cloned().expect("forwarded");
    let view = seen
        .header("x-seen-trace")
        .expect("the check ran")
        .to_string();
    let parts: Vec<&str> = view.split('-').collect();
    assert_eq!(parts[0], "4bf92f3577b34da6a3ce929d0e0e4736", "{view}");
    assert_ne!(
        parts[1], "00f067aa0ba902b7",
        "shardgate's span, not the caller's"
    );
    assert_eq!(parts[2], "true");
    assert_logged("trace 4bf92f3577b34da6a3ce929d0e0e4736");
    let untraced = start(&a);
    let r = send_raw(
        untraced,
        format!("GET /trace HTTP/1.1\r\nHost: acme.localhost\r\ntraceparent: {caller}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(r.status, 200);
    let seen = a.requests().last().cloned().expect("forwarded");
    assert_eq!(seen.header("x-seen-trace"), Some("none"));
    assert_eq!(seen.header("traceparent"), Some(caller), "passed unchanged");
}
