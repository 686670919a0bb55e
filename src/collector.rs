//! The Prometheus collector (DESIGN §2 "Metrics"): it reads, at scrape
//! time, what the router, the domain map, the health state, the cluster,
//! the TLS edge and [`crate::metrics::GatewayMetrics`] count, so the
//! request path pays nothing extra. No tenant label: tenants are
//! unbounded. It sits above [`Control`], which it reads; what the proxy
//! counts sits below it, in [`crate::metrics`].

use crate::control::Control;
use crate::proxy::hooks::UpstreamFailure;
use crate::routing::{Decision, ShardSet};
use crate::tls::store::Source;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

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

/// Every family shardgate exports, read now (a gather sorts them by name).
fn families(control: &Control) -> Vec<MetricFamily> {
    let mut out = Vec::new();
    decision_families(control, &mut out);
    // One view of the shards for their gauges and their failures.
    let set = control.router.shard_set();
    shard_families(control, &set, &mut out);
    upstream_failure_family(control, &set, &mut out);
    dns_failure_family(control, &mut out);
    dropped_families(control, &mut out);
    tenant_families(control, &mut out);
    cluster_families(control, &mut out);
    tls_families(control, &mut out);
    #[cfg(feature = "alloc-counts")]
    heap_families(&mut out);
    out.push(duration_family(control));
    out
}

/// Routing decisions: all of them, and by outcome and plan.
fn decision_families(control: &Control, out: &mut Vec<MetricFamily>) {
    let router = &control.router;
    let counts = router.decision_counts();
    let routes: u64 = counts.iter().map(|(_, n)| n).sum();
    out.push(family(
        "routes_total",
        "Routing decisions made.",
        MetricType::COUNTER,
        vec![counter(vec![], routes as f64)],
    ));
    out.push(family(
        "decisions_total",
        "Routing decisions by outcome and tenant plan (`none`: no plan).",
        MetricType::COUNTER,
        (router.decision_counts_by_plan().iter())
            .flat_map(|(plan, counts)| {
                counts.iter().map(move |(d, n)| {
                    let labels = vec![
                        label("decision", d.as_str()),
                        label("plan", plan.unwrap_or("none")),
                    ];
                    counter(labels, *n as f64)
                })
            })
            .collect(),
    ));
    debug_assert_eq!(counts.len(), Decision::ALL.len());
    out.push(family(
        "rate_limited_total",
        "Rate-limited refusals by the bucket that ran dry (tenant, route, client).",
        MetricType::COUNTER,
        (router.rate_limited_counts().iter())
            .map(|(bucket, n)| counter(vec![label("bucket", bucket)], *n as f64))
            .collect(),
    ));
}

/// Per shard: requests routed to it (a shard removed since keeps its
/// count), its live admissions, health and draining.
fn shard_families(control: &Control, set: &ShardSet, out: &mut Vec<MetricFamily>) {
    let m = control.router.metrics();
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
}

/// Failed upstream attempts: every kind of every current shard (0 when
/// none), then those of shards removed since.
fn upstream_failure_family(control: &Control, set: &ShardSet, out: &mut Vec<MetricFamily>) {
    let failures = control.metrics.upstream_failures();
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
}

/// DNS failures of every shard addressed by name, and of any that failed.
fn dns_failure_family(control: &Control, out: &mut Vec<MetricFamily>) {
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
}

/// Retries, access log lines dropped, and spans exported or dropped
/// (when tracing is on).
fn dropped_families(control: &Control, out: &mut Vec<MetricFamily>) {
    out.push(family(
        "retries_total",
        "Upstream attempts that were retries.",
        MetricType::COUNTER,
        vec![counter(vec![], control.metrics.retries() as f64)],
    ));
    out.push(family(
        "access_log_dropped_total",
        "Access log lines dropped: the file's buffer was full, or the file could not be written.",
        MetricType::COUNTER,
        vec![counter(vec![], control.access_log.dropped() as f64)],
    ));
    if control.tracer.is_on() {
        out.push(family(
            "trace_spans_exported_total",
            "Spans the OTLP collector accepted.",
            MetricType::COUNTER,
            vec![counter(vec![], control.tracer.exported() as f64)],
        ));
        out.push(family(
            "trace_spans_dropped_total",
            "Spans dropped: the export queue was full, or the collector did not accept them.",
            MetricType::COUNTER,
            vec![counter(vec![], control.tracer.dropped() as f64)],
        ));
    }
}

/// Host lookups by result, and the tenants this node tracks.
fn tenant_families(control: &Control, out: &mut Vec<MetricFamily>) {
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
    out.push(family(
        "clients_tracked",
        "Client buckets this node holds (limits.per_client; bounded by limits.max_tracked_clients).",
        MetricType::GAUGE,
        vec![gauge(vec![], control.router.client_count() as f64)],
    ));
}

/// Redis, the nodes alive and the sync errors, in cluster mode.
fn cluster_families(control: &Control, out: &mut Vec<MetricFamily>) {
    let Some(cluster) = &control.cluster else {
        return;
    };
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

/// The request duration histogram.
fn duration_family(control: &Control) -> MetricFamily {
    let view = control.metrics.durations();
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
    family(
        "request_duration_seconds",
        "Time from the request head to the end of the response (or socket).",
        MetricType::HISTOGRAM,
        vec![metric],
    )
}

/// HTTP/3's connections (DESIGN §9).
fn quic_families(control: &Control, out: &mut Vec<MetricFamily>) {
    use std::sync::atomic::Ordering::Relaxed;
    let quic = &control.metrics.quic;
    out.push(family(
        "quic_connections",
        "HTTP/3 connections open (handshake done).",
        MetricType::GAUGE,
        vec![gauge(vec![], quic.connections.load(Relaxed) as f64)],
    ));
    out.push(family(
        "quic_retries_total",
        "New HTTP/3 clients asked to prove their address first (a Retry: many handshakes at once).",
        MetricType::COUNTER,
        vec![counter(vec![], quic.retries.load(Relaxed) as f64)],
    ));
    out.push(family(
        "quic_refused_total",
        "New HTTP/3 clients refused: quic.max_connections were open.",
        MetricType::COUNTER,
        vec![counter(vec![], quic.refused.load(Relaxed) as f64)],
    ));
}

/// Heap allocations since start (`alloc-counts` builds only).
#[cfg(feature = "alloc-counts")]
fn heap_families(out: &mut Vec<MetricFamily>) {
    use crate::alloc_counts::{ALLOCATIONS, BYTES};
    use std::sync::atomic::Ordering::Relaxed;
    out.push(family(
        "heap_allocations_total",
        "Heap allocations and reallocations made (alloc-counts builds).",
        MetricType::COUNTER,
        vec![counter(vec![], ALLOCATIONS.load(Relaxed) as f64)],
    ));
    out.push(family(
        "heap_allocated_bytes_total",
        "Bytes those allocations asked for (alloc-counts builds).",
        MetricType::COUNTER,
        vec![counter(vec![], BYTES.load(Relaxed) as f64)],
    ));
}

/// Certificates, handshakes and ACME, when TLS is configured.
fn tls_families(control: &Control, out: &mut Vec<MetricFamily>) {
    let edge = &control.edge;
    let failures = control.metrics.tls_failures.counts();
    let quic = control.config.quic.is_some();
    if quic {
        quic_families(control, out);
    }
    if quic || control.config.listen.iter().any(|l| l.tls.is_on()) {
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
