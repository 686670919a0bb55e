//! `tls` (DESIGN §5): the certificate directory, the default and unknown
//! names, ALPN, and ACME.

use super::Checker;
use crate::config::raw::{RawAcme, RawTlsSection};
use crate::config::{AcmeConfig, TlsConfig};
use std::path::{Path, PathBuf};

/// `tls:` (DESIGN §5). `wanted`: a listener says `tls: true` or `quic: true`.
pub(super) fn check_tls(
    c: &mut Checker<'_>,
    raw: Option<RawTlsSection>,
    wanted: bool,
) -> Option<TlsConfig> {
    let Some(r) = raw else {
        if wanted {
            c.error(
                "tls",
                "a listener says `tls: true` or `quic: true`: the `tls` section (certs and/or \
                 acme) is needed",
            );
        }
        return None;
    };
    let defaults = TlsConfig::default();
    let certs = check_certs(c, r.certs, r.acme.is_some());
    let refuse = refuses_unknown_sni(c, r.unknown_sni.as_deref());
    let default_cert = check_default_cert(c, r.default_cert, refuse, certs.as_deref());
    let alpn = r.alpn.map_or(defaults.alpn, |list| check_alpn(c, &list));
    let h2_max_concurrent_streams = r
        .h2_max_concurrent_streams
        .unwrap_or(defaults.h2_max_concurrent_streams);
    if h2_max_concurrent_streams == 0 {
        c.error("tls.h2_max_concurrent_streams", "must be greater than 0");
    }
    let acme = r.acme.map(|a| check_acme(c, a));
    Some(TlsConfig {
        certs,
        default_cert,
        alpn,
        handshake_timeout: c.positive_ms(
            "tls.handshake_timeout_ms",
            r.handshake_timeout_ms,
            10_000,
        ),
        h2_max_concurrent_streams,
        acme,
    })
}

/// `tls.certs`: a directory of `NAME.crt` + `NAME.key` pairs, needed
/// unless ACME issues the certificates.
fn check_certs(c: &mut Checker<'_>, certs: Option<String>, acme: bool) -> Option<PathBuf> {
    let certs = certs.map(PathBuf::from);
    if let Some(dir) = &certs {
        if !dir.is_dir() {
            c.error(
                "tls.certs",
                format!("`{}`: no such directory", dir.display()),
            );
        }
    }
    if certs.is_none() && !acme {
        c.error(
            "tls.certs",
            "required unless `tls.acme` is set: a directory of NAME.crt + NAME.key pairs",
        );
    }
    certs
}

/// `tls.unknown_sni`: whether a handshake with no or an unknown name is
/// refused (`refuse`) rather than served the default certificate.
fn refuses_unknown_sni(c: &mut Checker<'_>, unknown_sni: Option<&str>) -> bool {
    match unknown_sni {
        None | Some("default") => false,
        Some("refuse") => true,
        Some(other) => {
            c.error(
                "tls.unknown_sni",
                format!("`{other}`: expected default or refuse"),
            );
            false
        }
    }
}

/// `tls.default_cert`: the `NAME` of a `NAME.crt` in `certs`, served for
/// unknown names unless those are refused.
fn check_default_cert(
    c: &mut Checker<'_>,
    default_cert: Option<String>,
    refuse: bool,
    certs: Option<&Path>,
) -> Option<String> {
    match (default_cert, refuse) {
        (Some(_), true) => {
            c.error(
                "tls.default_cert",
                "not with `unknown_sni: refuse`: unknown names are refused",
            );
            None
        }
        (Some(name), false) => {
            let valid = !name.is_empty() && !name.contains(['/', '\\']) && name != "..";
            match certs {
                _ if !valid => c.error(
                    "tls.default_cert",
                    format!("`{name}`: expected a NAME of NAME.crt in tls.certs"),
                ),
                Some(dir) if dir.is_dir() && !dir.join(format!("{name}.crt")).is_file() => c.error(
                    "tls.default_cert",
                    format!("`{name}`: no {name}.crt in `{}`", dir.display()),
                ),
                None => c.error(
                    "tls.default_cert",
                    "names a file of `tls.certs`, which is not set",
                ),
                _ => {}
            }
            Some(name)
        }
        (None, _) => None,
    }
}

/// `tls.alpn`: the protocols offered, `h2` and/or `http/1.1`.
fn check_alpn(c: &mut Checker<'_>, list: &[String]) -> Vec<Vec<u8>> {
    if list.is_empty() {
        c.error("tls.alpn", "at least one protocol is needed: h2, http/1.1");
    }
    let mut out = Vec::new();
    for (i, p) in list.iter().enumerate() {
        match p.as_str() {
            "h2" | "http/1.1" => out.push(p.as_bytes().to_vec()),
            other => c.error(
                format!("tls.alpn[{i}]"),
                format!("`{other}`: expected h2 or http/1.1"),
            ),
        }
    }
    out
}

/// `tls.acme`: the CA's directory, where the account and certificates are
/// kept, and how often it may be asked.
fn check_acme(c: &mut Checker<'_>, a: RawAcme) -> AcmeConfig {
    let directory = a.directory.unwrap_or_default();
    if !directory.starts_with("https://") || http::Uri::try_from(directory.as_str()).is_err() {
        c.error(
            "tls.acme.directory",
            format!("`{directory}`: expected the ACME server's https:// directory URL"),
        );
    }
    let storage = match a.storage {
        Some(s) => PathBuf::from(s),
        None => {
            c.error(
                "tls.acme.storage",
                "required: the directory for the account and the issued certificates",
            );
            PathBuf::new()
        }
    };
    if storage.exists() && !storage.is_dir() {
        c.error(
            "tls.acme.storage",
            format!("`{}`: not a directory", storage.display()),
        );
    }
    if let Some(email) = &a.email {
        if !email.contains('@') || email.contains(char::is_whitespace) {
            c.error(
                "tls.acme.email",
                format!("`{email}`: expected an email address"),
            );
        }
    }
    let ca_file = a.ca_file.map(PathBuf::from);
    if let Some(f) = &ca_file {
        if !f.is_file() {
            c.error(
                "tls.acme.ca_file",
                format!("`{}`: no such file", f.display()),
            );
        }
    }
    let orders_per_hour = a.orders_per_hour.unwrap_or(60);
    if orders_per_hour == 0 {
        c.error("tls.acme.orders_per_hour", "must be greater than 0");
    }
    AcmeConfig {
        directory,
        email: a.email,
        storage,
        ca_file,
        orders_per_hour,
    }
}
