//! What the edge answers before routing, for both transports (the front end
//! asks before handing a head to either): ACME HTTP-01 challenges on the
//! plain listeners, and the `redirect_https` listeners' 308.

use super::answer::Refusal;
use super::message::{check_host, closes_connection, host_name, request_target, Target};
use crate::tls::Edge;

/// Where ACME's HTTP-01 validation looks (RFC 8555 §8.3).
const CHALLENGE_PREFIX: &str = "/.well-known/acme-challenge/";

/// What the edge answers, and whether the connection closes after it.
pub struct EdgeAnswer {
    pub answer: Refusal,
    /// A `HEAD` request's: the head only.
    pub head_only: bool,
    pub close: bool,
}

/// The answer to a request head on a plain listener, if the edge answers
/// it: the key authorization of a pending challenge, else (when
/// `redirect` names the https port) a 308 to the same host and target
/// over https — for every request, a WebSocket handshake or a head that
/// does not parse included (400). `None`: route it as usual (no redirect
/// on this listener, or a challenge shardgate does not hold: the tenant's
/// app may run its own ACME).
pub fn edge_answer(head: &[u8], redirect: Option<u16>, edge: &Edge) -> Option<EdgeAnswer> {
    if redirect.is_none() && !edge.challenges_pending() {
        return None;
    }
    // `limits.max_headers` is at most 256.
    let mut fields = [httparse::EMPTY_HEADER; 256];
    let mut req = httparse::Request::new(&mut fields);
    let (target, head_only, close) = match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {
            let connection = (req.headers.iter())
                .filter(|h| h.name.eq_ignore_ascii_case("connection"))
                .map(|h| h.value);
            let close = closes_connection(req.version == Some(0), connection);
            (req.path.unwrap_or(""), req.method == Some("HEAD"), close)
        }
        _ if redirect.is_some() => return Some(bad_host(false)),
        _ => return None,
    };
    if let Some(token) = target.strip_prefix(CHALLENGE_PREFIX) {
        if let Some(key_auth) = edge.challenge(token) {
            return Some(EdgeAnswer {
                answer: Refusal::text(200, key_auth.to_string()),
                head_only,
                close,
            });
        }
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
    // An absolute-form target (RFC 9112 §3.2.2) carries its own authority;
    // an origin-form one (`/…`) never does, whatever its query holds.
    let (host, path) = match request_target(target) {
        Some(Target {
            authority: Some(authority),
            origin,
        }) => (Some(authority), origin),
        Some(Target { origin, .. }) => (host, origin),
        None => (host, "/".into()),
    };
    let name = host
        .and_then(|h| check_host(h).ok())
        .map(|h| host_name(h).to_ascii_lowercase());
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Some(bad_host(head_only));
    };
    let path = match path.starts_with('/') {
        true => path,
        false => "/".into(),
    };
    let location = match port {
        443 => format!("https://{name}{path}"),
        p => format!("https://{name}:{p}{path}"),
    };
    Some(EdgeAnswer {
        answer: Refusal::redirect(location),
        head_only,
        close,
    })
}

/// A 400 for a request without a usable host; the connection closes.
fn bad_host(head_only: bool) -> EdgeAnswer {
    EdgeAnswer {
        answer: Refusal::error(400, "invalid-host"),
        head_only,
        close: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn edge() -> Edge {
        let config = Config::parse(
            "listen: [{addr: 127.0.0.1:8080}]\nshards: [{id: a, url: http://127.0.0.1:9}]\ndomains: {fallback_suffix: .localhost}\n",
            None,
        )
        .expect("config");
        Edge::new(&config)
    }

    fn text(answer: Option<EdgeAnswer>) -> String {
        let a = answer.expect("an answer");
        String::from_utf8(a.answer.http1(a.head_only, a.close)).expect("utf-8")
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
