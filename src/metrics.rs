//! What only the proxy sees, counted (DESIGN §2 "Metrics"): upstream
//! failures, retries, request durations, failed TLS handshakes, failed
//! re-resolutions. Most other values live in the router, the domain map
//! and the health state; [`crate::collector`] reads them all at scrape
//! time.

use crate::counters::{HistogramView, StripedCounter, StripedHistogram};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Upper bounds of `shardgate_request_duration_seconds`.
pub static DURATION_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// What the proxy counts itself.
pub struct GatewayMetrics {
    retries: StripedCounter,
    durations: StripedHistogram,
    /// `(shard, kind)` → count; failures are rare, a lock is fine.
    failures: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// Client TLS handshakes that failed, by reason (shared with the
    /// handshake, which counts them).
    pub tls_failures: Arc<TlsFailures>,
    /// Shard → its host name failed to resolve again (bounded by the
    /// shards the operator configured).
    dns_failures: Mutex<BTreeMap<String, u64>>,
    /// HTTP/3's connections (shared with the `quic` listeners).
    pub quic: Arc<QuicCounts>,
}

/// What the `quic` listeners count.
#[derive(Default)]
pub struct QuicCounts {
    /// Connections open (handshake done).
    pub connections: std::sync::atomic::AtomicU64,
    /// New clients sent a Retry to prove their address first.
    pub retries: std::sync::atomic::AtomicU64,
    /// New clients refused: `quic.max_connections` open.
    pub refused: std::sync::atomic::AtomicU64,
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        GatewayMetrics {
            retries: StripedCounter::default(),
            durations: StripedHistogram::new(&DURATION_BUCKETS),
            failures: Mutex::new(BTreeMap::new()),
            tls_failures: Arc::default(),
            dns_failures: Mutex::new(BTreeMap::new()),
            quic: Arc::default(),
        }
    }
}

impl GatewayMetrics {
    pub fn retry(&self) {
        self.retries.incr();
    }

    pub fn retries(&self) -> u64 {
        self.retries.get()
    }

    /// One failed attempt on `shard`, of `kind` ([`crate::proxy::hooks::UpstreamFailure::KINDS`]).
    pub fn upstream_failure(&self, shard: &str, kind: &'static str) {
        *self
            .failures
            .lock()
            .entry((shard.to_string(), kind))
            .or_default() += 1;
    }

    /// A client's TLS handshake failed (`error`) or timed out (`timeout`).
    pub fn tls_handshake_failed(&self, reason: &'static str) {
        self.tls_failures.failed(reason);
    }

    /// A shard's host name did not resolve when it was due again.
    pub fn dns_failure(&self, shard: &str) {
        *self
            .dns_failures
            .lock()
            .entry(shard.to_string())
            .or_default() += 1;
    }

    /// Failed re-resolutions so far, by shard.
    pub fn dns_failures(&self) -> BTreeMap<String, u64> {
        self.dns_failures.lock().clone()
    }

    pub fn request_finished(&self, seconds: f64) {
        self.durations.observe(seconds);
    }

    /// Failed attempts so far, by `(shard, kind)`.
    pub fn upstream_failures(&self) -> BTreeMap<(String, &'static str), u64> {
        self.failures.lock().clone()
    }

    /// Request durations so far (`shardgate_request_duration_seconds`).
    pub fn durations(&self) -> HistogramView {
        self.durations.view()
    }
}

/// Client TLS handshakes that failed, by reason (`error`, `timeout`).
#[derive(Default)]
pub struct TlsFailures(Mutex<BTreeMap<&'static str, u64>>);

impl TlsFailures {
    pub fn failed(&self, reason: &'static str) {
        *self.0.lock().entry(reason).or_default() += 1;
    }

    /// The counts so far, by reason.
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        self.0.lock().clone()
    }
}
