//! Spans to the collector: the SDK's batch processor and OTLP/HTTP
//! protobuf exporter, with our own HTTP client and counts.
//!
//! The processor exports from a thread of its own, driving the exporter's
//! future with `block_on` and no runtime, so the bundled clients (hyper's,
//! reqwest's async one) cannot run there (opentelemetry-rust#3125). Ours is
//! a blocking HTTP/1.1 POST on that thread, every step within
//! [`EXPORT_TIMEOUT`]; nothing else waits on it.

use crate::config::TracingConfig;
use opentelemetry::InstrumentationScope;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
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
                if !self.failing.swap(true, Ordering::Relaxed) {
                    log::warn!("tracing: spans not exported, dropped and counted until the collector answers: {e}");
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
            .with_http_client(Blocking)
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
/// documentation).
#[derive(Debug)]
struct Blocking;

#[async_trait::async_trait]
impl HttpClient for Blocking {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        post(&request, Instant::now() + EXPORT_TIMEOUT)
    }
}

/// POSTs `request` on a connection of its own, before `deadline`.
fn post(request: &Request<Bytes>, deadline: Instant) -> Result<Response<Bytes>, HttpError> {
    let uri = request.uri();
    let authority = uri
        .authority()
        .ok_or("no host in the collector's address")?;
    let port = authority.port_u16().unwrap_or(80);
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or("timed out")
    };
    let mut stream = None;
    let mut last_error: HttpError = "the collector's host has no address".into();
    for addr in (authority.host().trim_matches(['[', ']']), port).to_socket_addrs()? {
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
        if let Ok(value) = value.to_str() {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    head.push_str("\r\n");
    stream.set_write_timeout(Some(left()?))?;
    stream.write_all(head.as_bytes())?;
    stream.write_all(request.body())?;
    // The answer: its head, and the body its length says (or up to the
    // close), within the deadline and MAX_ANSWER.
    let mut got = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    loop {
        stream.set_read_timeout(Some(left()?))?;
        let n = stream.read(&mut buf)?;
        got.extend_from_slice(&buf[..n]);
        let mut fields = [httparse::EMPTY_HEADER; 32];
        let mut parsed = httparse::Response::new(&mut fields);
        let status = parsed.parse(&got)?;
        if let httparse::Status::Complete(head_len) = status {
            let code = parsed.code.unwrap_or(0);
            let length = parsed
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| {
                    std::str::from_utf8(h.value)
                        .ok()?
                        .trim()
                        .parse::<usize>()
                        .ok()
                });
            let body = &got[head_len..];
            let whole = match length {
                Some(length) => body.len() >= length,
                None => n == 0,
            };
            if whole || body.len() >= MAX_ANSWER || n == 0 {
                let body =
                    Bytes::copy_from_slice(&body[..length.unwrap_or(body.len()).min(body.len())]);
                return Ok(Response::builder().status(code).body(body)?);
            }
        } else if n == 0 || got.len() > MAX_ANSWER {
            return Err("the collector's answer ended early".into());
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
