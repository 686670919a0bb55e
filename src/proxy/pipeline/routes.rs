//! Route prefixes: which per-route bucket a request path falls under. The
//! longest configured prefix wins, matched on path-segment boundaries:
//! `/api/export` covers `/api/export` and `/api/export/x`, not
//! `/api/exporter`; `/api/` covers everything under `/api/`.
//!
//! Prefixes match the path as the shard's framework will read it, so a
//! client cannot leave a bucket by spelling the same path another way
//! (DESIGN §3): for matching only, percent-encoded unreserved characters
//! are decoded, a `;parameter` ends its segment, repeated `/` are merged
//! and dot segments removed. The shard still receives the path byte for
//! byte.

use std::borrow::Cow;

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

    /// The longest prefix covering `path` (the path without its query), as
    /// an index for [`RoutePrefixes::name`].
    pub fn route_for(&self, path: &str) -> Option<usize> {
        if self.prefixes.is_empty() {
            return None;
        }
        let path = normalise(path);
        self.prefixes.iter().position(|p| covers(p, &path))
    }

    pub fn name(&self, index: usize) -> &str {
        self.prefixes.get(index).map_or("", String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }
}

fn covers(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        None => false,
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
    }
}

/// `path` as a framework reads it, for matching (see the module
/// documentation). Borrowed when there is nothing to normalise.
pub fn normalise(path: &str) -> Cow<'_, str> {
    let plain = !path.contains(['%', ';']) && !path.contains("//") && !path.contains("/.");
    if plain {
        return Cow::Borrowed(path);
    }
    let decoded = decode_unreserved(path);
    let mut segments: Vec<&str> = Vec::new();
    // Whether the path ends in a `/` (after the last kept segment).
    let mut trailing = false;
    for segment in decoded.split('/').skip(1) {
        let segment = segment.split(';').next().unwrap_or_default();
        match segment {
            "" | "." => trailing = true,
            ".." => {
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
/// digits, `-`, `.`, `_`, `~`); other escapes stay as they are.
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
            .filter(|b| b.is_ascii_alphanumeric() || b"-._~".contains(b));
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
            self.0.route_for(path).map(|i| self.0.name(i))
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
        // Reserved characters stay encoded: `%2F` is not a `/`.
        assert_eq!(r.route_for("/api%2Fexport"), None);
        assert_eq!(r.route_for("/api/export/../other"), Some("/api/"));
        assert_eq!(r.route_for("/../../api/"), Some("/api/"));
    }

    #[test]
    fn normalising_keeps_plain_paths_borrowed_and_is_idempotent() {
        assert!(matches!(normalise("/api/export/x"), Cow::Borrowed(_)));
        for path in [
            "/a/./b/../c//d;e",
            "/%7Euser/%41",
            "/",
            "/..",
            "/a/%zz/%c3%a9",
            "/é/.",
        ] {
            let once = normalise(path).into_owned();
            assert_eq!(normalise(&once), once, "{path}");
            assert!(once.starts_with('/'));
        }
    }
}
