//! `tracing`, `request_id` and `log`: what shardgate tells collectors,
//! shards and the access log about each request.

use super::Checker;
use crate::config::raw::{RawLog, RawRequestId, RawTracing};
use crate::config::{AccessFormat, LogConfig, RequestIdConfig, TracingConfig};
use http::HeaderName;
use std::path::PathBuf;

/// `tracing`: a plain-HTTP collector (`http://host[:port][/prefix]`), a
/// ratio between 0 and 1, a service name.
pub(super) fn check_tracing(c: &mut Checker<'_>, t: RawTracing) -> TracingConfig {
    let traces_url = match t.otlp_endpoint.as_deref() {
        None => {
            c.error(
                "tracing.otlp_endpoint",
                "required: the collector's OTLP/HTTP address, e.g. http://127.0.0.1:4318",
            );
            String::new()
        }
        Some(url) => match crate::trace::export::Endpoint::parse(url) {
            // What the exporter will parse it as, checked now.
            Ok(_) => {
                let traces = format!("{}/v1/traces", url.trim_end_matches('/'));
                match traces.parse::<http::Uri>() {
                    Ok(uri) if uri.host().is_some() => traces,
                    _ => {
                        c.error(
                            "tracing.otlp_endpoint",
                            format!("`{url}`: not a URL (an IPv6 address goes in brackets: http://[::1]:4318)"),
                        );
                        String::new()
                    }
                }
            }
            Err(why) => {
                c.error("tracing.otlp_endpoint", format!("`{url}`: {why}"));
                String::new()
            }
        },
    };
    let sample_ratio = t.sample_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sample_ratio) {
        c.error(
            "tracing.sample_ratio",
            format!("{sample_ratio}: expected a number from 0 to 1"),
        );
    }
    let service_name = t.service_name.unwrap_or_else(|| "shardgate".to_string());
    if service_name.is_empty() || service_name.chars().any(char::is_control) {
        c.error(
            "tracing.service_name",
            "expected a name of visible characters",
        );
    }
    TracingConfig {
        traces_url,
        sample_ratio,
        service_name,
    }
}

/// `request_id`: a field that means nothing else to HTTP or to shardgate.
pub(super) fn check_request_id(
    c: &mut Checker<'_>,
    r: RawRequestId,
    tenant_header: &HeaderName,
) -> RequestIdConfig {
    let default = HeaderName::from_static("x-request-id");
    // The default too: `tenant_header: x-request-id` needs another one.
    let name = r.header.as_deref().unwrap_or("x-request-id");
    let header = match c.header_name("request_id.header", name) {
        Some(header) if has_a_meaning(&header, tenant_header) => {
            c.error(
                "request_id.header",
                format!("`{name}` already has a meaning (framing, forwarding, hop-by-hop, tracing, shardgate's own answers or the tenant header): name another field"),
            );
            default
        }
        Some(header) => header,
        None => default,
    };
    RequestIdConfig {
        header,
        trust_incoming: r.trust_incoming,
    }
}

/// Whether a field is one HTTP or shardgate already gives a meaning: the
/// request ID in it would be dropped, or would change what a message
/// means (its framing, its content, a handshake, a cache's or a browser's
/// reading of it).
fn has_a_meaning(name: &HeaderName, tenant_header: &HeaderName) -> bool {
    use crate::wire::fields::{is_hop_by_hop, same_field, Owned};
    const TAKEN: [&str; 40] = [
        "baggage",
        "b3",
        "uber-trace-id",
        "x-cloud-trace-context",
        "x-amzn-trace-id",
        "sentry-trace",
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
        "x-original-url",
        "x-rewrite-url",
        "max-forwards",
        "early-data",
        "host",
        "expect",
        "date",
        "location",
        "retry-after",
        "cookie",
        "set-cookie",
        "authorization",
        "www-authenticate",
        "cache-control",
        "pragma",
        "expires",
        "age",
        "etag",
        "last-modified",
        "vary",
        "range",
        "origin",
        "referer",
        "user-agent",
        "server",
        "via",
        "link",
        "allow",
        "strict-transport-security",
        "traceparent",
        "tracestate",
    ];
    const TAKEN_PREFIXES: [&str; 10] = [
        "grpc-",
        "x-b3-",
        "x-forwarded-",
        "http2-",
        "content-",
        "accept",
        "if-",
        "sec-",
        "access-control-",
        "proxy-",
    ];
    let name = name.as_str();
    let owned = Owned {
        tenant_header: tenant_header.as_str(),
        request_id_header: "",
        trust_forwarded_for: false,
        traceparent: false,
        tracestate: false,
    };
    let lower = name.replace('_', "-");
    is_hop_by_hop(name)
        || owned.owns(name)
        || TAKEN.iter().any(|t| same_field(name, t))
        || TAKEN_PREFIXES.iter().any(|p| lower.starts_with(p))
        || lower == "transfer-encoding"
}

/// `log`: the access log's level, format and file.
pub(super) fn check_log(c: &mut Checker<'_>, raw: RawLog) -> LogConfig {
    let (file_given, format_given) = (raw.access_path.is_some(), raw.access_format.is_some());
    LogConfig {
        access_format: match raw.access_format.as_deref() {
            None | Some("text") => AccessFormat::Text,
            Some("json") => AccessFormat::Json,
            Some(other) => {
                c.error(
                    "log.access_format",
                    format!("`{other}`: expected text or json"),
                );
                AccessFormat::Text
            }
        },
        access_path: match raw.access_path {
            Some(path) if path.is_empty() => {
                c.error("log.access_path", "must not be empty");
                None
            }
            path => path.map(PathBuf::from),
        },
        access: match raw.access.as_deref() {
            // Asking for a file or a format turns the log on.
            None if file_given || format_given => Some(log::Level::Info),
            Some("off") if file_given => {
                c.error(
                    "log.access_path",
                    "the access log is off (`log.access: off`): remove one of the two",
                );
                None
            }
            None | Some("off") => None,
            Some(level) => match level.parse::<log::Level>() {
                Ok(l) => Some(l),
                Err(_) => {
                    c.error(
                        "log.access",
                        format!("`{level}`: expected off, error, warn, info, debug or trace"),
                    );
                    None
                }
            },
        },
    }
}
