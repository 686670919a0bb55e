//! What the edge answers before routing, for both transports (`HeadGuard`
//! asks before handing a head to either): ACME HTTP-01 challenges on the
//! plain listeners, and the `redirect_https` listeners' 308.

use crate::tls::Edge;
use pingora::protocols::http::date::get_cached_date;

/// Where ACME's HTTP-01 validation looks (RFC 8555 §8.3).
const CHALLENGE_PREFIX: &str = "/.well-known/acme-challenge/";

/// The answer to a request head on a plain listener, if the edge answers
/// it: the key authorization of a pending challenge, else (when
/// `redirect` names the https port) a 308 to the same host and target
/// over https. `None`: route it as usual.
pub fn edge_answer(head: &[u8], redirect: Option<u16>, edge: &Edge) -> Option<Vec<u8>> {
    if redirect.is_none() && !edge.challenges_pending() {
        return None;
    }
    let mut fields = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut fields);
    req.parse(head).ok()?;
    let target = req.path?;
    let head_only = req.method == Some("HEAD");
    if let Some(token) = target.strip_prefix(CHALLENGE_PREFIX) {
        if let Some(key_auth) = edge.challenge(token) {
            return Some(answer(
                200,
                &[("content-type", "text/plain")],
                &key_auth,
                head_only,
            ));
        }
        // Not ours: a tenant's app may answer its own challenges.
        return None;
    }
    let port = redirect?;
    let mut hosts = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
        .map(|h| h.value);
    let host = match (hosts.next(), hosts.next()) {
        (Some(h), None) => std::str::from_utf8(h).ok(),
        _ => None,
    };
    // An absolute-form target carries its own authority.
    let (host, path) = match target.split_once("://") {
        Some((_, rest)) => {
            let at = rest.find('/').unwrap_or(rest.len());
            (Some(&rest[..at]), &rest[at..])
        }
        None => (host, target),
    };
    let name = host
        .and_then(|h| http::uri::Authority::try_from(h).ok())
        .filter(|a| !a.as_str().contains('@'))
        .map(|a| a.host().to_string());
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Some(answer(
            400,
            &[("content-type", "application/json")],
            "{\"error\":\"invalid-host\"}",
            head_only,
        ));
    };
    let path = if path.starts_with('/') { path } else { "/" };
    let location = match port {
        443 => format!("https://{name}{path}"),
        p => format!("https://{name}:{p}{path}"),
    };
    Some(answer(308, &[("location", &location)], "", head_only))
}

/// An HTTP/1.1 answer with `Date`, `Content-Length` and `fields`.
fn answer(status: u16, fields: &[(&str, &str)], body: &str, head_only: bool) -> Vec<u8> {
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or_default();
    let mut out = format!("HTTP/1.1 {status} {reason}\r\n");
    for (name, value) in fields {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str(&format!(
        "content-length: {}\r\ncache-control: no-store\r\ndate: {}\r\n\r\n",
        body.len(),
        String::from_utf8_lossy(get_cached_date().as_bytes())
    ));
    if !head_only {
        out.push_str(body);
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn edge() -> Edge {
        let config = Config::parse(
            "listen: [{addr: 127.0.0.1:8080}]\nshards: [{id: a, url: http://127.0.0.1:9}]\n",
            None,
        )
        .expect("config");
        Edge::new(&config)
    }

    fn text(bytes: Option<Vec<u8>>) -> String {
        String::from_utf8(bytes.expect("an answer")).expect("utf-8")
    }

    #[test]
    fn redirects_to_the_https_port_keeping_the_target() {
        let e = edge();
        let a = text(edge_answer(
            b"GET /a?b=1 HTTP/1.1\r\nHost: Shop.Example:80\r\n\r\n",
            Some(443),
            &e,
        ));
        assert!(a.starts_with("HTTP/1.1 308 Permanent Redirect\r\n"), "{a}");
        assert!(
            a.contains("location: https://shop.example/a?b=1\r\n"),
            "{a}"
        );
        let a = text(edge_answer(
            b"GET / HTTP/1.1\r\nHost: x.test\r\n\r\n",
            Some(8443),
            &e,
        ));
        assert!(a.contains("location: https://x.test:8443/\r\n"), "{a}");
        let a = text(edge_answer(
            b"GET / HTTP/1.1\r\nHost: a@b\r\n\r\n",
            Some(443),
            &e,
        ));
        assert!(a.starts_with("HTTP/1.1 400"), "{a}");
        assert!(edge_answer(b"GET / HTTP/1.1\r\nHost: x.test\r\n\r\n", None, &e).is_none());
    }

    #[test]
    fn answers_a_pending_challenge_and_only_that() {
        let e = edge();
        e.publish_challenge("tok", "tok.thumb".to_string());
        let a = text(edge_answer(
            b"GET /.well-known/acme-challenge/tok HTTP/1.1\r\nHost: x.test\r\n\r\n",
            Some(443),
            &e,
        ));
        assert!(
            a.starts_with("HTTP/1.1 200 OK\r\n") && a.ends_with("\r\n\r\ntok.thumb"),
            "{a}"
        );
        // Another token is not redirected either: the app behind may own it.
        assert!(edge_answer(
            b"GET /.well-known/acme-challenge/other HTTP/1.1\r\nHost: x.test\r\n\r\n",
            Some(443),
            &e
        )
        .is_none());
        e.withdraw_challenge("tok");
        assert!(edge_answer(
            b"GET /.well-known/acme-challenge/tok HTTP/1.1\r\nHost: x.test\r\n\r\n",
            None,
            &e
        )
        .is_none());
    }
}
