//! `/v1/domains`: the host → tenant map, a host put or removed.

use super::reply::{parse, Reply};
use super::router::Call;
use super::AdminApi;
use http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantBody {
    tenant: String,
}

impl AdminApi {
    /// `/v1/domains/…` (`rest`: the segments after it); `None` for a path
    /// or method it does not serve.
    pub(super) fn domains_endpoint(&self, call: &Call<'_>, rest: &[&str]) -> Option<Reply> {
        let c = &self.control;
        let reply = match (call.method, rest) {
            (&Method::GET, []) => Reply::ok(json!(c.domains.list())),
            (&Method::PUT, [host]) => match parse::<TenantBody>(call.body) {
                Err(r) => r,
                Ok(b) if b.tenant.is_empty() => {
                    Reply::error(StatusCode::BAD_REQUEST, "tenant: must not be empty")
                }
                Ok(b) => match c.put_domain(host, &b.tenant) {
                    Ok(()) => Reply::ok(json!({ "host": host, "tenant": b.tenant })),
                    Err(e) => Reply::error(StatusCode::BAD_REQUEST, e),
                },
            },
            (&Method::DELETE, [host]) => match c.delete_domain(host) {
                true => Reply::ok(json!({ "removed": host })),
                false => Reply::unknown("domain", host),
            },
            _ => return None,
        };
        Some(reply)
    }
}
