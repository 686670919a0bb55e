//! `/v1/certs`: the certificates served and ACME's work, and the
//! certificate directory read again.

use super::reply::Reply;
use super::AdminApi;
use http::StatusCode;
use serde_json::json;

impl AdminApi {
    /// `GET /v1/certs`: every certificate served (name, SANs, issuer,
    /// expiry, source), the files skipped, and ACME's work per host.
    pub(super) fn certs(&self) -> Reply {
        let edge = &self.control.edge;
        let Some(store) = &edge.store else {
            return Reply::ok(json!({ "certs": [], "errors": [], "acme": null }));
        };
        let (mut certs, errors) = store.list();
        certs.sort_by(|a, b| a.name.cmp(&b.name).then(a.expires.cmp(&b.expires)));
        let acme = edge.config.acme.as_ref().map(|a| {
            json!({
                "directory": a.directory,
                "account_error": *edge.acme.account_error.lock(),
                "hosts": edge.acme.hosts(),
            })
        });
        Reply::ok(json!({ "certs": certs, "errors": errors, "acme": acme }))
    }

    /// `POST /v1/certs/reload`.
    pub(super) fn reload_certs(&self) -> Reply {
        match &self.control.edge.store {
            None => Reply::error(StatusCode::NOT_FOUND, "no `tls` section is configured"),
            // The admin API runs on its own threads: reading the
            // directory here holds up no request.
            Some(store) => Reply::ok(json!(store.reload())),
        }
    }
}
