//! The certificates served by SNI: every `NAME.crt` + `NAME.key` pair of
//! the `tls.certs` directory and of the ACME storage, indexed by the names
//! each certificate covers. A lookup is the exact name, then the one-label
//! wildcard (`a.example.com` → `*.example.com`), then the default
//! certificate; a name covered by a file certificate and an ACME one gets
//! the file's.
//!
//! Reloading stats every pair and parses only the ones whose size or
//! modification time changed, then swaps in a new index: handshakes never
//! wait for a reload. A file that does not parse, whose key does not match
//! its certificate, or whose other half is missing is logged, listed among
//! the errors and skipped; the rest keep serving.

use crate::wire::host::check_host;
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// Where a certificate came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The `tls.certs` directory (or a listener's own `{cert, key}`).
    File,
    /// Issued through ACME, kept under `tls.acme.storage`.
    Acme,
}

/// A certificate as `GET /v1/certs` lists it.
#[derive(Clone, Debug, Serialize)]
pub struct CertInfo {
    /// `NAME` of `NAME.crt`.
    pub name: String,
    /// The DNS names it covers (its SANs, else its subject's CN).
    pub sans: Vec<String>,
    pub issuer: String,
    /// Unix seconds.
    pub not_before: i64,
    /// Unix seconds.
    pub expires: i64,
    pub source: Source,
}

/// One loaded pair.
pub struct Loaded {
    pub info: CertInfo,
    pub key: Arc<CertifiedKey>,
}

/// A file that could not be served.
#[derive(Clone, Debug, Serialize)]
pub struct BadFile {
    pub file: String,
    pub error: String,
}

/// What a reload found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Reloaded {
    /// Certificates served after it.
    pub certs: usize,
    /// Pairs parsed again (new or changed).
    pub parsed: usize,
    /// Pairs gone since the last reload.
    pub removed: usize,
    pub errors: Vec<BadFile>,
}

/// The index one reload builds; handshakes read it without locks.
#[derive(Default)]
struct Table {
    exact: HashMap<Box<str>, Arc<Loaded>>,
    /// `example.com` for `*.example.com`.
    wildcard: HashMap<Box<str>, Arc<Loaded>>,
    default: Option<Arc<Loaded>>,
    all: Vec<Arc<Loaded>>,
    errors: Vec<BadFile>,
}

/// A pair's size and modification times: unchanged means not parsed again.
type Stamp = (u64, Option<SystemTime>, u64, Option<SystemTime>);

/// Per `.crt` path: its stamp and what parsing it gave.
type Seen = HashMap<PathBuf, (Stamp, Result<Arc<Loaded>, String>)>;

/// The certificate store (see the module documentation).
pub struct CertStore {
    dirs: Vec<(PathBuf, Source)>,
    default_name: Option<String>,
    table: ArcSwap<Table>,
    /// Per `.crt` path: its stamp and what parsing it gave.
    seen: Mutex<Seen>,
}

impl CertStore {
    /// A store over `dirs` (not read until [`CertStore::reload`]).
    pub fn new(dirs: Vec<(PathBuf, Source)>, default_name: Option<String>) -> Self {
        CertStore {
            dirs,
            default_name,
            table: ArcSwap::from_pointee(Table::default()),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Reads the directories again: new and changed pairs are parsed,
    /// removed ones dropped; the new index serves the next handshake.
    pub fn reload(&self) -> Reloaded {
        let mut seen = self.seen.lock();
        let mut report = Reloaded::default();
        let mut now_seen = HashMap::with_capacity(seen.len());
        let mut changed = false;
        for (dir, source) in &self.dirs {
            let entries = match std::fs::read_dir(dir) {
                Ok(entries) => entries,
                Err(e) => {
                    if dir.exists() || *source == Source::File {
                        report.errors.push(BadFile {
                            file: dir.display().to_string(),
                            error: e.to_string(),
                        });
                    }
                    continue;
                }
            };
            for entry in entries.flatten() {
                let crt = entry.path();
                if crt.extension().and_then(|e| e.to_str()) != Some("crt") {
                    continue;
                }
                let key = crt.with_extension("key");
                let stamp = stamp_of(&crt, &key);
                let (stamp, loaded) = match seen.remove(&crt) {
                    Some((old, loaded)) if old == stamp => (stamp, loaded),
                    previous => {
                        changed = true;
                        report.parsed += 1;
                        match (load_pair(&crt, &key, *source), previous) {
                            (Ok(loaded), _) => (stamp, Ok(Arc::new(loaded))),
                            // A pair caught half replaced (or broken by
                            // its replacement) keeps serving what it
                            // served; it is read again next time.
                            (Err(e), Some((old_stamp, Ok(served)))) => {
                                log::warn!("certificate `{}` not reloaded, the previous one still serves: {e}", crt.display());
                                report.errors.push(BadFile {
                                    file: crt.display().to_string(),
                                    error: format!("{e} (the previous certificate still serves)"),
                                });
                                (old_stamp, Ok(served))
                            }
                            (Err(e), _) => {
                                log::warn!("certificate `{}` skipped: {e}", crt.display());
                                (stamp, Err(e))
                            }
                        }
                    }
                };
                now_seen.insert(crt, (stamp, loaded));
            }
        }
        report.removed = seen.len();
        changed |= !seen.is_empty() || !report.errors.is_empty();
        *seen = now_seen;
        if changed {
            let mut errors = std::mem::take(&mut report.errors);
            self.table.store(Arc::new(self.index(&seen, &mut errors)));
        }
        report.errors = self.table.load().errors.clone();
        report.certs = self.table.load().all.len();
        report
    }

    /// The index over what `seen` holds; the errors of the directories
    /// (`errors`) and of the files are kept with it.
    fn index(&self, seen: &Seen, errors: &mut Vec<BadFile>) -> Table {
        let mut table = Table::default();
        let mut paths: Vec<_> = seen.iter().collect();
        paths.sort_by(|a, b| a.0.cmp(b.0));
        for (path, (_, loaded)) in paths {
            let loaded = match loaded {
                Ok(loaded) => loaded,
                Err(e) => {
                    errors.push(BadFile {
                        file: path.display().to_string(),
                        error: e.clone(),
                    });
                    continue;
                }
            };
            for san in &loaded.info.sans {
                let (map, name) = match san.strip_prefix("*.") {
                    Some(suffix) => (&mut table.wildcard, suffix),
                    None => (&mut table.exact, san.as_str()),
                };
                match map.get(name) {
                    Some(held) if !prefer(loaded, held) => {}
                    _ => {
                        map.insert(name.into(), Arc::clone(loaded));
                    }
                }
            }
            if loaded.info.source == Source::File
                && self.default_name.as_deref() == Some(loaded.info.name.as_str())
            {
                table.default = Some(Arc::clone(loaded));
            }
            table.all.push(Arc::clone(loaded));
        }
        if let (Some(name), None) = (&self.default_name, &table.default) {
            log::error!(
                "tls.default_cert `{name}` is not loaded: clients without a known name are refused"
            );
        }
        table.errors = errors.clone();
        table
    }

    /// The certificate for `sni` (none: the default, if any).
    pub fn resolve(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let table = self.table.load();
        sni.and_then(|name| covering(&table, name))
            .or(table.default.as_ref())
            .map(|l| Arc::clone(&l.key))
    }

    /// The certificate a handshake for `name` would get, other than the
    /// default.
    pub fn covering(&self, name: &str) -> Option<CertInfo> {
        covering(&self.table.load(), name).map(|l| l.info.clone())
    }

    /// Everything loaded, and the files skipped.
    pub fn list(&self) -> (Vec<CertInfo>, Vec<BadFile>) {
        let table = self.table.load();
        (
            table.all.iter().map(|l| l.info.clone()).collect(),
            table.errors.clone(),
        )
    }
}

/// Exact name, then the one-label wildcard.
fn covering<'t>(table: &'t Table, name: &str) -> Option<&'t Arc<Loaded>> {
    let name = name.strip_suffix('.').unwrap_or(name);
    let lower;
    let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
        lower = name.to_ascii_lowercase();
        lower.as_str()
    } else {
        name
    };
    table.exact.get(name).or_else(|| {
        let (_, parent) = name.split_once('.')?;
        table.wildcard.get(parent)
    })
}

/// Whether `new` should serve a name `held` serves too: a file beats ACME,
/// then the later expiry wins.
fn prefer(new: &Loaded, held: &Loaded) -> bool {
    match (new.info.source, held.info.source) {
        (Source::File, Source::Acme) => true,
        (Source::Acme, Source::File) => false,
        _ => new.info.expires > held.info.expires,
    }
}

fn stamp_of(crt: &Path, key: &Path) -> Stamp {
    let one = |p: &Path| match std::fs::metadata(p) {
        Ok(m) => (m.len(), m.modified().ok()),
        Err(_) => (u64::MAX, None),
    };
    let (a, b) = one(crt);
    let (c, d) = one(key);
    (a, b, c, d)
}

/// Loads one `NAME.crt` (the chain, leaf first) and `NAME.key`.
pub fn load_pair(crt: &Path, key: &Path, source: Source) -> Result<Loaded, String> {
    let name = crt
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or("the file name is not UTF-8")?
        .to_string();
    let pem = std::fs::read(crt).map_err(|e| format!("{}: {e}", crt.display()))?;
    let key_pem = std::fs::read(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let (key, info) = certified_key(&pem, &key_pem, &name, source)?;
    Ok(Loaded {
        info,
        key: Arc::new(key),
    })
}

/// A certificate chain and key (PEM) made ready to serve, and its listing.
pub fn certified_key(
    chain_pem: &[u8],
    key_pem: &[u8],
    name: &str,
    source: Source,
) -> Result<(CertifiedKey, CertInfo), String> {
    let chain = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("certificate: {e}"))?;
    let Some(leaf) = chain.first() else {
        return Err("certificate: no PEM certificate in the file".to_string());
    };
    let info = describe(leaf, name, source)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("key: {e}"))?;
    let signer =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| format!("key: {e}"))?;
    let certified = CertifiedKey::new(chain, signer);
    certified
        .keys_match()
        .map_err(|e| format!("the key does not belong to the certificate: {e}"))?;
    Ok((certified, info))
}

/// Names, issuer and validity of a leaf certificate.
fn describe(leaf: &CertificateDer<'_>, name: &str, source: Source) -> Result<CertInfo, String> {
    use x509_parser::prelude::*;
    let (_, cert) =
        X509Certificate::from_der(leaf.as_ref()).map_err(|e| format!("certificate: {e}"))?;
    let mut sans: Vec<String> = match cert.subject_alternative_name() {
        Ok(Some(ext)) => ext
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    if sans.is_empty() {
        sans.extend(
            cert.subject()
                .iter_common_name()
                .filter_map(|cn| cn.as_str().ok())
                .map(str::to_ascii_lowercase),
        );
    }
    if sans.is_empty() {
        return Err("certificate: no DNS name (neither a SAN nor a CN)".to_string());
    }
    let issuer = cert
        .issuer()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| cert.issuer().to_string());
    Ok(CertInfo {
        name: name.to_string(),
        sans,
        issuer,
        not_before: cert.validity().not_before.timestamp(),
        expires: cert.validity().not_after.timestamp(),
        source,
    })
}

/// rustls's view of the store: SNI → certificate.
#[derive(Debug)]
pub struct SniResolver(pub Arc<CertStore>);

impl std::fmt::Debug for CertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertStore")
            .field("dirs", &self.dirs)
            .finish()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // A name the host rule refuses is no name: the default's.
        let sni = hello.server_name().filter(|name| check_host(name).is_ok());
        self.0.resolve(sni)
    }
}

/// One certificate for every handshake (the old `{cert, key}` listener).
#[derive(Debug)]
pub struct OneCert(pub Arc<CertifiedKey>);

impl ResolvesServerCert for OneCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }
}
