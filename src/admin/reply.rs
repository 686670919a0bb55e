//! An admin answer before it becomes an HTTP response: a status, a body
//! and its type; and the JSON request body read into a type, or the 400
//! that says why not.

use http::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

/// An answer: status and JSON (or text) body.
pub(super) struct Reply {
    pub(super) status: StatusCode,
    pub(super) body: Vec<u8>,
    pub(super) content_type: &'static str,
}

impl Reply {
    pub(super) fn json(status: StatusCode, value: Value) -> Reply {
        Reply {
            status,
            body: serde_json::to_vec(&value).unwrap_or_default(),
            content_type: "application/json",
        }
    }

    pub(super) fn ok(value: Value) -> Reply {
        Reply::json(StatusCode::OK, value)
    }

    pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Reply {
        Reply::json(status, json!({ "error": message.into() }))
    }

    /// 404 for an id that names nothing: "unknown shard `a`".
    pub(super) fn unknown(what: &str, id: &str) -> Reply {
        Reply::error(StatusCode::NOT_FOUND, format!("unknown {what} `{id}`"))
    }

    pub(super) fn asset(body: &'static str, content_type: &'static str) -> Reply {
        Reply {
            status: StatusCode::OK,
            body: body.as_bytes().to_vec(),
            content_type,
        }
    }

    pub(super) fn text(status: StatusCode, body: String, content_type: &'static str) -> Reply {
        Reply {
            status,
            body: body.into_bytes(),
            content_type,
        }
    }
}

pub(super) fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, Reply> {
    serde_json::from_slice(body)
        .map_err(|e| Reply::error(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}
