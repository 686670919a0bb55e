//! `admin`: the admin API's address and its token.

use super::{socket_addr, warn_if_others_can_read, Checker};
use crate::config::raw::RawAdmin;
use crate::config::{AdminConfig, AdminToken};
use std::net::SocketAddr;

pub(super) fn check_admin(c: &mut Checker<'_>, admin: Option<RawAdmin>) -> AdminConfig {
    let raw = admin.unwrap_or(RawAdmin {
        addr: "127.0.0.1:9901".to_string(),
        token_file: None,
        token_env: None,
    });
    let addr = socket_addr(c, "admin.addr", &raw.addr)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 9901)));
    let token = match (&raw.token_file, &raw.token_env) {
        (Some(_), Some(_)) => {
            c.error("admin.token_env", "give token_file or token_env, not both");
            None
        }
        (Some(path), None) => match std::fs::read_to_string(path) {
            Ok(t) => {
                warn_if_others_can_read("admin.token_file", path);
                token_of(c, "admin.token_file", t.trim_end_matches(['\n', '\r']))
            }
            Err(e) => {
                c.error("admin.token_file", format!("`{path}`: cannot read it: {e}"));
                None
            }
        },
        (None, Some(var)) => match std::env::var(var) {
            Ok(t) => token_of(c, "admin.token_env", &t),
            Err(_) => {
                c.error(
                    "admin.token_env",
                    format!("environment variable `{var}` is not set"),
                );
                None
            }
        },
        (None, None) => None,
    };
    let has_token = raw.token_file.is_some() || raw.token_env.is_some();
    if !has_token && !addr.ip().is_loopback() {
        c.error(
            "admin.addr",
            format!("`{addr}` is not a loopback address: set admin.token_file or admin.token_env"),
        );
    }
    AdminConfig { addr, token }
}

/// The admin token read from `field`, if long enough to resist guessing.
fn token_of(c: &mut Checker<'_>, field: &str, token: &str) -> Option<AdminToken> {
    if token.len() < AdminToken::MIN_BYTES {
        c.error(
            field,
            format!(
                "the admin token has {} bytes, fewer than {} (e.g. `openssl rand -base64 24`)",
                token.len(),
                AdminToken::MIN_BYTES
            ),
        );
        return None;
    }
    Some(AdminToken::new(token.as_bytes()))
}
