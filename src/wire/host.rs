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
    match plain_host_in_bounds(host.as_bytes()) {
        Some(true) => return Ok(host),
        Some(false) => return Err("invalid-host"),
        None => {}
    }
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

/// What each byte is in a plain host: of a label (letters, digits, `-`),
/// a dot, the port's colon, or none of these (0).
const LABEL: u8 = 1;
const DOT: u8 = 2;
const COLON: u8 = 3;
const NAME_BYTES: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = match c {
            b'.' => DOT,
            b':' => COLON,
            b'-' => LABEL,
            _ if c.is_ascii_alphanumeric() => LABEL,
            _ => 0,
        };
        b += 1;
    }
    table
};

/// The host rule for nearly every host, in one pass: a name of letters,
/// digits, `.` and `-`, then a port of 1–5 digits (at most 65535) or none.
/// `Some`: such a host, and whether its name is within the bounds; `None`:
/// another shape, for the whole rule to read.
fn plain_host_in_bounds(host: &[u8]) -> Option<bool> {
    let (mut label, mut longest, mut name_end) = (0usize, 0usize, host.len());
    for (i, &b) in host.iter().enumerate() {
        match NAME_BYTES[usize::from(b)] {
            LABEL => label += 1,
            DOT => {
                longest = longest.max(label);
                label = 0;
            }
            COLON => {
                name_end = i;
                break;
            }
            _ => return None,
        }
    }
    let name = &host[..name_end];
    if name.is_empty() {
        return None;
    }
    if name_end < host.len() {
        let port = &host[name_end + 1..];
        let digits = !port.is_empty() && port.len() <= 5 && port.iter().all(u8::is_ascii_digit);
        let value = || port.iter().fold(0u32, |v, &d| v * 10 + u32::from(d - b'0'));
        if !digits || value() > u32::from(u16::MAX) {
            return None;
        }
    }
    // A final dot is no label, and not counted in the name's length.
    let length = name.len() - usize::from(name.ends_with(b"."));
    Some(length <= MAX_HOST_NAME && longest.max(label) <= MAX_HOST_LABEL)
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
            "a.example.:443",
            "x:99999999999999999999",
            "x:6553a",
            ".",
        ] {
            let parsed = http::uri::Authority::try_from(host)
                .ok()
                .filter(|a| !a.as_str().contains('@'))
                .map(|_| host);
            assert_eq!(check_host(host).ok(), parsed, "{host:?}");
        }
        // The bounds, with and without a port or a final dot.
        let label = "a".repeat(MAX_HOST_LABEL);
        let name = [label.as_str(); 4].join(".");
        assert_eq!(name.len(), 4 * MAX_HOST_LABEL + 3);
        let name = &name[..MAX_HOST_NAME];
        for (host, ok) in [
            (format!("{label}.example:80"), true),
            (format!("{label}a.example:80"), false),
            (format!("{name}.:80"), true),
            (format!("{name}a:80"), false),
            (format!("{name}a."), false),
        ] {
            assert_eq!(check_host(&host).is_ok(), ok, "{} bytes", host.len());
        }
    }
}
