//! `GET /v1/snapshot` and `POST /v1/restore`: the state file's content,
//! read and put back (its clock shifted to this node's).

use super::reply::{parse, Reply};
use super::uri::query_params;
use super::AdminApi;
use crate::state::{self, StateSnapshot};
use serde_json::json;

impl AdminApi {
    /// `GET /v1/snapshot`.
    pub(super) fn snapshot(&self) -> Reply {
        Reply::ok(json!(state::capture(&self.control)))
    }

    pub(super) fn restore(&self, query: Option<&str>, body: &[u8]) -> Reply {
        let snapshot: StateSnapshot = match parse(body) {
            Ok(s) => s,
            Err(r) => return r,
        };
        let reset = query_params(query)
            .iter()
            .any(|(k, v)| k == "reset_connections" && v != "false" && v != "0");
        let mut router = snapshot.router;
        router.shift_time(self.control.router.clock().now_ms() - snapshot.written_at_ms);
        self.control.router.restore(&router, reset);
        if let (Some(directory), Some(regions)) = (&self.control.regions, &snapshot.regions) {
            directory.restore(regions);
        }
        Reply::ok(json!({ "restored": true, "reset_connections": reset }))
    }
}
