//! HTTP/3 to clients (DESIGN §9): the `quic` listeners, a quinn endpoint
//! each on its UDP socket, with the `tls` section's certificates (the
//! same store, SNI choice, reloads and ACME as the TCP listeners), each
//! request stream served by the fast transport through the same pipeline
//! as HTTP/1 and HTTP/2 (`fast/h3.rs`). QUIC stays behind this module and
//! that one: the pipeline knows nothing of it.
//!
//! Bounded by design (`docs/http3.md` states the figures):
//! - a handshake has `tls.handshake_timeout_ms`; more than
//!   [`RETRY_ABOVE`] handshakes at once and a new client must first prove
//!   its address (a Retry), so a flood of spoofed Initials costs a
//!   stateless answer each; amplification stays within RFC 9000's 3×
//!   (quinn's accounting);
//! - at most `quic.max_connections` connections, `quic.max_streams`
//!   requests in flight on each, and the windows below in flight per
//!   connection and per stream;
//! - a connection with nothing in flight for `limits.keepalive_timeout_ms`
//!   closes (QUIC's idle timeout is the same);
//! - a stream its client reset before it was served reaches no shard.

mod conn;
mod handover;

use super::fast::FastPath;
use crate::control::Control;
use crate::metrics::{QuicCounts, TlsFailures};
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::Service;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Handshakes in progress on one endpoint above which a client whose
/// address is not validated is sent a Retry first.
pub const RETRY_ABOVE: usize = 64;

/// Bytes of one stream's request body in flight (its receive window).
const STREAM_WINDOW: u32 = 256 * 1024;

/// Bytes of request bodies in flight on one connection.
const CONNECTION_WINDOW: u32 = 1024 * 1024;

/// Bytes sent and not yet acknowledged on one connection, at most.
const SEND_WINDOW: u64 = 4 * 1024 * 1024;

/// Unidirectional streams a client may open: HTTP/3's control stream and
/// QPACK's two, and room for reserved (grease) ones.
const UNI_STREAMS: u32 = 8;

/// Connections not yet accepted that quinn keeps, per endpoint.
const MAX_INCOMING: usize = 4096;

/// How long a stopping endpoint waits for its connections' last packets.
const CLOSE_WAIT: Duration = Duration::from_millis(500);

/// What every connection of the `quic` listeners shares.
pub(crate) struct Shared {
    fast: Arc<FastPath>,
    handshake_timeout: Duration,
    header_timeout: Duration,
    keepalive_timeout: Duration,
    max_header_bytes: usize,
    early_data: bool,
    /// `server.grace_period_seconds`: what is in flight has this long.
    grace: Duration,
    failures: Arc<TlsFailures>,
    counts: Arc<QuicCounts>,
}

/// The `quic` listeners' service.
pub struct QuicService {
    shared: Arc<Shared>,
    server: quinn::ServerConfig,
    addrs: Vec<SocketAddr>,
    max_connections: usize,
}

impl QuicService {
    /// The `quic` listeners of `control`'s configuration, served by
    /// `fast`; `None` without any; `Err` if the certificates cannot be
    /// served over QUIC.
    pub fn new(control: &Control, fast: Arc<FastPath>) -> Result<Option<Self>, String> {
        let config = &control.config;
        let Some(quic) = &config.quic else {
            return Ok(None);
        };
        let tls = crate::tls::quic_server_config(&control.edge, quic.early_data)?;
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
            .map_err(|e| format!("quic: {e}"))?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        let mut transport = quinn::TransportConfig::default();
        let keepalive = config.limits.keepalive_timeout;
        transport
            .max_concurrent_bidi_streams(quic.max_streams.into())
            .max_concurrent_uni_streams(UNI_STREAMS.into())
            .max_idle_timeout(quinn::IdleTimeout::try_from(keepalive).ok())
            .stream_receive_window(STREAM_WINDOW.into())
            .receive_window(CONNECTION_WINDOW.into())
            .send_window(SEND_WINDOW)
            // No QUIC datagrams (HTTP/3 datagrams are not offered): none
            // is buffered for a reader that never comes.
            .datagram_receive_buffer_size(None)
            .datagram_send_buffer_size(0);
        server
            .transport_config(Arc::new(transport))
            .max_incoming(MAX_INCOMING);
        let handshake_timeout = config
            .tls
            .as_ref()
            .map_or(Duration::from_secs(10), |t| t.handshake_timeout);
        let shared = Shared {
            fast,
            handshake_timeout,
            header_timeout: config.limits.header_timeout,
            keepalive_timeout: keepalive,
            max_header_bytes: config.limits.max_header_bytes,
            early_data: quic.early_data,
            grace: Duration::from_secs(config.server.grace_period_seconds),
            failures: Arc::clone(&control.metrics.tls_failures),
            counts: Arc::clone(&control.metrics.quic),
        };
        Ok(Some(QuicService {
            shared: Arc::new(shared),
            server,
            addrs: quic.listeners.clone(),
            max_connections: quic.max_connections,
        }))
    }
}

#[async_trait::async_trait]
impl Service for QuicService {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        _listeners_per_fd: usize,
    ) {
        let mut loops = Vec::new();
        for addr in &self.addrs {
            let endpoint = match endpoint(*addr, fds.as_ref(), &self.server).await {
                Ok(endpoint) => endpoint,
                Err(e) => {
                    // A gateway that cannot listen must not seem to run.
                    log::error!("quic: cannot listen on udp {addr}: {e}; exiting");
                    std::process::exit(1);
                }
            };
            let accepting = Accepting {
                endpoint,
                shared: Arc::clone(&self.shared),
                max_connections: self.max_connections,
                handshaking: Arc::new(AtomicUsize::new(0)),
            };
            loops.push(pingora_runtime::current_handle().spawn(accepting.run(shutdown.clone())));
        }
        futures_util::future::join_all(loops).await;
    }

    fn name(&self) -> &str {
        "shardgate quic"
    }

    /// Keeps the UDP sockets a graceful upgrade handed over, and their
    /// channels to the process before (`handover.rs`).
    fn listen_addresses(&self) -> Option<Vec<String>> {
        let keys = self.addrs.iter().map(key);
        Some(keys.flat_map(|k| [handover::channel_key(&k), k]).collect())
    }
}

/// A UDP socket's name in the table a graceful upgrade hands over (the
/// TCP listeners' are their addresses).
fn key(addr: &SocketAddr) -> String {
    format!("udp://{addr}")
}

/// The endpoint on `addr`: its socket the one in the upgrade's table,
/// else a new one, put in the table for the next upgrade; with the
/// channel to the process before or after this one (`handover.rs`).
async fn endpoint(
    addr: SocketAddr,
    fds: Option<&ListenFds>,
    server: &quinn::ServerConfig,
) -> std::io::Result<quinn::Endpoint> {
    let key = key(&addr);
    let handed = fds.and_then(|fds| fds.lock().get(&key).copied());
    let socket = match handed {
        // SAFETY: the table holds listening sockets, each claimed by the
        // one service listening on its address.
        Some(fd) => unsafe { std::net::UdpSocket::from_raw_fd(fd) },
        None => {
            let socket = std::net::UdpSocket::bind(addr)?;
            if let Some(fds) = fds {
                fds.lock().add(key.clone(), socket.as_raw_fd());
            }
            socket
        }
    };
    let handover = Arc::new(handover::Handover::new(&key, fds).await?);
    let mut config = quinn::EndpointConfig::default();
    let (me, predecessor) = (handover.me, handover.predecessor());
    config.cid_generator(move || Box::new(handover::Issuer { me, predecessor }));
    let runtime = Arc::new(quinn::TokioRuntime);
    let udp = quinn::Runtime::wrap_udp_socket(runtime.as_ref(), socket)?;
    // GSO and GRO, where the kernel has them (quinn-udp finds out).
    log::info!(
        "quic: HTTP/3 on udp {addr} (datagrams per send: {}, per receive: {})",
        udp.max_transmit_segments(),
        udp.max_receive_segments()
    );
    let routed = Arc::new(handover::Routed::new(udp, handover));
    quinn::Endpoint::new_with_abstract_socket(config, Some(server.clone()), routed, runtime)
}

/// One endpoint's accept loop.
struct Accepting {
    endpoint: quinn::Endpoint,
    shared: Arc<Shared>,
    max_connections: usize,
    /// Handshakes in progress.
    handshaking: Arc<AtomicUsize>,
}

impl Accepting {
    async fn run(self, mut shutdown: ShutdownWatch) {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let incoming = tokio::select! {
                incoming = self.endpoint.accept() => incoming,
                changed = shutdown.changed() => match changed {
                    Ok(()) if !*shutdown.borrow() => continue,
                    _ => break,
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            };
            let Some(incoming) = incoming else { break };
            let counts = &self.shared.counts;
            if self.endpoint.open_connections() >= self.max_connections {
                counts.refused.fetch_add(1, Ordering::Relaxed);
                incoming.refuse();
                continue;
            }
            let handshaking = self.handshaking.load(Ordering::Relaxed);
            if handshaking >= RETRY_ABOVE && !incoming.remote_address_validated() {
                // The client proves its address first: a flood of spoofed
                // Initials costs a stateless Retry each.
                if incoming.may_retry() {
                    counts.retries.fetch_add(1, Ordering::Relaxed);
                    let _ = incoming.retry();
                    continue;
                }
            }
            let shared = Arc::clone(&self.shared);
            let guard = Handshaking::start(&self.handshaking);
            let port = self.endpoint.local_addr().map_or(0, |a| a.port());
            let connection = conn::serve(shared, incoming, guard, port, shutdown.clone());
            connections.spawn_on(connection, &pingora_runtime::current_handle());
        }
        // No new connection; those open get GOAWAY (their watch) and end
        // once their requests are answered, or are closed when the grace
        // period ends (Pingora then stops the runtime, which would drop
        // them without a word: their clients would wait for the idle
        // timeout).
        self.endpoint.set_server_config(None);
        let drained = async { while connections.join_next().await.is_some() {} };
        let _ = tokio::time::timeout(self.shared.grace.saturating_sub(CLOSE_WAIT), drained).await;
        self.endpoint.close(conn::NO_ERROR.into(), b"");
        let _ = tokio::time::timeout(CLOSE_WAIT, self.endpoint.wait_idle()).await;
    }
}

/// One handshake in progress, counted until dropped.
pub(crate) struct Handshaking(Arc<AtomicUsize>);

impl Handshaking {
    fn start(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Handshaking(Arc::clone(count))
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
