//! `/v1/tenants`: one tenant's plan and limits, its plan or region set or
//! cleared, tenants denied and allowed again, and those refused most.

use super::reply::{parse, Reply};
use super::router::Call;
use super::uri::{param, query_params};
use super::AdminApi;
use crate::routing::top;
use http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegionBody {
    region: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanBody {
    plan: String,
}

impl AdminApi {
    /// `/v1/tenants/…` (`rest`: the segments after it); `None` for a path
    /// or method it does not serve. `top` and `denied` are read before a
    /// tenant of that name.
    pub(super) fn tenants_endpoint(&self, call: &Call<'_>, rest: &[&str]) -> Option<Reply> {
        let (c, body) = (&self.control, call.body);
        let reply = match (call.method, rest) {
            (&Method::PUT, [tenant, "region"]) => self.assign_region(tenant, body),
            (&Method::DELETE, [tenant, "region"]) => self.release_region(tenant),
            (&Method::GET, ["top"]) => self.top_tenants(call.query),
            (&Method::GET, ["denied"]) => Reply::ok(json!(c.router.denied())),
            (&Method::PUT, [tenant, "deny"]) => {
                c.deny(tenant);
                Reply::ok(json!({ "denied": tenant }))
            }
            (&Method::DELETE, [tenant, "deny"]) => match c.undeny(tenant) {
                true => Reply::ok(json!({ "allowed": tenant })),
                false => Reply::unknown("denied tenant", tenant),
            },
            (&Method::GET, [tenant]) => Reply::ok(self.tenant(tenant)),
            (&Method::PUT, [tenant, "plan"]) => match parse::<PlanBody>(body) {
                Err(r) => r,
                Ok(b) => self.plan_changed(tenant, c.set_plan(tenant, Some(&b.plan))),
            },
            (&Method::DELETE, [tenant, "plan"]) => {
                self.plan_changed(tenant, c.set_plan(tenant, None))
            }
            _ => return None,
        };
        Some(reply)
    }

    /// `PUT /v1/tenants/{tenant}/region`: 404 when no regions are
    /// configured.
    fn assign_region(&self, tenant: &str, body: &[u8]) -> Reply {
        let c = &self.control;
        if c.regions.is_none() {
            return Reply::error(StatusCode::NOT_FOUND, "no regions are configured");
        }
        match parse::<RegionBody>(body) {
            Err(r) => r,
            Ok(b) => match c.assign_region(tenant, &b.region) {
                Ok(()) => Reply::ok(json!({ "tenant": tenant, "region": b.region })),
                Err(e) => Reply::error(StatusCode::BAD_REQUEST, e),
            },
        }
    }

    /// `DELETE /v1/tenants/{tenant}/region`.
    fn release_region(&self, tenant: &str) -> Reply {
        let c = &self.control;
        match &c.regions {
            None => Reply::error(StatusCode::NOT_FOUND, "no regions are configured"),
            Some(_) => match c.release_region(tenant) {
                true => Reply::ok(json!({ "released": tenant })),
                false => Reply::unknown("region assignment for tenant", tenant),
            },
        }
    }

    /// `GET /v1/tenants/top?by=refused&n=10`: the tenants refused most over
    /// the last minute (`routing::top`); `n` is 1–[`top::CAPACITY`].
    fn top_tenants(&self, query: Option<&str>) -> Reply {
        let params = query_params(query);
        let get = |name: &str| param(&params, name);
        match get("by") {
            None | Some("refused") => {}
            Some(other) => {
                return Reply::error(
                    StatusCode::BAD_REQUEST,
                    format!("by: unknown ranking `{other}` (known: refused)"),
                )
            }
        }
        let n = match get("n").map(str::parse::<usize>) {
            None => 10,
            Some(Ok(n)) if (1..=top::CAPACITY).contains(&n) => n,
            Some(_) => {
                return Reply::error(
                    StatusCode::BAD_REQUEST,
                    format!("n: must be an integer from 1 to {}", top::CAPACITY),
                )
            }
        };
        let plans = self.control.router.plans();
        let tenants: Vec<Value> = (self.control.router.top_refused(n).into_iter())
            .map(|t| {
                let plan = plans.plan_of(&t.tenant).and_then(|i| plans.name(i));
                let mut entry = json!(t);
                entry["plan"] = json!(plan);
                entry
            })
            .collect();
        Reply::ok(json!({
            "by": "refused",
            "window_seconds": top::SLOT_MS * top::SLOTS as u64 / 1000,
            "tenants": tenants,
        }))
    }
}
