//! The admin path's segments and the query's parameters, `%XX`-decoded.

/// `%XX` decoding of one path segment.
pub(super) fn decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

pub(super) fn query_params(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let plus = |s: &str| s.replace('+', " ");
            (
                decode(&plus(k)).unwrap_or_default(),
                decode(&plus(v)).unwrap_or_default(),
            )
        })
        .collect()
}

/// The first value of query parameter `name`.
pub(super) fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_and_queries_decode() {
        assert_eq!(decode("%2A.acme.com").as_deref(), Some("*.acme.com"));
        assert_eq!(decode("%zz"), None);
        let q = query_params(Some("tenant=a%20b&channel=&path=/api/export"));
        assert_eq!(q[0], ("tenant".into(), "a b".into()));
        assert_eq!(q[1], ("channel".into(), "".into()));
    }
}
