//! HTTP/2 connections at the front end: Pingora's handshake and stream
//! checks under shardgate's deadlines, each stream served on the
//! connection's own task by the fast transport (or by Pingora's proxy
//! when it is off).

use super::ctx::RequestCtx;
use super::fast::h2::Served;
use super::fast::FastPath;
use super::frontend::{peer, Frontend};
use super::hooks::RequestLine;
use super::watched::{Alarm, Watched};
use futures_util::future::Either;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use pingora::apps::HttpServerApp;
use pingora::protocols::http::v2::server::H2Accept;
use pingora::protocols::http::v2::server::HttpSession as H2Session;
use pingora::protocols::Digest;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

/// The streams in flight on an HTTP/2 connection, and a wake-up when the
/// last one ends (its idle timeout starts then).
#[derive(Default)]
struct InFlight {
    count: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// One stream in flight, until dropped (also by a panic).
struct Started(Arc<InFlight>);

impl InFlight {
    fn start(this: &Arc<InFlight>) -> Started {
        this.count.fetch_add(1, Ordering::AcqRel);
        Started(Arc::clone(this))
    }

    /// Ends once nothing is in flight and then `first_at` came (no first
    /// stream yet), or `idle_timeout` passed.
    async fn idle_until(&self, first_at: Option<Instant>, idle_timeout: Option<Duration>) {
        while self.count.load(Ordering::Acquire) != 0 {
            self.idle.notified().await;
        }
        match first_at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => tokio::time::sleep(idle_timeout.unwrap_or_default()).await,
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_one();
        }
    }
}

/// What the connection's digest says of `stream` (shared by its streams).
fn digest_of(stream: &Stream) -> Arc<Digest> {
    Arc::new(Digest {
        ssl_digest: stream.get_ssl_digest(),
        timing_digest: stream.get_timing_digest(),
        proxy_digest: stream.get_proxy_digest(),
        socket_digest: stream.get_socket_digest(),
    })
}

/// Serves a stream on the fast transport, counted in flight until done.
/// Its future is boxed when taken, so a stream in flight holds only what
/// it uses.
async fn serve_stream(fast: &FastPath, session: Box<H2Session>, started: Started) -> Served {
    let begun = std::time::Instant::now();
    let served = Box::pin(fast.serve_h2(session)).await;
    drop(started);
    match served {
        // Served a while before its reset: not what the guard counts.
        Served::Reset if begun.elapsed() >= PREMATURE => Served::Done,
        served => served,
    }
}

/// Serves a stream on Pingora's proxy (the fast transport off), counted in
/// flight until done. (Pingora's session does not tell whether its client
/// reset it: only resets found at accept count there.)
async fn serve_stream_on_pingora<A: HttpServerApp + Send + Sync + 'static>(
    app: Arc<A>,
    session: Box<H2Session>,
    shutdown: ShutdownWatch,
    started: Started,
) -> Served {
    let session = pingora::protocols::http::ServerSession::new_http2(*session);
    Box::pin(app.process_new_http(session, &shutdown)).await;
    drop(started);
    Served::Done
}

/// A client that sends more malformed streams than this on one HTTP/2
/// connection loses it (Pingora's own budget).
const MAX_MALFORMED_H2_STREAMS: usize = 32;

/// A client that resets more streams than this before they are served
/// (found reset when accepted), and more streams than it let be (or is
/// letting be) served, gets GOAWAY (`ENHANCE_YOUR_CALM`): a rapid reset.
/// The h2 crate's own limit on reset streams awaiting accept (20) holds
/// only while accepting lags behind.
const MAX_EARLY_RESETS: usize = 32;

/// A stream its client resets while it is served (the shard already
/// asked) counts as a reset when it lived less than this (Envoy's
/// `premature_reset_min_stream_lifetime_seconds`): a gRPC call cancelled
/// at its deadline behind a slow shard is not an attack.
const PREMATURE: Duration = Duration::from_secs(1);

/// Resets while served trip the guard only once the connection has had
/// this many streams (Envoy's `premature_reset_total_stream_count`):
/// browsers cancel in bursts, and a served stream has spent its token.
const RESET_SAMPLE: usize = 500;

/// The client's resets on one HTTP/2 connection, against its streams.
#[derive(Default)]
struct Resets {
    /// Streams accepted and handed to a transport.
    accepted: usize,
    /// Streams found reset when accepted (never served).
    early: usize,
    /// Streams reset by the client while served, within [`PREMATURE`]
    /// (also in `accepted`).
    late: usize,
}

impl Resets {
    /// Counts a stream its client reset, before it was served or while;
    /// whether the connection has now seen a rapid reset.
    fn reset(&mut self, served: bool) -> bool {
        match served {
            true => self.late += 1,
            false => self.early += 1,
        }
        let kept = self.accepted - self.late;
        let enough = self.early > MAX_EARLY_RESETS || self.accepted + self.early >= RESET_SAMPLE;
        enough && self.early + self.late > kept
    }
}

impl<A> Frontend<A>
where
    A: HttpServerApp + Send + Sync + 'static,
{
    /// An HTTP/2 connection, as Pingora's accept loop serves it (its
    /// handshake options, idle timeout, graceful shutdown and stream
    /// checks), each stream on the fast transport, or on Pingora's proxy
    /// when `fast` is `None`. `read`: what was read of the connection
    /// already (a plain connection's preface, read as an HTTP/1 head).
    ///
    /// A new connection has `limits.keepalive_timeout_ms` for its preface
    /// and its first request, as an HTTP/1 connection has for its first
    /// head: a client that completes TLS and then stays silent (or sends
    /// only a preface, settings and pings) holds a socket no longer than
    /// an idle one.
    ///
    /// Streams run on this connection's own task, not a task each as
    /// Pingora spawns them: a stream's response and the connection's next
    /// flush are then one wake-up, and no stream pays a spawn (about 14 %
    /// less CPU per request, `benches/load/README.md`). They run side by
    /// side, but one connection's streams share one core, as they do in
    /// nginx and HAProxy.
    pub(super) async fn serve_h2(
        self: &Arc<Self>,
        fast: Option<&FastPath>,
        stream: Stream,
        read: &[u8],
        shutdown: &ShutdownWatch,
    ) {
        let digest = digest_of(&stream);
        let first_by = Instant::now() + self.limits.keepalive_timeout;
        let Some((mut conn, alarm)) = self.handshake_h2(stream, read, first_by).await else {
            return;
        };
        let idle_timeout = self.inner.server_options().and_then(|o| o.h2_idle_timeout);
        let active = Arc::new(InFlight::default());
        let mut watch = shutdown.clone();
        let mut closing = false;
        let mut malformed = 0;
        let mut resets = Resets::default();
        // The streams in flight, driven by this task. A panic in one ends
        // that stream only, as it would in its own task (one inside the h2
        // crate, holding its lock, ends the connection either way).
        let mut local = FuturesUnordered::new();
        loop {
            // Until a first stream is served, the connection's deadline.
            let first_at = (resets.accepted == 0).then_some(first_by);
            let idle = active.idle_until(first_at, idle_timeout);
            let accepted = tokio::select! {
                biased;
                _ = watch.changed(), if !closing => {
                    conn.graceful_shutdown();
                    closing = true;
                    continue;
                }
                Some(done) = local.next(), if !local.is_empty() => {
                    if report(done) == Served::Reset && resets.reset(true) {
                        self.calm(&mut conn, &resets, &alarm).await;
                        break;
                    }
                    continue;
                }
                () = alarm.flooded.notified() => break goaway_calm(&mut conn, &alarm).await,
                accepted = H2Session::from_h2_conn(&mut conn, Arc::clone(&digest)) => accepted,
                // Idle with nothing in flight, or no first request in time:
                // the socket closes now.
                () = idle, if first_at.is_some() || (idle_timeout.is_some() && !closing) => return,
            };
            let mut session = match accepted {
                Ok(Some(H2Accept::Session(session))) => Box::new(session),
                Ok(Some(H2Accept::Rejected)) => {
                    malformed += 1;
                    if malformed >= MAX_MALFORMED_H2_STREAMS {
                        log::warn!("an HTTP/2 client sent {malformed} malformed streams: closed");
                        break;
                    }
                    continue;
                }
                // Closed, or a connection error.
                Ok(None) | Err(_) => break,
            };
            // A stream its client already reset is dropped here: it spends
            // no token and reaches no shard.
            if session.idle().now_or_never().is_some() {
                self.log_unserved(&session, &digest);
                if resets.reset(false) {
                    self.calm(&mut conn, &resets, &alarm).await;
                    break;
                }
                continue;
            }
            resets.accepted += 1;
            let started = InFlight::start(&active);
            local.push(self.stream_served(fast, session, started, shutdown));
        }
        // The connection is over: streams still in flight see it closed
        // once it is dropped, and end.
        drop(conn);
        while let Some(done) = local.next().await {
            report(done);
        }
    }

    /// A stream's course on the fast transport or Pingora's proxy, with a
    /// panic in it caught (it ends that stream only).
    fn stream_served<'f>(
        &self,
        fast: Option<&'f FastPath>,
        session: Box<H2Session>,
        started: Started,
        shutdown: &ShutdownWatch,
    ) -> impl std::future::Future<Output = std::thread::Result<Served>> + 'f {
        let serve = match fast {
            Some(fast) => Either::Left(serve_stream(fast, session, started)),
            None => {
                let inner = Arc::clone(&self.inner);
                Either::Right(serve_stream_on_pingora(
                    inner,
                    session,
                    shutdown.clone(),
                    started,
                ))
            }
        };
        std::panic::AssertUnwindSafe(serve).catch_unwind()
    }

    /// The connection's HTTP/2 handshake, by `first_by` (`None`: failed,
    /// or no preface in time; the socket closes), and the alarm its
    /// stream tells if the client floods (`super::watched`).
    async fn handshake_h2(
        &self,
        stream: Stream,
        read: &[u8],
        first_by: Instant,
    ) -> Option<(H2Connection, Arc<Alarm>)> {
        use pingora::protocols::http::v2::server::handshake;
        use pingora::ErrorType::ReadError;
        // The h2 crate's handshake takes about 28 KiB of buffers: a client
        // that finished TLS and sent nothing yet holds none of them. Its
        // first bytes are read first (unless they were: `read`, a plain
        // connection's), put back in front, under the same deadline as
        // the handshake.
        let options = self.inner.h2_options();
        let alarm = Arc::new(Alarm::default());
        let told = Arc::clone(&alarm);
        let digest = stream.get_socket_digest();
        let addr = digest.as_ref().and_then(|d| d.peer_addr().cloned());
        let handshake = async move {
            if !read.is_empty() {
                let watched = Watched::client(stream, read, addr, alarm);
                return handshake(Box::new(watched), options).await;
            }
            let mut stream = stream;
            let mut start = [0u8; 24]; // a preface's length
            let read = stream.read(&mut start).await;
            let n =
                read.map_err(|e| pingora::Error::because(ReadError, "before the preface", e))?;
            if n == 0 {
                return pingora::Error::e_explain(ReadError, "closed before the preface");
            }
            handshake(
                Box::new(Watched::client(stream, &start[..n], addr, alarm)),
                options,
            )
            .await
        };
        // (The handshake reads the preface only: no frame, no flood.)
        match tokio::time::timeout_at(first_by, handshake).await {
            Ok(Ok(conn)) => Some((conn, told)),
            Ok(Err(e)) => {
                log::debug!("HTTP/2 handshake with a client failed: {e}");
                None
            }
            Err(_) => {
                log::debug!("an HTTP/2 client sent no preface in time: closed");
                None
            }
        }
    }

    /// Logs a stream its client reset before it was served (status 0).
    fn log_unserved(&self, session: &H2Session, digest: &pingora::protocols::Digest) {
        let req = session.req_header();
        let client = peer(digest.socket_digest.as_ref());
        let line = RequestLine {
            client: client.as_ref(),
            method: req.method.as_str(),
            target: &req.uri,
            host: req.uri.authority().map(|a| a.as_str()),
            protocol: "HTTP/2",
        };
        self.log(&mut RequestCtx::default(), &line, 0);
    }

    /// Ends a connection whose client resets streams faster than it lets
    /// them be served: GOAWAY (`ENHANCE_YOUR_CALM`).
    async fn calm(&self, conn: &mut H2Connection, resets: &Resets, alarm: &Alarm) {
        log::warn!(
            "an HTTP/2 client reset {} streams before they were served and {} while served, \
             of {} (rapid reset): GOAWAY",
            resets.early,
            resets.late,
            resets.accepted + resets.early,
        );
        goaway_calm(conn, alarm).await;
    }
}

/// A client's HTTP/2 connection, as the h2 crate serves it.
type H2Connection = h2::server::Connection<Stream, bytes::Bytes>;

/// GOAWAY (`ENHANCE_YOUR_CALM`) to a client that abused its connection,
/// which then closes.
async fn goaway_calm(conn: &mut H2Connection, alarm: &Alarm) {
    // What the client sends is dropped from now on (`super::watched`).
    alarm.calm();
    conn.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
    // The GOAWAY goes out while the connection is driven, then the
    // client is read a second more: two seconds at most (a client that
    // stopped reading does not hold the socket).
    let flushed = std::future::poll_fn(|cx| conn.poll_closed(cx));
    let _ = tokio::time::timeout(Duration::from_secs(2), flushed).await;
}

/// How a stream's service ended; logs one that panicked (it was reset as
/// it was dropped).
fn report(done: std::thread::Result<Served>) -> Served {
    done.unwrap_or_else(|panic| {
        let what = (panic.downcast_ref::<&str>().copied())
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("?");
        log::error!("an HTTP/2 stream panicked ({what}); the stream was reset");
        Served::Done
    })
}

#[cfg(test)]
mod tests {
    use super::{Resets, MAX_EARLY_RESETS, RESET_SAMPLE};

    #[test]
    fn resets_past_the_bound_and_past_the_streams_kept_are_a_rapid_reset() {
        // Reset before accept: the bound's next one trips.
        let mut early = Resets::default();
        let tripped: Vec<bool> = (0..=MAX_EARLY_RESETS).map(|_| early.reset(false)).collect();
        assert_eq!(tripped.iter().filter(|t| **t).count(), 1);
        assert_eq!(tripped.last(), Some(&true));
        // Every stream reset while served: only once the sample is in.
        let mut late = Resets::default();
        for n in 1..RESET_SAMPLE {
            late.accepted += 1;
            assert!(!late.reset(true), "reset {n}");
        }
        late.accepted += 1;
        assert!(late.reset(true));
        // A browser that opened 600 streams and cancels 250 of them.
        let mut browser = Resets {
            accepted: 600,
            ..Resets::default()
        };
        assert!((0..250).all(|_| !browser.reset(true)));
        // Past half of what it opened, it is one.
        assert!((0..60).any(|_| browser.reset(true)));
    }
}
