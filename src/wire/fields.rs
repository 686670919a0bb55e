//! Which request and response fields are whose: the hop-by-hop table
//! (both directions), the fields shardgate owns upstream and never takes
//! from a client, and when two field names are one field to a backend.
//! Configuration validation checks the configured names against them;
//! the pipeline (`proxy::pipeline::fields`) applies them on both
//! transports.

/// Hop-by-hop fields (RFC 9110 §7.6.1), removed in both directions;
/// `Connection` and `Upgrade` survive only a WebSocket handshake, and
/// `Transfer-Encoding` is re-framed by the transport that writes the body.
pub const HOP_BY_HOP: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "http2-settings",
];

/// Field names not among `http`'s standard ones that nearly every
/// request or gRPC response through shardgate carries: the forwarding
/// fields, the default tenant and request-ID fields, trace context, and
/// gRPC's own. Named from here, they cost no allocation (a name
/// `HeaderName::from_bytes` does not know is copied into one).
static KNOWN_NAMES: [http::HeaderName; 14] = [
    http::HeaderName::from_static("x-forwarded-for"),
    http::HeaderName::from_static("x-forwarded-host"),
    http::HeaderName::from_static("x-forwarded-proto"),
    http::HeaderName::from_static("x-real-ip"),
    http::HeaderName::from_static("x-tenant-id"),
    http::HeaderName::from_static("x-request-id"),
    http::HeaderName::from_static("traceparent"),
    http::HeaderName::from_static("tracestate"),
    http::HeaderName::from_static("grpc-status"),
    http::HeaderName::from_static("grpc-message"),
    http::HeaderName::from_static("grpc-encoding"),
    http::HeaderName::from_static("grpc-accept-encoding"),
    http::HeaderName::from_static("grpc-timeout"),
    http::HeaderName::from_static("grpc-status-details-bin"),
];

/// The field name `name` (any case), as `HeaderName::from_bytes` reads it,
/// without an allocation for the names of [`KNOWN_NAMES`].
pub fn field_name(name: &[u8]) -> Result<http::HeaderName, http::header::InvalidHeaderName> {
    // Every known name begins with `x`, `t` or `g`; the standard ones
    // (most of a head) mostly do not.
    if !matches!(
        name.first().map(u8::to_ascii_lowercase),
        Some(b'x' | b't' | b'g')
    ) {
        return http::HeaderName::from_bytes(name);
    }
    let known = KNOWN_NAMES.iter().find(|known| {
        let known = known.as_str().as_bytes();
        known.len() == name.len() && known.eq_ignore_ascii_case(name)
    });
    match known {
        Some(known) => Ok(known.clone()),
        None => http::HeaderName::from_bytes(name),
    }
}

/// Whether `name` is a hop-by-hop field of [`HOP_BY_HOP`].
pub fn is_hop_by_hop(name: &str) -> bool {
    is_hop_by_hop_name(name.as_bytes())
}

/// [`is_hop_by_hop`] for a name as bytes: the table, looked up by length
/// first (every request and response field is asked).
pub fn is_hop_by_hop_name(name: &[u8]) -> bool {
    let is = |field: &str| name.eq_ignore_ascii_case(field.as_bytes());
    match name.len() {
        2 => is("te"),
        7 => is("trailer") || is("upgrade"),
        10 => is("connection") || is("keep-alive"),
        14 => is("http2-settings"),
        16 => is("proxy-connection"),
        17 => is("transfer-encoding"),
        18 => is("proxy-authenticate"),
        19 => is("proxy-authorization"),
        _ => false,
    }
}

/// Whether two field names are the same field to a backend: equal but for
/// case and `_` for `-` (CGI-style backends read `X_User` as `X-User`).
pub fn same_field(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes().zip(b.bytes()).all(|(a, b)| {
            let a = if a == b'_' { b'-' } else { a };
            let b = if b == b'_' { b'-' } else { b };
            a.eq_ignore_ascii_case(&b)
        })
}

/// The client-address fields frameworks trust that shardgate neither sets
/// nor forwards (DESIGN §3).
const CLIENT_ADDRESS_FIELDS: [&str; 5] = [
    "x-client-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-cluster-client-ip",
];

/// The request fields shardgate owns upstream, as configured.
#[derive(Clone, Copy, Debug)]
pub struct Owned<'a> {
    pub tenant_header: &'a str,
    /// `request_id.header`.
    pub request_id_header: &'a str,
    /// Whether a client's `Forwarded` (and `X-Forwarded-For`) is trusted.
    pub trust_forwarded_for: bool,
    /// `traceparent`, when tracing is on (off, the client's passes).
    pub traceparent: bool,
    /// `tracestate`, when tracing started a new trace for the request (the
    /// caller's state belongs to a trace the shard does not see; W3C Trace
    /// Context §4.3). Per request: [`Owned::of`] leaves it false.
    pub tracestate: bool,
}

impl Owned<'_> {
    /// Whether a request field is one shardgate owns upstream — the
    /// forwarding fields, `X-Real-IP`, the tenant header, the request ID's
    /// field, the client-address fields frameworks trust, RFC 7239's
    /// `Forwarded` unless `trust_forwarded_for`, and the framing fields —
    /// under its own name or a look-alike with `_` for `-` (CGI-style
    /// backends read `X_Tenant_Id` as `X-Tenant-Id`; nginx drops such fields
    /// by default for this reason). The client's value never reaches the
    /// shard. (The real `Content-Length` and `Transfer-Encoding` are the
    /// transports' to frame; only their look-alikes are caught here.)
    pub fn owns(&self, name: &str) -> bool {
        let same = |wanted: &str| same_field(name, wanted);
        // The length first (`same`), the `_` only then: nearly every name
        // is neither.
        let look_alike = |wanted: &str| same(wanted) && name.as_bytes().contains(&b'_');
        same("x-forwarded-for")
            || same("x-forwarded-host")
            || same("x-forwarded-proto")
            || same("x-real-ip")
            || same(self.tenant_header)
            || same(self.request_id_header)
            || (!self.trust_forwarded_for && same("forwarded"))
            || (self.traceparent && same("traceparent"))
            || (self.tracestate && same("tracestate"))
            || CLIENT_ADDRESS_FIELDS.iter().any(|f| same(f))
            || look_alike("content-length")
            || look_alike("transfer-encoding")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hop_by_hop_lookup_is_the_table() {
        for field in HOP_BY_HOP {
            assert!(is_hop_by_hop(field) && is_hop_by_hop(&field.to_uppercase()));
        }
        for other in ["host", "te2", "tee", "upgrades", "connections", "x-upgrade"] {
            assert!(!is_hop_by_hop(other), "{other}");
        }
    }

    #[test]
    fn field_names_read_as_the_http_crate_reads_them() {
        let known = KNOWN_NAMES.iter().map(|n| n.as_str().to_string());
        let upper = KNOWN_NAMES.iter().map(|n| n.as_str().to_uppercase());
        let others = [
            "Content-Type",
            "x-other",
            "grpc-statu",
            "grpc-status2",
            "X-Real-Ip",
        ];
        for name in known.chain(upper).chain(others.map(String::from)) {
            let ours = field_name(name.as_bytes()).map(|n| n.to_string());
            let theirs = http::HeaderName::from_bytes(name.as_bytes()).map(|n| n.to_string());
            assert_eq!(ours.ok(), theirs.ok(), "{name}");
        }
        for bad in [&b""[..], b"a b", b"a:b", b"\xff"] {
            assert!(field_name(bad).is_err(), "{bad:?}");
        }
    }
}
