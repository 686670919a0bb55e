//! `quic` (DESIGN §9): HTTP/3's settings, for the `quic` listeners.

use super::Checker;
use crate::config::raw::RawQuic;
use crate::config::{Listener, QuicConfig};
use std::net::SocketAddr;

/// `quic.max_streams` when the section does not say (as nginx's
/// `http3_max_concurrent_streams`).
const DEFAULT_MAX_STREAMS: u64 = 100;

/// `quic.alt_svc_max_age` when the section does not say: a day.
const DEFAULT_ALT_SVC_MAX_AGE: u64 = 86_400;

/// `quic.max_connections` when the section does not say.
const DEFAULT_MAX_CONNECTIONS: u64 = 16_384;

/// The most streams one connection may have in flight: each holds a
/// request's state and a stream's receive window.
const MOST_STREAMS: u64 = 10_000;

/// HTTP/3's settings; `None` without a `quic` listener. The TLS listeners
/// advertise the first `quic` listener's port.
pub(super) fn check_quic(
    c: &mut Checker<'_>,
    raw: RawQuic,
    listeners: Vec<SocketAddr>,
    tcp: &[Listener],
) -> Option<QuicConfig> {
    let max_streams = raw.max_streams.unwrap_or(DEFAULT_MAX_STREAMS);
    if !(1..=MOST_STREAMS).contains(&max_streams) {
        c.error(
            "quic.max_streams",
            format!("must be between 1 and {MOST_STREAMS}"),
        );
    }
    let max_age = raw.alt_svc_max_age.unwrap_or(DEFAULT_ALT_SVC_MAX_AGE);
    if max_age > u64::from(u32::MAX) {
        c.error(
            "quic.alt_svc_max_age",
            "must be at most 4294967295 (seconds)",
        );
    }
    let max_connections = raw.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
    if !(1..=10_000_000).contains(&max_connections) {
        c.error("quic.max_connections", "must be between 1 and 10000000");
    }
    let port = listeners.first()?.port();
    let advertised = max_age > 0 && tcp.iter().any(|l| l.tls.is_on());
    let alt_svc = advertised
        .then(|| format!("h3=\":{port}\"; ma={max_age}"))
        .and_then(|v| http::HeaderValue::from_str(&v).ok());
    Some(QuicConfig {
        listeners,
        max_streams: max_streams.min(MOST_STREAMS) as u32,
        max_connections: max_connections.min(10_000_000) as usize,
        early_data: raw.early_data.unwrap_or(false),
        alt_svc,
    })
}
