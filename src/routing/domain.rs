//! The custom-domain map: `Host` → tenant. Exact entries beat `*.suffix`
//! wildcards (exactly one extra label), which beat the platform fallback
//! (`<tenant><fallback_suffix>`, the tenant being one non-empty label).
//! Readers see an immutable table; edits publish a new one.

use super::clock::{Clock, MonotonicClock};
use crate::counters::StripedCounter;
use arc_swap::ArcSwap;
use compact_str::CompactString;
use indexmap::IndexMap;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

/// How a host matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DomainMatch {
    Exact,
    Wildcard,
    Fallback,
}

impl DomainMatch {
    pub fn as_str(&self) -> &'static str {
        match self {
            DomainMatch::Exact => "exact",
            DomainMatch::Wildcard => "wildcard",
            DomainMatch::Fallback => "fallback",
        }
    }
}

/// A resolved host. Tenant ids up to 24 bytes are stored inline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub tenant: CompactString,
    pub matched: DomainMatch,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DomainError {
    /// `*` anywhere but a leading `*.` label, or `*.` with nothing after it.
    UnsupportedWildcard(String),
}

impl fmt::Display for DomainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DomainError::UnsupportedWildcard(h) => write!(
                f,
                "unsupported wildcard `{h}`: only a leading `*.` label followed by a suffix is allowed"
            ),
        }
    }
}

impl std::error::Error for DomainError {}

/// A user-supplied fallback: normalised host → tenant.
pub trait FallbackHook: Send + Sync {
    fn tenant_for(&self, host: &str) -> Option<String>;
}

impl<F: Fn(&str) -> Option<String> + Send + Sync> FallbackHook for F {
    fn tenant_for(&self, host: &str) -> Option<String> {
        self(host)
    }
}

/// What resolves a host that no entry matches.
#[derive(Clone, Default)]
pub enum Fallback {
    #[default]
    None,
    /// `<tenant><suffix>` → tenant, e.g. suffix `.apps.example.com`.
    Suffix(String),
    Hook(Arc<dyn FallbackHook>),
}

impl Fallback {
    /// A platform suffix, normalised: lowercase, with its leading dot.
    pub fn suffix(suffix: &str) -> Self {
        let s = normalize(suffix);
        let s = s.trim_start_matches('.');
        Fallback::Suffix(format!(".{s}"))
    }
}

/// One entry as listed: exact hosts, or wildcards rendered `*.suffix`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainEntry {
    pub host: String,
    pub tenant: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DomainSnapshot {
    pub at: f64,
    pub entries: Vec<DomainEntry>,
    pub version: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainMetrics {
    pub entries: usize,
    pub resolves: u64,
    pub hits: u64,
    pub misses: u64,
    pub exact: u64,
    pub wildcard: u64,
    pub fallback: u64,
}

type Table = IndexMap<CompactString, CompactString, foldhash::fast::RandomState>;

#[derive(Clone, Default)]
struct Tables {
    exact: Table,
    /// suffix (without `*.`) → tenant
    wildcard: Table,
}

#[derive(Default)]
struct Counters {
    exact: StripedCounter,
    wildcard: StripedCounter,
    fallback: StripedCounter,
    misses: StripedCounter,
}

pub struct DomainMap {
    tables: ArcSwap<Tables>,
    write: Mutex<()>,
    fallback: Fallback,
    counters: Counters,
    clock: Arc<dyn Clock>,
}

/// JavaScript's `trim()` set: WhiteSpace and LineTerminator.
fn is_js_whitespace(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\u{0B}' | '\u{0C}' | '\r' | ' ' | '\u{A0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200A}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202F}'
                | '\u{205F}'
                | '\u{3000}'
                | '\u{FEFF}'
    )
}

/// Normalises a host: trim, lowercase, drop the port and trailing dots
/// (`Example.COM.:80` → `example.com`); an IPv6 literal keeps its brackets
/// (`[::1]:8080` → `[::1]`). Borrows when nothing changes. (The reference
/// keeps a trailing dot; a fully qualified name is the same host.)
pub fn normalize(host: &str) -> Cow<'_, str> {
    let trimmed = host.trim_matches(is_js_whitespace);
    let cut = if trimmed.starts_with('[') {
        match trimmed.find(']') {
            Some(end) => &trimmed[..=end],
            None => trimmed,
        }
    } else {
        // A byte search: an ASCII character is never part of another in
        // UTF-8 (`str::find` with a `char` costs 3 times as much per host).
        let name = match memchr::memchr(b':', trimmed.as_bytes()) {
            Some(colon) => &trimmed[..colon],
            None => trimmed,
        };
        // A fully qualified name (`example.com.`) is the same host. Dots
        // and blanks go together so that normalising twice changes nothing
        // (`k \n.` → `k`, found by fuzzing).
        name.trim_end_matches(|c: char| c == '.' || is_js_whitespace(c))
    };
    if cut.bytes().any(|b| b.is_ascii_uppercase() || !b.is_ascii()) {
        Cow::Owned(cut.to_lowercase())
    } else {
        Cow::Borrowed(cut)
    }
}

impl DomainMap {
    pub fn new(fallback: Fallback) -> Self {
        Self::with_clock(fallback, Arc::new(MonotonicClock::new()))
    }

    pub fn with_clock(fallback: Fallback, clock: Arc<dyn Clock>) -> Self {
        DomainMap {
            tables: ArcSwap::from_pointee(Tables::default()),
            write: Mutex::new(()),
            fallback,
            counters: Counters::default(),
            clock,
        }
    }

    /// Builds a map from `(host, tenant)` pairs in one step.
    pub fn from_entries<I, H, T>(entries: I, fallback: Fallback) -> Result<Self, DomainError>
    where
        I: IntoIterator<Item = (H, T)>,
        H: AsRef<str>,
        T: AsRef<str>,
    {
        let map = DomainMap::new(fallback);
        let mut tables = Tables::default();
        for (host, tenant) in entries {
            insert(&mut tables, host.as_ref(), tenant.as_ref())?;
        }
        map.tables.store(Arc::new(tables));
        Ok(map)
    }

    pub fn fallback(&self) -> &Fallback {
        &self.fallback
    }

    /// Maps a host (or `*.suffix`) to a tenant; re-adding overwrites.
    pub fn add(&self, host: &str, tenant: &str) -> Result<(), DomainError> {
        self.edit(|t| insert(t, host, tenant).map(|_| true))
            .map(|_| ())
    }

    /// Removes a host (or `*.suffix`); returns whether it was there.
    pub fn remove(&self, host: &str) -> bool {
        self.edit(|t| Ok(remove(t, host))).unwrap_or(false)
    }

    /// The tenant an exact or wildcard entry gives `host`, if any.
    pub fn entry(&self, host: &str) -> Option<String> {
        let n = normalize(host);
        let tables = self.tables.load();
        match n.strip_prefix("*.") {
            Some(suffix) => tables.wildcard.get(suffix),
            None => tables.exact.get(n.as_ref()),
        }
        .map(|t| t.to_string())
    }

    fn edit(
        &self,
        f: impl FnOnce(&mut Tables) -> Result<bool, DomainError>,
    ) -> Result<bool, DomainError> {
        let _w = self.write.lock();
        let mut next = Tables::clone(&self.tables.load());
        let changed = f(&mut next)?;
        if changed {
            self.tables.store(Arc::new(next));
        }
        Ok(changed)
    }

    /// Resolves a `Host` header value to a tenant, counting the outcome.
    pub fn resolve(&self, host: &str) -> Option<Resolved> {
        let r = self.lookup(host);
        match &r {
            Some(Resolved { matched, .. }) => match matched {
                DomainMatch::Exact => self.counters.exact.incr(),
                DomainMatch::Wildcard => self.counters.wildcard.incr(),
                DomainMatch::Fallback => self.counters.fallback.incr(),
            },
            None => self.counters.misses.incr(),
        }
        r
    }

    /// Resolves without counting (the explain endpoint).
    pub fn lookup(&self, host: &str) -> Option<Resolved> {
        let n = normalize(host);
        let n = n.as_ref();
        let tables = self.tables.load();
        if let Some(t) = tables.exact.get(n) {
            return Some(Resolved {
                tenant: t.clone(),
                matched: DomainMatch::Exact,
            });
        }
        if let Some(dot) = memchr::memchr(b'.', n.as_bytes()) {
            if dot > 0 && !tables.wildcard.is_empty() {
                if let Some(t) = tables.wildcard.get(&n[dot + 1..]) {
                    return Some(Resolved {
                        tenant: t.clone(),
                        matched: DomainMatch::Wildcard,
                    });
                }
            }
        }
        let tenant = match &self.fallback {
            Fallback::None => None,
            Fallback::Suffix(suffix) => n
                .strip_suffix(suffix.as_str())
                .filter(|label| !label.is_empty() && !label.contains('.'))
                .map(CompactString::from),
            Fallback::Hook(hook) => hook.tenant_for(n).map(CompactString::from),
        };
        tenant.map(|tenant| Resolved {
            tenant,
            matched: DomainMatch::Fallback,
        })
    }

    /// Exact entries in insertion order, then wildcards as `*.suffix`.
    pub fn list(&self) -> Vec<DomainEntry> {
        let tables = self.tables.load();
        let exact = tables.exact.iter().map(|(h, t)| DomainEntry {
            host: h.to_string(),
            tenant: t.to_string(),
        });
        let wildcard = tables.wildcard.iter().map(|(s, t)| DomainEntry {
            host: format!("*.{s}"),
            tenant: t.to_string(),
        });
        exact.chain(wildcard).collect()
    }

    pub fn len(&self) -> usize {
        let tables = self.tables.load();
        tables.exact.len() + tables.wildcard.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn snapshot(&self) -> DomainSnapshot {
        DomainSnapshot {
            at: self.clock.now_ms(),
            entries: self.list(),
            version: 1,
        }
    }

    /// Replaces every entry with the snapshot's; nothing changes if one of
    /// them is invalid.
    pub fn restore(&self, snapshot: &DomainSnapshot) -> Result<(), DomainError> {
        let mut tables = Tables::default();
        for e in &snapshot.entries {
            insert(&mut tables, &e.host, &e.tenant)?;
        }
        let _w = self.write.lock();
        self.tables.store(Arc::new(tables));
        Ok(())
    }

    pub fn metrics(&self) -> DomainMetrics {
        let c = &self.counters;
        let (exact, wildcard, fallback, misses) = (
            c.exact.get(),
            c.wildcard.get(),
            c.fallback.get(),
            c.misses.get(),
        );
        DomainMetrics {
            entries: self.len(),
            resolves: exact + wildcard + fallback + misses,
            hits: exact + wildcard + fallback,
            misses,
            exact,
            wildcard,
            fallback,
        }
    }
}

fn insert(tables: &mut Tables, host: &str, tenant: &str) -> Result<(), DomainError> {
    let n = normalize(host);
    if let Some(suffix) = n.strip_prefix("*.") {
        if suffix.is_empty() || suffix.contains('*') {
            return Err(DomainError::UnsupportedWildcard(host.to_string()));
        }
        tables
            .wildcard
            .insert(CompactString::from(suffix), CompactString::from(tenant));
    } else if n.contains('*') {
        return Err(DomainError::UnsupportedWildcard(host.to_string()));
    } else {
        tables
            .exact
            .insert(CompactString::from(n.as_ref()), CompactString::from(tenant));
    }
    Ok(())
}

fn remove(tables: &mut Tables, host: &str) -> bool {
    let n = normalize(host);
    match n.strip_prefix("*.") {
        Some(suffix) => tables.wildcard.shift_remove(suffix).is_some(),
        None => tables.exact.shift_remove(n.as_ref()).is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> DomainMap {
        let m = DomainMap::new(Fallback::suffix(".apps.example.com"));
        m.add("app.acme.com", "acme").unwrap();
        m.add("*.acme.com", "acme-wild").unwrap();
        m.add("*.com", "dotcom").unwrap();
        m
    }

    fn tenant(m: &DomainMap, host: &str) -> Option<(String, DomainMatch)> {
        m.resolve(host).map(|r| (r.tenant.to_string(), r.matched))
    }

    #[test]
    fn normalisation_trims_lowercases_and_strips_ports() {
        assert_eq!(normalize("  App.Acme.COM:8443 "), "app.acme.com");
        assert_eq!(normalize("[::1]:8080"), "[::1]");
        assert_eq!(normalize("[::1"), "[::1");
        assert_eq!(normalize("::1"), "");
        assert_eq!(normalize("\u{FEFF}x.y"), "x.y");
        assert_eq!(normalize("Example.COM.:80"), "example.com");
        for h in ["k\n\u{b}.", "k.\n.", " a.b. ", "X.Y..:1"] {
            assert_eq!(normalize(&normalize(h)), normalize(h), "{h:?}");
        }
        assert!(matches!(normalize("plain.host"), Cow::Borrowed(_)));
    }

    #[test]
    fn precedence_is_exact_then_wildcard_then_fallback() {
        let m = map();
        assert_eq!(
            tenant(&m, "APP.acme.com:80"),
            Some(("acme".into(), DomainMatch::Exact))
        );
        assert_eq!(
            tenant(&m, "www.acme.com"),
            Some(("acme-wild".into(), DomainMatch::Wildcard))
        );
        // One label only: a.b.acme.com is not under *.acme.com, but is
        // under nothing else either (*.com needs exactly one label).
        assert_eq!(tenant(&m, "a.b.acme.com"), None);
        assert_eq!(
            tenant(&m, "acme.com"),
            Some(("dotcom".into(), DomainMatch::Wildcard))
        );
        assert_eq!(tenant(&m, ".acme.com"), None);
        assert_eq!(
            tenant(&m, "beta.apps.example.com"),
            Some(("beta".into(), DomainMatch::Fallback))
        );
        assert_eq!(tenant(&m, "a.b.apps.example.com"), None);
        assert_eq!(tenant(&m, ".apps.example.com"), None);
        assert_eq!(tenant(&m, "unknown.org"), None);
    }

    #[test]
    fn bad_wildcards_are_errors() {
        let m = map();
        for bad in ["*.", "a.*.com", "*.*.com", "*", "x*.com"] {
            assert!(
                matches!(m.add(bad, "t"), Err(DomainError::UnsupportedWildcard(_))),
                "{bad}"
            );
        }
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn remove_and_list_keep_insertion_order() {
        let m = map();
        m.add("b.example", "b").unwrap();
        assert!(m.remove("APP.ACME.COM"));
        assert!(!m.remove("app.acme.com"));
        assert!(m.remove("*.com"));
        let hosts: Vec<String> = m.list().into_iter().map(|e| e.host).collect();
        assert_eq!(hosts, vec!["b.example", "*.acme.com"]);
    }

    #[test]
    fn metrics_count_hits_and_misses() {
        let m = map();
        m.resolve("app.acme.com");
        m.resolve("x.acme.com");
        m.resolve("t.apps.example.com");
        m.resolve("nope");
        let got = m.metrics();
        assert_eq!(
            (got.entries, got.resolves, got.hits, got.misses),
            (3, 4, 3, 1)
        );
        assert_eq!((got.exact, got.wildcard, got.fallback), (1, 1, 1));
    }

    #[test]
    fn snapshot_round_trip() {
        let m = map();
        let snap = m.snapshot();
        let other = DomainMap::new(Fallback::None);
        other.restore(&snap).unwrap();
        assert_eq!(other.list(), m.list());
    }
}
