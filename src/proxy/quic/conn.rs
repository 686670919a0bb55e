//! One QUIC connection's life: its handshake under the deadline, HTTP/3
//! over it, its request streams served side by side on the connection's
//! own task (as an HTTP/2 connection's are), GOAWAY when the gateway
//! stops, and its close once idle.

use super::{Handshaking, Shared};
use crate::proxy::fast::h2::Served;
use crate::proxy::fast::h3::{H3Conn, H3Stream};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use pingora::protocols::l4::socket::SocketAddr;
use pingora::server::ShutdownWatch;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::time::Instant;

/// The largest field section an HTTP/3 client may send, whatever
/// `limits.max_header_bytes` says (see where it is set).
const MAX_FIELD_SECTION: usize = 768 * 1024;

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
    // With 0-RTT the handshake goes on while early requests are served:
    // it keeps its place among the handshakes, and its deadline.
    let handshake = match confirmed {
        None => {
            drop(handshaking);
            None
        }
        Some(confirmed) => Some(Finishing {
            confirmed: Box::pin(confirmed),
            by: Instant::now() + shared.handshake_timeout,
            _counted: handshaking,
        }),
    };
    let client = conn.remote_address();
    let client = std::net::SocketAddr::new(client.ip().to_canonical(), client.port());
    let info = H3Conn {
        conn: conn.clone(),
        client: SocketAddr::Inet(client),
        local: (conn.local_ip()).map(|ip| std::net::SocketAddr::new(ip, port)),
    };
    let mut builder = h3::server::builder();
    // At most 768 KiB: the h3 crate sizes a header map to a head's field
    // count before the plan counts them, and that map panics past 24 576
    // fields; h3 charges each field its name, its value and 32 bytes, so
    // 768 KiB holds 24 576 empty ones at most.
    builder.max_field_section_size(shared.max_header_bytes.min(MAX_FIELD_SECTION) as u64);
    let h3 = builder.build::<_, bytes::Bytes>(h3_quinn::Connection::new(conn.clone()));
    let mut h3 = match tokio::time::timeout(shared.handshake_timeout, h3).await {
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
    let ended = requests(&shared, &mut h3, &info, handshake, shutdown).await;
    let code = match ended {
        // The last answers were handed to QUIC, not all delivered: a close
        // now would drop what is unacknowledged. The client closes once it
        // has them (GOAWAY told it to go); the endpoint closes every
        // connection at the grace period's end.
        Ended::Drained => {
            let _ = tokio::time::timeout(shared.grace, conn.closed()).await;
            NO_ERROR
        }
        // The client's GOAWAY: it closes once it has the last answers.
        Ended::Away => {
            let _ = tokio::time::timeout(shared.keepalive_timeout, conn.closed()).await;
            NO_ERROR
        }
        Ended::Over => NO_ERROR,
        Ended::Refused(code) => code,
    };
    // With its code, then: the h3 connection closes the QUIC one when
    // dropped (so only now), with H3_NO_ERROR.
    conn.close(code.into(), b"");
    drop(h3);
}

/// A 0-RTT connection's handshake, still going while it serves.
struct Finishing {
    confirmed: Pin<Box<quinn::ZeroRttAccepted>>,
    /// `tls.handshake_timeout_ms` from its start.
    by: Instant,
    _counted: Handshaking,
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

/// HTTP/3's `H3_EXCESSIVE_LOAD`: a client resetting streams faster than
/// it lets them be served.
const EXCESSIVE_LOAD: u32 = 0x107;

/// More streams than this reset before they are served, and more of them
/// than were served, and the connection closes (as HTTP/2's rapid reset
/// guard does, `frontend_h2.rs`).
const MAX_EARLY_RESETS: usize = 32;

/// How a connection's requests ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// Closed by the client, an HTTP/3 error, or idle.
    Over,
    /// The gateway stops: GOAWAY went, and what was in flight is answered.
    Drained,
    /// The client sent GOAWAY, and what was in flight is answered.
    Away,
    /// Closed by the gateway with this code (a handshake not done in
    /// time, a rapid reset).
    Refused(u32),
}

/// The connection's requests, each on this task, until the client closes
/// it, it is idle for `limits.keepalive_timeout_ms` (or has no first
/// request by then), or the gateway stops (GOAWAY; those in flight end).
async fn requests(
    shared: &Shared,
    h3: &mut H3Connection,
    info: &H3Conn,
    mut handshake: Option<Finishing>,
    mut shutdown: ShutdownWatch,
) -> Ended {
    let mut in_flight = FuturesUnordered::new();
    let mut closing = false;
    let mut open = handshake.is_none().then(|| Open::count(&shared.counts));
    let mut resets = Resets::default();
    let idle = tokio::time::sleep(shared.keepalive_timeout);
    tokio::pin!(idle);
    loop {
        let accepted = tokio::select! {
            biased;
            // 0-RTT: until the handshake is done, requests came in early
            // data; not done in time, the connection ends.
            done = finishing(&mut handshake), if handshake.is_some() => {
                if !done {
                    shared.failures.failed("timeout");
                    return Ended::Refused(NO_ERROR);
                }
                // Done, or failed (quinn says which only by the close).
                if info.conn.close_reason().is_some() {
                    shared.failures.failed("error");
                    return Ended::Over;
                }
                handshake = None;
                open = Some(Open::count(&shared.counts));
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
            Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                if resets.rapid(done) {
                    return Ended::Refused(EXCESSIVE_LOAD);
                }
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
            // The client's GOAWAY, its requests answered.
            Ok(None) => {
                while in_flight.next().await.is_some() {}
                return Ended::Away;
            }
            // Closed by the client, or an HTTP/3 error (the h3 crate
            // closed the connection with its code).
            Err(_) => break,
        };
        // After GOAWAY, a stream is refused unprocessed (the client may
        // send it again elsewhere, RFC 9114 §5.2).
        let course = Course {
            early: handshake.is_some(),
            refused: closing,
        };
        in_flight.push(stream(shared, resolver, info, course));
    }
    while in_flight.next().await.is_some() {}
    drop(open);
    Ended::Over
}

/// Streams served, and reset by their client before they were.
#[derive(Default)]
struct Resets {
    served: usize,
    early: usize,
}

impl Resets {
    /// Counts a stream's end; whether the client is resetting streams
    /// faster than it lets them be served (a rapid reset).
    fn rapid(&mut self, done: Served) -> bool {
        match done {
            Served::Reset => self.early += 1,
            Served::Done => self.served += 1,
        }
        let rapid = self.early > MAX_EARLY_RESETS && self.early > self.served;
        if rapid {
            log::warn!(
                "an HTTP/3 client reset {} streams before they were served (rapid reset): closed",
                self.early
            );
        }
        rapid
    }
}

/// What a stream's connection knew of it when it came.
#[derive(Clone, Copy)]
struct Course {
    /// Before the handshake was done (0-RTT).
    early: bool,
    /// After the gateway's GOAWAY: refused, `H3_REQUEST_REJECTED`.
    refused: bool,
}

/// A 0-RTT handshake's end: `true` once done, `false` once its deadline
/// passed first.
async fn finishing(handshake: &mut Option<Finishing>) -> bool {
    let Some(h) = handshake else { return true };
    let by = h.by;
    tokio::time::timeout_at(by, h.confirmed.as_mut())
        .await
        .is_ok()
}

type Resolver = h3::server::RequestResolver<h3_quinn::Connection, bytes::Bytes>;

/// A stream's course: its head read within `limits.header_timeout_ms`,
/// then its request served (or refused, after GOAWAY).
fn stream<'a>(
    shared: &'a Shared,
    resolver: Resolver,
    info: &'a H3Conn,
    course: Course,
) -> Pin<Box<dyn Future<Output = Served> + Send + 'a>> {
    Box::pin(async move {
        let resolved = tokio::time::timeout(shared.header_timeout, resolver.resolve_request());
        match resolved.await {
            Ok(Ok((_, mut stream))) if course.refused => {
                stream.stop_stream(h3::error::Code::H3_REQUEST_REJECTED);
                Served::Done
            }
            Ok(Ok((req, stream))) => {
                serve_stream(&shared.fast, req, stream, info, course.early).await
            }
            // Reset before its head was read, or no head in time.
            _ => Served::Reset,
        }
    })
}

/// Serves one stream, a panic in it caught: it ends that stream only
/// (its client's drop resets it).
async fn serve_stream(
    fast: &crate::proxy::fast::FastPath,
    req: http::Request<()>,
    stream: H3Stream,
    info: &H3Conn,
    early: bool,
) -> Served {
    let served = std::panic::AssertUnwindSafe(fast.serve_h3(req, stream, info, early));
    served.catch_unwind().await.unwrap_or_else(|panic| {
        let what = (panic.downcast_ref::<&str>().copied())
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("?");
        log::error!("an HTTP/3 stream panicked ({what}); the stream was reset");
        Served::Done
    })
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
