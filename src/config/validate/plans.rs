//! `plans`, `tenants` and `default_plan`: per-tenant limits, each field
//! falling back to `limits`.

use super::Checker;
use crate::config::raw::RawPlan;
use crate::config::{LimitsConfig, PlanConfig, PlansConfig};
use crate::limits::RateRule;
use std::collections::HashMap;

/// The most plans a configuration may name: each is a value of the
/// `plan` metric label.
pub const MAX_PLANS: usize = 256;

/// `plans`, `tenants`, `default_plan` (DESIGN §6): each plan field falls
/// back to `limits`; a plan a tenant or `default_plan` names must exist.
pub(super) fn check_plans(
    c: &mut Checker<'_>,
    raw: indexmap::IndexMap<String, RawPlan>,
    tenants: HashMap<String, String>,
    default_plan: Option<String>,
    limits: &LimitsConfig,
) -> PlansConfig {
    if raw.len() > MAX_PLANS {
        c.error("plans", format!("at most {MAX_PLANS} plans"));
    }
    let mut plans = Vec::with_capacity(raw.len());
    for (name, plan) in raw.into_iter().take(MAX_PLANS) {
        plans.push(check_plan(c, name, plan, limits));
    }
    let mut config = PlansConfig {
        plans,
        tenants: HashMap::with_capacity(tenants.len()),
        default_plan: None,
    };
    assign_tenants(c, &mut config, tenants);
    if let Some(plan) = default_plan {
        config.default_plan = config.index_of(&plan);
        if config.default_plan.is_none() {
            c.error(
                "default_plan",
                format!("unknown plan `{plan}` (not in `plans`)"),
            );
        }
    }
    config
}

/// `plans.NAME`: a name that can label a metric, and each field given or
/// taken from `limits` (`null`: no limit).
fn check_plan(
    c: &mut Checker<'_>,
    name: String,
    plan: RawPlan,
    limits: &LimitsConfig,
) -> PlanConfig {
    let field = format!("plans.{name}");
    check_plan_name(c, &field, &name);
    let rate = match plan.rate {
        None => limits.rate,
        Some(None) => RateRule::UNLIMITED,
        Some(Some(rate)) => c.rate(&format!("{field}.rate"), &rate),
    };
    let connection_cap = match plan.connection_cap {
        None => limits.connection_cap,
        Some(None) => None,
        Some(Some(cap)) => match u64::try_from(cap) {
            Ok(cap) => Some(cap),
            Err(_) => {
                c.error(format!("{field}.connection_cap"), "must be an integer ≥ 0");
                None
            }
        },
    };
    let routes = match plan.routes {
        None => limits.routes.clone(),
        Some(routes) => (routes.iter())
            .map(|(prefix, rule)| {
                let at = format!("{field}.routes.{prefix}");
                if !prefix.starts_with('/') {
                    c.error(&at, format!("route prefix `{prefix}` must start with `/`"));
                }
                (prefix.clone(), c.rate(&at, rule))
            })
            .collect(),
    };
    let per_client = match plan.per_client {
        None => limits.per_client,
        Some(None) => RateRule::UNLIMITED,
        Some(Some(p)) => c.rate(&format!("{field}.per_client.rate"), &p.rate),
    };
    PlanConfig {
        name,
        per_client,
        rate,
        connection_cap,
        max_body_bytes: plan.max_body_bytes.unwrap_or(limits.max_body_bytes),
        routes,
    }
}

/// A plan's name: 1 to 64 characters a metric label takes, and not one
/// of the words that mean "no plan".
fn check_plan_name(c: &mut Checker<'_>, field: &str, name: &str) {
    let label = |b: u8| b.is_ascii_alphanumeric() || b"_.-".contains(&b);
    if name.is_empty() || name.len() > 64 || !name.bytes().all(label) {
        c.error(
            field,
            "a plan's name is 1 to 64 letters, digits, `_`, `.` or `-`",
        );
    }
    // `none` labels tenants on no plan in the metrics; `-` says "no
    // plan" in the cluster's shared state.
    if name == "none" || name == "-" {
        c.error(field, format!("`{name}` is reserved (it means no plan)"));
    }
}

/// `tenants`: each tenant's plan, which must be one of `plans`. Errors
/// come sorted by tenant (the map has no stable order).
fn assign_tenants(c: &mut Checker<'_>, config: &mut PlansConfig, tenants: HashMap<String, String>) {
    let mut tenants: Vec<_> = tenants.into_iter().collect();
    // Errors in a stable order.
    tenants.sort_unstable();
    for (tenant, plan) in tenants {
        match config.index_of(&plan) {
            Some(index) => {
                config.tenants.insert(tenant.into(), index);
            }
            None => c.error(
                format!("tenants.{tenant}"),
                format!("unknown plan `{plan}` (not in `plans`)"),
            ),
        }
    }
}
