//! The client listeners' accept loop, in place of Pingora's listening
//! service when the fast transport serves (as the binary's does).
//!
//! Pingora spawns each accepted connection as a task whose future holds,
//! for the connection's whole life, the room of a TLS handshake it never
//! runs here (TLS listeners are plain TCP to Pingora: the front end runs
//! the handshake): 8.8 KiB per connection, silent or not, measured with
//! heaptrack — most of what a silent socket cost. Here a connection's
//! task holds the front end's boxed future and little else.
//!
//! The rest is as Pingora's: the listening socket is taken from the table
//! a graceful upgrade hands over (or bound and put in it, under the
//! address as configured), `SO_REUSEADDR`, a backlog of 65 535,
//! `TCP_NODELAY` and TCP keep-alive on each accepted socket, the peer's
//! address in the socket digest, `listeners_per_fd` accept loops per
//! socket, each connection spawned on a thread Pingora's runtime picks
//! (with `work_stealing: false`, a random one of the service's threads),
//! and accepting stops when shutdown starts. Where it differs: a socket
//! option that cannot be set is logged, not a reason to drop the
//! connection; a listener that cannot bind stops the process when it is
//! `required` (Pingora's panic is caught by its task, and the process ran
//! on without the listener), else it is logged and the others serve.

use pingora::apps::ServerApp;
use pingora::protocols::l4::ext::TcpKeepalive;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::{GetSocketDigest, SocketDigest};
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::Service;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket};

/// Pingora's backlog for its listeners.
const BACKLOG: u32 = 65_535;

/// Places of a bounded listener kept for clients on a loopback address.
pub const LOOPBACK_RESERVE: usize = 16;

/// How long the accept loop rests when the process is out of file
/// descriptors (accept would fail again at once).
const OUT_OF_FDS_PAUSE: Duration = Duration::from_millis(100);

/// A listening service running `app` on each of `addrs`.
pub struct Listening<A> {
    name: String,
    app: Option<A>,
    addrs: Vec<SocketAddr>,
    keepalive: TcpKeepalive,
    /// Connections open at once, at most (the others are closed as soon
    /// as accepted); `None`: no bound of the listener's own.
    cap: Option<usize>,
    /// A listener that cannot bind stops the process.
    required: bool,
}

impl<A> Listening<A> {
    /// `app` on `addrs`, each accepted socket with TCP keep-alive
    /// `keepalive`.
    pub fn new(name: &str, app: A, addrs: Vec<SocketAddr>, keepalive: TcpKeepalive) -> Self {
        Listening {
            name: name.to_string(),
            app: Some(app),
            addrs,
            keepalive,
            cap: None,
            required: true,
        }
    }

    /// At most `cap` connections open at once: the next ones are closed as
    /// soon as they are accepted. The last [`LOOPBACK_RESERVE`] places are
    /// kept for clients on a loopback address (a local probe or operator
    /// still gets in when others hold the rest).
    pub fn with_cap(mut self, cap: usize) -> Self {
        self.cap = Some(cap);
        self
    }

    /// A listener that cannot bind is logged and left out; the others
    /// serve (the admin API's: the gateway must not stop for it, e.g. in
    /// an upgrade whose new admin address is still taken).
    pub fn optional(mut self) -> Self {
        self.required = false;
        self
    }
}

#[async_trait::async_trait]
impl<A: ServerApp + Send + Sync + 'static> Service for Listening<A> {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
    ) {
        let Some(app) = self.app.take() else {
            log::error!("{}: started twice", self.name);
            return;
        };
        let app = Arc::new(app);
        let open = Arc::new(Open {
            count: AtomicUsize::new(0),
            cap: self.cap.unwrap_or(usize::MAX),
            warned: Default::default(),
        });
        let mut loops = Vec::new();
        for addr in &self.addrs {
            let listener = match listen(*addr, fds.as_ref()).await {
                Ok(listener) => Arc::new(listener),
                Err(e) if self.required => {
                    // A gateway that cannot listen must not seem to run.
                    log::error!("{}: cannot listen on {addr}: {e}; exiting", self.name);
                    std::process::exit(1);
                }
                Err(e) => {
                    log::error!("{}: cannot listen on {addr}: {e}", self.name);
                    continue;
                }
            };
            for _ in 0..listeners_per_fd.max(1) {
                let accepting = Accepting {
                    listener: Arc::clone(&listener),
                    app: Arc::clone(&app),
                    keepalive: self.keepalive.clone(),
                    open: Arc::clone(&open),
                    name: self.name.clone(),
                };
                loops
                    .push(pingora_runtime::current_handle().spawn(accepting.run(shutdown.clone())));
            }
        }
        futures_util::future::join_all(loops).await;
        app.cleanup().await;
    }

    fn name(&self) -> &str {
        &self.name
    }

    /// Keeps the sockets a graceful upgrade handed over for these
    /// addresses (Pingora closes the ones no service claims).
    fn listen_addresses(&self) -> Option<Vec<String>> {
        Some(self.addrs.iter().map(|a| a.to_string()).collect())
    }
}

/// The listening socket for `addr`: the one in the upgrade's table under
/// that address, else a new one, put in the table for the next upgrade.
async fn listen(addr: SocketAddr, fds: Option<&ListenFds>) -> std::io::Result<TcpListener> {
    let key = addr.to_string();
    let Some(fds) = fds else {
        return bind(addr).await;
    };
    let handed = fds.lock().get(&key).copied();
    if let Some(fd) = handed {
        // SAFETY: the table holds listening sockets, each claimed by the
        // one service listening on its address.
        let socket = TcpSocket::from_std_stream(unsafe { std::net::TcpStream::from_raw_fd(fd) });
        return socket.listen(BACKLOG);
    }
    let listener = bind(addr).await?;
    fds.lock().add(key, listener.as_raw_fd());
    Ok(listener)
}

/// A new listening socket on `addr`, retried for 30 s while the address
/// is in use (a previous process may still hold it), as Pingora does.
async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let mut tries = 0;
    loop {
        let socket = match addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(addr) {
            Ok(()) => return socket.listen(BACKLOG),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 30 => {
                tries += 1;
                log::warn!("{addr} is in use, will try again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// One accept loop on a listening socket.
struct Accepting<A> {
    listener: Arc<TcpListener>,
    app: Arc<A>,
    keepalive: TcpKeepalive,
    open: Arc<Open>,
    name: String,
}

/// The connections a service has open, and its bound.
struct Open {
    count: AtomicUsize,
    cap: usize,
    /// The second (since the epoch) of the last warning of the bound.
    warned: std::sync::atomic::AtomicU64,
}

/// One open connection, counted until dropped.
struct Counted(Arc<Open>);

impl Open {
    /// Counts one more connection, unless the bound is reached (for a
    /// client on a loopback address, the bound with its reserve).
    fn admit(this: &Arc<Open>, loopback: bool) -> Option<Counted> {
        let bound = match loopback {
            true => this.cap,
            false => this.cap.saturating_sub(LOOPBACK_RESERVE),
        };
        let admitted = this
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < bound).then_some(n + 1)
            })
            .is_ok();
        admitted.then(|| Counted(Arc::clone(this)))
    }

    /// Whether to warn of the bound now: once a second at most.
    fn warn_now(&self) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.warned.swap(now, Ordering::Relaxed) != now
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<A: ServerApp + Send + Sync + 'static> Accepting<A> {
    async fn run(self, mut shutdown: ShutdownWatch) {
        loop {
            let accepted = tokio::select! {
                accepted = self.listener.accept() => accepted,
                changed = shutdown.changed() => match changed {
                    Ok(()) if !*shutdown.borrow() => continue,
                    _ => return,
                },
            };
            match accepted {
                Ok((socket, peer)) => {
                    let Some(counted) = Open::admit(&self.open, peer.ip().is_loopback()) else {
                        if self.open.warn_now() {
                            log::warn!(
                                "{}: {} connections open, the most allowed: new ones are \
                                 closed ({peer} the latest)",
                                self.name,
                                self.open.cap
                            );
                        }
                        continue;
                    };
                    let stream = self.stream(socket, peer);
                    let app = Arc::clone(&self.app);
                    let connection = serve(app, stream, shutdown.clone(), counted);
                    pingora_runtime::current_handle().spawn(connection);
                }
                Err(e) => {
                    if self.open.warn_now() {
                        log::error!("{}: accept() failed: {e}", self.name);
                    }
                    // EMFILE, ENFILE: fails again at once until one closes.
                    if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) {
                        tokio::time::sleep(OUT_OF_FDS_PAUSE).await;
                    }
                }
            }
        }
    }

    /// An accepted socket as Pingora's unbuffered stream: no read buffer
    /// (the front end reads into buffers of its own), no write buffer (the
    /// fast transport writes each answer whole).
    fn stream(
        &self,
        socket: tokio::net::TcpStream,
        peer: SocketAddr,
    ) -> pingora::protocols::Stream {
        let mut stream = L4Stream::from(socket);
        if let Err(e) = stream.set_nodelay() {
            log::debug!("TCP_NODELAY on a client socket: {e}");
        }
        // A client that vanished from an idle connection frees its slot.
        if let Err(e) = stream.set_keepalive(&self.keepalive) {
            log::debug!("TCP keep-alive on a client socket: {e}");
        }
        let digest = SocketDigest::from_raw_fd(stream.as_raw_fd());
        let _ = digest.peer_addr.set(Some(peer.into()));
        stream.set_socket_digest(digest);
        Box::new(stream)
    }
}

/// A connection's life: its requests, as long as the front end hands the
/// connection back.
async fn serve<A: ServerApp>(
    app: Arc<A>,
    stream: pingora::protocols::Stream,
    shutdown: ShutdownWatch,
    counted: Counted,
) {
    let mut next = Some(stream);
    while let Some(stream) = next {
        next = app.process_new(stream, &shutdown).await;
    }
    drop(counted);
}

#[cfg(test)]
mod tests {
    use super::{Open, LOOPBACK_RESERVE};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_bounded_listener_keeps_its_last_places_for_loopback_clients() {
        let open = Arc::new(Open {
            count: AtomicUsize::new(0),
            cap: 20,
            warned: Default::default(),
        });
        let remote: Vec<_> = std::iter::from_fn(|| Open::admit(&open, false)).collect();
        assert_eq!(remote.len(), 20 - LOOPBACK_RESERVE);
        let local: Vec<_> = std::iter::from_fn(|| Open::admit(&open, true)).collect();
        assert_eq!(local.len(), LOOPBACK_RESERVE);
        assert!(Open::admit(&open, true).is_none());
        // Connections that end give their places back.
        drop(remote);
        assert_eq!(open.count.load(Ordering::Acquire), LOOPBACK_RESERVE);
        assert!(Open::admit(&open, true).is_some());
        // Remote clients count against the bound less the reserve, which
        // loopback clients may fill: while they hold it, none gets in.
        assert!(Open::admit(&open, false).is_none());
        drop(local);
        assert!(Open::admit(&open, false).is_some());
    }
}
