//! TLS at the edge (DESIGN §5): the certificates served by SNI
//! ([`store`]), the handshake with its own deadline on the listeners that
//! say `tls`, what each listener is (plain, TLS, redirecting), and the
//! HTTP-01 challenges ACME ([`acme`]) answers through the plain listeners.
//!
//! Pingora's TLS listener has a fixed 60 s handshake deadline and one
//! certificate per listener, so shardgate listens in plain TCP and runs
//! the rustls handshake itself — through Pingora's acceptor, so the stream
//! it gives the proxy is Pingora's own TLS stream (digest, ALPN).

pub mod acme;
pub mod store;

use crate::config::{Config, ListenerTls, TlsConfig};
use crate::metrics::TlsFailures;
use parking_lot::RwLock;
use pingora::listeners::tls::Acceptor;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::Stream;
use rustls::server::ResolvesServerCert;
use rustls::ServerConfig;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use store::{CertStore, OneCert, SniResolver, Source};

/// The edge's TLS state, shared by the listeners, ACME and the admin API.
pub struct Edge {
    pub config: TlsConfig,
    /// The `tls` section's certificates (`None` without the section).
    pub store: Option<Arc<CertStore>>,
    /// HTTP-01: token → key authorization, for the plain listeners.
    challenges: RwLock<HashMap<String, String>>,
    /// In cluster mode, the challenges other nodes published (read from
    /// Redis by the ACME service).
    shared_challenges: RwLock<HashMap<String, String>>,
    /// Whether any challenge is pending (read per request, without a lock).
    pending: AtomicBool,
    /// ACME's view of each host (for `GET /v1/certs`).
    pub acme: acme::Board,
}

impl Edge {
    /// The edge for `config` (certificates not yet read: see
    /// [`CertStore::reload`]).
    pub fn new(config: &Config) -> Self {
        let tls = config.tls.clone().unwrap_or_default();
        let store = config.tls.as_ref().map(|t| {
            let mut dirs = Vec::new();
            if let Some(certs) = &t.certs {
                dirs.push((certs.clone(), Source::File));
            }
            if let Some(acme) = &t.acme {
                dirs.push((acme.storage.join("certs"), Source::Acme));
            }
            Arc::new(CertStore::new(dirs, t.default_cert.clone()))
        });
        Edge {
            config: tls,
            store,
            challenges: RwLock::new(HashMap::new()),
            shared_challenges: RwLock::new(HashMap::new()),
            pending: AtomicBool::new(false),
            acme: acme::Board::default(),
        }
    }

    /// The key authorization for an HTTP-01 `token`, if one is pending.
    pub fn challenge(&self, token: &str) -> Option<String> {
        if let Some(answer) = self.challenges.read().get(token) {
            return Some(answer.clone());
        }
        self.shared_challenges.read().get(token).cloned()
    }

    /// Whether any HTTP-01 challenge is waiting to be answered.
    pub fn challenges_pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    /// Answers `token` with `key_authorization` until withdrawn.
    pub fn publish_challenge(&self, token: &str, key_authorization: String) {
        let mut map = self.challenges.write();
        map.insert(token.to_string(), key_authorization);
        self.pending.store(true, Ordering::Relaxed);
    }

    pub fn withdraw_challenge(&self, token: &str) {
        let mut map = self.challenges.write();
        map.remove(token);
        let others = !self.shared_challenges.read().is_empty();
        self.pending
            .store(others || !map.is_empty(), Ordering::Relaxed);
    }

    /// Replaces the challenges other nodes published (cluster mode).
    pub fn set_shared_challenges(&self, shared: HashMap<String, String>) {
        let map = self.challenges.read();
        let mut others = self.shared_challenges.write();
        self.pending
            .store(!shared.is_empty() || !map.is_empty(), Ordering::Relaxed);
        *others = shared;
    }
}

/// What one listener does with a new connection.
#[derive(Clone)]
pub struct Role {
    /// The TLS handshake to run first.
    pub tls: Option<Arc<Handshake>>,
    /// 308 to `https` (on this port, if not 443) for all but ACME
    /// challenges.
    pub redirect_https: Option<u16>,
    /// Each connection opens with a PROXY header, from a peer in these.
    pub proxy_from: Option<Arc<[crate::config::Cidr]>>,
}

/// The roles of all listeners, found by the address a connection came in on.
pub struct Roles {
    by_addr: Vec<(SocketAddr, Role)>,
    /// Every listener is plain and none redirects: no lookup at all.
    all_plain: bool,
}

impl Roles {
    /// The roles `config`'s listeners take, their handshakes counting
    /// their failures in `failures`; `Err` names a listener whose
    /// certificate cannot be served.
    pub fn new(config: &Config, edge: &Edge, failures: &Arc<TlsFailures>) -> Result<Self, String> {
        let https_port = config
            .listen
            .iter()
            .find(|l| l.tls.is_on())
            .map_or(443, |l| l.addr.port());
        let mut section = None;
        let mut by_addr = Vec::new();
        for l in &config.listen {
            let resolver: Option<Arc<dyn ResolvesServerCert>> = match &l.tls {
                ListenerTls::Off => None,
                ListenerTls::Section => {
                    let store = edge.store.as_ref().ok_or("the `tls` section is missing")?;
                    Some(Arc::new(SniResolver(Arc::clone(store))))
                }
                ListenerTls::Files(cert, key) => {
                    let loaded = store::load_pair(cert, key, Source::File)
                        .map_err(|e| format!("listen {}: {e}", l.addr))?;
                    Some(Arc::new(OneCert(loaded.key)))
                }
            };
            let tls = match resolver {
                None => None,
                Some(resolver) if l.tls == ListenerTls::Section => {
                    Some(Arc::clone(section.get_or_insert(Arc::new(Handshake::new(
                        &edge.config,
                        resolver,
                        failures,
                    )?))))
                }
                Some(resolver) => Some(Arc::new(Handshake::new(&edge.config, resolver, failures)?)),
            };
            let redirect_https = l.redirect_https.then_some(https_port);
            let proxy_from = l.proxy_protocol.as_deref().map(Arc::from);
            by_addr.push((
                l.addr,
                Role {
                    tls,
                    redirect_https,
                    proxy_from,
                },
            ));
        }
        let all_plain = (by_addr.iter())
            .all(|(_, r)| r.tls.is_none() && r.redirect_https.is_none() && r.proxy_from.is_none());
        Ok(Roles { by_addr, all_plain })
    }

    /// The role of the listener `stream` was accepted on: `Ok(None)` when
    /// every listener is plain, `Err` when roles differ and the
    /// connection's listener is not found (it is then dropped, not served
    /// as plain HTTP).
    pub fn of(&self, stream: &Stream) -> Result<Option<&Role>, Unmatched> {
        if self.all_plain {
            return Ok(None);
        }
        let local = stream
            .get_socket_digest()
            .and_then(|d| d.local_addr().and_then(|a| a.as_inet()).copied())
            .ok_or(Unmatched)?;
        let mut found = None;
        for (addr, role) in &self.by_addr {
            if *addr == local {
                return Ok(Some(role));
            }
            if addr.port() == local.port() && addr.ip().is_unspecified() {
                found = Some(role);
            }
        }
        match found {
            Some(role) => Ok(Some(role)),
            None => {
                log::error!("a connection on {local} matches no listener: dropped");
                Err(Unmatched)
            }
        }
    }
}

/// A connection whose listener is not known.
#[derive(Debug)]
pub struct Unmatched;

/// The TLS handshake of a listener: its rustls configuration (ALPN,
/// session tickets, certificates) and deadline.
pub struct Handshake {
    acceptor: Acceptor,
    timeout: Duration,
    failures: Arc<TlsFailures>,
}

impl Handshake {
    fn new(
        tls: &TlsConfig,
        resolver: Arc<dyn ResolvesServerCert>,
        failures: &Arc<TlsFailures>,
    ) -> Result<Self, String> {
        let versions = [&rustls::version::TLS13, &rustls::version::TLS12];
        let config = server_config(&versions, resolver, tls.alpn.clone(), true)?;
        Ok(Handshake {
            acceptor: Acceptor::from_server_config(Arc::new(config)),
            timeout: tls.handshake_timeout,
            failures: Arc::clone(failures),
        })
    }

    /// The client's TLS stream, or `None` (logged and counted) when its
    /// handshake fails or does not finish in time.
    pub async fn accept(&self, stream: Stream) -> Option<Stream> {
        let peer = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().map(|a| a.to_string()))
            .unwrap_or_default();
        let l4 = match stream.into_any().downcast::<L4Stream>() {
            Ok(l4) => *l4,
            Err(_) => {
                log::error!("a TLS listener's connection is not a TCP stream");
                return None;
            }
        };
        match tokio::time::timeout(self.timeout, self.acceptor.tls_handshake(l4)).await {
            Ok(Ok(tls)) => Some(Box::new(tls)),
            Ok(Err(e)) => {
                log::debug!("TLS handshake with {peer} failed: {e}");
                self.failures.failed("error");
                None
            }
            Err(_) => {
                log::debug!("TLS handshake with {peer} timed out");
                self.failures.failed("timeout");
                None
            }
        }
    }
}

/// The rustls configuration of the `quic` listeners (DESIGN §9): the
/// `tls` section's certificates by SNI, as the TCP listeners serve them
/// (reloads and ACME included), TLS 1.3 only (QUIC's), ALPN `h3`, and
/// 0-RTT when `early_data` (quinn wants the largest early data size), on
/// resumption from the session cache then rather than by tickets.
pub fn quic_server_config(edge: &Edge, early_data: bool) -> Result<ServerConfig, String> {
    let store = edge
        .store
        .as_ref()
        .ok_or("quic: the `tls` section is missing")?;
    let resolver = Arc::new(SniResolver(Arc::clone(store)));
    // 0-RTT needs resumption the server keeps state for (a ticket alone
    // could be replayed anywhere): the session cache, no tickets.
    let mut config = server_config(
        &[&rustls::version::TLS13],
        resolver,
        vec![b"h3".to_vec()],
        !early_data,
    )?;
    if early_data {
        config.max_early_data_size = u32::MAX;
    }
    Ok(config)
}

/// A listener's rustls configuration: `versions`, certificates from
/// `resolver`, `alpn` offered, resumption from a session cache and, with
/// `tickets`, by tickets without server state (keys rotated by rustls every
/// 6 h), as nginx does by default.
fn server_config(
    versions: &[&'static rustls::SupportedProtocolVersion],
    resolver: Arc<dyn ResolvesServerCert>,
    alpn: Vec<Vec<u8>>,
    tickets: bool,
) -> Result<ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| format!("tls: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = alpn;
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(20_000);
    if tickets {
        config.ticketer = rustls::crypto::ring::Ticketer::new().map_err(|e| format!("tls: {e}"))?;
    }
    Ok(config)
}

/// Reads the certificate directories again every 2 s: files added,
/// replaced or removed are served without a restart.
pub struct CertWatcher(pub Arc<CertStore>);

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for CertWatcher {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            let store = Arc::clone(&self.0);
            let _ = tokio::task::spawn_blocking(move || store.reload()).await;
        }
    }
}

/// Creates `dir` (and its parents) with owner-only access.
pub(crate) fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}
