//! Pooled, multiplexed HTTP/2 connections to `h2` and `auto` shards
//! (DESIGN §8), shared by every worker thread: a request takes a stream on
//! the oldest connection to its shard with room (up to the shard's
//! `SETTINGS_MAX_CONCURRENT_STREAMS`, and [`MAX_STREAMS`]); another
//! connection opens only when all are full, up to
//! `upstream.pool_per_shard`; beyond that a stream waits on the least busy
//! one for a place (within the request's headers deadline). Each
//! connection is driven by a task of its own that pings it every
//! `upstream.liveness.after_ms` (a connection that does not answer by the
//! next ping is a vanished host: dropped, its streams fail as a reset
//! connection's do) and closes it once idle for
//! `upstream.keepalive_timeout_ms`.
//!
//! A connection refuses what a hostile shard could make it hold: the
//! response head (`max_header_list_size`, so headers without end are cut
//! off), the streams it resets or that err, the data it sends ahead
//! (stream and connection windows), server push (off). What the `h2`
//! crate bounds itself: queued PING answers and SETTINGS acknowledgements
//! (one at a time), CONTINUATION floods. What it does not: a flood's CPU,
//! frame by frame; a shard that floods is cut off (`proxy::watched`).

use super::conn::{Alpn, Conn, UpstreamTls};
pub(crate) use super::h2_message::FieldRules;
use super::h2_stream::ShardStream;
use crate::control::{ShardPeer, UpstreamKey};
use crate::proxy::hooks::UpstreamFailure;
use crate::proxy::pipeline::failure::AttemptFailure;
use crate::proxy::watched::Watched;
use crate::routing::ShardProtocol;
use bytes::Bytes;
use h2::client::SendRequest;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Streams one connection carries at most (fewer if the shard says so).
pub(crate) const MAX_STREAMS: usize = 100;

/// A stream's receive window: what a shard may send ahead of a client
/// that reads slowly, per stream.
const STREAM_WINDOW: u32 = 256 * 1024;

/// The connection's receive window: room for every stream's window, so
/// that no stream can hold the others back by leaving its data unread.
const CONNECTION_WINDOW: u32 = STREAM_WINDOW * MAX_STREAMS as u32;

/// Request data the `h2` crate holds per stream at most.
const SEND_BUFFER: usize = 64 * 1024;

/// A response head's decoded fields at most (as an HTTP/1.1 head's).
const MAX_HEADER_LIST: u32 = 64 * 1024;

/// How long an `auto` shard that chose HTTP/1.1 is taken at its word
/// before it is offered `h2` again.
const AUTO_RECHECK: Duration = Duration::from_secs(300);

/// How many ping intervals an answer may take before the connection is
/// taken for a vanished host.
const PONG_ROUNDS: u32 = 3;

/// How often idle connections are pinged when `upstream.liveness` is off.
const PING_DEFAULT: Duration = Duration::from_secs(10);

/// Every shard's HTTP/2 connections (see the module documentation).
pub(crate) struct H2Pool {
    endpoints: Mutex<HashMap<UpstreamKey, Endpoint>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    ping_every: Duration,
    max_connections: usize,
}

/// One shard endpoint's connections.
#[derive(Default)]
struct Endpoint {
    conns: Vec<H2Conn>,
    /// Connections being opened.
    opening: usize,
    /// Requests waiting for those.
    waiting: usize,
    /// Woken when an opening ends (opened or failed), and how many have.
    opened: Arc<Notify>,
    openings_ended: u64,
    /// An `auto` shard chose HTTP/1.1, at this time.
    http1_since: Option<Instant>,
}

struct H2Conn {
    send: SendRequest<Bytes>,
    shared: Arc<Shared>,
}

/// What a connection's streams and its driver share.
#[derive(Default)]
struct Shared {
    streams: AtomicUsize,
    /// Streams ever taken (the driver tells idle from busy by it).
    taken: AtomicUsize,
    /// Handed out no more (gone, going away, or idle and closing).
    closed: AtomicBool,
}

/// A stream's place on its connection, given back when dropped.
pub(crate) struct Slot(Arc<Shared>);

impl Slot {
    /// A place on the connection, unless it closed meanwhile (its driver
    /// closes an idle one without the pool's lock: the count goes up
    /// first, then `closed` is read, as the driver does the reverse).
    fn take(shared: &Arc<Shared>) -> Option<Slot> {
        shared.streams.fetch_add(1, Ordering::SeqCst);
        shared.taken.fetch_add(1, Ordering::SeqCst);
        let slot = Slot(Arc::clone(shared));
        (!shared.closed.load(Ordering::SeqCst)).then_some(slot)
    }

    /// The connection is going away: no new stream goes to it.
    pub(crate) fn retire(&self) {
        self.0.closed.store(true, Ordering::SeqCst);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a request to an HTTP/2-capable shard goes on.
pub(crate) enum Opened {
    /// A stream; and whether its connection served others before.
    Stream(Box<ShardStream>, bool),
    /// An `auto` shard chose HTTP/1.1 on the connection just opened.
    Http1(Conn),
    /// An `auto` shard known to speak HTTP/1.1: the HTTP/1.1 pool's.
    UseHttp1,
}

/// A connection just opened.
enum Connected {
    H2(SendRequest<Bytes>, Arc<Shared>),
    Http1(Conn),
}

impl H2Pool {
    pub(crate) fn new(config: &crate::config::Config) -> H2Pool {
        let upstream = &config.upstream;
        H2Pool {
            endpoints: Mutex::default(),
            connect_timeout: upstream.connect_timeout,
            idle_timeout: upstream.keepalive_timeout,
            ping_every: upstream.liveness.as_ref().map_or(PING_DEFAULT, |l| l.after),
            max_connections: upstream.pool_per_shard.max(1),
        }
    }

    /// A stream to `peer` (an `h2` or `auto` shard), on a pooled
    /// connection with room or a new one, its request's fields sent by
    /// `rules`.
    pub(crate) async fn open(
        &self,
        peer: &ShardPeer,
        tls: &UpstreamTls,
        rules: FieldRules,
    ) -> Result<Opened, AttemptFailure> {
        let connect_failed = AttemptFailure::Shard(UpstreamFailure::Connect);
        let auto = peer.protocol == ShardProtocol::Auto;
        let stream = |conn: &H2Conn| {
            let slot = Slot::take(&conn.shared)?;
            let tls = peer.key.tls.is_some();
            Some(Box::new(ShardStream::new(
                conn.send.clone(),
                slot,
                tls,
                rules.clone(),
            )))
        };
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        loop {
            // Decided under the lock, which no wait holds.
            let wait = {
                let mut endpoints = self.endpoints.lock();
                let endpoint = endpoints.entry(peer.key.clone()).or_default();
                endpoint
                    .conns
                    .retain(|c| !c.shared.closed.load(Ordering::SeqCst));
                if auto
                    && endpoint
                        .http1_since
                        .is_some_and(|t| t.elapsed() < AUTO_RECHECK)
                {
                    return Ok(Opened::UseHttp1);
                }
                match endpoint.choose(self.max_connections) {
                    Choice::Take(i) => match stream(&endpoint.conns[i]) {
                        Some(stream) => return Ok(Opened::Stream(stream, true)),
                        // Closed just now: dropped from the list next turn.
                        None => continue,
                    },
                    Choice::Open => {
                        endpoint.opening += 1;
                        None
                    }
                    Choice::Wait => {
                        endpoint.waiting += 1;
                        Some((Arc::clone(&endpoint.opened), endpoint.openings_ended))
                    }
                }
            };
            if let Some((opened, seen)) = wait {
                // Counted out however the wait ends (also if the request
                // is dropped meanwhile).
                let _waiting = Counted::waiting(self, &peer.key);
                let notified = opened.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                // An opening that ended before the wait was registered.
                let ended = |e: &Endpoint| e.openings_ended != seen;
                let missed = self.endpoints.lock().get(&peer.key).is_none_or(ended);
                if !missed && tokio::time::timeout_at(deadline, notified).await.is_err() {
                    return Err(connect_failed);
                }
                continue;
            }
            let opening = Counted::opening(self, &peer.key);
            let connected = tokio::time::timeout_at(deadline, self.connect(peer, tls, auto)).await;
            let connected = connected.unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
            return opening.end(|endpoint| Self::opened(peer, endpoint, connected, stream));
        }
    }

    /// An opening ended (the caller holds the lock and wakes the
    /// waiters): a new connection pooled and a stream taken on it, or an
    /// `auto` shard's choice of HTTP/1.1 noted.
    fn opened(
        peer: &ShardPeer,
        endpoint: &mut Endpoint,
        connected: std::io::Result<Connected>,
        stream: impl Fn(&H2Conn) -> Option<Box<ShardStream>>,
    ) -> Result<Opened, AttemptFailure> {
        let connect_failed = AttemptFailure::Shard(UpstreamFailure::Connect);
        match connected {
            Ok(Connected::H2(send, shared)) => {
                let conn = H2Conn { send, shared };
                let stream = stream(&conn);
                endpoint.conns.push(conn);
                stream
                    .map(|s| Opened::Stream(s, false))
                    .ok_or(connect_failed)
            }
            Ok(Connected::Http1(conn)) => {
                endpoint.http1_since = Some(Instant::now());
                Ok(Opened::Http1(conn))
            }
            Err(e) => {
                log::debug!("connecting to {} (HTTP/2) failed: {e}", peer.addr);
                Err(connect_failed)
            }
        }
    }

    /// Opens a connection: TCP, TLS offering `h2` (and `http/1.1` to an
    /// `auto` shard), the HTTP/2 handshake; its driver started.
    async fn connect(
        &self,
        peer: &ShardPeer,
        tls: &UpstreamTls,
        auto: bool,
    ) -> std::io::Result<Connected> {
        let tcp = TcpStream::connect(peer.addr).await?;
        let _ = tcp.set_nodelay(true);
        crate::proxy::fast::tunnel::keep_alive(&tcp);
        let io = match &peer.key.tls {
            None => Conn::Plain(tcp),
            Some(name) => {
                let alpn = if auto { Alpn::Either } else { Alpn::H2 };
                let (conn, h2) = tls.connect_offering(name.clone(), tcp, alpn).await?;
                if auto && !h2 {
                    return Ok(Connected::Http1(conn));
                }
                conn
            }
        };
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_header_list_size(MAX_HEADER_LIST)
            .max_send_buffer_size(SEND_BUFFER)
            .enable_push(false)
            .handshake::<_, Bytes>(Watched::shard(io, peer.addr))
            .await
            .map_err(std::io::Error::other)?;
        let mut connection = connection;
        let mut ping = connection.ping_pong();
        // The shard's SETTINGS open its side of the connection: the answer
        // to a first PING comes after them, so its limits (and whether it
        // takes extended CONNECT) are known before any stream goes.
        if let Some(ping) = ping.as_mut() {
            ping.send_ping(h2::Ping::opaque())
                .map_err(std::io::Error::other)?;
            let pong = poll_fn(|cx| ping.poll_pong(cx));
            tokio::select! {
                _ = &mut connection => return Err(std::io::ErrorKind::ConnectionReset.into()),
                answered = pong => {
                    answered.map_err(std::io::Error::other)?;
                }
            }
        }
        let shared = Arc::new(Shared::default());
        tokio::spawn(drive(
            connection,
            ping,
            Arc::clone(&shared),
            (self.ping_every, self.idle_timeout),
        ));
        Ok(Connected::H2(send, shared))
    }
}

/// A request counted among an endpoint's openings or waiters, counted
/// out when dropped (an opening's end also wakes the waiters): a request
/// dropped mid-way (the client gone, a shutdown) leaves no count behind.
struct Counted<'a> {
    pool: &'a H2Pool,
    key: &'a UpstreamKey,
    opening: bool,
}

impl<'a> Counted<'a> {
    /// An opening (the caller counted it in, under the lock).
    fn opening(pool: &'a H2Pool, key: &'a UpstreamKey) -> Self {
        Counted {
            pool,
            key,
            opening: true,
        }
    }

    /// A waiter (the caller counted it in, under the lock).
    fn waiting(pool: &'a H2Pool, key: &'a UpstreamKey) -> Self {
        Counted {
            pool,
            key,
            opening: false,
        }
    }

    /// Ends an opening under the lock: `f` sees the endpoint first, then
    /// the waiters are woken (they find what `f` pooled).
    fn end<R>(self, f: impl FnOnce(&mut Endpoint) -> R) -> R {
        let mut endpoints = self.pool.endpoints.lock();
        let endpoint = endpoints.entry(self.key.clone()).or_default();
        let out = f(endpoint);
        drop(endpoints);
        drop(self);
        out
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        let mut endpoints = self.pool.endpoints.lock();
        let Some(endpoint) = endpoints.get_mut(self.key) else {
            return;
        };
        if !self.opening {
            endpoint.waiting -= 1;
            return;
        }
        endpoint.opening -= 1;
        endpoint.openings_ended += 1;
        endpoint.opened.notify_waiters();
    }
}

/// Where a request's stream goes.
enum Choice {
    /// On this connection.
    Take(usize),
    /// On a connection it opens.
    Open,
    /// On one being opened: it waits for it.
    Wait,
}

impl Endpoint {
    /// The oldest connection with room for one more stream; else a new one
    /// while the connections being opened could not carry the requests
    /// already waiting for them, and there are fewer than `max`; else the
    /// least busy (the h2 crate holds the stream until a place frees);
    /// else (every one is still opening) a wait.
    fn choose(&self, max: usize) -> Choice {
        let room = |c: &H2Conn| c.streams() < c.send.current_max_send_streams().min(MAX_STREAMS);
        if let Some(i) = self.conns.iter().position(room) {
            return Choice::Take(i);
        }
        if self.opening > 0 && self.waiting < self.opening * MAX_STREAMS {
            return Choice::Wait;
        }
        if self.conns.len() + self.opening < max {
            return Choice::Open;
        }
        let least_busy = (0..self.conns.len()).min_by_key(|&i| self.conns[i].streams());
        least_busy.map_or(Choice::Wait, Choice::Take)
    }
}

impl H2Conn {
    fn streams(&self) -> usize {
        self.shared.streams.load(Ordering::SeqCst)
    }
}

/// What woke a connection's driver.
enum Event {
    Closed,
    Tick,
    Pong(bool),
}

/// Drives one connection until it ends, is silent for a ping's round, or
/// idles past `idle_timeout`; then marks it closed (and drops it).
async fn drive(
    mut connection: h2::client::Connection<Watched<Conn>, Bytes>,
    mut ping: Option<h2::PingPong>,
    shared: Arc<Shared>,
    (ping_every, idle_timeout): (Duration, Duration),
) {
    let start = tokio::time::Instant::now() + ping_every;
    let mut tick = tokio::time::interval_at(start, ping_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Ticks since the last PING went unanswered (0: none awaited).
    let mut awaiting = 0u32;
    let mut idle = Duration::ZERO;
    let mut taken = shared.taken.load(Ordering::SeqCst);
    loop {
        let pong = poll_fn(|cx| match ping.as_mut() {
            Some(ping) if awaiting > 0 => ping.poll_pong(cx).map(|r| r.is_ok()),
            _ => Poll::Pending,
        });
        let event = tokio::select! {
            _ = &mut connection => Event::Closed,
            _ = tick.tick() => Event::Tick,
            answered = pong => Event::Pong(answered),
        };
        match event {
            Event::Closed => break,
            Event::Pong(answered) => {
                awaiting = 0;
                if !answered {
                    break;
                }
            }
            Event::Tick => {
                if awaiting > 0 {
                    // Behind a large response's DATA, or a shard's pause,
                    // an answer may take a while: a few rounds.
                    awaiting += 1;
                    if awaiting > PONG_ROUNDS {
                        log::debug!(
                            "an HTTP/2 connection to a shard did not answer a ping: dropped"
                        );
                        break;
                    }
                }
                // Idle: no stream open now, and none taken since the last
                // tick (short calls between ticks keep it busy).
                let now_taken = shared.taken.load(Ordering::SeqCst);
                let quiet = shared.streams.load(Ordering::SeqCst) == 0 && now_taken == taken;
                taken = now_taken;
                idle = if quiet {
                    idle + ping_every
                } else {
                    Duration::ZERO
                };
                if idle >= idle_timeout {
                    shared.closed.store(true, Ordering::SeqCst);
                    // A stream taken just before: it ends first.
                    if shared.streams.load(Ordering::SeqCst) == 0 {
                        break;
                    }
                }
                if let (0, Some(ping)) = (awaiting, ping.as_mut()) {
                    awaiting = u32::from(ping.send_ping(h2::Ping::opaque()).is_ok());
                }
            }
        }
    }
    shared.closed.store(true, Ordering::SeqCst);
}
