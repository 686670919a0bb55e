//! DESIGN §7's tracing over real sockets: W3C `traceparent` continued or
//! started, the shard's parent being the attempt's span, one server span
//! per request and a client span per attempt, exported over OTLP/HTTP
//! protobuf to a test receiver that decodes it with the OpenTelemetry
//! proto crate; and a collector that is dead or hung costs requests
//! nothing. Both transports (`SHARDGATE_TEST_FAST_PATH=off` runs these on
//! Pingora's).

mod common;

use common::*;
use std::time::{Duration, Instant};

fn config(shards: &[(&str, String)], extra: &str) -> String {
    config_yaml(
        "listen: [{ addr: \"127.0.0.1:{port}\" }]\nadmin: { addr: \"127.0.0.1:{admin}\" }\nstate: false\n",
        shards,
        extra,
    )
}

fn tracing(endpoint: &str, ratio: f64) -> String {
    format!(
        "tracing: {{ otlp_endpoint: \"{endpoint}\", sample_ratio: {ratio}, service_name: edge-test }}\n"
    )
}

/// The `traceparent` the shard saw on the last request it got.
fn seen_traceparent(backend: &Backend) -> (String, String, String) {
    let seen = backend.requests().last().cloned().expect("forwarded");
    assert_eq!(seen.header_count("traceparent"), 1, "{:?}", seen.headers);
    traceparent_parts(seen.header("traceparent").expect("a traceparent"))
}

#[test]
fn spans_reach_the_collector_with_the_trace_the_shard_saw() {
    let otlp = OtlpReceiver::start();
    let a = Backend::start("a");
    let gw = Gateway::start(&config(
        &[("a", a.url())],
        &format!(
            "{}log: {{ access_format: json, access_path: \"{{dir}}/access.log\" }}\n",
            tracing(&otlp.endpoint(), 1.0)
        ),
    ));
    // A new trace: started here, sampled (ratio 1).
    let r = gw
        .send("GET /shop/cart?id=7 HTTP/1.1\r\nHost: acme.localhost\r\nConnection: close\r\n\r\n");
    assert_eq!(r.status, 200);
    let mut ids = vec![r.header("x-request-id").unwrap_or_default().to_string()];
    let (trace_id, parent, flags) = seen_traceparent(&a);
    assert_eq!(flags, "01");
    let spans = otlp.trace(&trace_id, 2);
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let server = spans.iter().find(|s| s.kind == 2).expect("a server span");
    let attempt = spans.iter().find(|s| s.kind == 3).expect("a client span");
    assert_eq!(server.parent_id, "", "a root: no caller");
    assert_eq!(attempt.span_id, parent, "the shard's parent is the attempt");
    assert_eq!(attempt.parent_id, server.span_id);
    assert_eq!(server.service, "edge-test");
    assert_eq!(server.name, "GET");
    for (key, value) in [
        ("shardgate.tenant", "acme"),
        ("shardgate.shard", "a"),
        ("shardgate.decision", "allow"),
        ("http.request.method", "GET"),
        ("http.response.status_code", "200"),
        ("shardgate.attempts", "1"),
        ("url.path", "/shop/cart"),
        ("server.address", "acme.localhost"),
        ("network.protocol.version", "1.1"),
        ("client.address", "127.0.0.1"),
    ] {
        assert_eq!(server.attr(key), Some(value), "{key}: {server:#?}");
    }
    assert_eq!(
        server.attr("shardgate.request_id"),
        r.header("x-request-id"),
        "the answer's ID"
    );
    assert_eq!(attempt.attr("shardgate.shard"), Some("a"));
    assert_eq!(attempt.attr("shardgate.attempt"), Some("1"));
    assert!(server.start_ns <= attempt.start_ns && attempt.end_ns <= server.end_ns);
    assert!(server.start_ns > 0 && server.end_ns >= server.start_ns);
    // A caller's sampled trace is continued: same trace, our span under
    // the caller's.
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let r = gw.send(&format!(
        "POST /up HTTP/1.1\r\nHost: acme.localhost\r\ntraceparent: {caller}\r\n\
         tracestate: vendor=abc\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    ));
    assert_eq!(r.status, 200);
    ids.push(r.header("x-request-id").unwrap_or_default().to_string());
    let (trace_id, parent, flags) = seen_traceparent(&a);
    assert_eq!(
        (trace_id.as_str(), flags.as_str()),
        ("4bf92f3577b34da6a3ce929d0e0e4736", "01")
    );
    assert_ne!(
        parent, "00f067aa0ba902b7",
        "shardgate's span is the new parent"
    );
    let seen = a.requests().last().cloned().expect("forwarded");
    assert_eq!(seen.header("tracestate"), Some("vendor=abc"), "passed on");
    let spans = otlp.trace(&trace_id, 2);
    let server = spans.iter().find(|s| s.kind == 2).expect("a server span");
    assert_eq!(
        server.parent_id, "00f067aa0ba902b7",
        "under the caller's span"
    );
    assert_eq!(server.attr("http.request.method"), Some("POST"));
    // A caller's unsampled trace: continued unsampled, nothing exported.
    let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let r = gw.send(&format!(
        "GET / HTTP/1.1\r\nHost: acme.localhost\r\ntraceparent: {unsampled}\r\nConnection: close\r\n\r\n"
    ));
    assert_eq!(r.status, 200);
    ids.push(r.header("x-request-id").unwrap_or_default().to_string());
    let (trace_id, parent, flags) = seen_traceparent(&a);
    assert_eq!(trace_id, "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(flags, "00");
    assert_ne!(parent, "b7ad6b7169203331");
    // A client's malformed one (upper case) starts a new trace.
    let r = gw.send(
        "GET / HTTP/1.1\r\nHost: acme.localhost\r\n\
         traceparent: 00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    ids.push(r.header("x-request-id").unwrap_or_default().to_string());
    let (fresh, _, _) = seen_traceparent(&a);
    assert_ne!(fresh, "4bf92f3577b34da6a3ce929d0e0e4736");
    // A new trace: the caller's tracestate (of another trace) is dropped.
    let r = gw.send(
        "GET / HTTP/1.1\r\nHost: acme.localhost\r\ntracestate: vendor=abc\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    ids.push(r.header("x-request-id").unwrap_or_default().to_string());
    let seen = a.requests().last().cloned().expect("forwarded");
    assert_eq!(seen.header("tracestate"), None, "{:?}", seen.headers);
    // A refusal is traced too: no shard, no attempt.
    let r = gw.send(&format!(
        "GET / HTTP/1.1\r\nHost: nobody.example.org\r\ntraceparent: 00-{}-00f067aa0ba902b7-01\r\nConnection: close\r\n\r\n",
        "11111111111111111111111111111111"
    ));
    assert_eq!(r.status, 404);
    ids.push(r.header("x-request-id").unwrap_or_default().to_string());
    let refused = otlp.trace("11111111111111111111111111111111", 1);
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0].attr("http.response.status_code"), Some("404"));
    assert_eq!(refused[0].attr("shardgate.attempts"), Some("0"));
    assert_eq!(refused[0].attr("shardgate.shard"), None);
    // By now the unsampled request's spans would have come.
    assert!(otlp
        .spans()
        .iter()
        .all(|s| s.trace_id != "0af7651916cd43dd8448eb211c80319c"));
    assert!(otlp.wrong.lock().unwrap().is_empty(), "{:?}", otlp.wrong);
    // The access log names each request's trace.
    let path = gw.dir.path().join("access.log");
    let lines = || -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        whole
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    assert!(eventually(Duration::from_secs(5), || lines().len() >= 6));
    // Each line's trace, found by its request's ID (lines are written as
    // requests end, not necessarily in the order they were sent).
    let trace_of = |id: &str| -> String {
        let lines = lines();
        let line = lines.iter().find(|l| l["request_id"] == id);
        let line = line.unwrap_or_else(|| panic!("no line for {id}: {lines:?}"));
        line["trace_id"].as_str().unwrap_or("null").to_string()
    };
    assert_eq!(ids.len(), 6);
    assert_eq!(trace_of(&ids[1]), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(trace_of(&ids[2]), "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(trace_of(&ids[3]), fresh);
    assert_eq!(trace_of(&ids[5]), "11111111111111111111111111111111");
    let text = metrics_reaching(gw.admin_port, "shardgate_trace_spans_exported_total", 9);
    assert_eq!(
        metric_value(&text, "shardgate_trace_spans_dropped_total"),
        0
    );
}

#[test]
fn a_retry_is_a_second_attempt_span_in_one_trace() {
    let otlp = OtlpReceiver::start();
    let resetter = Resetter::start();
    let b = Backend::start("b");
    let gw = Gateway::start(&config(
        &[("r", resetter.url()), ("b", b.url())],
        &format!(
            "health: {{ interval_ms: 60000 }}\nretry: {{ attempts: 2 }}\n{}",
            tracing(&otlp.endpoint(), 1.0)
        ),
    ));
    let r = retried_after_a_reset(&gw, &resetter);
    assert_eq!(r.status, 200, "retried on b");
    let (trace_id, parent, _) = seen_traceparent(&b);
    let spans = otlp.trace(&trace_id, 3);
    assert_eq!(spans.len(), 3, "{spans:#?}");
    let server = spans.iter().find(|s| s.kind == 2).expect("a server span");
    assert_eq!(server.attr("shardgate.attempts"), Some("2"));
    assert_eq!(server.attr("shardgate.shard"), Some("b"));
    let mut attempts: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.kind == 3).collect();
    attempts.sort_by_key(|s| s.attr("shardgate.attempt").map(str::to_string));
    assert_eq!(attempts[0].attr("shardgate.shard"), Some("r"));
    assert_eq!(attempts[0].attr("error.type"), Some("reset"));
    assert_eq!(attempts[0].status, 2, "an error");
    assert_eq!(attempts[1].attr("shardgate.shard"), Some("b"));
    assert_eq!(attempts[1].span_id, parent, "b saw the retry's own span");
    assert_eq!(attempts[1].attr("http.response.status_code"), Some("200"));
    assert!(attempts.iter().all(|s| s.parent_id == server.span_id));
    assert!(attempts[0].end_ns <= attempts[1].start_ns);
}

#[test]
fn an_unsampled_trace_still_reaches_the_shard_and_nothing_is_exported() {
    let otlp = OtlpReceiver::start();
    let a = Backend::start("a");
    let gw = Gateway::start(&config(&[("a", a.url())], &tracing(&otlp.endpoint(), 0.0)));
    let mut traces = std::collections::HashSet::new();
    for _ in 0..20 {
        // A client's malformed one is replaced, not passed on.
        let r = gw.send(
            "GET / HTTP/1.1\r\nHost: acme.localhost\r\ntraceparent: junk\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(r.status, 200);
        let (trace_id, _, flags) = seen_traceparent(&a);
        assert_eq!(flags, "00", "ratio 0: not sampled, said so");
        traces.insert(trace_id);
    }
    assert_eq!(traces.len(), 20, "a new trace each");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(otlp.spans().is_empty());
    let text = metrics_text(gw.admin_port);
    assert_eq!(
        metric_value(&text, "shardgate_trace_spans_exported_total"),
        0
    );
    assert_eq!(
        metric_value(&text, "shardgate_trace_spans_dropped_total"),
        0
    );
}

/// The 99th percentile of `n` sequential GETs on one connection.
fn p99(port: u16, n: usize) -> Duration {
    use std::io::{BufReader, Write};
    let stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        writer
            .write_all(b"GET / HTTP/1.1\r\nHost: acme.localhost\r\n\r\n")
            .expect("send");
        let r = read_response(&mut reader).expect("an answer");
        assert_eq!(r.status, 200);
        took.push(start.elapsed());
    }
    took.sort();
    took[n * 99 / 100]
}

/// The tests that load the machine take turns: the latencies measured
/// are not another test's.
static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_dead_or_hung_collector_costs_requests_nothing_and_its_spans_are_counted() {
    let _turn = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let a = Backend::start("a");
    // Hung: connections are accepted by the kernel, never answered.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let hung_url = format!("http://{}", hung.local_addr().expect("addr"));
    // Dead: nothing listens.
    let dead_url = format!("http://127.0.0.1:{}", free_port());
    let plain = Gateway::start(&config(&[("a", a.url())], ""));
    let to_hung = Gateway::start(&config(&[("a", a.url())], &tracing(&hung_url, 1.0)));
    let to_dead = Gateway::start(&config(&[("a", a.url())], &tracing(&dead_url, 1.0)));
    // Side by side, in turns: the traced gateways' p99 is the untraced
    // one's, within this machine's noise.
    let (mut base, mut hung_p99, mut dead_p99) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        base.push(p99(plain.port, 400));
        hung_p99.push(p99(to_hung.port, 400));
        dead_p99.push(p99(to_dead.port, 400));
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[1]
    };
    let (base, hung_p99, dead_p99) = (median(base), median(hung_p99), median(dead_p99));
    eprintln!("p99: untraced {base:?}, hung collector {hung_p99:?}, dead collector {dead_p99:?}");
    let bound = base * 3 + Duration::from_millis(5);
    assert!(
        hung_p99 <= bound,
        "hung collector: p99 {hung_p99:?}, untraced {base:?}"
    );
    assert!(
        dead_p99 <= bound,
        "dead collector: p99 {dead_p99:?}, untraced {base:?}"
    );
    // 1 200 requests, 2 spans each: the dead collector's are dropped as
    // their exports fail; the hung one holds a batch for the export's
    // timeout (5 s), then drops it.
    let dropped = |gw: &Gateway, at_least: u64| {
        let mut text = String::new();
        eventually(Duration::from_secs(20), || {
            text = metrics_text(gw.admin_port);
            metric_value(&text, "shardgate_trace_spans_dropped_total") >= at_least
        });
        metric_value(&text, "shardgate_trace_spans_dropped_total")
    };
    assert_eq!(dropped(&to_dead, 2400), 2400);
    assert!(
        dropped(&to_hung, 512) >= 512,
        "a timed-out batch is counted"
    );
    assert_eq!(
        metric_value(
            &metrics_text(to_dead.admin_port),
            "shardgate_trace_spans_exported_total"
        ),
        0
    );
    drop(hung);
}

#[test]
fn a_full_export_queue_drops_and_counts_what_does_not_fit() {
    let _turn = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let a = Backend::start("a");
    let hung = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let hung_url = format!("http://{}", hung.local_addr().expect("addr"));
    let gw = Gateway::start(&config(&[("a", a.url())], &tracing(&hung_url, 1.0)));
    // 5 000 requests (10 000 spans) within the hung export's 5 s: at most
    // 8 192 wait, the rest are dropped at once.
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let port = gw.port;
            std::thread::spawn(move || p99(port, 1250))
        })
        .collect();
    for t in threads {
        t.join().expect("requests");
    }
    // The last requests' spans are handed over just after their answers.
    let mut dropped = 0;
    eventually(Duration::from_secs(5), || {
        dropped = metric_value(
            &metrics_text(gw.admin_port),
            "shardgate_trace_spans_dropped_total",
        );
        dropped >= 10_000 - 8_192
    });
    eprintln!("{dropped} of 10 000 spans dropped");
    assert!(dropped >= 10_000 - 8_192, "{dropped} dropped");
    drop(hung);
}

#[test]
fn an_attempt_the_client_ends_is_marked_so() {
    use std::io::Write;
    let otlp = OtlpReceiver::start();
    let a = Backend::start("a");
    let gw = Gateway::start(&config(
        &[("a", a.url())],
        &format!(
            "limits: {{ body_timeout_ms: 300 }}\n{}",
            tracing(&otlp.endpoint(), 1.0)
        ),
    ));
    // A body that stalls halfway: the shard has the head, never the rest.
    let trace = "22222222222222222222222222222222";
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    stream
        .write_all(
            format!(
                "POST / HTTP/1.1\r\nHost: acme.localhost\r\ntraceparent: 00-{trace}-00f067aa0ba902b7-01\r\n\
                 Content-Length: 100\r\n\r\nonly-a-little"
            )
            .as_bytes(),
        )
        .expect("send");
    let mut reader = std::io::BufReader::new(stream);
    let _ = read_response(&mut reader);
    let spans = otlp.trace(trace, 2);
    let attempt = spans.iter().find(|s| s.kind == 3).expect("an attempt span");
    assert_eq!(attempt.attr("error.type"), Some("client"), "{spans:#?}");
    assert_eq!(attempt.status, 2);
    assert_eq!(attempt.attr("http.response.status_code"), None);
}
