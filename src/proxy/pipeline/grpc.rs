//! gRPC's rules (DESIGN §8), for both transports: what a gRPC call is,
//! the gRPC status of shardgate's own answers, a call's `grpc-timeout`,
//! and the status a shard's answer carries (for the access log and the
//! span).

use http::HeaderMap;
use std::time::Duration;

/// The gRPC status for shardgate's answer with HTTP `status` (DESIGN §8's
/// table; the rest as gRPC maps HTTP statuses).
pub fn status_for_http(status: u16) -> u8 {
    match status {
        // INTERNAL
        400 | 431 | 500 | 505 => 13,
        // UNAUTHENTICATED
        401 => 16,
        // PERMISSION_DENIED
        403 => 7,
        // UNIMPLEMENTED
        404 | 405 | 501 => 12,
        // DEADLINE_EXCEEDED
        408 | 504 => 4,
        // RESOURCE_EXHAUSTED
        413 | 429 => 8,
        // UNAVAILABLE
        502 | 503 => 14,
        // UNKNOWN
        _ => 2,
    }
}

/// Whether a request with this `content-type` is a gRPC call
/// (`application/grpc`, `application/grpc+proto`, with parameters or not).
pub fn is_grpc(content_type: &[u8]) -> bool {
    let Some(rest) = content_type
        .get(..16)
        .filter(|p| p.eq_ignore_ascii_case(b"application/grpc"))
        .map(|_| &content_type[16..])
    else {
        return false;
    };
    matches!(rest.first(), None | Some(b'+') | Some(b';'))
}

/// A call's `grpc-timeout` (`1–8 digits` and a unit: `H`, `M`, `S`, `m`
/// milliseconds, `u` microseconds, `n` nanoseconds); `None` when absent
/// or malformed (the call then has no deadline of its own).
pub fn timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The `grpc-status` a shard's head or trailers carry, if a number.
pub fn status_in(fields: &HeaderMap) -> Option<u8> {
    status_of(
        fields
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_bytes())),
    )
}

/// As [`status_in`], of fields as bytes (the fast transport's).
pub fn status_of<'a>(fields: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Option<u8> {
    let (_, value) = fields
        .into_iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("grpc-status"))?;
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_calls_are_told_by_their_content_type() {
        for yes in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC;x=1",
        ] {
            assert!(is_grpc(yes.as_bytes()), "{yes}");
        }
        for no in [
            "application/grpc-web",
            "application/json",
            "application/grp",
            "",
        ] {
            assert!(!is_grpc(no.as_bytes()), "{no}");
        }
    }

    #[test]
    fn a_grpc_timeout_is_read_by_its_unit() {
        assert_eq!(timeout(b"10S"), Some(Duration::from_secs(10)));
        assert_eq!(timeout(b"500m"), Some(Duration::from_millis(500)));
        assert_eq!(timeout(b"2H"), Some(Duration::from_secs(7200)));
        assert_eq!(
            timeout(b"99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in [
            &b""[..],
            b"S",
            b"10",
            b"123456789S",
            b"1.5S",
            b"-1S",
            b"10s",
        ] {
            assert_eq!(timeout(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_shards_grpc_status_is_read_from_its_fields() {
        let mut fields = HeaderMap::new();
        assert_eq!(status_in(&fields), None);
        fields.insert("grpc-status", "5".parse().unwrap());
        assert_eq!(status_in(&fields), Some(5));
        fields.insert("grpc-status", "x".parse().unwrap());
        assert_eq!(status_in(&fields), None);
    }
}
