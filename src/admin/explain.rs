//! `GET /v1/route?tenant=…`: the decision the router would make for a
//! request, without making it (nothing is admitted or counted).

use super::reply::Reply;
use super::uri::{param, query_params};
use super::AdminApi;
use crate::limits::ClientKey;
use crate::routing::RouteRequest;
use http::StatusCode;
use serde_json::json;

impl AdminApi {
    pub(super) fn explain(&self, query: Option<&str>) -> Reply {
        let params = query_params(query);
        let get = |name: &str| param(&params, name);
        let Some(tenant) = get("tenant").filter(|t| !t.is_empty()) else {
            return Reply::error(StatusCode::BAD_REQUEST, "tenant: required");
        };
        let region = match (get("region"), &self.control.regions) {
            (Some(r), _) => Some(r.to_string()),
            (None, Some(directory)) => Some(directory.peek_region_for(tenant)),
            (None, None) => None,
        };
        let found = get("path")
            .map(|p| self.routes.route_for(p))
            .unwrap_or_default();
        // An address, or a client as the state file names it (`…/64`).
        let client = match get("client").map(ClientKey::parse) {
            None => None,
            Some(Some(key)) => Some(key.address()),
            Some(None) => {
                return Reply::error(StatusCode::BAD_REQUEST, "client: not an IP address")
            }
        };
        let name = |i: Option<usize>| i.map(|i| self.routes.name(i));
        let request = RouteRequest {
            tenant,
            channel: get("channel"),
            route: name(found.longest),
            route_also: name(found.other),
            region: region.as_deref(),
            balance: None,
            exclude: &[],
            client,
        };
        let r = self.control.router.explain(&request);
        let plans = self.control.router.plans();
        Reply::ok(json!({
            "decision": r.decision,
            "shard": r.shard_id(),
            "plan": plans.plan_of(tenant).and_then(|i| plans.name(i)),
            "region": region,
            "bucket": r.bucket.map(|b| b.name().to_string()),
            "retry_after": r.retry_after_secs.map(|s| (s.ceil() as u64).max(1)),
        }))
    }
}
