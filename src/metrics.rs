//! Prometheus metrics (DESIGN §2 "Metrics"). Most values already live in
//! the router, the domain map and the health state, counted per thread;
//! a collector reads them at scrape time, so the request path pays nothing
//! extra. What only the proxy sees (upstream failures, retries, request
//! durations) is counted here. No tenant label: tenants are unbounded.

use crate::control::Control;
use crate::proxy::hooks::UpstreamFailure;
use crate::routing::counters::{HistogramView, StripedCounter, StripedHistogram};
use crate::routing::Decision;
use crate::tls::store::Source;
use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

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
    /// Client TLS handshakes that failed, by reason.
    tls_failures: Mutex<BTreeMap<&'static str, u64>>,
    /// Shard → its host name failed to resolve again (bounded by the
    /// shards the operator configured).
    dns_failures: Mutex<BTreeMap<String, u64>>,
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        GatewayMetrics {
            retries: StripedCounter::default(),
            durations: StripedHistogram::new(&DURATION_BUCKETS),
            failures: Mutex::new(BTreeMap::new()),
            tls_failures: Mutex::new(BTreeMap::new()),
            dns_failures: Mutex::new(BTreeMap::new()),
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

    /// One failed attempt on `shard`, of `kind` ([`UpstreamFailure::KINDS`]).
    pub fn upstream_failure(&self, shard: &str, kind: &'static str) {
        *self
            .failures
            .lock()
            .entry((shard.to_string(), kind))
            .or_default() += 1;
    }

    /// A client's TLS handshake failed (`error`) or timed out (`timeout`).
    pub fn tls_handshake_failed(&self, reason: &'static str) {
        *self.tls_failures.lock().entry(reason).or_default() += 1;
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

fn label(name: &str, value: &str) -> LabelPair {
    let mut l = LabelPair::default();
    l.set_name(name.to_string());
    l.set_value(value.to_string());
    l
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(format!("shardgate_{name}"));
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

fn counter(labels: Vec<LabelPair>, value: f64) -> Metric {
    let mut c = Counter::default();
    c.set_value(value);
    let mut m = Metric::from_label(labels);
    m.set_counter(c);
    m
}

fn gauge(labels: Vec<LabelPair>, value: f64) -> Metric {
    let mut g = Gauge::default();
    g.set_value(value);
    let mut m = Metric::from_label(labels);
    m.set_gauge(g);
    m
}

/// Reads everything at scrape time.
pub struct ShardgateCollector {
    control: Weak<Control>,
    descs: Vec<Desc>,
}

impl ShardgateCollector {
    pub fn new(control: &Arc<Control>) -> Self {
        ShardgateCollector {
            control: Arc::downgrade(control),
            descs: Vec::new(),
        }
    }
}

impl Collector for ShardgateCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Some(control) = self.control.upgrade() else {
            return Vec::new();
        };
        families(&control)
    }
}

fn families(control: &Control) -> Vec<MetricFamily> {
    let router = &control.router;
    let counts = router.decision_counts();
    let routes: u64 = counts.iter().map(|(_, n)| n).sum();
    let mut out = vec![
        family(
            "routes_total",
            "Routing decisions made.",
            MetricType::COUNTER,
            vec![counter(vec![], routes as f64)],
        ),
        family(
            "decisions_total",
            "Routing decisions by outcome.",
            MetricType::COUNTER,
            counts
                .iter()
                .map(|(d, n)| counter(vec![label("decision", d.as_str())], *n as f64))
                .collect(),
        ),
    ];
    debug_assert_eq!(counts.len(), Decision::ALL.len());
    let m = router.metrics();
    let set = router.shard_set();
    let mut routed: BTreeMap<String, u64> = m.shard_load_distribution;
    for e in &set.all {
        routed.entry(e.id().to_string()).or_insert(0);
    }
    out.push(family(
        "shard_routes_total",
        "Requests routed to each shard.",
        MetricType::COUNTER,
        routed
            .iter()
            .map(|(s, n)| counter(vec![label("shard", s)], *n as f64))
            .collect(),
    ));
    let per_shard = |f: &dyn Fn(&crate::routing::ShardEntry) -> f64| -> Vec<Metric> {
        set.all
            .iter()
            .map(|e| gauge(vec![label("shard", e.id().as_str())], f(e)))
            .collect()
    };
    out.push(family(
        "shard_active_connections",
        "Live admissions (requests and sockets) on each shard.",
        MetricType::GAUGE,
        per_shard(&|e| e.active() as f64),
    ));
    out.push(family(
        "shard_healthy",
        "1 if the shard is healthy.",
        MetricType::GAUGE,
        per_shard(&|e| f64::from(u8::from(e.status.healthy))),
    ));
    out.push(family(
        "shard_draining",
        "1 if the shard is draining.",
        MetricType::GAUGE,
        per_shard(&|e| f64::from(u8::from(e.status.draining))),
    ));
    let failures = control.metrics.failures.lock().clone();
    let mut failure_metrics = Vec::new();
    for e in &set.all {
        for kind in UpstreamFailure::KINDS {
            let n = failures
                .get(&(e.id().to_string(), kind))
                .copied()
                .unwrap_or(0);
            failure_metrics.push(counter(
                vec![label("shard", e.id().as_str()), label("kind", kind)],
                n as f64,
            ));
        }
    }
    for ((shard, kind), n) in &failures {
        if set.get(shard).is_none() {
            failure_metrics.push(counter(
                vec![label("shard", shard), label("kind", kind)],
                *n as f64,
            ));
        }
    }
    out.push(family(
        "upstream_failures_total",
        "Failed upstream attempts by shard and kind (connect, reset, timeout, liveness).",
        MetricType::COUNTER,
        failure_metrics,
    ));
    let dns = control.metrics.dns_failures();
    let named = control
        .router
        .shard_set()
        .all
        .iter()
        .filter(|e| crate::dns::host_name(&e.shard.url).is_some())
        .map(|e| e.id().to_string())
        .chain(dns.keys().cloned())
        .collect::<std::collections::BTreeSet<String>>();
    out.push(family(
        "dns_failures_total",
        "Times a shard's host name did not resolve when due again (its last addresses are kept).",
        MetricType::COUNTER,
        named
            .iter()
            .map(|shard| {
                let n = dns.get(shard).copied().unwrap_or(0);
                counter(vec![label("shard", shard)], n as f64)
            })
            .collect(),
    ));
    out.push(family(
        "retries_total",
        "Upstream attempts that were retries.",
        MetricType::COUNTER,
        vec![counter(vec![], control.metrics.retries() as f64)],
    ));
    let d = control.domains.metrics();
    out.push(family(
        "domain_resolves_total",
        "Host lookups by result.",
        MetricType::COUNTER,
        [
            ("exact", d.exact),
            ("wildcard", d.wildcard),
            ("fallback", d.fallback),
            ("miss", d.misses),
        ]
        .iter()
        .map(|(r, n)| counter(vec![label("result", r)], *n as f64))
        .collect(),
    ));
    out.push(family(
        "tenants_tracked",
        "Tenants whose admissions or buckets this node holds (bounded by limits.max_tracked_tenants).",
        MetricType::GAUGE,
        vec![gauge(vec![], control.router.tenant_count() as f64)],
    ));
    if let Some(cluster) = &control.cluster {
        out.push(family(
            "cluster_redis_up",
            "1 while this node reaches Redis (cluster mode).",
            MetricType::GAUGE,
            vec![gauge(vec![], f64::from(u8::from(cluster.redis_up())))],
        ));
        out.push(family(
            "cluster_nodes",
            "Gateway nodes last seen alive, this one included (cluster mode).",
            MetricType::GAUGE,
            vec![gauge(vec![], cluster.nodes_alive())],
        ));
        out.push(family(
            "cluster_sync_errors_total",
            "Redis calls of the cluster service that failed or timed out.",
            MetricType::COUNTER,
            vec![counter(vec![], cluster.sync_errors() as f64)],
        ));
    }
    tls_families(control, &mut out);
    let view = control.metrics.durations.view();
    let mut h = Histogram::default();
    h.set_sample_count(view.count);
    h.set_sample_sum(view.sum);
    h.set_bucket(
        view.buckets
            .iter()
            .map(|(bound, count)| {
                let mut b = Bucket::default();
                b.set_upper_bound(*bound);
                b.set_cumulative_count(*count);
                b
            })
            .collect(),
    );
    let mut metric = Metric::default();
    metric.set_histogram(h);
    out.push(family(
        "request_duration_seconds",
        "Time from the request head to the end of the response (or socket).",
        MetricType::HISTOGRAM,
        vec![metric],
    ));
    out
}

/// Certificates, handshakes and ACME, when TLS is configured.
fn tls_families(control: &Control, out: &mut Vec<MetricFamily>) {
    let edge = &control.edge;
    let failures = control.metrics.tls_failures.lock().clone();
    if control.config.listen.iter().any(|l| l.tls.is_on()) {
        out.push(family(
            "tls_handshake_failures_total",
            "Client TLS handshakes that failed (error: refused, bad or unknown name; timeout: not done within tls.handshake_timeout_ms).",
            MetricType::COUNTER,
            ["error", "timeout"]
                .iter()
                .map(|r| counter(vec![label("reason", r)], failures.get(r).copied().unwrap_or(0) as f64))
                .collect(),
        ));
    }
    let Some(store) = &edge.store else { return };
    let (certs, errors) = store.list();
    out.push(family(
        "tls_certificates",
        "Certificates served, by source (file or acme).",
        MetricType::GAUGE,
        [("file", Source::File), ("acme", Source::Acme)]
            .iter()
            .map(|(name, source)| {
                let n = certs.iter().filter(|c| c.source == *source).count();
                gauge(vec![label("source", name)], n as f64)
            })
            .collect(),
    ));
    out.push(family(
        "tls_certificate_errors",
        "Certificate files skipped because they do not load.",
        MetricType::GAUGE,
        vec![gauge(vec![], errors.len() as f64)],
    ));
    if let Some(first) = certs.iter().map(|c| c.expires).min() {
        out.push(family(
            "tls_certificate_earliest_expiry_timestamp_seconds",
            "When the first served certificate expires (Unix seconds).",
            MetricType::GAUGE,
            vec![gauge(vec![], first as f64)],
        ));
    }
    if edge.config.acme.is_some() {
        use std::sync::atomic::Ordering::Relaxed;
        out.push(family(
            "acme_orders_total",
            "ACME orders by result (issued, failed).",
            MetricType::COUNTER,
            vec![
                counter(
                    vec![label("result", "issued")],
                    edge.acme.issued.load(Relaxed) as f64,
                ),
                counter(
                    vec![label("result", "failed")],
                    edge.acme.failed.load(Relaxed) as f64,
                ),
            ],
        ));
    }
}

/// The Prometheus text exposition of a registry holding shardgate's
/// collector.
pub fn render(registry: &prometheus::Registry) -> String {
    use prometheus::Encoder;
    let mut buf = Vec::new();
    let encoder = prometheus::TextEncoder::new();
    if let Err(e) = encoder.encode(&registry.gather(), &mut buf) {
        log::error!("cannot encode metrics: {e}");
    }
    String::from_utf8(buf).unwrap_or_default()
}
