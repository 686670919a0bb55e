//! Route prefixes: which per-route bucket a request path falls under. The
//! longest configured prefix wins, matched on path-segment boundaries:
//! `/api/export` covers `/api/export` and `/api/export/x`, not
//! `/api/exporter`; `/api/` covers everything under `/api/`.
//!
//! Prefixes match the path as the shard's framework will read it, so a
//! client cannot leave a bucket by spelling the same path another way
//! (DESIGN §3): for matching only, percent-encoded unreserved characters
//! are decoded, a `;parameter` ends its segment, repeated `/` are merged
//! and dot segments removed, and ASCII case is ignored (Express, ASP.NET
//! and IIS route `/API/Export` as `/api/export`). The shard still receives the path byte for
//! byte.

use crate::limits::prefix_covers as covers;
use std::borrow::Cow;

/// The prefixes covering a path: the longest over both readings, and the
/// other reading's longest when the two fall under different prefixes (a
/// plan that lacks the longest may hold the other: the router keeps the
/// longer of what each plan has).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteMatch {
    pub longest: Option<usize>,
    pub other: Option<usize>,
}

/// The configured prefixes, longest first.
#[derive(Clone, Debug, Default)]
pub struct RoutePrefixes {
    prefixes: Vec<String>,
}

impl RoutePrefixes {
    pub fn new<I, S>(prefixes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut prefixes: Vec<String> = prefixes.into_iter().map(Into::into).collect();
        prefixes.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        RoutePrefixes { prefixes }
    }

    /// The prefixes covering `path` (the path without its query), as
    /// indices for [`RoutePrefixes::name`].
    pub fn route_for(&self, path: &str) -> RouteMatch {
        if self.prefixes.is_empty() {
            return RouteMatch::default();
        }
        // Two readings of the path: dot segments resolved (as a server
        // that normalises reads it) and `..` kept as a name (as Express,
        // Django or Rails route it); the longer prefix of either wins, so
        // neither reading leaves a bucket.
        let resolved = normalise(path, true);
        let literal = normalise(path, false);
        let longest = |path: &str| self.prefixes.iter().position(|p| covers(p, path));
        let first = longest(&resolved);
        if resolved == literal {
            return RouteMatch {
                longest: first,
                other: None,
            };
        }
        // Longest first: the smaller index is the longer prefix.
        match (first, longest(&literal)) {
            (Some(a), Some(b)) => RouteMatch {
                longest: Some(a.min(b)),
                other: (a != b).then_some(a.max(b)),
            },
            (a, b) => RouteMatch {
                longest: a.or(b),
                other: None,
            },
        }
    }

    pub fn name(&self, index: usize) -> &str {
        self.prefixes.get(index).map_or("", String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }
}

/// `path` as a framework reads it, for matching (see the module
/// documentation); `dots`: resolve `..` segments (else a `..` is kept as a
/// name). Borrowed when there is nothing to normalise.
pub fn normalise(path: &str, dots: bool) -> Cow<'_, str> {
    let plain = path.starts_with('/')
        && !path.contains(['%', ';'])
        && !path.contains("//")
        && !path.contains("/.");
    if plain {
        return Cow::Borrowed(path);
    }
    let decoded = decode_unreserved(path);
    let mut segments: Vec<&str> = Vec::new();
    // Whether the path ends in a `/` (after the last kept segment).
    let mut trailing = false;
    let relative = decoded.strip_prefix('/').unwrap_or(&decoded);
    for segment in relative.split('/') {
        let segment = segment.split(';').next().unwrap_or_default();
        match segment {
            "" | "." => trailing = true,
            ".." if dots => {
                segments.pop();
                trailing = true;
            }
            name => {
                segments.push(name);
                trailing = false;
            }
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if trailing || segments.is_empty() {
        out.push('/');
    }
    Cow::Owned(out)
}

/// Decodes `%XX` escapes of unreserved characters (RFC 3986 §2.3: letters,
/// digits, `-`, `.`, `_`, `~`) and of `/` (servers for Django or Flask
/// decode `%2F` before routing); other escapes stay as they are.
fn decode_unreserved(path: &str) -> Cow<'_, str> {
    if !path.contains('%') {
        return Cow::Borrowed(path);
    }
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut at = 0;
    while at < bytes.len() {
        let decoded = (bytes[at] == b'%')
            .then(|| bytes.get(at + 1..at + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            .filter(|b| b.is_ascii_alphanumeric() || b"-._~/".contains(b));
        match decoded {
            Some(b) => {
                out.push(b as char);
                at += 3;
            }
            None => {
                // `path` is a str: copy the whole character at `at`.
                let ch = path[at..].chars().next().unwrap_or_default();
                out.push(ch);
                at += ch.len_utf8().max(1);
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(RoutePrefixes);

    impl Named {
        fn route_for(&self, path: &str) -> Option<&str> {
            self.0.route_for(path).longest.map(|i| self.0.name(i))
        }

        fn other_for(&self, path: &str) -> Option<&str> {
            self.0.route_for(path).other.map(|i| self.0.name(i))
        }
    }

    #[test]
    fn longest_prefix_on_segment_boundaries() {
        let r = Named(RoutePrefixes::new(["/api/export", "/api/", "/"]));
        assert_eq!(r.route_for("/api/export"), Some("/api/export"));
        assert_eq!(r.route_for("/api/export/x"), Some("/api/export"));
        assert_eq!(r.route_for("/api/exporter"), Some("/api/"));
        assert_eq!(r.route_for("/api/"), Some("/api/"));
        assert_eq!(r.route_for("/api"), Some("/"));
        assert_eq!(r.route_for("/other"), Some("/"));
        let r = Named(RoutePrefixes::new(["/api/export"]));
        assert_eq!(r.route_for("/api/exporter"), None);
        assert_eq!(r.route_for("/"), None);
    }

    #[test]
    fn a_path_spelled_another_way_stays_in_its_bucket() {
        let r = Named(RoutePrefixes::new(["/api/export", "/api/"]));
        for path in [
            "//api/export",
            "/api//export",
            "/api/./export",
            "/api/x/../export",
            "/api/%65xport",
            "/api/%2e/export",
            "/api/export;x",
            "/api;v=1/export/",
            "/%61pi/export/y",
        ] {
            assert_eq!(r.route_for(path), Some("/api/export"), "{path}");
        }
        // `%2F` reads as `/` (Django, Flask); other reserved escapes stay.
        assert_eq!(r.route_for("/api%2Fexport"), Some("/api/export"));
        assert_eq!(r.route_for("/api%3Fexport"), None);
        // `..` read either way: resolved, or kept as a name by frameworks
        // that route on the raw segments — the longer prefix wins.
        assert_eq!(r.route_for("/api/export/../other"), Some("/api/export"));
        assert_eq!(r.route_for("/api/export/%2e%2e/x"), Some("/api/export"));
        assert_eq!(r.route_for("/x/../api/export"), Some("/api/export"));
        assert_eq!(r.route_for("/../../api/"), Some("/api/"));
        assert_eq!(r.route_for("api/export"), Some("/api/export"));
        // The other reading's prefix is kept when it differs: a plan may
        // limit only that one.
        let r = Named(RoutePrefixes::new(["/internal/reports", "/api"]));
        let path = "/internal/reports/../../api/x";
        assert_eq!(r.route_for(path), Some("/internal/reports"));
        assert_eq!(r.other_for(path), Some("/api"));
        assert_eq!(r.other_for("/api/x"), None);
        assert_eq!(r.other_for("/api/./x"), None, "one prefix either way");
    }

    #[test]
    fn prefixes_ignore_ascii_case_on_segment_boundaries() {
        let r = Named(RoutePrefixes::new(["/api/export", "/Internal/"]));
        for path in [
            "/API/Export",
            "/Api/EXPORT/x",
            "/api/%45xport",
            "//API/./export;v",
        ] {
            assert_eq!(r.route_for(path), Some("/api/export"), "{path}");
        }
        assert_eq!(r.route_for("/internal/x"), Some("/Internal/"));
        assert_eq!(
            r.route_for("/API/Exporter"),
            None,
            "a segment boundary still"
        );
        assert_eq!(r.route_for("/internal"), None);
        // Only ASCII folds: `É` is not `é`, and a multi-byte character
        // where the prefix ends is no boundary.
        let r = Named(RoutePrefixes::new(["/café", "/ab"]));
        assert_eq!(r.route_for("/CAFé/x"), Some("/café"));
        assert_eq!(r.route_for("/cafÉ"), None);
        assert_eq!(r.route_for("/aé"), None);
    }

    #[test]
    fn normalising_keeps_plain_paths_borrowed_and_is_idempotent() {
        assert!(matches!(normalise("/api/export/x", true), Cow::Borrowed(_)));
        for path in [
            "/a/./b/../c//d;e",
            "/%7Euser/%41",
            "/",
            "/..",
            "/a/%zz/%c3%a9",
            "/é/.",
            "x/y",
        ] {
            for dots in [true, false] {
                let once = normalise(path, dots).into_owned();
                assert_eq!(normalise(&once, dots), once, "{path}");
                assert!(once.starts_with('/'));
            }
        }
    }
}
