//! Header rewriting between client and shard. Pingora already strips the
//! standard hop-by-hop request fields and the fields `Connection` names
//! (keeping a WebSocket handshake's `Upgrade`); this adds the forwarding
//! fields, which are never taken from the client, and strips hop-by-hop
//! fields from responses.

use http::header::{HeaderName, CONNECTION, PROXY_AUTHENTICATE, TE, TRAILER, UPGRADE};
use http::HeaderValue;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use std::net::IpAddr;

pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// What the forwarding fields say about the client.
pub struct Forwarding<'a> {
    /// The client's `Host` (or absolute-form authority), verbatim.
    pub host: &'a str,
    /// `http` or `https`.
    pub proto: &'static str,
    /// The peer's IP, if the connection has one.
    pub peer_ip: Option<IpAddr>,
    /// Append to a client-sent `X-Forwarded-For` instead of replacing it.
    pub trust_forwarded_for: bool,
    pub tenant_header: &'a HeaderName,
    pub tenant: &'a str,
}

/// Whether a request field is one shardgate sets itself — the forwarding
/// fields and the tenant header — under its own name or a look-alike with
/// `_` for `-` (CGI-style backends read `X_Tenant_Id` as `X-Tenant-Id`;
/// nginx drops such fields by default for this reason), or RFC 7239's
/// `Forwarded`, which says the same things, unless `trust_forwarded_for`.
/// Either way the client's value never reaches the shard.
pub fn is_ours(name: &str, tenant_header: &str, trust_forwarded_for: bool) -> bool {
    let same = |wanted: &str| {
        name.len() == wanted.len()
            && name.bytes().zip(wanted.bytes()).all(|(a, b)| {
                let a = if a == b'_' { b'-' } else { a };
                let b = if b == b'_' { b'-' } else { b };
                a.eq_ignore_ascii_case(&b)
            })
    };
    same("x-forwarded-for")
        || same("x-forwarded-host")
        || same("x-forwarded-proto")
        || same(tenant_header)
        || (!trust_forwarded_for && same("forwarded"))
}

impl Forwarding<'_> {
    pub fn apply(&self, req: &mut RequestHeader) -> Result<()> {
        // A trusted chain is read before the client's fields go.
        let client_xff = self
            .trust_forwarded_for
            .then(|| joined(req, &X_FORWARDED_FOR))
            .flatten();
        let theirs: Vec<HeaderName> = req
            .headers
            .keys()
            .filter(|n| {
                is_ours(
                    n.as_str(),
                    self.tenant_header.as_str(),
                    self.trust_forwarded_for,
                )
            })
            .cloned()
            .collect();
        for name in &theirs {
            req.remove_header(name);
        }
        req.insert_header(X_FORWARDED_HOST, self.host)?;
        req.insert_header(X_FORWARDED_PROTO, self.proto)?;
        if let Some(ip) = self.peer_ip {
            let ip = canonical(ip).to_string();
            let value = match client_xff {
                Some(prior) => format!("{prior}, {ip}"),
                None => ip,
            };
            req.insert_header(X_FORWARDED_FOR, value)?;
        }
        req.insert_header(self.tenant_header.clone(), self.tenant)?;
        Ok(())
    }
}

/// An IPv4 client on a dual-stack listener, as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Every value of a (list) header joined with `, `; `None` if absent or not
/// text.
fn joined(req: &RequestHeader, name: &HeaderName) -> Option<String> {
    let values: Vec<&str> = req
        .headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str())
        .collect::<Result<_, _>>()
        .ok()?;
    (!values.is_empty()).then(|| values.join(", "))
}

/// Removes hop-by-hop fields from a shard's response: `Connection` and the
/// fields it names, `Keep-Alive`, `Proxy-Connection`, `Proxy-Authenticate`,
/// `TE`, `Trailer`, and `Upgrade` unless the response switches protocols.
/// `Transfer-Encoding` stays: it describes the framing Pingora writes.
pub fn strip_response_hop_by_hop(resp: &mut ResponseHeader) {
    // Most responses carry none: one pass over the names decides.
    let hop_by_hop = [
        &CONNECTION,
        &UPGRADE,
        &KEEP_ALIVE,
        &PROXY_CONNECTION,
        &PROXY_AUTHENTICATE,
        &TE,
        &TRAILER,
    ];
    if !resp.headers.keys().any(|k| hop_by_hop.contains(&k)) {
        return;
    }
    let switching = resp.status == http::StatusCode::SWITCHING_PROTOCOLS;
    if !switching {
        let named: Vec<HeaderName> = resp
            .headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
            .filter(|name| {
                name != http::header::TRANSFER_ENCODING && name != http::header::CONTENT_LENGTH
            })
            .collect();
        for name in named {
            resp.remove_header(&name);
        }
        resp.remove_header(&CONNECTION);
        resp.remove_header(&UPGRADE);
    }
    resp.remove_header(&KEEP_ALIVE);
    resp.remove_header(&PROXY_CONNECTION);
    resp.remove_header(&PROXY_AUTHENTICATE);
    resp.remove_header(&TE);
    resp.remove_header(&TRAILER);
}

/// Whether a header value names the WebSocket protocol.
pub fn is_websocket(upgrade: Option<&HeaderValue>) -> bool {
    upgrade.and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(',')
            .any(|p| p.trim().eq_ignore_ascii_case("websocket"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        req
    }

    fn forward(req: &mut RequestHeader, trust: bool, ip: Option<IpAddr>) {
        let tenant_header = HeaderName::from_static("x-tenant-id");
        Forwarding {
            host: "App.Acme.com:8080",
            proto: "https",
            peer_ip: ip,
            trust_forwarded_for: trust,
            tenant_header: &tenant_header,
            tenant: "acme",
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
    }

    #[test]
    fn trusted_forwarded_for_is_appended_to() {
        let mut req = request();
        forward(&mut req, true, Some("10.1.1.1".parse().unwrap()));
        assert_eq!(req.headers["x-forwarded-for"], "1.2.3.4, 5.6.7.8, 10.1.1.1");
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
