//! The admission guard: proof that a request or socket counts against its
//! tenant's connection cap (and its shard's live count). Dropping it
//! releases both, exactly once, never below zero.

use super::tenants::TenantEntry;
use crate::counters::{Gauge, GaugeCell};
use std::fmt;
use std::sync::Arc;

pub struct AdmissionGuard {
    tenant: Arc<TenantEntry>,
    shard: Option<GaugeCell>,
}

impl AdmissionGuard {
    pub(crate) fn new(tenant: Arc<TenantEntry>, shard: Option<GaugeCell>) -> Self {
        AdmissionGuard { tenant, shard }
    }

    /// The admitted tenant.
    pub fn tenant(&self) -> &str {
        self.tenant.id()
    }

    /// The tenant's live admissions, this one included.
    pub fn tenant_active(&self) -> u64 {
        self.tenant.active()
    }

    /// Whether the admission counts on a shard (tagged acquire).
    pub fn is_tagged(&self) -> bool {
        self.shard.is_some()
    }

    /// Releases now; the same as dropping the guard.
    pub fn release(self) {}
}

impl Drop for AdmissionGuard {
    fn drop(&mut self) {
        self.tenant.release();
        if let Some(cell) = self.shard.take() {
            Gauge::release(&cell);
        }
    }
}

impl fmt::Debug for AdmissionGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionGuard")
            .field("tenant", &self.tenant.id())
            .field("tagged", &self.shard.is_some())
            .finish()
    }
}
