//! The board: where ACME stands for each host (ordering, issued, failed
//! and its backoff), the account's last error and the counters, for
//! `GET /v1/certs` and the metrics.

use parking_lot::Mutex;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

/// Where ACME stands for one host, as `GET /v1/certs` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct HostStatus {
    /// `ordering`, `issued` or `failed`.
    pub state: &'static str,
    /// Failed orders in a row.
    pub failures: u32,
    pub last_error: Option<String>,
    /// Unix seconds: when a failed host is tried again.
    pub retry_at: Option<u64>,
    #[serde(skip)]
    retry_instant: Option<Instant>,
}

impl HostStatus {
    pub(super) fn issued() -> Self {
        HostStatus {
            state: "issued",
            failures: 0,
            last_error: None,
            retry_at: None,
            retry_instant: None,
        }
    }

    /// An order running, after `failures` failed ones in a row.
    fn ordering(failures: u32) -> Self {
        HostStatus {
            state: "ordering",
            failures,
            last_error: None,
            retry_at: None,
            retry_instant: None,
        }
    }

    /// The `failures`-th failed order in a row, tried again at `retry_at`
    /// (unix seconds), which is `retry_instant` (`None`: now) here.
    pub(super) fn failed(
        failures: u32,
        last_error: String,
        retry_at: u64,
        retry_instant: Option<Instant>,
    ) -> Self {
        HostStatus {
            state: "failed",
            failures,
            last_error: Some(last_error),
            retry_at: Some(retry_at),
            retry_instant,
        }
    }
}

/// What ACME is doing, for the admin API and the metrics.
#[derive(Default)]
pub struct Board {
    hosts: Mutex<BTreeMap<String, HostStatus>>,
    /// The account could not be loaded or created (the last error).
    pub account_error: Mutex<Option<String>>,
    pub issued: AtomicU64,
    pub failed: AtomicU64,
}

impl Board {
    /// Every host ACME has worked on, by name.
    pub fn hosts(&self) -> BTreeMap<String, HostStatus> {
        self.hosts.lock().clone()
    }

    pub(super) fn set(&self, host: &str, status: HostStatus) {
        self.hosts.lock().insert(host.to_string(), status);
    }

    /// Shows an order for `host` running; returns its failed orders in a
    /// row before this one.
    pub(super) fn ordering(&self, host: &str) -> u32 {
        let failures = self.hosts.lock().get(host).map_or(0, |s| s.failures);
        self.set(host, HostStatus::ordering(failures));
        failures
    }

    /// Hosts not in `wanted` leave the board.
    pub(super) fn keep_only(&self, wanted: &[String]) {
        self.hosts
            .lock()
            .retain(|h, _| wanted.iter().any(|w| w == h));
    }

    pub(super) fn waiting(&self, host: &str, now: Instant) -> bool {
        self.hosts
            .lock()
            .get(host)
            .and_then(|s| s.retry_instant)
            .is_some_and(|at| at > now)
    }
}
