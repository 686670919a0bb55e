//! The spans of a sampled request, built once it is over: the request's
//! server span and a client span per upstream attempt, their attributes
//! (OpenTelemetry's HTTP conventions) each cut to a bounded size.

use super::{AttemptSpan, TraceContext};
use crate::summary::RequestSummary;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use std::borrow::Cow;
use std::time::{Instant, SystemTime};

/// What a sampled request's spans are made of.
pub(crate) struct Finished<'a> {
    pub trace: &'a TraceContext,
    pub summary: &'a RequestSummary<'a>,
    /// The route prefix matched.
    pub route: Option<&'a str>,
    pub attempts: &'a [AttemptSpan],
    pub started: Instant,
    pub ended: Instant,
}

impl Finished<'_> {
    /// The request's span, then one per attempt.
    pub(super) fn spans(&self, scope: &InstrumentationScope) -> Vec<SpanData> {
        let template = SpanTemplate::new(self, scope);
        let mut spans = Vec::with_capacity(1 + self.attempts.len());
        spans.push(template.span(
            (self.trace.span_id, SpanKind::Server),
            self.trace.parent_id,
            (self.started, self.ended),
            self.request_attributes(),
            self.request_status(),
        ));
        for (n, attempt) in self.attempts.iter().enumerate() {
            let (attributes, status) = self.attempt_outcome(n, attempt);
            spans.push(template.span(
                (attempt.id, SpanKind::Client),
                self.trace.span_id,
                (attempt.started, attempt.ended.unwrap_or(self.ended)),
                attributes,
                status,
            ));
        }
        spans
    }

    /// The request span's attributes: what was asked, what was decided,
    /// and by whom.
    fn request_attributes(&self) -> Vec<KeyValue> {
        let s = self.summary;
        let mut attributes = vec![
            KeyValue::new("http.request.method", capped(&s.method)),
            KeyValue::new("shardgate.request_id", capped(&s.request_id)),
            KeyValue::new("shardgate.attempts", i64::from(s.attempts)),
            KeyValue::new("network.protocol.version", protocol_version(s.protocol)),
            KeyValue::new("url.path", capped(&path_of(&s.target.to_string()))),
        ];
        if s.status != 0 {
            attributes.push(KeyValue::new(
                "http.response.status_code",
                i64::from(s.status),
            ));
        }
        if let Some(status) = s.grpc_status {
            // OpenTelemetry's name for a gRPC call's status.
            attributes.push(KeyValue::new("rpc.grpc.status_code", i64::from(status)));
        }
        let optional = [
            ("shardgate.tenant", s.tenant),
            ("shardgate.shard", s.shard.map(|id| id.as_str())),
            ("shardgate.decision", s.decision.map(|d| d.as_str())),
            ("shardgate.route", self.route),
            ("server.address", s.host),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                attributes.push(KeyValue::new(key, capped(&value)));
            }
        }
        client_attributes(&s.client.to_string(), &mut attributes);
        attributes
    }

    /// An error when nothing or a 5xx was answered.
    fn request_status(&self) -> Status {
        let s = self.summary;
        let failed = s.status == 0 || s.status >= 500;
        match failed {
            true => Status::error(format!("status {}", s.status)),
            false => Status::Unset,
        }
    }

    /// Attempt `n`'s attributes and status: failed, answered, or neither
    /// (the client went away or was refused (its body) before the shard
    /// answered).
    fn attempt_outcome(&self, n: usize, attempt: &AttemptSpan) -> (Vec<KeyValue>, Status) {
        let mut attributes = vec![
            KeyValue::new("http.request.method", capped(&self.summary.method)),
            KeyValue::new("shardgate.attempt", n as i64 + 1),
        ];
        if let Some(shard) = &attempt.shard {
            attributes.push(KeyValue::new("shardgate.shard", shard.as_str().to_string()));
        }
        let status = match (attempt.failure, attempt.status) {
            (why @ Some(_), _) | (why @ None, None) => {
                let why = why.unwrap_or("no-response");
                attributes.push(KeyValue::new("error.type", why));
                Status::error(why)
            }
            (None, Some(code)) => {
                attributes.push(KeyValue::new("http.response.status_code", i64::from(code)));
                match code >= 500 {
                    true => Status::error(format!("status {code}")),
                    false => Status::Unset,
                }
            }
        };
        (attributes, status)
    }
}

/// `client.address` and `client.port` of a client's `ip:port` (an IPv4
/// client of a dual-stack listener as IPv4).
fn client_attributes(client: &str, attributes: &mut Vec<KeyValue>) {
    let Some((ip, port)) = client.rsplit_once(':') else {
        return;
    };
    let ip = ip.trim_start_matches('[').trim_end_matches(']');
    let ip = match ip.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.to_canonical().to_string(),
        Err(_) => ip.to_string(),
    };
    attributes.push(KeyValue::new("client.address", ip));
    if let Ok(port) = port.parse::<i64>() {
        attributes.push(KeyValue::new("client.port", port));
    }
}

/// What every span of one request shares: the trace, the name, the wall
/// clock of the request's instants (read once), the scope.
struct SpanTemplate<'s> {
    trace_id: TraceId,
    name: Cow<'static, str>,
    now: Instant,
    wall: SystemTime,
    scope: &'s InstrumentationScope,
}

impl<'s> SpanTemplate<'s> {
    fn new(request: &Finished<'_>, scope: &'s InstrumentationScope) -> Self {
        SpanTemplate {
            trace_id: TraceId::from_bytes(request.trace.trace_id.to_be_bytes()),
            name: span_name(request.summary.method),
            now: Instant::now(),
            wall: SystemTime::now(),
            scope,
        }
    }

    fn at(&self, i: Instant) -> SystemTime {
        self.wall - self.now.saturating_duration_since(i)
    }

    /// A span of this trace: its ID and kind, its parent (the caller's is
    /// remote: the server span's parent other than 0), its times.
    fn span(
        &self,
        (id, kind): (u64, SpanKind),
        parent: u64,
        (start, end): (Instant, Instant),
        attributes: Vec<KeyValue>,
        status: Status,
    ) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                self.trace_id,
                SpanId::from_bytes(id.to_be_bytes()),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::from_bytes(parent.to_be_bytes()),
            parent_span_is_remote: kind == SpanKind::Server && parent != 0,
            span_kind: kind,
            name: self.name.clone(),
            start_time: self.at(start),
            end_time: self.at(end),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.scope.clone(),
        }
    }
}

/// The most a span keeps of one attribute a client chose (its path, Host,
/// tenant, method, request ID): up to [`super::QUEUE`] spans of traces a client
/// forced sampled wait for export, and each stays a bounded size.
pub const MAX_ATTRIBUTE_BYTES: usize = 1024;

/// `value`'s text, cut to [`MAX_ATTRIBUTE_BYTES`] (marked when cut).
fn capped(value: &dyn std::fmt::Display) -> String {
    crate::capped::Capped(value, MAX_ATTRIBUTE_BYTES).to_string()
}

/// A span's name (OpenTelemetry's HTTP conventions): the method, or
/// `HTTP` for one outside RFC 9110's.
fn span_name(method: &str) -> Cow<'static, str> {
    const KNOWN: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
    ];
    match KNOWN.iter().find(|m| **m == method) {
        Some(m) => Cow::Borrowed(m),
        None => Cow::Borrowed("HTTP"),
    }
}

/// `1.0`, `1.1` or `2` of `HTTP/1.0`, `HTTP/1.1` or `HTTP/2`.
fn protocol_version(protocol: &'static str) -> &'static str {
    protocol.strip_prefix("HTTP/").unwrap_or(protocol)
}

/// A target's path: without its query, and without the scheme and
/// authority of an absolute-form target (the head reader's rule; a target
/// it does not read is cut at its query only).
fn path_of(target: &str) -> String {
    match crate::wire::target::request_target(target) {
        Some(t) => t.path().to_string(),
        None => target.split('?').next().unwrap_or(target).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Tracer;

    #[test]
    fn a_targets_path_has_no_query_or_authority() {
        assert_eq!(path_of("/a/b?token=x"), "/a/b");
        assert_eq!(path_of("http://h.example:80/p?q"), "/p");
        assert_eq!(path_of("https://h.example"), "/");
        assert_eq!(path_of("*"), "*");
    }

    /// A client's 30 KB path, Host and tenant cost a pinned span at most
    /// [`MAX_ATTRIBUTE_BYTES`] each.
    #[test]
    fn a_span_keeps_a_bounded_part_of_what_a_client_sent() {
        let long = format!("/{}", "a".repeat(30_000));
        let summary = crate::summary::tests::client_strings(&long);
        let trace = Tracer::new(None).start(std::iter::empty());
        assert!(trace.is_none(), "off: no context");
        let trace = TraceContext {
            trace_id: 1,
            span_id: 2,
            parent_id: 0,
            sampled: true,
            attempt_id: 3,
        };
        let now = Instant::now();
        let attempt = AttemptSpan {
            id: 3,
            started: now,
            ended: None,
            shard: None,
            failure: None,
            status: Some(200),
        };
        let finished = Finished {
            trace: &trace,
            summary: &summary,
            route: None,
            attempts: std::slice::from_ref(&attempt),
            started: now,
            ended: now,
        };
        let scope = opentelemetry::InstrumentationScope::builder("test").build();
        let spans = finished.spans(&scope);
        let mut heap = 0;
        for span in &spans {
            for kv in &span.attributes {
                let value = kv.value.as_str();
                assert!(value.len() <= MAX_ATTRIBUTE_BYTES + 3, "{}", kv.key);
                heap += kv.key.as_str().len() + value.len();
            }
            heap += span.attributes.capacity() * std::mem::size_of::<KeyValue>();
        }
        let url = &spans[0]
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == "url.path");
        assert!(url.is_some_and(|kv| kv.value.as_str().ends_with('…')));
        let size = std::mem::size_of::<SpanData>() * spans.len() + heap;
        // The bound the README states (a request span and one attempt's).
        assert!(size < 10 * 1024, "{size} bytes");
        println!("a request's spans with a 30 KB path, Host, tenant: {size} bytes");
    }
}
