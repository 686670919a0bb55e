//! Spans to the collector: the SDK's batch processor and OTLP/HTTP
//! protobuf exporter, with our own HTTP client and counts.
//!
//! The processor exports from a thread of its own, driving the exporter's
//! future with `block_on` and no runtime, so the bundled clients (hyper's,
//! reqwest's async one) cannot run there (opentelemetry-rust#3125). Ours is
//! a blocking HTTP/1.1 POST on that thread, every step within
//! [`EXPORT_TIMEOUT`]; nothing else waits on it.

use super::TracingConfig;
use opentelemetry::InstrumentationScope;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One export, from connecting to the last byte of the answer.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// Spans sent in one request at most.
const BATCH: usize = 512;
/// How long a span waits for a batch to fill at most.
const DELAY: Duration = Duration::from_secs(1);
/// The largest answer read from a collector.
const MAX_ANSWER: usize = 64 * 1024;

/// A collector's address: `http://host[:port][/prefix]`.
#[derive(Debug, PartialEq, Eq)]
pub struct Endpoint<'a> {
    pub host: &'a str,
    pub port: u16,
}

impl<'a> Endpoint<'a> {
    pub fn parse(url: &'a str) -> Result<Endpoint<'a>, &'static str> {
        let Some(rest) = url.strip_prefix("http://") else {
            return Err(match url.starts_with("https://") {
                true => "https collectors are not supported: run a collector (or its agent) reachable over plain http, e.g. on the same host",
                false => "expected http://host[:port][/path]",
            });
        };
        let authority = rest.split('/').next().unwrap_or_default();
        if authority.contains('@') || authority.contains('?') || authority.contains('#') {
            return Err("expected http://host[:port][/path], without user info, query or fragment");
        }
        if rest.contains(['?', '#', ' ']) {
            return Err("expected http://host[:port][/path], without a query or fragment");
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => {
                let port = port
                    .parse()
                    .map_err(|_| "the port is not a number from 1 to 65535")?;
                (host, port)
            }
            _ => (authority, 80),
        };
        if host.is_empty() || port == 0 {
            return Err("expected http://host[:port][/path]");
        }
        Ok(Endpoint { host, port })
    }
}

/// What happened to spans, for the metrics.
#[derive(Debug, Default)]
pub struct Counts {
    /// Spans handed to the processor and not yet exported or failed.
    in_flight: AtomicUsize,
    dropped: AtomicU64,
    exported: AtomicU64,
    /// The last export failed (its error was logged; the next one is
    /// logged only after a success).
    failing: AtomicBool,
    /// What the client last failed on.
    cause: Mutex<Option<String>>,
}

impl Counts {
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    pub fn exported(&self) -> u64 {
        self.exported.load(Ordering::Relaxed)
    }

    pub fn drop_spans(&self, n: usize) {
        self.dropped.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Takes a place for `n` spans in the queue, if there is room.
    fn admit(&self, n: usize) -> bool {
        let before = self.in_flight.fetch_add(n, Ordering::AcqRel);
        if before + n > super::QUEUE {
            self.in_flight.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// `n` spans left the queue: exported, or not.
    fn done(&self, n: usize, result: &OTelSdkResult) {
        self.in_flight.fetch_sub(n, Ordering::AcqRel);
        match result {
            Ok(()) => {
                self.exported.fetch_add(n as u64, Ordering::Relaxed);
                if self.failing.swap(false, Ordering::Relaxed) {
                    log::info!("tracing: the collector accepts spans again");
                }
            }
            Err(e) => {
                self.drop_spans(n);
                let cause = self.cause.lock().take();
                if !self.failing.swap(true, Ordering::Relaxed) {
                    let cause = cause.map(|c| format!(" ({c})")).unwrap_or_default();
                    log::warn!("tracing: spans not exported, dropped and counted until the collector takes them again: {e}{cause}");
                }
            }
        }
    }
}

/// The exporter, counting what each batch became.
#[derive(Debug)]
struct Counting<E> {
    inner: E,
    counts: Arc<Counts>,
}

impl<E: SpanExporter> SpanExporter for Counting<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let n = batch.len();
        let export = self.inner.export(batch);
        let counts = Arc::clone(&self.counts);
        async move {
            let result = export.await;
            counts.done(n, &result);
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The running exporter.
pub struct Exporting {
    processor: BatchSpanProcessor,
    scope: InstrumentationScope,
    counts: Arc<Counts>,
}

impl Exporting {
    /// Starts the processor's thread; `None` (and an error logged) if the
    /// exporter cannot be built.
    pub fn start(config: &TracingConfig, counts: Arc<Counts>) -> Option<Exporting> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(Blocking {
                counts: Arc::clone(&counts),
                lookups: Arc::default(),
            })
            .with_endpoint(config.traces_url.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(EXPORT_TIMEOUT)
            .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
            .build();
        let exporter = match exporter {
            Ok(e) => e,
            Err(e) => {
                log::error!("tracing: cannot export to {}: {e}", config.traces_url);
                return None;
            }
        };
        let mut exporter = Counting {
            inner: exporter,
            counts: Arc::clone(&counts),
        };
        let resource = Resource::builder_empty()
            .with_service_name(config.service_name.clone())
            .build();
        exporter.set_resource(&resource);
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(super::QUEUE)
            .with_max_export_batch_size(BATCH)
            .with_scheduled_delay(DELAY)
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batches)
            .build();
        let scope = InstrumentationScope::builder("shardgate")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        Some(Exporting {
            processor,
            scope,
            counts,
        })
    }

    pub fn scope(&self) -> &InstrumentationScope {
        &self.scope
    }

    /// Hands a request's spans to the processor (never waiting), or drops
    /// and counts them all when the queue has no room for them.
    pub fn submit(&self, spans: Vec<SpanData>) {
        if !self.counts.admit(spans.len()) {
            self.counts.drop_spans(spans.len());
            return;
        }
        for span in spans {
            self.processor.on_end(span);
        }
    }

    pub fn shutdown(&self, within: Duration) {
        if let Err(e) = self.processor.shutdown_with_timeout(within) {
            log::warn!("tracing: spans left unexported at exit: {e}");
        }
    }
}

/// A blocking HTTP/1.1 client for the processor's thread (see the module
/// documentation): one connection per batch, every step within the export's
/// deadline — the name's lookup included.
#[derive(Debug)]
struct Blocking {
    counts: Arc<Counts>,
    lookups: Arc<Lookups>,
}

/// The collector's addresses, looked up again after [`LOOKUP_EVERY`]; the
/// last ones found stay in use while a lookup runs or fails.
#[derive(Debug, Default)]
struct Lookups {
    found: Mutex<Option<(Instant, Vec<SocketAddr>)>>,
    /// A lookup's thread runs (one at a time).
    running: AtomicBool,
}

/// How long a collector's looked-up addresses are used.
const LOOKUP_EVERY: Duration = Duration::from_secs(30);

#[async_trait::async_trait]
impl HttpClient for Blocking {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let sent = self.post(&request, Instant::now() + EXPORT_TIMEOUT);
        if let Err(e) = &sent {
            // The exporter reports any client error as "network error":
            // the cause goes with the warning.
            *self.counts.cause.lock() = Some(e.to_string());
        }
        sent
    }
}

impl Blocking {
    /// The collector's addresses: an IP as it is, a name looked up on a
    /// thread of its own so that a hung resolver costs this export its
    /// deadline, not the resolver's timeout (one lookup at a time).
    ///
    /// A lookup that outlives its export still fills the cache for the
    /// next one; the last addresses found serve while a lookup runs,
    /// fails or is late.
    fn addresses(
        &self,
        host: &str,
        port: u16,
        deadline: Instant,
    ) -> Result<Vec<SocketAddr>, HttpError> {
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let known = self.lookups.found.lock().clone();
        if let Some((at, addrs)) = &known {
            if at.elapsed() < LOOKUP_EVERY {
                return Ok(addrs.clone());
            }
        }
        let stale = |why: String| -> Result<Vec<SocketAddr>, HttpError> {
            match &known {
                Some((_, addrs)) => Ok(addrs.clone()),
                None => Err(why.into()),
            }
        };
        if self.lookups.running.swap(true, Ordering::AcqRel) {
            return stale("the collector's name is being looked up".into());
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (name, lookups) = (host.to_string(), Arc::clone(&self.lookups));
        let spawned = std::thread::Builder::new()
            .name("shardgate-otlp-dns".into())
            .spawn(move || {
                let found = (name.as_str(), port).to_socket_addrs();
                let found = found.map(Vec::from_iter).map_err(|e| e.to_string());
                if let Ok(addrs) = &found {
                    if !addrs.is_empty() {
                        *lookups.found.lock() = Some((Instant::now(), addrs.clone()));
                    }
                }
                lookups.running.store(false, Ordering::Release);
                let _ = tx.send(found);
            });
        if let Err(e) = spawned {
            self.lookups.running.store(false, Ordering::Release);
            return stale(e.to_string());
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(Ok(addrs)) if !addrs.is_empty() => Ok(addrs),
            Ok(Ok(_)) => stale("the collector's name has no address".into()),
            Ok(Err(e)) => stale(e),
            Err(_) => stale("the collector's name was not looked up in time".into()),
        }
    }

    /// POSTs `request` on a connection of its own, before `deadline`.
    fn post(
        &self,
        request: &Request<Bytes>,
        deadline: Instant,
    ) -> Result<Response<Bytes>, HttpError> {
        let uri = request.uri();
        let authority = uri
            .authority()
            .ok_or("no host in the collector's address")?;
        let port = authority.port_u16().unwrap_or(80);
        let host = authority.host().trim_matches(['[', ']']);
        let left = || {
            deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or("timed out")
        };
        let mut stream = None;
        let mut last_error: HttpError = "the collector's name has no address".into();
        for addr in self.addresses(host, port, deadline)? {
            match TcpStream::connect_timeout(&addr, left()?) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last_error = e.into(),
            }
        }
        let mut stream = stream.ok_or(last_error)?;
        stream.set_nodelay(true)?;
        let mut head = format!(
            "POST {} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {}\r\nConnection: close\r\n",
            uri.path_and_query().map_or("/", |p| p.as_str()),
            request.body().len()
        );
        for (name, value) in request.headers() {
            // Ours are written above (`OTEL_EXPORTER_OTLP_HEADERS` may name
            // them too).
            let ours = [
                http::header::HOST,
                http::header::CONTENT_LENGTH,
                http::header::CONNECTION,
            ]
            .contains(name);
            if let (false, Ok(value)) = (ours, value.to_str()) {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
        }
        head.push_str("\r\n");
        // Each write within what is left (a socket's timeout is per call).
        for mut rest in [head.as_bytes(), &request.body()[..]] {
            while !rest.is_empty() {
                stream.set_write_timeout(Some(left()?))?;
                match stream.write(rest) {
                    Ok(0) => return Err("the collector closed the connection".into()),
                    Ok(n) => rest = &rest[n..],
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        read_answer(&mut stream, left)
    }
}

/// The collector's answer: its head, and the body its length says (or its
/// last chunk, or up to the close), within the deadline and
/// [`MAX_ANSWER`]. Interim (1xx) answers are skipped.
fn read_answer(
    stream: &mut TcpStream,
    left: impl Fn() -> Result<Duration, &'static str>,
) -> Result<Response<Bytes>, HttpError> {
    let mut got = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    // Bytes after an interim answer are parsed before reading more.
    let mut unparsed = false;
    // The final answer's status, once its head is in: all the exporter
    // needs, if the body never ends.
    let mut status = None;
    loop {
        let mut n = 1;
        if !std::mem::take(&mut unparsed) {
            let read = left()
                .map_err(HttpError::from)
                .and_then(|wait| Ok(stream.set_read_timeout(Some(wait))?))
                .and_then(|()| Ok(stream.read(&mut buf)?));
            n = match (read, status) {
                (Ok(n), _) => n,
                (Err(_), Some(code)) => {
                    return Ok(Response::builder().status(code).body(Bytes::new())?)
                }
                (Err(e), None) => return Err(e),
            };
            got.extend_from_slice(&buf[..n]);
        }
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Response::new(&mut fields);
        match parsed.parse(&got)? {
            httparse::Status::Complete(head_len) => {
                let code = parsed.code.unwrap_or(0);
                if (100..200).contains(&code) && code != 101 {
                    got.drain(..head_len);
                    unparsed = !got.is_empty();
                    continue;
                }
                let field = |wanted: &str| {
                    (parsed.headers.iter())
                        .find(|h| h.name.eq_ignore_ascii_case(wanted))
                        .and_then(|h| std::str::from_utf8(h.value).ok())
                };
                let length = field("content-length").and_then(|v| v.trim().parse::<usize>().ok());
                let chunked = field("transfer-encoding")
                    .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
                status = Some(code);
                let body = &got[head_len..];
                let bodiless = matches!(code, 101 | 204 | 304);
                let whole = bodiless
                    || match (length, chunked) {
                        (Some(length), _) => body.len() >= length,
                        // Its content is not needed (an empty body says all
                        // was accepted; a partial success is rare): the last
                        // chunk ends it.
                        (None, true) => body.ends_with(b"0\r\n\r\n"),
                        (None, false) => n == 0,
                    };
                if whole || n == 0 || body.len() >= MAX_ANSWER {
                    let body = match chunked {
                        true => Bytes::new(),
                        false => Bytes::copy_from_slice(
                            &body[..length.unwrap_or(body.len()).min(body.len())],
                        ),
                    };
                    return Ok(Response::builder().status(code).body(body)?);
                }
            }
            httparse::Status::Partial if n == 0 || got.len() > MAX_ANSWER => {
                return Err("the collector's answer ended early".into());
            }
            httparse::Status::Partial => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_plain_http_host_and_port() {
        assert_eq!(
            Endpoint::parse("http://otel:4318"),
            Ok(Endpoint {
                host: "otel",
                port: 4318
            })
        );
        assert_eq!(
            Endpoint::parse("http://127.0.0.1/otlp/"),
            Ok(Endpoint {
                host: "127.0.0.1",
                port: 80
            })
        );
        assert_eq!(
            Endpoint::parse("http://[::1]:4318").map(|e| e.port),
            Ok(4318)
        );
        for bad in [
            "https://otel:4318",
            "otel:4318",
            "http://",
            "http://otel:0",
            "http://otel:99999",
            "http://u:p@otel:4318",
            "http://otel:4318/?x",
        ] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }

    /// What `read_answer` makes of a collector that sends `answer` and
    /// then keeps the connection open, within 300 ms.
    fn answer_to(answer: &'static [u8]) -> Result<(u16, usize), String> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(answer).unwrap();
            std::thread::sleep(Duration::from_millis(500));
        });
        let mut stream = TcpStream::connect(addr).unwrap();
        let deadline = Instant::now() + Duration::from_millis(300);
        let left = || {
            deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or("timed out")
        };
        let got = read_answer(&mut stream, left)
            .map(|r| (r.status().as_u16(), r.body().len()))
            .map_err(|e| e.to_string());
        let _ = server.join();
        got
    }

    #[test]
    fn a_collectors_answer_is_read_within_the_deadline_whatever_it_is() {
        assert_eq!(
            answer_to(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
            Ok((200, 2))
        );
        assert_eq!(
            answer_to(b"HTTP/1.1 400 Bad\r\nContent-Length: 0\r\n\r\n"),
            Ok((400, 0))
        );
        // Interim answers are skipped; a chunked one ends with its last chunk.
        assert_eq!(
            answer_to(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"),
            Ok((200, 0))
        );
        // Garbage, a head that never ends, a body shorter than said: an
        // error by the deadline, never a wait past it.
        let started = Instant::now();
        assert!(answer_to(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(answer_to(b"HTTP/1.1 200 OK\r\nContent-Le").is_err());
        // A body that never ends: the status, once the deadline comes.
        assert_eq!(
            answer_to(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok"),
            Ok((200, 0))
        );
        assert_eq!(answer_to(b"HTTP/1.1 204 No Content\r\n\r\n"), Ok((204, 0)));
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn the_queue_admits_up_to_its_size_and_counts_the_rest() {
        let counts = Counts::default();
        assert!(counts.admit(super::super::QUEUE - 1));
        assert!(!counts.admit(2));
        assert!(counts.admit(1));
        counts.done(3, &Ok(()));
        assert!(counts.admit(3));
        counts.done(
            2,
            &Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                "x".into(),
            )),
        );
        assert_eq!(counts.exported(), 3);
        assert_eq!(counts.dropped(), 2);
    }
}
