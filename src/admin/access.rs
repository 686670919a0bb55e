//! Who may call the admin API: the bearer token, or without one only this
//! machine and never another site's page; `/metrics` for an address, not
//! a name (DNS rebinding), or the token.

use super::AdminApi;
use crate::config::AdminToken;
use pingora::protocols::http::ServerSession;

impl AdminApi {
    pub(super) fn authorized(&self, session: &ServerSession) -> bool {
        let Some(token) = &self.control.config.admin.token else {
            // Loopback only (checked by validation), but a browser on this
            // machine could still be made to call it by another site.
            return from_this_machine_not_another_site(session.req_header());
        };
        bears(session.req_header(), token)
    }

    /// `/metrics` answers a `Host` that is an address, or the bearer token.
    pub(super) fn may_scrape(&self, session: &ServerSession) -> bool {
        let req = session.req_header();
        let token = self.control.config.admin.token.as_ref();
        host_is_an_address(req) || token.is_some_and(|t| bears(req, t))
    }
}

/// Without a token, `/v1/` answers only what cannot come from a web page
/// of another site: the `Host` must name the loopback (not a name an
/// attacker's DNS points at 127.0.0.1: DNS rebinding), and a browser's
/// `Sec-Fetch-Site` and `Origin`, when sent, must say the admin's own
/// page. (With a token, a cross-site page cannot send the
/// `Authorization` header without a CORS preflight, which is never
/// granted.)
fn from_this_machine_not_another_site(req: &pingora::http::RequestHeader) -> bool {
    let header = |name: &str| lowercase_header(req, name);
    let host = header("host").unwrap_or_default();
    let name = host_name(&host);
    let loopback = name == "localhost"
        || name == "[::1]"
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback());
    let same_site = match header("sec-fetch-site").as_deref() {
        None | Some("same-origin") | Some("none") => true,
        Some(_) => false,
    };
    let same_origin = match header("origin") {
        None => true,
        Some(origin) => origin == format!("http://{host}"),
    };
    loopback && same_site && same_origin
}

/// Whether the request's `Host` is an IP address or `localhost`: never a
/// name, so never a page whose DNS an attacker re-pointed at this
/// listener (DNS rebinding), which is how a browser would be made to read
/// `/metrics` for another site. Scrapers address the listener by IP (or
/// send the bearer token).
fn host_is_an_address(req: &pingora::http::RequestHeader) -> bool {
    let host = lowercase_header(req, "host").unwrap_or_default();
    let name = host_name(&host);
    let v6 = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok());
    name == "localhost" || v6 || name.parse::<std::net::Ipv4Addr>().is_ok()
}

fn lowercase_header(req: &pingora::http::RequestHeader, name: &str) -> Option<String> {
    (req.headers.get(name))
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase)
}

/// A `Host` value without its port.
fn host_name(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Whether the request carries `Authorization: Bearer <token>`.
fn bears(req: &pingora::http::RequestHeader, token: &AdminToken) -> bool {
    let header = (req.headers.get(http::header::AUTHORIZATION))
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    let given = header.strip_prefix(b"Bearer ").unwrap_or(b"");
    token.matches(given)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        let token = AdminToken::new(b"secret-of-16-bytes");
        assert!(token.matches(b"secret-of-16-bytes"));
        assert!(!token.matches(b"secret-of-16-byte"));
        assert!(!token.matches(b"secret-of-16-bytes!"));
        assert!(!token.matches(b""));
        assert!(!token.matches(b"Secret-of-16-bytes"));
        assert_eq!(format!("{token:?}"), "AdminToken(..)", "never printed");
    }

    #[test]
    fn metrics_answer_an_address_not_a_name() {
        let req = |host: Option<&str>| {
            let mut r = pingora::http::RequestHeader::build("GET", b"/metrics", None).expect("req");
            if let Some(host) = host {
                r.insert_header("host", host).expect("header");
            }
            host_is_an_address(&r)
        };
        for host in [
            "127.0.0.1:9901",
            "10.0.0.5",
            "[::1]:9901",
            "[fd00::5]",
            "LocalHost:1",
        ] {
            assert!(req(Some(host)), "{host}");
        }
        for host in [
            "evil.example:9901",
            "127.0.0.1.nip.io",
            "[evil]",
            "",
            "localhost.evil",
        ] {
            assert!(!req(Some(host)), "{host}");
        }
        assert!(!req(None));
    }

    #[test]
    fn an_open_admin_answers_its_own_page_not_another_sites() {
        let req = |headers: &[(&str, &str)]| {
            let mut r =
                pingora::http::RequestHeader::build("POST", b"/v1/shards", None).expect("request");
            for (k, v) in headers {
                r.insert_header(k.to_string(), v.to_string())
                    .expect("header");
            }
            from_this_machine_not_another_site(&r)
        };
        assert!(req(&[("host", "127.0.0.1:9901")]));
        assert!(req(&[
            ("host", "localhost:9901"),
            ("sec-fetch-site", "same-origin"),
            ("origin", "http://localhost:9901")
        ]));
        assert!(req(&[("host", "[::1]:9901"), ("sec-fetch-site", "none")]));
        assert!(!req(&[("host", "evil.example:9901")]), "DNS rebinding");
        assert!(!req(&[
            ("host", "127.0.0.1:9901"),
            ("sec-fetch-site", "cross-site")
        ]));
        assert!(!req(&[
            ("host", "127.0.0.1:9901"),
            ("origin", "http://evil.example")
        ]));
        assert!(!req(&[]));
    }
}
