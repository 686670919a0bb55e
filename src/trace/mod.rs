//! Tracing (DESIGN §7): W3C Trace Context continued or started, one span
//! per request and a child span per upstream attempt, exported in batches
//! over OTLP/HTTP protobuf.
//!
//! A request carries only a [`TraceContext`] (plain numbers, no
//! allocation) while it runs; the shard sees the current attempt's span as
//! its parent in `traceparent`. Spans are built once the request is over,
//! and only for a sampled trace: the SDK's span objects never live across
//! a request's awaits, and an unsampled request builds nothing. Built
//! spans go to the OpenTelemetry SDK's batch processor, whose thread
//! exports them; a request only hands its spans over (a `try_send`), or
//! drops and counts them when [`QUEUE`] spans are already waiting. An
//! unreachable or hung collector therefore costs requests nothing: its
//! spans are dropped and counted (`shardgate_trace_spans_dropped_total`).

pub mod export;
mod spans;

pub(crate) use spans::Finished;
pub use spans::MAX_ATTRIBUTE_BYTES;

use crate::routing::ShardId;
use export::Exporting;
use std::cell::Cell;
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;
use std::time::Instant;

/// Spans waiting for export at most; more are dropped and counted.
pub const QUEUE: usize = 8192;

/// A request's place in a trace: shardgate's span for it, and the span of
/// its current upstream attempt (the parent the shard sees).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceContext {
    /// The trace: the caller's, or a new one.
    pub trace_id: u128,
    /// shardgate's span for the request.
    pub span_id: u64,
    /// The caller's span (0: the trace starts here).
    pub parent_id: u64,
    /// Whether the trace is recorded (the caller's flag, or `sample_ratio`).
    pub sampled: bool,
    /// The current attempt's span.
    pub(crate) attempt_id: u64,
}

impl TraceContext {
    /// The `traceparent` the shard receives: this trace, the current
    /// attempt's span as the parent, the sampled flag.
    pub fn traceparent(&self) -> TraceParent {
        let mut out = [0u8; 55];
        out[..3].copy_from_slice(b"00-");
        hex_into(&mut out[3..35], &self.trace_id.to_be_bytes());
        out[35] = b'-';
        hex_into(&mut out[36..52], &self.attempt_id.to_be_bytes());
        out[52] = b'-';
        out[53] = b'0';
        out[54] = if self.sampled { b'1' } else { b'0' };
        TraceParent(out)
    }

    /// The trace ID as 32 lowercase hex digits (the access log's
    /// `trace_id`).
    pub fn trace_id_hex(&self) -> Hex<32> {
        let mut out = [0u8; 32];
        hex_into(&mut out, &self.trace_id.to_be_bytes());
        Hex(out)
    }
}

/// A `traceparent` value: 55 ASCII characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent([u8; 55]);

impl TraceParent {
    pub fn as_str(&self) -> &str {
        // Hex digits and dashes only.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// Where the parent span's 16 digits sit in the value.
    pub const PARENT: std::ops::Range<usize> = 36..52;
}

/// `N` lowercase hex digits.
#[derive(Clone, Copy, Debug)]
pub struct Hex<const N: usize>([u8; N]);

impl<const N: usize> Hex<N> {
    pub fn as_str(&self) -> &str {
        // Hex digits only.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

fn hex_into(out: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 15)];
    }
}

/// A W3C `traceparent` (Trace Context level 1, §3.2): the trace, the
/// caller's span and whether it is sampled. `None` when malformed: an
/// unknown future version is read for its first four fields (§4.3), and
/// version `ff`, upper-case hex, an all-zero trace or span are refused.
pub fn parse_traceparent(value: &[u8]) -> Option<(u128, u64, bool)> {
    if value.len() < 55 || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let version = hex_number(&value[..2])?;
    match version {
        0xff => return None,
        0 if value.len() != 55 => return None,
        _ if value.len() > 55 && value[55] != b'-' => return None,
        _ => {}
    }
    let trace_id = hex_number(&value[3..35])?;
    let parent_id = hex_number(&value[36..52])? as u64;
    let flags = hex_number(&value[53..55])? as u8;
    (trace_id != 0 && parent_id != 0).then_some((trace_id, parent_id, flags & 1 == 1))
}

/// Lowercase hex digits as a number (at most 32 of them).
fn hex_number(digits: &[u8]) -> Option<u128> {
    digits.iter().try_fold(0u128, |n, &d| {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => return None,
        };
        Some(n << 4 | u128::from(v))
    })
}

thread_local! {
    /// This thread's generator state (wyrand), seeded from the system's
    /// randomness.
    static RNG: Cell<u64> = Cell::new(RandomState::new().hash_one(std::thread::current().id()));
}

/// 64 random bits (wyrand: a few nanoseconds, no shared state). IDs need
/// to be unique and unguessable enough not to collide across nodes, not
/// secret.
fn random_u64() -> u64 {
    RNG.with(|state| {
        let x = state.get().wrapping_add(0xa076_1d64_78bd_642f);
        state.set(x);
        let t = u128::from(x).wrapping_mul(u128::from(x ^ 0xe703_7ed1_a0b4_28db));
        ((t >> 64) ^ t) as u64
    })
}

/// A new span ID (never 0, which W3C reserves).
pub fn new_span_id() -> u64 {
    loop {
        let id = random_u64();
        if id != 0 {
            return id;
        }
    }
}

/// A new trace ID (never 0).
fn new_trace_id() -> u128 {
    u128::from(new_span_id()) << 64 | u128::from(random_u64())
}

/// An upstream attempt of a sampled request, for its child span.
#[derive(Clone, Debug)]
pub(crate) struct AttemptSpan {
    pub id: u64,
    pub started: Instant,
    /// When it failed (a successful attempt lasts to the request's end).
    pub ended: Option<Instant>,
    pub shard: Option<ShardId>,
    /// Why it failed.
    pub failure: Option<&'static str>,
    /// The status the shard answered with.
    pub status: Option<u16>,
}

/// `tracing` (DESIGN §7).
#[derive(Clone, Debug)]
pub struct TracingConfig {
    /// Where spans are POSTed: `otlp_endpoint` + `/v1/traces`.
    pub traces_url: String,
    /// The share of new traces recorded (0–1); a continued trace follows
    /// its caller's sampled flag.
    pub sample_ratio: f64,
    /// The `service.name` of the spans' resource.
    pub service_name: String,
}

/// The gateway's tracing: off (nothing is parsed, `traceparent` passes
/// through), or sampling and exporting as configured.
pub struct Tracer {
    config: Option<TracingConfig>,
    /// New traces are sampled when their low 64 bits are under this.
    threshold: u64,
    /// The exporter, started with the first sampled span (a daemon forks
    /// after the configuration is read, and threads do not survive a fork).
    exporting: OnceLock<Option<Exporting>>,
    counts: std::sync::Arc<export::Counts>,
}

impl Tracer {
    pub fn new(config: Option<&TracingConfig>) -> Tracer {
        let ratio = config.map_or(0.0, |c| c.sample_ratio);
        Tracer {
            config: config.cloned(),
            // 1.0 is every trace (u64::MAX is not reached by `as`).
            threshold: match ratio >= 1.0 {
                true => u64::MAX,
                false => (ratio * 2f64.powi(64)) as u64,
            },
            exporting: OnceLock::new(),
            counts: Default::default(),
        }
    }

    pub fn is_on(&self) -> bool {
        self.config.is_some()
    }

    /// The context of a request whose `traceparent` fields are `incoming`:
    /// the caller's trace continued if there is exactly one valid field,
    /// else a new trace, sampled by `sample_ratio`. `None` when tracing is
    /// off.
    pub fn start<'v>(&self, mut incoming: impl Iterator<Item = &'v [u8]>) -> Option<TraceContext> {
        self.config.as_ref()?;
        let caller = match (incoming.next(), incoming.next()) {
            (Some(value), None) => parse_traceparent(value),
            // None, or several: W3C asks for one.
            _ => None,
        };
        let (trace_id, parent_id, sampled) = match caller {
            Some(caller) => caller,
            None => {
                let trace_id = new_trace_id();
                let sampled = self.threshold == u64::MAX || (trace_id as u64) < self.threshold;
                (trace_id, 0, sampled)
            }
        };
        Some(TraceContext {
            trace_id,
            span_id: new_span_id(),
            parent_id,
            sampled,
            attempt_id: new_span_id(),
        })
    }

    /// Spans dropped: the queue was full, or their export failed.
    pub fn dropped(&self) -> u64 {
        self.counts.dropped()
    }

    /// Spans the collector accepted.
    pub fn exported(&self) -> u64 {
        self.counts.exported()
    }

    /// Starts the exporter's thread, if tracing is on and it has not
    /// started: the binary's background service does at start (after a
    /// daemon's fork); otherwise the first sampled request does. A thread
    /// that cannot be started leaves tracing dropping (and counting) every
    /// span, logged once.
    pub fn start_exporting(&self) -> Option<&Exporting> {
        let config = self.config.as_ref()?;
        let started = self.exporting.get_or_init(|| {
            let counts = std::sync::Arc::clone(&self.counts);
            let start = std::panic::AssertUnwindSafe(|| Exporting::start(config, counts));
            std::panic::catch_unwind(start).unwrap_or_else(|_| {
                log::error!(
                    "tracing: the exporter's thread could not be started; spans are dropped"
                );
                None
            })
        });
        started.as_ref()
    }

    /// Exports what is queued (at exit), waiting at most `within`.
    pub fn shutdown(&self, within: std::time::Duration) {
        if let Some(Some(exporting)) = self.exporting.get() {
            exporting.shutdown(within);
        }
    }

    /// A sampled request is over: its span and its attempts' spans, handed
    /// to the exporter (or dropped and counted when the queue is full).
    pub(crate) fn record(&self, request: &Finished<'_>) {
        let Some(exporting) = self.start_exporting() else {
            self.counts.drop_spans(1 + request.attempts.len());
            return;
        };
        let spans = request.spans(exporting.scope());
        exporting.submit(spans);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_read_as_w3c_says() {
        let valid = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            parse_traceparent(valid),
            Some((0x4bf92f3577b34da6a3ce929d0e0e4736, 0x00f067aa0ba902b7, true))
        );
        let unsampled = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert_eq!(parse_traceparent(unsampled).map(|t| t.2), Some(false));
        // A future version: its first four fields, more after a dash.
        let future = b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-what";
        assert_eq!(parse_traceparent(future).map(|t| t.2), Some(true));
        for bad in [
            &b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"[..],
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            b"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            b"",
        ] {
            assert_eq!(
                parse_traceparent(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    fn tracer(ratio: f64) -> Tracer {
        Tracer::new(Some(&TracingConfig {
            traces_url: "http://127.0.0.1:9/v1/traces".into(),
            sample_ratio: ratio,
            service_name: "test".into(),
        }))
    }

    #[test]
    fn a_callers_trace_is_continued_with_our_span_as_the_parent() {
        let t = tracer(0.0);
        let caller = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = t.start([&caller[..]].into_iter()).expect("on");
        assert_eq!(cx.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(cx.parent_id, 0x00f067aa0ba902b7);
        assert!(cx.sampled, "the caller's flag, whatever the ratio");
        let sent = cx.traceparent();
        let sent = sent.as_str();
        assert_eq!(&sent[..36], "00-4bf92f3577b34da6a3ce929d0e0e4736-");
        assert_eq!(
            &sent[TraceParent::PARENT],
            format!("{:016x}", cx.attempt_id)
        );
        assert!(sent.ends_with("-01"));
        assert_eq!(
            parse_traceparent(sent.as_bytes()).map(|p| p.1),
            Some(cx.attempt_id)
        );
        assert_ne!(cx.attempt_id, 0x00f067aa0ba902b7);
        // Two fields, or a malformed one: a new trace.
        let twice = t.start([&caller[..], &caller[..]].into_iter()).expect("on");
        assert_ne!(twice.trace_id, cx.trace_id);
        assert_eq!(twice.parent_id, 0);
        assert!(!twice.sampled, "ratio 0");
        assert!(Tracer::new(None).start([&caller[..]].into_iter()).is_none());
    }

    #[test]
    fn new_traces_are_sampled_by_the_ratio() {
        let sampled = |ratio: f64| {
            let t = tracer(ratio);
            (0..20_000)
                .filter(|_| t.start(std::iter::empty()).is_some_and(|c| c.sampled))
                .count()
        };
        assert_eq!(sampled(0.0), 0);
        assert_eq!(sampled(1.0), 20_000);
        let tenth = sampled(0.1);
        assert!((1_600..2_400).contains(&tenth), "{tenth}");
    }

    #[test]
    fn ids_are_not_zero_and_do_not_repeat() {
        let ids: std::collections::HashSet<u64> = (0..100_000).map(|_| new_span_id()).collect();
        assert_eq!(ids.len(), 100_000);
        assert!(!ids.contains(&0));
    }
}
