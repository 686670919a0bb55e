//! Text written into answers and log lines: a JSON string's inside, and
//! an IP address without the formatter or an allocation.

use std::fmt::Write as _;
use std::net::IpAddr;

/// `value` as the inside of a JSON string: quotes, backslashes and
/// control characters escaped (shardgate's answers and the access log).
pub fn escape_json(out: &mut String, value: &str) {
    // The common case: nothing to escape, one copy.
    if !value
        .bytes()
        .any(|b| b < 0x20 || b == b'"' || b == b'\\' || b == 0x7f)
    {
        out.push_str(value);
        return;
    }
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// `bytes` as text, if they are: ASCII (nearly every host, address and
/// ID) is seen at a glance, word by word; anything else gets UTF-8's full
/// check. (`str::from_utf8` costs 3 to 10 times as much on the short
/// ASCII strings a request is made of.)
pub fn text(bytes: &[u8]) -> Option<&str> {
    if bytes.is_ascii() {
        // SAFETY: every ASCII byte sequence is UTF-8.
        return Some(unsafe { std::str::from_utf8_unchecked(bytes) });
    }
    std::str::from_utf8(bytes).ok()
}

/// An IP address as text, on the stack (an IPv6 address is at most 45
/// characters).
pub(crate) struct IpText {
    bytes: [u8; 48],
    len: usize,
}

impl IpText {
    pub(crate) fn of(ip: IpAddr) -> IpText {
        let mut text = IpText {
            bytes: [0; 48],
            len: 0,
        };
        match ip {
            // The common case, digit by digit (no formatter).
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        text.push(b'.');
                    }
                    if octet >= 100 {
                        text.push(b'0' + octet / 100);
                    }
                    if octet >= 10 {
                        text.push(b'0' + octet / 10 % 10);
                    }
                    text.push(b'0' + octet % 10);
                }
            }
            IpAddr::V6(_) => {
                let mut cursor = std::io::Cursor::new(&mut text.bytes[..]);
                let _ = std::io::Write::write_fmt(&mut cursor, format_args!("{ip}"));
                text.len = cursor.position() as usize;
            }
        }
        text
    }

    fn push(&mut self, byte: u8) {
        self.bytes[self.len] = byte;
        self.len += 1;
    }

    pub(crate) fn as_str(&self) -> &str {
        // An address's digits, dots and colons: ASCII.
        text(&self.bytes[..self.len]).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_what_utf8_says_it_is() {
        let cases: [&[u8]; 7] = [
            b"",
            b"t.localhost:8080",
            "b\u{fc}cher.example".as_bytes(),
            b"\x7f\x00",
            b"\xff",
            b"ok\xc3",
            &[b'a'; 40],
        ];
        for bytes in cases {
            assert_eq!(text(bytes), std::str::from_utf8(bytes).ok(), "{bytes:?}");
        }
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for ip in ["0.0.0.0", "127.0.0.1", "10.20.255.9", "::1", "2001:db8::5"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(IpText::of(ip).as_str(), ip.to_string());
        }
    }
}
