//! The response-headers watch. Pingora has no phase that runs while
//! response headers are awaited, so each upstream attempt gets a small task
//! that sleeps until either the headers deadline or the next liveness probe:
//!
//! - deadline passed → the attempt timed out (504, never retried);
//! - a fresh TCP connect to the shard is refused or times out → the shard is
//!   gone (unreachable: failure hook and retry rules);
//! - a probe connects → a slow app: keep waiting.
//!
//! Either verdict ends the attempt by shutting down the upstream socket,
//! which makes Pingora's pending read fail; the proxy then reads the
//! verdict to classify the error. The watch is disarmed as soon as response
//! headers arrive, before the connection can return to the pool. To act on
//! the right socket even if the descriptor number was closed and reused
//! meanwhile, a verdict first duplicates the descriptor, then checks that
//! the duplicate is the connection it watched (same local and peer
//! addresses, which identify a live TCP socket) before shutting it down.
//! Nothing of this costs a system call unless the watch concludes.

use crate::config::LivenessConfig;
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// What the watch concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Still waiting (or disarmed before concluding).
    None,
    /// No response headers before the deadline.
    TimedOut,
    /// A liveness probe could not connect.
    Unreachable,
}

const WAITING: u8 = 0;
const DISARMED: u8 = 1;
const TIMED_OUT: u8 = 2;
const UNREACHABLE: u8 = 3;

struct Shared {
    state: AtomicU8,
    /// Milliseconds after `start` of the last request-body progress: the
    /// deadline counts from there, so a slow upload is not a slow shard.
    last_activity_ms: AtomicU64,
    start: Instant,
}

/// One attempt's watch; dropping it disarms it.
pub struct Watch {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
    socket: Socket,
}

/// What the watch needs to know.
#[derive(Clone, Copy, Debug)]
pub struct WatchSettings {
    pub headers_timeout: Duration,
    /// Longest silence of a shard once its head came.
    pub read_timeout: Duration,
    pub liveness: Option<LivenessConfig>,
}

impl Watch {
    /// Starts watching the upstream connection `fd` from `local` to `addr`
    /// (the shard; also what liveness probes dial).
    pub fn start(
        fd: RawFd,
        local: SocketAddr,
        addr: SocketAddr,
        settings: WatchSettings,
    ) -> Option<Watch> {
        if fd < 0 {
            return None;
        }
        let shared = Arc::new(Shared {
            state: AtomicU8::new(WAITING),
            last_activity_ms: AtomicU64::new(0),
            start: Instant::now(),
        });
        let socket = Socket {
            fd,
            local,
            peer: addr,
        };
        let task = tokio::spawn(watch(Arc::clone(&shared), socket, settings));
        Some(Watch {
            shared,
            task,
            socket,
        })
    }

    /// The response head came: this watch is disarmed (its verdict if it
    /// had concluded), and the body's reads are watched on the same socket:
    /// a shard silent for `read_timeout` (no [`Watch::touch`] meanwhile)
    /// is cut, with the verdict `TimedOut`. It must be dropped before the
    /// connection can go back to the pool.
    pub fn body(self, read_timeout: Duration) -> (Verdict, Option<Watch>) {
        let verdict = self.disarm();
        if verdict != Verdict::None {
            return (verdict, None);
        }
        let shared = Arc::new(Shared {
            state: AtomicU8::new(WAITING),
            last_activity_ms: AtomicU64::new(0),
            start: Instant::now(),
        });
        let task = tokio::spawn(watch_reads(Arc::clone(&shared), self.socket, read_timeout));
        let socket = self.socket;
        (
            Verdict::None,
            Some(Watch {
                shared,
                task,
                socket,
            }),
        )
    }

    /// Bytes moved (request-body bytes went out, or response-body bytes
    /// came in): the deadline restarts from now.
    pub fn touch(&self) {
        let ms = self.shared.start.elapsed().as_millis() as u64;
        self.shared.last_activity_ms.store(ms, Ordering::Relaxed);
    }

    /// Response headers arrived: stop watching. Returns the verdict if the
    /// watch had already concluded (the headers lost the race).
    pub fn disarm(&self) -> Verdict {
        match self.shared.state.compare_exchange(
            WAITING,
            DISARMED,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                self.task.abort();
                Verdict::None
            }
            Err(state) => verdict_of(state),
        }
    }

    /// The verdict so far.
    pub fn verdict(&self) -> Verdict {
        verdict_of(self.shared.state.load(Ordering::Acquire))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.disarm();
    }
}

fn verdict_of(state: u8) -> Verdict {
    match state {
        TIMED_OUT => Verdict::TimedOut,
        UNREACHABLE => Verdict::Unreachable,
        _ => Verdict::None,
    }
}

/// The watched connection: its descriptor number and its addresses.
#[derive(Clone, Copy)]
struct Socket {
    fd: RawFd,
    local: SocketAddr,
    peer: SocketAddr,
}

impl Socket {
    /// Shuts the connection down if `fd` still is it.
    fn shutdown(&self) {
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) only reads the descriptor number;
        // on a closed number it fails with EBADF, which we handle.
        let dup = unsafe { libc::fcntl(self.fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return;
        }
        // SAFETY: `dup` is a descriptor we just created and own alone.
        let stream = std::net::TcpStream::from(unsafe { OwnedFd::from_raw_fd(dup) });
        let same = stream.local_addr().ok() == Some(self.local)
            && stream.peer_addr().ok() == Some(self.peer);
        if same {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Concludes (if still waiting) and cuts the connection.
fn conclude(shared: &Shared, socket: &Socket, verdict: u8) {
    if shared
        .state
        .compare_exchange(WAITING, verdict, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        socket.shutdown();
    }
}

async fn watch(shared: Arc<Shared>, socket: Socket, settings: WatchSettings) {
    let mut waiting = Waiting::new(settings, shared.start);
    let mut seen_activity = 0;
    loop {
        let activity = Duration::from_millis(shared.last_activity_ms.load(Ordering::Relaxed));
        let deadline = shared.start + activity + settings.headers_timeout;
        tokio::time::sleep_until(waiting.wake(deadline)).await;
        if shared.state.load(Ordering::Acquire) != WAITING {
            return;
        }
        let activity_ms = shared.last_activity_ms.load(Ordering::Relaxed);
        if activity_ms != seen_activity {
            seen_activity = activity_ms;
            waiting.progressed(shared.start + Duration::from_millis(activity_ms));
        }
        let deadline = shared.start + Duration::from_millis(activity_ms) + settings.headers_timeout;
        match waiting.look(deadline, socket.peer).await {
            Verdict::None => {}
            Verdict::TimedOut => return conclude(&shared, &socket, TIMED_OUT),
            Verdict::Unreachable => return conclude(&shared, &socket, UNREACHABLE),
        }
    }
}

/// Watches a response body's reads: cut once `read_timeout` passed since
/// the last touch.
async fn watch_reads(shared: Arc<Shared>, socket: Socket, read_timeout: Duration) {
    let mut postponed = None;
    loop {
        let activity = Duration::from_millis(shared.last_activity_ms.load(Ordering::Relaxed));
        let deadline =
            (shared.start + activity + read_timeout).max(postponed.unwrap_or(shared.start));
        if Instant::now() >= deadline {
            // Bytes the shard sent wait unread: the gateway is the one not
            // reading (its client stopped taking the response), and a slow
            // client is the send timeout's, not the shard's.
            if !quiet(socket.fd) {
                postponed = Some(Instant::now() + read_timeout);
                continue;
            }
            return conclude(&shared, &socket, TIMED_OUT);
        }
        tokio::time::sleep_until(deadline).await;
        if shared.state.load(Ordering::Acquire) != WAITING {
            return;
        }
    }
}

/// The rule both transports wait for response headers by: look at the
/// headers deadline and at each liveness probe's time, whichever comes
/// first; past the deadline the attempt timed out, a probe that cannot
/// connect means the shard is gone, one that connects means a slow app.
pub struct Waiting {
    settings: WatchSettings,
    next_probe: Option<Instant>,
}

impl Waiting {
    /// Waiting since `start` (the request was sent).
    pub fn new(settings: WatchSettings, start: Instant) -> Self {
        Waiting {
            next_probe: settings.liveness.map(|l| start + l.after),
            settings,
        }
    }

    /// The request moved (body bytes went to the shard at `now`): a shard
    /// taking a body is alive, so the next liveness probe waits a full
    /// interval. (Bytes a vanished host no longer takes stop moving once
    /// the socket's send buffer is full, and the probes resume.)
    pub fn progressed(&mut self, now: Instant) {
        if let Some(liveness) = self.settings.liveness {
            self.next_probe = Some(now + liveness.after);
        }
    }

    /// When to look next, given the headers deadline.
    pub fn wake(&self, deadline: Instant) -> Instant {
        match self.next_probe {
            Some(p) if p < deadline => p,
            _ => deadline,
        }
    }

    /// A look at the time [`Waiting::wake`] named: the verdict, or
    /// `Verdict::None` to keep waiting.
    pub async fn look(&mut self, deadline: Instant, shard: SocketAddr) -> Verdict {
        let now = Instant::now();
        if now >= deadline {
            return Verdict::TimedOut;
        }
        if let (Some(probe_at), Some(liveness)) = (self.next_probe, self.settings.liveness) {
            if now >= probe_at {
                if !probe(shard, liveness.probe_timeout).await {
                    return Verdict::Unreachable;
                }
                self.next_probe = Some(Instant::now() + liveness.after);
            }
        }
        Verdict::None
    }
}

/// A fresh TCP connect: does the shard's host still accept connections?
pub async fn probe(addr: SocketAddr, timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

/// Whether the connected socket `fd` has neither been closed nor sent
/// anything: a non-blocking one-byte peek finds nothing. A real system
/// call: tokio's `try_read` answers "would block" without one whenever
/// the reactor has not yet seen the socket become readable, which is the
/// very case to catch (bytes or a close that just arrived).
pub fn quiet(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: a one-byte peek into a local; on a closed descriptor recv
    // fails (EBADF), which reads as "not quiet".
    let n = unsafe {
        libc::recv(
            fd,
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
}
