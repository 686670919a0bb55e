//! The router of `/v1/` paths: the path's segments decoded, then one
//! resource group per first segment (shards, domains, tenants) or one
//! endpoint; what no group serves is "no such endpoint".

use super::reply::Reply;
use super::uri::decode;
use super::AdminApi;
use http::{Method, StatusCode};

/// A `/v1/` request as a resource's handlers see it; each group is given
/// it with the path's segments after its own.
pub(super) struct Call<'r> {
    pub(super) method: &'r Method,
    pub(super) query: Option<&'r str>,
    pub(super) body: &'r [u8],
}

impl AdminApi {
    /// The answer to an authorized request under `/v1`.
    pub(super) async fn route(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        body: &[u8],
    ) -> Reply {
        let segments = match path_segments(path) {
            Ok(segments) => segments,
            Err(reply) => return reply,
        };
        let s: Vec<&str> = segments.iter().map(String::as_str).collect();
        let call = Call {
            method,
            query,
            body,
        };
        let served = match s.as_slice() {
            ["v1", "shards", rest @ ..] => self.shards_endpoint(&call, rest).await,
            ["v1", "domains", rest @ ..] => self.domains_endpoint(&call, rest),
            ["v1", "tenants", rest @ ..] => self.tenants_endpoint(&call, rest),
            ["v1", rest @ ..] => self.other_endpoint(&call, rest),
            _ => Some(Reply::error(StatusCode::NOT_FOUND, "not found")),
        };
        served.unwrap_or_else(|| {
            Reply::error(
                StatusCode::NOT_FOUND,
                format!("no such endpoint: {method} {path}"),
            )
        })
    }

    /// The endpoints that are one path each (`rest`: the segments after
    /// `v1`); `None` for any other.
    fn other_endpoint(&self, call: &Call<'_>, rest: &[&str]) -> Option<Reply> {
        let (query, body) = (call.query, call.body);
        let reply = match (call.method, rest) {
            (&Method::GET, ["cluster"]) => Reply::ok(self.cluster()),
            (&Method::GET, ["certs"]) => self.certs(),
            (&Method::POST, ["certs", "reload"]) => self.reload_certs(),
            (&Method::GET, ["plans"]) => Reply::ok(self.plans()),
            (&Method::GET, ["route"]) => self.explain(query),
            (&Method::GET, ["snapshot"]) => self.snapshot(),
            (&Method::POST, ["restore"]) => self.restore(query, body),
            (&Method::GET, ["metrics"]) => Reply::ok(self.metrics_json()),
            _ => return None,
        };
        Some(reply)
    }
}

/// The path's segments, each `%XX`-decoded; 400 when one does not decode.
fn path_segments(path: &str) -> Result<Vec<String>, Reply> {
    let segments: Option<Vec<String>> = path
        .trim_start_matches('/')
        .split('/')
        .map(decode)
        .collect();
    segments.ok_or_else(|| {
        Reply::error(
            StatusCode::BAD_REQUEST,
            "invalid percent-encoding in the path",
        )
    })
}
