//! The plans and the limits a tenant is held to: `GET /v1/plans`,
//! `GET /v1/tenants/{tenant}`, and the answer to a plan change.

use super::reply::Reply;
use super::AdminApi;
use crate::control::PlanChangeError;
use http::StatusCode;
use serde_json::json;

/// A rate as the admin API shows it (`null`: no limit).
fn rate_json(rule: &crate::limits::RateRule) -> serde_json::Value {
    match rule.is_unlimited() {
        true => serde_json::Value::Null,
        false => json!({ "tokens": rule.tokens, "refill_per_second": rule.refill_per_second }),
    }
}

impl AdminApi {
    /// `GET /v1/plans`: each plan's limits, `limits`' value where it left
    /// a field out.
    pub(super) fn plans(&self) -> serde_json::Value {
        let plans = self.control.config.plans.plans.iter().map(|p| {
            let routes: serde_json::Map<String, serde_json::Value> = (p.routes.iter())
                .map(|(prefix, rule)| (prefix.clone(), rate_json(rule)))
                .collect();
            let fields = json!({
                "rate": rate_json(&p.rate),
                "connection_cap": p.connection_cap,
                "max_body_bytes": p.max_body_bytes,
                "routes": routes,
                "per_client": rate_json(&p.per_client),
            });
            (p.name.clone(), fields)
        });
        serde_json::Value::Object(plans.collect())
    }

    /// A plan change's answer: the tenant as it is now, or why not (409
    /// past the bound on runtime changes: put the rest in `tenants`).
    pub(super) fn plan_changed(&self, tenant: &str, changed: Result<(), PlanChangeError>) -> Reply {
        match changed {
            Ok(()) => Reply::ok(self.tenant(tenant)),
            Err(e @ PlanChangeError::Full) => Reply::error(StatusCode::CONFLICT, e.to_string()),
            Err(e) => Reply::error(StatusCode::BAD_REQUEST, e.to_string()),
        }
    }

    /// `GET /v1/tenants/{tenant}`: its plan and the limits it is held to.
    pub(super) fn tenant(&self, tenant: &str) -> serde_json::Value {
        let plans = self.control.router.plans();
        let plan = plans.plan_of(tenant);
        let limits = plans.limits_for(tenant);
        let max_body = self.control.config.max_body_of(plan);
        json!({
            "tenant": tenant,
            "plan": plan.and_then(|i| plans.name(i)),
            "limits": {
                "rate": rate_json(limits.rate()),
                "connection_cap": limits.connection_cap(),
                "max_body_bytes": max_body,
                "per_client": rate_json(limits.per_client()),
            },
        })
    }
}
