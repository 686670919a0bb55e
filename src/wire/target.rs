//! A request target as RFC 9112 §3.2 reads it: what the pipeline routes
//! and forwards, and what a span names.

/// A request target as RFC 9112 §3.2 reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target<'a> {
    /// An absolute-form target's authority (`http://a.example/x` →
    /// `a.example`): the request's host, whatever `Host` says.
    pub authority: Option<&'a str>,
    /// The path and query the shard receives, in origin form: an absolute
    /// form's (`/` before a query if it has no path), or the target as
    /// sent (origin form, or `*`).
    pub origin: std::borrow::Cow<'a, str>,
}

impl Target<'_> {
    /// The path, without the query.
    pub fn path(&self) -> &str {
        self.origin.split('?').next().unwrap_or_default()
    }
}

/// Reads a request target: origin form (`/x?y`), asterisk form (`*`), or
/// absolute form with an `http` or `https` scheme (case-insensitive).
/// Anything else (an authority form, another scheme) is `None`.
pub fn request_target(target: &str) -> Option<Target<'_>> {
    use std::borrow::Cow;
    if target.starts_with('/') || target == "*" {
        return Some(Target {
            authority: None,
            origin: Cow::Borrowed(target),
        });
    }
    let scheme = target.get(..8).unwrap_or(target).to_ascii_lowercase();
    let rest = if scheme.starts_with("http://") {
        &target[7..]
    } else if scheme.starts_with("https://") {
        &target[8..]
    } else {
        return None;
    };
    let at = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, origin) = rest.split_at(at);
    let origin = match origin.as_bytes().first() {
        Some(b'/') => Cow::Borrowed(origin),
        Some(_) => Cow::Owned(format!("/{origin}")),
        None => Cow::Borrowed("/"),
    };
    Some(Target {
        authority: Some(authority),
        origin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_origin_asterisk_or_absolute_form() {
        let t = |text| request_target(text).map(|t| (t.authority, t.origin.into_owned()));
        assert_eq!(t("/a?b"), Some((None, "/a?b".into())));
        assert_eq!(t("*"), Some((None, "*".into())));
        assert_eq!(
            t("http://a.example/p?q=1"),
            Some((Some("a.example"), "/p?q=1".into()))
        );
        assert_eq!(
            t("HTTPS://a.example:8443"),
            Some((Some("a.example:8443"), "/".into()))
        );
        assert_eq!(
            t("http://a.example?q"),
            Some((Some("a.example"), "/?q".into()))
        );
        assert_eq!(t("http://"), Some((Some(""), "/".into())));
        for other in ["a.example:443", "ftp://a/x", "x", ""] {
            assert_eq!(t(other), None, "{other:?}");
        }
        assert_eq!(request_target("http://a/p/q?x").unwrap().path(), "/p/q");
    }
}
