//! The host rule every transport and protocol asks (a `Host`, an
//! absolute-form target's authority, an HTTP/2 `:authority`, the edge's
//! redirect, SNI), and the name of an authority without its port. The
//! request pipeline and the TLS certificate store both ask it.

/// The longest host name (RFC 1035 §2.3.4: 255 bytes on the wire, 253 as
/// text), and the longest label in one. Beyond them a name is no DNS name
/// and no tenant: refused before any table sees it, so that what a table
/// holds per name is bounded in bytes.
pub const MAX_HOST_NAME: usize = 253;
pub const MAX_HOST_LABEL: usize = 63;

/// The host rule, the one every transport and protocol asks (a `Host`, an
/// absolute-form target's authority, an HTTP/2 `:authority`, the edge's
/// redirect, SNI): a valid authority (no spaces, no user info, no path),
/// its name at most [`MAX_HOST_NAME`] bytes (a final dot aside, port
/// excluded) with no label over [`MAX_HOST_LABEL`]. Returns the host as
/// given, or the refusal's code.
pub fn check_host(host: &str) -> Result<&str, &'static str> {
    let name = host_name(host);
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.len() > MAX_HOST_NAME || name.split('.').any(|l| l.len() > MAX_HOST_LABEL) {
        return Err("invalid-host");
    }
    // A name of letters, digits, `.` and `-`, with a port of digits or
    // none (nearly every host), is one without parsing it as a URI.
    let (plain, port) = match host.rsplit_once(':') {
        Some((plain, port)) => (plain, Some(port)),
        None => (host, None),
    };
    let plain_name = !plain.is_empty()
        && plain
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    let plain_port = port.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 5
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u16>().is_ok()
    });
    if plain_name && plain_port {
        return Ok(host);
    }
    match http::uri::Authority::try_from(host) {
        Ok(a) if !a.as_str().contains('@') => Ok(host),
        _ => Err("invalid-host"),
    }
}

/// The name of an authority, without its port: `a.example:8080` →
/// `a.example`, `[::1]:80` → `[::1]` (as `http::uri::Authority::host`).
pub fn host_name(authority: &str) -> &str {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(end) => &authority[..=end],
            None => authority,
        };
    }
    authority
        .rsplit_once(':')
        .map_or(authority, |(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_hosts_are_taken_as_the_uri_parser_takes_them() {
        for host in [
            "a.example",
            "A-1.example:8080",
            "127.0.0.1",
            "x:0",
            "x:65535",
            "x:65536",
            "x:080",
            "x:",
            ":80",
            "a b",
            "a@b",
            "[::1]:80",
            "a/b",
            "a%20b",
            "a_b.example",
            "a..b",
            "-a",
            "a:b",
            "a:8080:1",
            "\u{e9}.example",
        ] {
            let parsed = http::uri::Authority::try_from(host)
                .ok()
                .filter(|a| !a.as_str().contains('@'))
                .map(|_| host);
            assert_eq!(check_host(host).ok(), parsed, "{host:?}");
        }
    }
}
