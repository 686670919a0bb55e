//! The operator's page (src/ui), built into the binary (no build step, no
//! CDN): static, no data in it; its script reads `/v1/` with the token.

use super::reply::Reply;
use super::AdminApi;
use serde_json::json;

pub(super) const PAGE_HTML: &str = include_str!("../ui/index.html");
pub(super) const PAGE_JS: &str = include_str!("../ui/app.js");
pub(super) const PAGE_CSS: &str = include_str!("../ui/app.css");
/// Everything the admin listener serves may load only its own script and
/// style and talk only to itself; no page may frame it.
pub(super) const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

impl AdminApi {
    /// `GET /ui/auth`: whether the page must ask for the token.
    pub(super) fn page_auth(&self) -> Reply {
        Reply::ok(json!({
            "token_required": self.control.config.admin.token.is_some(),
        }))
    }
}
