//! The answers shardgate writes itself — refusals, its own errors, the
//! head limits' 408/431, the edge's ACME challenges and https redirects —
//! with their status codes and small bodies (DESIGN §2 "Per request"). One
//! encoder: [`Refusal::fields`] is the head every transport writes (with
//! `Date`), as raw HTTP/1 bytes or as a Pingora response head.

use super::grpc;
use super::request_id::RequestId;
use crate::routing::Decision;
pub use crate::wire::text::escape_json;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::protocols::http::date::get_cached_date;
use pingora::protocols::http::HttpTask;
use pingora_proxy::Session;

/// A refusal to proxy, with everything needed to answer it.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    pub status: u16,
    pub body: String,
    /// `Retry-After` in whole seconds.
    pub retry_after: Option<u32>,
    /// The router's decision, when it was one.
    pub decision: Option<Decision>,
    /// The body's type (`application/json` for shardgate's own answers);
    /// none for an empty body.
    pub content_type: Option<&'static str>,
    /// A redirect's target.
    pub location: Option<Box<str>>,
    /// An embedder's own fields (`RequestCheck::Answer`), after shardgate's.
    pub extra: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The request's ID and its field, written last (over an embedder's
    /// field of the same name).
    pub request_id: Option<Box<(http::HeaderName, RequestId)>>,
    /// The decision's or the error's name (`rate-limited`,
    /// `unknown-domain`): what a gRPC answer's `grpc-message` says.
    pub name: Option<&'static str>,
    /// A gRPC answer's status (DESIGN §8): the answer is then HTTP 200,
    /// trailers-only, and this is its `grpc-status`.
    pub grpc_status: Option<u8>,
}

impl Refusal {
    /// A router refusal: `denied` 403, `capped`/`rate-limited` 429,
    /// `no-*-shards` 503.
    pub fn decision(
        decision: Decision,
        bucket: Option<&str>,
        retry_after_secs: Option<f64>,
    ) -> Self {
        let status = match decision {
            Decision::Denied => 403,
            Decision::Capped | Decision::RateLimited => 429,
            Decision::NoShards | Decision::NoTenantShards | Decision::NoRegionShards => 503,
            Decision::Allow => 500,
        };
        let body = match bucket {
            Some(b) => format!(
                "{{\"decision\":\"{}\",\"bucket\":{}}}",
                decision.as_str(),
                json_string(b)
            ),
            None => format!("{{\"decision\":\"{}\"}}", decision.as_str()),
        };
        Refusal {
            retry_after: retry_after_secs.map(|s| (s.ceil() as u32).max(1)),
            decision: Some(decision),
            name: Some(decision.as_str()),
            ..Refusal::json(status, body)
        }
    }

    /// An error of shardgate's own (`unknown-domain`, `upstream-timeout`, …).
    pub fn error(status: u16, error: &'static str) -> Self {
        Refusal {
            name: Some(error),
            ..Refusal::json(status, format!("{{\"error\":{}}}", json_string(error)))
        }
    }

    /// The same answer as a gRPC client reads one (DESIGN §8): HTTP 200,
    /// `content-type: application/grpc`, no body (trailers-only: the head
    /// ends the stream), `grpc-status` by the HTTP status, `grpc-message`
    /// the decision or error name, and `grpc-retry-pushback-ms` where a
    /// `Retry-After` would be. An embedder's own answer is left as it is.
    pub fn for_grpc(self) -> Self {
        let (Some(name), None) = (self.name, self.grpc_status) else {
            return self;
        };
        let grpc_status = grpc::status_for_http(self.status);
        Refusal {
            status: 200,
            body: String::new(),
            content_type: Some("application/grpc"),
            location: None,
            grpc_status: Some(grpc_status),
            name: Some(name),
            ..self
        }
    }

    /// An answer with a JSON body.
    fn json(status: u16, body: String) -> Self {
        Refusal {
            status,
            body,
            retry_after: None,
            decision: None,
            content_type: Some("application/json"),
            location: None,
            extra: Vec::new(),
            request_id: None,
            name: None,
            grpc_status: None,
        }
    }

    /// The same answer, saying the request's ID in the field `name`.
    pub fn with_request_id(mut self, name: &http::HeaderName, id: &RequestId) -> Self {
        self.request_id = Some(Box::new((name.clone(), id.clone())));
        self
    }

    /// A plain-text answer (an ACME challenge's key authorization).
    pub fn text(status: u16, body: String) -> Self {
        Refusal {
            content_type: Some("text/plain"),
            ..Refusal::json(status, body)
        }
    }

    /// A permanent redirect (308) to `location`, with no body.
    pub fn redirect(location: String) -> Self {
        Refusal {
            content_type: None,
            location: Some(location.into_boxed_str()),
            ..Refusal::json(308, String::new())
        }
    }

    /// An embedder's refusal (see `GatewayHooks::check_request`): its status
    /// (a status outside 200–599 is sent as 500) and body.
    pub fn custom(status: u16, body: String) -> Self {
        let status = if (200..=599).contains(&status) {
            status
        } else {
            500
        };
        // 204, 205 and 304 have no content (RFC 9110 §15.3.5, §15.3.6,
        // §15.4.5): a body after their head would be read as the next
        // response on a kept-alive connection.
        let body = if bodiless(status) {
            String::new()
        } else {
            body
        };
        Refusal::json(status, body)
    }

    /// An embedder's own answer (see `GatewayHooks::check_request`): its
    /// status (outside 200–599: 500), its `fields` (framing, hop-by-hop
    /// fields and `Date` are the transports' to write: dropped) and body.
    pub fn answer(
        status: u16,
        fields: Vec<(http::HeaderName, http::HeaderValue)>,
        body: String,
    ) -> Self {
        let extra = fields
            .into_iter()
            .filter(|(name, _)| crate::proxy::hooks::editable(name))
            .collect();
        Refusal {
            content_type: None,
            extra,
            ..Refusal::custom(status, body)
        }
    }

    /// The answer's head fields, in order: what both transports write.
    pub fn fields(&self) -> impl Iterator<Item = (&str, String)> + '_ {
        let theirs = |name: &str| self.extra.iter().any(|(n, _)| n.as_str() == name);
        let id = self.request_id.as_deref();
        let ours = move |name: &http::HeaderName| id.is_some_and(|(n, _)| n == name);
        let grpc = self.grpc_status;
        let fixed: [Option<(&str, String)>; 8] = [
            self.content_type.map(|t| ("content-type", t.to_string())),
            // None on a 204 or 304 (RFC 9110 §8.6).
            (!matches!(self.status, 204 | 304))
                .then(|| ("content-length", self.body.len().to_string())),
            (!theirs("cache-control")).then(|| ("cache-control", "no-store".to_string())),
            self.retry_after.map(|secs| match grpc {
                None => ("retry-after", secs.to_string()),
                Some(_) => (
                    "grpc-retry-pushback-ms",
                    (u64::from(secs) * 1000).to_string(),
                ),
            }),
            self.location
                .as_deref()
                .map(|l| ("location", l.to_string())),
            Some((
                "date",
                String::from_utf8_lossy(get_cached_date().as_bytes()).into_owned(),
            )),
            grpc.map(|status| ("grpc-status", status.to_string())),
            grpc.and(self.name)
                .map(|name| ("grpc-message", name.to_string())),
        ];
        // A value that is not visible ASCII (as `http` reads it) is left out.
        let extra = (self.extra.iter())
            .filter(move |(name, _)| !ours(name))
            .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?.to_string())));
        let id = id.map(|(name, id)| (name.as_str(), id.to_string()));
        fixed.into_iter().flatten().chain(extra).chain(id)
    }

    /// The answer as HTTP/1.1 bytes; `close`: the connection closes after
    /// it (and says so).
    pub fn http1(&self, head_only: bool, close: bool) -> Vec<u8> {
        self.http1_to(head_only, close, false)
    }

    /// As [`Refusal::http1`], to an HTTP/1.0 client if `http10` (which
    /// needs `Connection: keep-alive` to keep its connection).
    pub fn http1_to(&self, head_only: bool, close: bool, http10: bool) -> Vec<u8> {
        let reason = http::StatusCode::from_u16(self.status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or_default();
        let mut out = Vec::with_capacity(192 + self.body.len());
        out.extend_from_slice(format!("HTTP/1.1 {} {reason}\r\n", self.status).as_bytes());
        for (name, value) in self.fields() {
            for part in [name.as_bytes(), b": ", value.as_bytes(), b"\r\n"] {
                out.extend_from_slice(part);
            }
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        } else if http10 {
            out.extend_from_slice(b"connection: keep-alive\r\n");
        }
        out.extend_from_slice(b"\r\n");
        if !head_only {
            out.extend_from_slice(self.body.as_bytes());
        }
        out
    }

    /// The answer's head, for a Pingora session (either HTTP version).
    pub fn response_header(&self) -> Result<Box<ResponseHeader>> {
        let mut resp = ResponseHeader::build(self.status, Some(6))?;
        for (name, value) in self.fields() {
            resp.append_header(name.to_string(), value)?;
        }
        Ok(Box::new(resp))
    }

    /// Writes the answer through Pingora's session; the connection stays
    /// usable when the request was read whole. An answer with no body ends
    /// with its head (a gRPC answer's trailers-only HEADERS frame).
    pub async fn send(&self, session: &mut Session) -> Result<()> {
        let head_only = session.req_header().method == http::Method::HEAD;
        if self.grpc_status.is_some() {
            // Trailers-only: one HEADERS frame that ends the stream
            // (Pingora's `write_response_header` leaves it open on HTTP/2).
            let head = HttpTask::Header(self.response_header()?, true);
            session.as_mut().response_duplex_vec(vec![head]).await?;
            return Ok(());
        }
        session
            .write_response_header(self.response_header()?, head_only)
            .await?;
        if !head_only {
            session
                .write_response_body(Some(Bytes::from(self.body.clone())), true)
                .await?;
        }
        Ok(())
    }
}

/// Whether an answer with `status` has no content.
fn bodiless(status: u16) -> bool {
    matches!(status, 204 | 205 | 304)
}

/// A JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    escape_json(&mut out, s);
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_map_decisions_to_status_and_body() {
        let r = Refusal::decision(Decision::RateLimited, Some("/api/export"), Some(0.2));
        assert_eq!(r.status, 429);
        assert_eq!(
            r.body,
            r#"{"decision":"rate-limited","bucket":"/api/export"}"#
        );
        assert_eq!(r.retry_after, Some(1));
        assert_eq!(
            Refusal::decision(Decision::RateLimited, Some("tenant"), Some(2.01)).retry_after,
            Some(3)
        );
        assert_eq!(Refusal::decision(Decision::Capped, None, None).status, 429);
        assert_eq!(Refusal::decision(Decision::Denied, None, None).status, 403);
        assert_eq!(
            Refusal::decision(Decision::NoRegionShards, None, None).status,
            503
        );
        assert_eq!(
            Refusal::error(404, "unknown-domain").body,
            r#"{"error":"unknown-domain"}"#
        );
    }

    #[test]
    fn a_grpc_call_is_refused_in_grpc() {
        let fields = |r: &Refusal| -> Vec<(String, String)> {
            r.fields()
                .filter(|(n, _)| *n != "date")
                .map(|(n, v)| (n.to_string(), v))
                .collect()
        };
        let r = Refusal::decision(Decision::RateLimited, Some("tenant"), Some(1.5)).for_grpc();
        assert_eq!((r.status, r.body.as_str()), (200, ""));
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            fields(&r),
            pairs(&[
                ("content-type", "application/grpc"),
                ("content-length", "0"),
                ("cache-control", "no-store"),
                ("grpc-retry-pushback-ms", "2000"),
                ("grpc-status", "8"),
                ("grpc-message", "rate-limited"),
            ])
        );
        let table = [
            (Refusal::decision(Decision::Denied, None, None), 7, "denied"),
            (
                Refusal::decision(Decision::Capped, None, Some(1.0)),
                8,
                "capped",
            ),
            (Refusal::error(413, "body-too-large"), 8, "body-too-large"),
            (Refusal::error(404, "unknown-domain"), 12, "unknown-domain"),
            (Refusal::error(400, "bad-request"), 13, "bad-request"),
            (
                Refusal::error(431, "header-too-large"),
                13,
                "header-too-large",
            ),
            (
                Refusal::decision(Decision::NoShards, None, None),
                14,
                "no-shards",
            ),
            (
                Refusal::error(502, "upstream-unreachable"),
                14,
                "upstream-unreachable",
            ),
            (
                Refusal::error(504, "upstream-timeout"),
                4,
                "upstream-timeout",
            ),
        ];
        for (refusal, status, message) in table {
            let r = refusal.for_grpc();
            let got = fields(&r);
            assert!(
                got.contains(&("grpc-status".into(), status.to_string())),
                "{got:?}"
            );
            assert!(
                got.contains(&("grpc-message".into(), message.into())),
                "{got:?}"
            );
            assert!(!got.iter().any(|(n, _)| n == "retry-after"), "{got:?}");
        }
        // An embedder's own answer is its own.
        let own = Refusal::custom(451, "no".into()).for_grpc();
        assert_eq!((own.status, own.grpc_status), (451, None));
    }

    #[test]
    fn every_answer_is_dated_and_framed() {
        let r = Refusal::decision(Decision::RateLimited, Some("tenant"), Some(1.5));
        let text = String::from_utf8(r.http1(false, true)).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
            "{text}"
        );
        for field in [
            "\r\ndate: ",
            "\r\nretry-after: 2\r\n",
            "\r\nconnection: close\r\n",
        ] {
            assert!(text.contains(field), "{field:?} in {text}");
        }
        assert!(text.ends_with(&format!("\r\n\r\n{}", r.body)));
        let head = String::from_utf8(r.http1(true, false)).unwrap();
        assert!(head.ends_with("\r\n\r\n") && !head.contains("connection"));
    }
}
