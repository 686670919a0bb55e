//! The fields a request and a response carry past shardgate, for both
//! transports: the hop-by-hop table and the fields shardgate owns upstream
//! applied (the rules themselves are `wire::fields`, which configuration
//! validation checks names against too), the forwarding fields, WebSocket
//! detection, and the check for a switch of protocols nobody asked for.
//! Pingora's path applies them to header maps, the fast path to raw heads.

use crate::trace::TraceParent;
pub use crate::wire::fields::{is_hop_by_hop, is_hop_by_hop_name, same_field, Owned, HOP_BY_HOP};
pub(crate) use crate::wire::text::IpText;
use http::header::{HeaderName, CONNECTION};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use std::fmt::Write;
use std::net::IpAddr;

pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// The edit of a proxied response's head, for both transports: the
/// embedder's (`GatewayHooks::edit_response`), and on a TLS connection
/// HTTP/3's advertisement (`Alt-Svc`, DESIGN §9), after the shard's
/// fields (as nginx's `add_header`). `None`: nothing to change.
impl crate::proxy::Gateway {
    pub fn response_edit(
        &self,
        status: u16,
        ctx: &crate::proxy::ctx::RequestCtx,
    ) -> Option<crate::hooks::ResponseEdit> {
        let shard = ctx.shard.as_ref()?;
        let control = self.control();
        let mut edit = crate::hooks::ResponseEdit::new(status);
        let tenant = ctx.tenant.as_deref().unwrap_or_default();
        control.hooks.edit_response(tenant, shard.id(), &mut edit);
        let quic = control.config.quic.as_ref();
        if let Some(alt_svc) = quic.and_then(|q| q.alt_svc.as_ref()).filter(|_| ctx.tls) {
            edit.append(http::header::ALT_SVC, alt_svc.clone());
        }
        (!edit.is_empty()).then_some(edit)
    }
}

/// How the pipeline fills [`Owned`] in: from the configuration, and per
/// request from its trace.
impl<'a> Owned<'a> {
    /// The fields `config` makes shardgate's.
    pub fn of(config: &'a crate::config::Config) -> Self {
        Owned {
            tenant_header: config.tenant_header.as_str(),
            request_id_header: config.request_id.header.as_str(),
            trust_forwarded_for: config.trust_forwarded_for,
            traceparent: config.tracing.is_some(),
            tracestate: false,
        }
    }

    /// The fields owned for a request in `trace`: its `tracestate` too
    /// when the trace starts here.
    pub fn for_trace(self, trace: Option<&crate::trace::TraceContext>) -> Self {
        Owned {
            tracestate: trace.is_some_and(|t| t.parent_id == 0),
            ..self
        }
    }
}

/// Comma-separated tokens of a field value, trimmed, empty ones skipped.
pub fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Whether an `Upgrade` value asks for the WebSocket protocol: the value
/// is `websocket` (trimmed, any case) and nothing else — Pingora's own
/// rule for which upgrades it forwards, so both transports agree.
pub fn names_websocket(upgrade: &[u8]) -> bool {
    upgrade.trim_ascii().eq_ignore_ascii_case(b"websocket")
}

/// Whether a request is a WebSocket handshake (RFC 6455 §4.1), the one
/// rule every path asks (the head reader, both transports, the read
/// timeouts): an HTTP/1.1 `GET` whose `Connection` has the `upgrade`
/// token and whose one `Upgrade` field names only `websocket`.
pub fn websocket_handshake<'v>(
    method: &str,
    http11: bool,
    connection: impl Iterator<Item = &'v [u8]>,
    mut upgrade: impl Iterator<Item = &'v [u8]>,
) -> bool {
    let mut connection = connection;
    method == "GET"
        && http11
        && connection.any(|v| tokens(v).any(|t| t.eq_ignore_ascii_case(b"upgrade")))
        && matches!((upgrade.next(), upgrade.next()), (Some(u), None) if names_websocket(u))
}

/// The hop-by-hop rule for a shard's response (RFC 9110 §7.6.1), for
/// every transport: the fields of [`HOP_BY_HOP`] and the fields its
/// `Connection` names go, and a 101 keeps `Connection` and `Upgrade`. The
/// framing fields (`Content-Length`, `Transfer-Encoding`) are left to the
/// writer, which frames the body itself.
pub struct ResponseHops<'a> {
    switching: bool,
    /// The fields the shard's `Connection` names (framing fields aside).
    named: smallvec::SmallVec<[&'a [u8]; 4]>,
}

impl<'a> ResponseHops<'a> {
    /// The rule for a response with `status` whose `Connection` fields
    /// are `connection`.
    pub fn new(status: u16, connection: impl Iterator<Item = &'a [u8]>) -> Self {
        let names_no_field =
            |t: &[u8]| t.eq_ignore_ascii_case(b"keep-alive") || t.eq_ignore_ascii_case(b"close");
        let named = connection
            // Nearly every shard's value, at a glance: no tokens to split.
            .filter(|value| !names_no_field(value))
            .flat_map(tokens)
            .filter(|t| !is_framing(t) && !names_no_field(t))
            .collect();
        ResponseHops {
            switching: status == 101,
            named,
        }
    }

    /// Whether the field `name` goes on to the client (framing fields
    /// always do: the writer decides on them).
    pub fn keeps(&self, name: &[u8]) -> bool {
        if is_framing(name) {
            return true;
        }
        let named = |n: &[u8]| name.eq_ignore_ascii_case(n);
        if self.switching && (named(b"connection") || named(b"upgrade")) {
            return true;
        }
        !is_hop_by_hop_name(name) && !self.named.iter().any(|n| named(n))
    }
}

/// `Content-Length` or `Transfer-Encoding`: framing, which each writer
/// sets for the body it writes.
pub(crate) fn is_framing(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"content-length") || name.eq_ignore_ascii_case(b"transfer-encoding")
}

/// A shard's `101 Switching Protocols` to a request that asked for no
/// WebSocket: not an answer shardgate forwards (502, no failure hook, no
/// retry — the shard is reachable and the request was delivered).
pub fn unrequested_switch(status: u16, websocket_asked: bool) -> bool {
    status == 101 && !websocket_asked
}

/// What the forwarding fields say about the client (DESIGN §2 "Forward").
pub struct Forwarding<'a> {
    /// The client's `Host` (or absolute-form authority), verbatim.
    pub host: &'a str,
    /// `http` or `https`.
    pub proto: &'static str,
    /// The peer's IP, if the connection has one.
    pub peer_ip: Option<IpAddr>,
    /// The fields shardgate owns (and whether to append to a client-sent
    /// `X-Forwarded-For` instead of replacing it).
    pub owned: Owned<'a>,
    pub tenant: &'a str,
    /// The request's ID.
    pub request_id: &'a str,
    /// The trace context the shard continues, when tracing is on.
    pub traceparent: Option<TraceParent>,
}

impl Forwarding<'_> {
    /// Whether `name` is a field shardgate owns upstream (see
    /// [`Owned::owns`]).
    pub fn owns(&self, name: &str) -> bool {
        self.owned.owns(name)
    }

    /// The fields shardgate sets upstream, in the order they are written,
    /// each handed to `emit`. `prior_xff`: the client's `X-Forwarded-For`
    /// values (read only when trusted, and kept only if all of them are
    /// text).
    pub fn each_field<'v>(
        &self,
        prior_xff: impl Iterator<Item = &'v [u8]>,
        mut emit: impl FnMut(&str, &str),
    ) {
        emit("X-Forwarded-Host", self.host);
        emit("X-Forwarded-Proto", self.proto);
        if let Some(ip) = self.peer_ip.map(canonical_ip) {
            if !self.owned.trust_forwarded_for {
                // The common case, without an allocation.
                let text = IpText::of(ip);
                emit("X-Forwarded-For", text.as_str());
                emit("X-Real-IP", text.as_str());
                self.emit_ours(emit);
                return;
            }
            let mut chain = String::with_capacity(48);
            {
                let prior: Vec<&[u8]> = prior_xff.collect();
                if prior.iter().all(|v| is_text(v)) {
                    for value in prior {
                        // Text, checked above.
                        chain.push_str(std::str::from_utf8(value).unwrap_or_default());
                        chain.push_str(", ");
                    }
                }
            }
            let start = chain.len();
            let _ = write!(chain, "{ip}");
            emit("X-Forwarded-For", &chain);
            emit("X-Real-IP", &chain[start..]);
        }
        self.emit_ours(emit);
    }

    /// The tenant's field and the request ID's.
    fn emit_ours(&self, mut emit: impl FnMut(&str, &str)) {
        emit(self.owned.tenant_header, self.tenant);
        emit(self.owned.request_id_header, self.request_id);
        if let Some(traceparent) = &self.traceparent {
            emit("traceparent", traceparent.as_str());
        }
    }

    /// Applies the fields to a Pingora request head: the client's own and
    /// hop-by-hop fields go, ours are set. (`Connection` and `Upgrade` are
    /// left to Pingora's WebSocket-only upgrade policy, which removes them
    /// unless the request is a WebSocket handshake.)
    pub fn apply(&self, req: &mut RequestHeader) -> Result<()> {
        let prior: Vec<Vec<u8>> = if self.owned.trust_forwarded_for {
            req.headers
                .get_all(&X_FORWARDED_FOR)
                .iter()
                .map(|v| v.as_bytes().to_vec())
                .collect()
        } else {
            Vec::new()
        };
        let theirs: Vec<HeaderName> = req
            .headers
            .keys()
            .filter(|n| {
                let n = n.as_str();
                self.owns(n) || (is_hop_by_hop(n) && n != "connection" && n != "upgrade")
            })
            .cloned()
            .collect();
        for name in &theirs {
            req.remove_header(name);
        }
        let mut applied = Ok(());
        self.each_field(prior.iter().map(Vec::as_slice), |name, value| {
            if applied.is_ok() {
                applied = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|e| Error::because(ErrorType::InternalError, "header name", e))
                    .and_then(|name| req.insert_header(name, value).map(|_| ()));
            }
        });
        applied
    }
}

/// Whether the client's `TE` fields accept trailers (`TE: trailers`, the
/// one value HTTP/2 allows, RFC 9113 §8.2.2). `TE` is hop-by-hop: an
/// HTTP/2 shard is sent `te: trailers` anew when this holds (gRPC servers
/// refuse a call without it).
pub fn accepts_trailers<'v>(te: impl Iterator<Item = &'v [u8]>) -> bool {
    te.flat_map(|value| value.split(|b| *b == b','))
        .map(|part| {
            part.split(|b| *b == b';')
                .next()
                .unwrap_or_default()
                .trim_ascii()
        })
        .any(|coding| coding.eq_ignore_ascii_case(b"trailers"))
}

/// The `Cookie` fields as one, joined by "; ", when there are several:
/// HTTP/2 lets a client split them, an HTTP/1.1 shard must get one (RFC
/// 9113 §8.2.3).
/// A single field (the common case) costs no allocation.
pub fn joined_cookie<'v>(mut values: impl Iterator<Item = &'v [u8]>) -> Option<Vec<u8>> {
    let first = values.next()?;
    let mut joined = [first, b"; ", values.next()?].concat();
    for value in values {
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(value);
    }
    Some(joined)
}

/// Visible ASCII, spaces and tabs.
pub fn is_text(value: &[u8]) -> bool {
    value
        .iter()
        .all(|b| *b == b'\t' || (b' '..=b'~').contains(b))
}

/// An IPv4 client on a dual-stack listener, as IPv4.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Removes hop-by-hop fields from a shard's response (the rule of
/// [`ResponseHops`]) in a Pingora response head. `Transfer-Encoding`
/// stays: it describes the framing Pingora writes.
pub fn strip_response_hop_by_hop(resp: &mut ResponseHeader) {
    let hop = |k: &HeaderName| k != http::header::TRANSFER_ENCODING && is_hop_by_hop(k.as_str());
    // Most responses carry none: one pass over the names decides.
    if !resp.headers.keys().any(hop) {
        return;
    }
    let gone: Vec<HeaderName> = {
        let hops = ResponseHops::new(
            resp.status.as_u16(),
            resp.headers
                .get_all(CONNECTION)
                .iter()
                .map(|v| v.as_bytes()),
        );
        resp.headers
            .keys()
            .filter(|k| !hops.keeps(k.as_str().as_bytes()))
            .cloned()
            .collect()
    };
    for name in gone {
        resp.remove_header(&name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn te_accepts_trailers_by_its_coding_alone() {
        let accepts = |values: &[&str]| accepts_trailers(values.iter().map(|v| v.as_bytes()));
        assert!(accepts(&["trailers"]));
        assert!(accepts(&["gzip, Trailers"]));
        assert!(accepts(&["gzip;q=0.5", "trailers;q=1"]));
        assert!(!accepts(&["gzip"]));
        assert!(!accepts(&["trailersx", "no-trailers"]));
        assert!(!accepts(&[]));
    }

    fn request() -> RequestHeader {
        let mut req = RequestHeader::build("GET", b"/x?y=1", None).unwrap();
        req.insert_header("host", "App.Acme.com:8080").unwrap();
        req.append_header("x-forwarded-for", "1.2.3.4").unwrap();
        req.append_header("x-forwarded-for", "5.6.7.8").unwrap();
        req.insert_header("x-forwarded-proto", "gopher").unwrap();
        req.insert_header("x-forwarded-host", "evil.example")
            .unwrap();
        req.insert_header("x-tenant-id", "someone-else").unwrap();
        req.insert_header("x_tenant_id", "someone-else").unwrap();
        req.insert_header("X_Forwarded_For", "6.6.6.6").unwrap();
        req.insert_header("x-tenant_id-extra", "kept").unwrap();
        req.insert_header("forwarded", "for=6.6.6.6;proto=https")
            .unwrap();
        for (name, value) in [
            ("x-real-ip", "6.6.6.6"),
            ("true-client-ip", "6.6.6.6"),
            ("cf-connecting-ip", "6.6.6.6"),
            ("transfer_encoding", "chunked"),
            ("content_length", "5"),
            ("proxy-authorization", "Basic eA=="),
            ("te", "trailers"),
            ("x-request-id", "from-the-client"),
            ("X_Request_ID", "from-the-client"),
        ] {
            req.insert_header(name, value).unwrap();
        }
        req
    }

    fn forward(req: &mut RequestHeader, trust: bool, ip: Option<IpAddr>) {
        Forwarding {
            host: "App.Acme.com:8080",
            proto: "https",
            peer_ip: ip,
            owned: Owned {
                tenant_header: "x-tenant-id",
                request_id_header: "x-request-id",
                trust_forwarded_for: trust,
                traceparent: false,
                tracestate: false,
            },
            tenant: "acme",
            request_id: "ours",
            traceparent: None,
        }
        .apply(req)
        .unwrap();
    }

    #[test]
    fn client_forwarding_fields_are_replaced() {
        let mut req = request();
        forward(&mut req, false, Some("::ffff:127.0.0.1".parse().unwrap()));
        let h = &req.headers;
        assert_eq!(h["x-forwarded-host"], "App.Acme.com:8080");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-forwarded-for"], "127.0.0.1");
        assert_eq!(h.get_all("x-tenant-id").iter().count(), 1);
        assert_eq!(h["x-tenant-id"], "acme");
        assert_eq!(h["host"], "App.Acme.com:8080");
        assert!(h.get("x_tenant_id").is_none(), "look-alikes go too");
        assert!(h.get("x_forwarded_for").is_none());
        assert_eq!(h["x-tenant_id-extra"], "kept");
        assert!(h.get("forwarded").is_none());
        assert_eq!(h["x-real-ip"], "127.0.0.1");
        assert_eq!(h.get_all("x-request-id").iter().count(), 1);
        assert_eq!(h["x-request-id"], "ours");
        assert!(h.get("x_request_id").is_none());
        for gone in [
            "true-client-ip",
            "cf-connecting-ip",
            "transfer_encoding",
            "content_length",
            "proxy-authorization",
            "te",
        ] {
            assert!(h.get(gone).is_none(), "{gone} dropped");
        }
    }

    #[test]
    fn trusted_forwarded_for_is_appended_to() {
        let mut req = request();
        forward(&mut req, true, Some("10.1.1.1".parse().unwrap()));
        assert_eq!(req.headers["x-forwarded-for"], "1.2.3.4, 5.6.7.8, 10.1.1.1");
    }

    #[test]
    fn websocket_handshakes_are_one_shape() {
        let ws = |method, http11, connection: &[&str], upgrade: &[&str]| {
            websocket_handshake(
                method,
                http11,
                connection.iter().map(|v| v.as_bytes()),
                upgrade.iter().map(|v| v.as_bytes()),
            )
        };
        assert!(ws("GET", true, &["keep-alive, Upgrade"], &["websocket"]));
        assert!(ws("GET", true, &["x", "upgrade"], &[" WebSocket "]));
        assert!(
            !ws("GET", true, &[], &["websocket"]),
            "no Connection: upgrade"
        );
        assert!(!ws("POST", true, &["upgrade"], &["websocket"]));
        assert!(!ws("GET", false, &["upgrade"], &["websocket"]), "HTTP/1.0");
        assert!(!ws("GET", true, &["upgrade"], &["h2c"]));
        assert!(!ws("GET", true, &["upgrade"], &["websocket", "websocket"]));
    }

    #[test]
    fn a_response_field_connection_names_goes_and_date_is_one_like_any() {
        let hops = ResponseHops::new(200, [&b"close, Date, x-secret"[..]].into_iter());
        assert!(!hops.keeps(b"date") && !hops.keeps(b"X-Secret"));
        assert!(hops.keeps(b"x-kept") && hops.keeps(b"content-length"));
        assert!(!hops.keeps(b"keep-alive") && !hops.keeps(b"connection"));
        let hops = ResponseHops::new(101, [&b"Upgrade"[..]].into_iter());
        assert!(hops.keeps(b"connection") && hops.keeps(b"upgrade"));
        // Named framing fields stay: the writer frames the body.
        let hops = ResponseHops::new(200, [&b"content-length"[..]].into_iter());
        assert!(hops.keeps(b"Content-Length"));
        // A value of only `keep-alive` or `close` names no field; one
        // beside them still does, in any field of several.
        let values = [&b"Keep-Alive"[..], b"close", b"keep-alive, x-b", b"x-c"];
        let hops = ResponseHops::new(200, values.into_iter());
        assert!(hops.named.len() == 2 && !hops.keeps(b"x-b") && !hops.keeps(b"X-C"));
        assert!(hops.keeps(b"x-kept"));
    }

    #[test]
    fn response_hop_by_hop_fields_go() {
        let mut resp = ResponseHeader::build(200, None).unwrap();
        for (k, v) in [
            ("connection", "close, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("trailer", "x-sum"),
            ("upgrade", "h2c"),
            ("x-kept", "yes"),
        ] {
            resp.insert_header(k, v).unwrap();
        }
        strip_response_hop_by_hop(&mut resp);
        let names: Vec<&str> = resp.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, vec!["x-kept"]);
        let mut ws = ResponseHeader::build(101, None).unwrap();
        ws.insert_header("connection", "Upgrade").unwrap();
        ws.insert_header("upgrade", "websocket").unwrap();
        strip_response_hop_by_hop(&mut ws);
        assert_eq!(ws.headers.len(), 2);
    }
}
