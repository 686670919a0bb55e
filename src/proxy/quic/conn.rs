//! One QUIC connection's life: its handshake under the deadline, HTTP/3
//! over it, its request streams served side by side on the connection's
//! own task (as an HTTP/2 connection's are), GOAWAY when the gateway
//! stops, and its close once idle.

use super::{Handshaking, Shared};
use crate::proxy::fast::h3::{H3Conn, H3Stream};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use pingora::protocols::l4::socket::SocketAddr;
use pingora::server::ShutdownWatch;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The code a connection closes with: HTTP/3's `H3_NO_ERROR`.
pub(super) const NO_ERROR: u32 = 0x100;

/// A connection's handshake, then its requests until it ends.
pub(super) async fn serve(
    shared: Arc<Shared>,
    incoming: quinn::Incoming,
    handshaking: Handshaking,
    port: u16,
    shutdown: ShutdownWatch,
) {
    let Some((conn, confirmed)) = handshake(&shared, incoming).await else {
        return;
    };
    drop(handshaking);
    let _open = Open::count(&shared.counts);
    let client = conn.remote_address();
    let client = std::net::SocketAddr::new(client.ip().to_canonical(), client.port());
    let info = H3Conn {
        conn: conn.clone(),
        client: SocketAddr::Inet(client),
        local: conn
            .local_ip()
            .map(|ip| std::net::SocketAddr::new(ip, port)),
    };
    let mut builder = h3::server::builder();
    builder.max_field_section_size(shared.max_header_bytes as u64);
    let h3 = builder.build::<_, bytes::Bytes>(h3_quinn::Connection::new(conn.clone()));
    let h3 = match tokio::time::timeout(shared.handshake_timeout, h3).await {
        Ok(Ok(h3)) => h3,
        Ok(Err(e)) => {
            log::debug!("HTTP/3 with {client} did not start: {e}");
            return;
        }
        Err(_) => {
            log::debug!("HTTP/3 with {client} did not start in time");
            return;
        }
    };
    let ended = requests(&shared, h3, &info, confirmed, shutdown).await;
    if ended == Ended::Drained {
        // The last answers were handed to QUIC, not yet delivered: a close
        // now would drop what is unacknowledged. The client closes once it
        // has them (GOAWAY said to), or a few round trips pass.
        let delivered = (conn.rtt() * 4).clamp(Duration::from_millis(200), Duration::from_secs(2));
        let _ = tokio::time::timeout(delivered, conn.closed()).await;
    }
    conn.close(NO_ERROR.into(), b"");
}

/// The handshake under `tls.handshake_timeout_ms` (counted as a TLS
/// failure when it fails), and with 0-RTT on, what is ready once the
/// handshake is done (until then requests came in early data).
async fn handshake(
    shared: &Shared,
    incoming: quinn::Incoming,
) -> Option<(quinn::Connection, Option<quinn::ZeroRttAccepted>)> {
    let client = incoming.remote_address();
    let connecting = match incoming.accept() {
        Ok(connecting) => connecting,
        Err(e) => {
            log::debug!("QUIC handshake with {client} failed: {e}");
            shared.failures.failed("error");
            return None;
        }
    };
    let connecting = match shared.early_data {
        true => match connecting.into_0rtt() {
            Ok((conn, confirmed)) => return Some((conn, Some(confirmed))),
            Err(connecting) => connecting,
        },
        false => connecting,
    };
    match tokio::time::timeout(shared.handshake_timeout, connecting).await {
        Ok(Ok(conn)) => Some((conn, None)),
        Ok(Err(e)) => {
            log::debug!("QUIC handshake with {client} failed: {e}");
            shared.failures.failed("error");
            None
        }
        Err(_) => {
            log::debug!("QUIC handshake with {client} timed out");
            shared.failures.failed("timeout");
            None
        }
    }
}

type H3Connection = h3::server::Connection<h3_quinn::Connection, bytes::Bytes>;

/// How a connection's requests ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// Closed by the client, an HTTP/3 error, or idle.
    Over,
    /// The gateway stops: GOAWAY went, and what was in flight is answered.
    Drained,
}

/// The connection's requests, each on this task, until the client closes
/// it, it is idle for `limits.keepalive_timeout_ms` (or has no first
/// request by then), or the gateway stops (GOAWAY; those in flight end).
async fn requests(
    shared: &Shared,
    mut h3: H3Connection,
    info: &H3Conn,
    confirmed: Option<quinn::ZeroRttAccepted>,
    mut shutdown: ShutdownWatch,
) -> Ended {
    let mut in_flight = FuturesUnordered::new();
    let mut closing = false;
    // 0-RTT: until the handshake is done, requests came in early data.
    let mut confirmed = confirmed.map(Box::pin);
    let idle = tokio::time::sleep(shared.keepalive_timeout);
    tokio::pin!(idle);
    loop {
        let accepted = tokio::select! {
            biased;
            _ = async { confirmed.as_mut().expect("early").await }, if confirmed.is_some() => {
                confirmed = None;
                continue;
            }
            _ = shutdown.changed(), if !closing => {
                closing = true;
                // The last stream accepted is served; later ones are not.
                let _ = h3.shutdown(1).await;
                if in_flight.is_empty() {
                    return Ended::Drained;
                }
                continue;
            }
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {
                if in_flight.is_empty() {
                    if closing {
                        return Ended::Drained;
                    }
                    idle.as_mut().reset(Instant::now() + shared.keepalive_timeout);
                }
                continue;
            }
            accepted = h3.accept() => accepted,
            () = &mut idle, if in_flight.is_empty() => return Ended::Over,
        };
        let resolver = match accepted {
            Ok(Some(resolver)) => resolver,
            // Closed by the client, or an HTTP/3 error (the h3 crate
            // closed the connection with its code).
            Ok(None) | Err(_) => break,
        };
        let early = confirmed.is_some();
        let fast = &shared.fast;
        let header_timeout = shared.header_timeout;
        let served: Pin<Box<dyn Future<Output = ()> + Send + '_>> = Box::pin(async move {
            let resolved = tokio::time::timeout(header_timeout, resolver.resolve_request()).await;
            let Ok(Ok((req, stream))) = resolved else {
                return;
            };
            serve_stream(fast, req, stream, info, early).await;
        });
        in_flight.push(served);
    }
    while in_flight.next().await.is_some() {}
    match closing {
        true => Ended::Drained,
        false => Ended::Over,
    }
}

/// Serves one stream, a panic in it caught: it ends that stream only
/// (dropped, it is reset).
async fn serve_stream(
    fast: &crate::proxy::fast::FastPath,
    req: http::Request<()>,
    stream: H3Stream,
    info: &H3Conn,
    early: bool,
) {
    let served = std::panic::AssertUnwindSafe(fast.serve_h3(req, stream, info, early));
    if let Err(panic) = served.catch_unwind().await {
        let what = (panic.downcast_ref::<&str>().copied())
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("?");
        log::error!("an HTTP/3 stream panicked ({what}); the stream was reset");
    }
}

/// An open connection, counted until dropped.
struct Open(Arc<crate::metrics::QuicCounts>);

impl Open {
    fn count(counts: &Arc<crate::metrics::QuicCounts>) -> Open {
        counts.connections.fetch_add(1, Ordering::Relaxed);
        Open(Arc::clone(counts))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}
