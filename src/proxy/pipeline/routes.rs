//! Route prefixes: which per-route bucket a request path falls under. The
//! longest configured prefix wins, matched on path-segment boundaries:
//! `/api/export` covers `/api/export` and `/api/export/x`, not
//! `/api/exporter`; `/api/` covers everything under `/api/`.

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
        self.prefixes.iter().position(|p| covers(p, path))
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
}
