//! Test support: real backends on 127.0.0.1 (hyper HTTP servers that record
//! what they receive, raw TCP servers that misbehave, WebSocket echo
//! servers), the real `shardgate` binary started on a written config, and a
//! small HTTP/1.1 client over a plain socket.
#![allow(dead_code)]

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response as HyperResponse};
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A runtime for the backends, shared by a test binary.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

/// A configuration for [`Gateway::start`]: `head` (the sections before
/// `shards`), the shards as `(id, url)`, then `extra` sections; the
/// fallback suffix `.localhost` unless `extra` has its own `domains`.
pub fn config_yaml(head: &str, shards: &[(&str, String)], extra: &str) -> String {
    let mut yaml = String::from(head);
    yaml.push_str("shards:\n");
    for (id, url) in shards {
        yaml.push_str(&format!("  - {{ id: {id}, url: \"{url}\" }}\n"));
    }
    if !extra.contains("domains:") {
        yaml.push_str("domains:\n  fallback_suffix: .localhost\n");
    }
    yaml.push_str(extra);
    yaml
}

/// A gateway whose plain listener takes PROXY headers from `from`, in
/// front of `backend`, with `state` (`false`, or its section).
pub fn behind_balancer_with_state(
    backend: &Backend,
    from: &str,
    state: &str,
    extra: &str,
) -> Gateway {
    let head = format!(
        "listen: [{{ addr: \"127.0.0.1:{{port}}\", proxy_protocol: true, proxy_protocol_from: [{from}] }}]\n\
         admin: {{ addr: \"127.0.0.1:{{admin}}\" }}\nstate: {state}\n"
    );
    Gateway::start(&config_yaml(&head, &[("a", backend.url())], extra))
}

/// A gateway on a plain listener in front of `shards` (`(id, url, more
/// fields)`, e.g. `protocol: h2`), any `<tenant>.localhost` a tenant,
/// with `extra` sections.
pub fn gateway_with_fields(shards: &[(&str, String, &str)], extra: &str) -> Gateway {
    let mut yaml = String::from(
        "listen: [{ addr: \"127.0.0.1:{port}\" }]\nadmin: { addr: \"127.0.0.1:{admin}\" }\nstate: false\nshards:\n",
    );
    for (id, url, more) in shards {
        yaml.push_str(&format!("  - {{ id: {id}, url: \"{url}\", {more} }}\n"));
    }
    yaml.push_str("domains:\n  fallback_suffix: .localhost\n");
    yaml.push_str(extra);
    Gateway::start(&yaml)
}

/// As [`gateway_with_fields`], each shard's third part its `protocol`.
pub fn gateway_with_protocols(shards: &[(&str, String, &str)], extra: &str) -> Gateway {
    let fields: Vec<String> = shards
        .iter()
        .map(|(_, _, p)| format!("protocol: {p}"))
        .collect();
    let shards: Vec<(&str, String, &str)> = (shards.iter().zip(&fields))
        .map(|((id, url, _), more)| (*id, url.clone(), more.as_str()))
        .collect();
    gateway_with_fields(&shards, extra)
}

/// A loopback port nobody listens on, for a gateway, a Redis or a dead
/// shard, that nothing else will take before the caller binds it.
///
/// A port the kernel handed out by itself (a bind to port 0, asked of it
/// and released) can be handed out again at once: to a test backend
/// binding port 0, or to a second call. A gateway that then fails to bind
/// exits, but its readiness check sees someone else's listener accept, and
/// the test talks to the wrong server. So ports come from below the
/// kernel's ephemeral range, which it never hands out by itself, each one
/// once per test binary (starting where the process id says, so that test
/// binaries run one after the other start apart).
pub fn free_port() -> u16 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    const LOWEST: usize = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<usize>().ok())
        .unwrap_or(32_768);
    let span = ephemeral_low.saturating_sub(LOWEST);
    if span < 1_000 {
        // No room below the ephemeral range: the kernel's own choice.
        return StdListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
    }
    let start = (std::process::id() as usize).wrapping_mul(7_919);
    for _ in 0..span {
        let candidate = LOWEST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let Ok(port) = u16::try_from(candidate) else {
            continue;
        };
        if StdListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below {ephemeral_low}");
}

/// Whether process `pid` holds a socket listening on TCP `port` (IPv4),
/// read off /proc: a port that accepts may be another server's. Where
/// /proc cannot be read, whether the port accepts at all.
pub fn listens(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return TcpStream::connect(("127.0.0.1", port)).is_ok();
    };
    // Fields: sl, local address, remote address, state (0A: LISTEN), ...,
    // inode (the tenth).
    let sockets: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
            let local_port = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            (*state == "0A" && local_port == port).then(|| format!("socket:[{inode}]"))
        })
        .collect();
    if sockets.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| sockets.iter().any(|s| target.as_os_str() == s.as_str()))
    })
}

/// A request as a backend saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub uri: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn header_count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .count()
    }
}

/// What a backend answers.
pub enum Reply {
    /// Status, extra headers, body.
    Full(u16, Vec<(String, String)>, Vec<u8>),
    /// Wait, then answer.
    After(Duration, Box<Reply>),
    /// Run the closure, then answer: it happens before any reply byte leaves.
    Then(Box<dyn FnOnce() + Send>, Box<Reply>),
    /// Headers now, then the chunks, one every `gap`.
    Stream { chunks: Vec<Vec<u8>>, gap: Duration },
}

impl Reply {
    pub fn ok(body: &str) -> Reply {
        Reply::Full(200, Vec::new(), body.as_bytes().to_vec())
    }
}

type Handler = dyn Fn(&Seen) -> Reply + Send + Sync;

/// A recording HTTP/1.1 backend (hyper).
pub struct Backend {
    pub name: String,
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
    connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Backend {
    /// Answers every request with `{"shard": name, "tenant": <tenant header>}`.
    pub fn start(name: &str) -> Backend {
        let n = name.to_string();
        Backend::with(name, move |seen| {
            let tenant = seen.header("x-tenant-id").unwrap_or("").to_string();
            Reply::ok(&format!("{{\"shard\":\"{n}\",\"tenant\":\"{tenant}\"}}"))
        })
    }

    pub fn with(name: &str, handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Backend {
        Backend::on(name, 0, handler)
    }

    /// A backend on a given port (0 = any).
    pub fn on(
        name: &str,
        port: u16,
        handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
    ) -> Backend {
        Backend::at(name, "127.0.0.1", port, handler)
    }

    /// A backend on a given loopback address and port (0 = any).
    pub fn at(
        name: &str,
        ip: &str,
        port: u16,
        handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
    ) -> Backend {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let handler: Arc<Handler> = Arc::new(handler);
        let listener = runtime()
            .block_on(tokio::net::TcpListener::bind((ip, port)))
            .expect("bind backend");
        let addr = listener.local_addr().expect("backend address");
        let rec = Arc::clone(&seen);
        let connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let conns = Arc::clone(&connections);
        let task = runtime().spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (rec, handler) = (Arc::clone(&rec), Arc::clone(&handler));
                let conn = tokio::spawn(async move {
                    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let (rec, handler) = (Arc::clone(&rec), Arc::clone(&handler));
                        async move { Ok::<_, hyper::Error>(serve(req, rec, handler).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
                conns.lock().unwrap().push(conn.abort_handle());
            }
        });
        Backend {
            name: name.to_string(),
            addr,
            seen,
            task,
            connections,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Dies: stops accepting, drops the listener and every open connection.
    pub fn stop(&self) {
        self.task.abort();
        for c in self.connections.lock().unwrap().drain(..) {
            c.abort();
        }
        // Let the abort land so the port is closed when we return.
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

async fn serve(
    req: Request<hyper::body::Incoming>,
    rec: Arc<Mutex<Vec<Seen>>>,
    handler: Arc<Handler>,
) -> HyperResponse<Body> {
    let method = req.method().to_string();
    let uri = req.uri().to_string();
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).to_string(),
            )
        })
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let seen = Seen {
        method,
        uri,
        headers,
        body,
    };
    let reply = handler(&seen);
    rec.lock().unwrap().push(seen);
    respond(reply).await
}

fn respond(
    reply: Reply,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = HyperResponse<Body>> + Send>> {
    Box::pin(async move {
        match reply {
            Reply::Full(status, headers, body) => {
                let mut resp = HyperResponse::builder().status(status);
                for (k, v) in headers {
                    resp = resp.header(k, v);
                }
                resp.body(Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed())
                    .expect("response")
            }
            Reply::After(delay, inner) => {
                tokio::time::sleep(delay).await;
                respond(*inner).await
            }
            Reply::Then(before, inner) => {
                before();
                respond(*inner).await
            }
            Reply::Stream { chunks, gap } => {
                let (tx, rx) =
                    tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
                tokio::spawn(async move {
                    for chunk in chunks {
                        tokio::time::sleep(gap).await;
                        if tx.send(Ok(Frame::data(Bytes::from(chunk)))).await.is_err() {
                            return;
                        }
                    }
                });
                let stream = tokio_stream_from(rx);
                HyperResponse::builder()
                    .status(200)
                    .body(BodyExt::boxed(StreamBody::new(stream)))
                    .expect("response")
            }
        }
    })
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A TLS acceptor with a fresh self-signed certificate for 127.0.0.1, and
/// that certificate (PEM) to trust.
pub fn tls_acceptor() -> (tokio_rustls::TlsAcceptor, String) {
    use tokio_rustls::rustls;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("certificate");
    let ca_pem = cert.cert.pem();
    let key =
        rustls::pki_types::PrivateKeyDer::try_from(cert.key_pair.serialize_der()).expect("key");
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .expect("tls config");
    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), ca_pem)
}

/// A fresh self-signed certificate for `localhost`, and its files in
/// `dir` (`edge.crt`, `edge.key`) for a `tls: { cert, key }` listener.
pub fn self_signed_files(
    dir: &std::path::Path,
) -> (rcgen::CertifiedKey, std::path::PathBuf, std::path::PathBuf) {
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    let (crt, key) = (dir.join("edge.crt"), dir.join("edge.key"));
    std::fs::write(&crt, cert.cert.pem()).expect("crt");
    std::fs::write(&key, cert.key_pair.serialize_pem()).expect("key");
    (cert, crt, key)
}

/// A TLS client trusting `cert` alone (as [`self_signed_files`] made it).
pub fn connector_trusting(cert: &rcgen::CertifiedKey) -> tokio_rustls::TlsConnector {
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).expect("root");
    let client = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(client))
}

/// An HTTPS backend with a fresh self-signed certificate for 127.0.0.1;
/// `ca_pem` is the certificate to trust.
pub struct TlsBackend {
    pub addr: SocketAddr,
    pub ca_pem: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsBackend {
    pub fn start(name: &'static str) -> TlsBackend {
        TlsBackend::with(move |s: &Seen| {
            let tenant = s.header("x-tenant-id").unwrap_or("").to_string();
            Reply::ok(&format!(
                "{{\"shard\":\"{name}\",\"tenant\":\"{tenant}\",\"tls\":true}}"
            ))
        })
    }

    /// An HTTPS backend answering with `handler`.
    pub fn with(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> TlsBackend {
        let (acceptor, ca_pem) = tls_acceptor();
        let listener = runtime()
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let rec = Arc::clone(&seen);
        let handler: Arc<Handler> = Arc::new(handler);
        let task = runtime().spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, rec, handler) =
                    (acceptor.clone(), Arc::clone(&rec), Arc::clone(&handler));
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let (rec, handler) = (Arc::clone(&rec), Arc::clone(&handler));
                        async move { Ok::<_, hyper::Error>(serve(req, rec, handler).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        TlsBackend {
            addr,
            ca_pem,
            seen,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

impl Drop for TlsBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A backend that reads each request head (and a Content-Length body),
/// counts it, then resets the connection without answering.
pub struct Resetter {
    pub addr: SocketAddr,
    pub received: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Resetter {
    pub fn start() -> Resetter {
        Resetter::when(|_| true)
    }

    /// Resets the connection of each request whose head `drops` (one
    /// tenant's broken app); answers the others `200 ok`, keeping the
    /// connection open.
    pub fn when(drops: fn(&str) -> bool) -> Resetter {
        let listener = runtime()
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let received = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&received);
        let task = runtime().spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let count = Arc::clone(&count);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let end = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        buf.drain(..end);
                        if drops(&head) {
                            count.fetch_add(1, Ordering::SeqCst);
                            // SO_LINGER 0: close with a reset.
                            let _ =
                                socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                            return;
                        }
                        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Resetter {
            addr,
            received,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Resetter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A WebSocket echo server that records handshake headers.
/// A byte stream a test WebSocket backend serves on (plain or TLS).
pub trait TunnelIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> TunnelIo for T {}

pub struct WsBackend {
    pub addr: SocketAddr,
    pub handshakes: Arc<Mutex<Vec<BTreeMap<String, String>>>>,
    pub open: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl WsBackend {
    pub fn start(name: &'static str) -> WsBackend {
        WsBackend::serve(name, None)
    }

    /// A WebSocket backend behind TLS (`wss`), and its certificate (PEM).
    pub fn start_tls(name: &'static str) -> (WsBackend, String) {
        let (acceptor, ca_pem) = tls_acceptor();
        (WsBackend::serve(name, Some(acceptor)), ca_pem)
    }

    fn serve(name: &'static str, tls: Option<tokio_rustls::TlsAcceptor>) -> WsBackend {
        let listener = runtime()
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let handshakes: Arc<Mutex<Vec<BTreeMap<String, String>>>> = Arc::default();
        let open = Arc::new(AtomicUsize::new(0));
        let (hs, op) = (Arc::clone(&handshakes), Arc::clone(&open));
        let task = runtime().spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (hs, op, tls) = (Arc::clone(&hs), Arc::clone(&op), tls.clone());
                tokio::spawn(async move {
                    let stream: Box<dyn TunnelIo> = match tls {
                        Some(acceptor) => match acceptor.accept(stream).await {
                            Ok(tls) => Box::new(tls),
                            Err(_) => return,
                        },
                        None => Box::new(stream),
                    };
                    #[allow(clippy::result_large_err)] // tungstenite's callback signature
                    let record =
                        |req: &tokio_tungstenite::tungstenite::handshake::server::Request, resp| {
                            let headers = req
                                .headers()
                                .iter()
                                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                                .collect();
                            hs.lock().unwrap().push(headers);
                            Ok(resp)
                        };
                    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, record).await
                    else {
                        return;
                    };
                    op.fetch_add(1, Ordering::SeqCst);
                    use tokio_tungstenite::tungstenite::Message;
                    while let Some(Ok(msg)) = ws.next().await {
                        let reply = match msg {
                            Message::Text(t) if t.as_str() == "close-me" => {
                                let _ = ws.close(None).await;
                                break;
                            }
                            Message::Text(t) => Message::Text(format!("{name}:{t}")),
                            Message::Binary(b) => Message::Binary(b),
                            Message::Close(_) => break,
                            _ => continue,
                        };
                        if ws.send(reply).await.is_err() {
                            break;
                        }
                    }
                    op.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        WsBackend {
            addr,
            handshakes,
            open,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for WsBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The real `shardgate` binary on a written configuration.
pub struct Gateway {
    child: Child,
    pub port: u16,
    pub admin_port: u16,
    /// Every loopback port the config listens on (proxy listeners and
    /// admin): ready means all of them accept.
    listening: Vec<u16>,
    pub dir: tempfile::TempDir,
    pub config_path: std::path::PathBuf,
    program: std::path::PathBuf,
}

/// The ports of every `addr: "127.0.0.1:N"` in a config's text.
fn loopback_addrs(text: &str) -> Vec<u16> {
    const KEY: &str = "addr: \"127.0.0.1:";
    text.match_indices(KEY)
        .filter_map(|(at, _)| {
            let rest = &text[at + KEY.len()..];
            rest[..rest.find('"')?].parse().ok()
        })
        .collect()
}

/// Whether test gateways run with the fast path (see below).
pub fn fast_path_on() -> bool {
    std::env::var("SHARDGATE_TEST_FAST_PATH").as_deref() != Ok("off")
}

/// `SHARDGATE_TEST_FAST_PATH=off` runs every test gateway with
/// `server.fast_path: false`, so the same tests cover Pingora's path for
/// the requests the fast path would take (`scripts/test.sh` does both).
fn without_fast_path_if_asked(yaml: String) -> String {
    if fast_path_on() {
        return yaml;
    }
    match yaml.find("server: {") {
        Some(at) => {
            let at = at + "server: {".len();
            format!("{} fast_path: false,{}", &yaml[..at], &yaml[at..])
        }
        None => format!("{yaml}server: {{ fast_path: false }}\n"),
    }
}

impl Gateway {
    /// Starts the binary. In `yaml`, `{port}`, `{admin}` and `{dir}` are
    /// replaced by the listen port, the admin port and a scratch folder.
    pub fn start(yaml: &str) -> Gateway {
        Gateway::start_program(std::path::Path::new(env!("CARGO_BIN_EXE_shardgate")), yaml)
    }

    /// Starts `program` (the binary, or an embedder's built on shardgate,
    /// taking the same flags) as [`Gateway::start`] does.
    pub fn start_program(program: &std::path::Path, yaml: &str) -> Gateway {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let admin_port = free_port();
        let text = yaml
            .replace("{port}", &port.to_string())
            .replace("{admin}", &admin_port.to_string())
            .replace("{dir}", &dir.path().display().to_string());
        let text = without_fast_path_if_asked(text);
        // Never the default state file (/var/lib/shardgate/state.json):
        // gateways of tests running side by side would read each other's
        // drains and buckets.
        let text = if text.contains("state:") {
            text
        } else {
            format!(
                "{text}state: {{ path: \"{}/state.json\" }}\n",
                dir.path().display()
            )
        };
        let listening = loopback_addrs(&text);
        let config_path = dir.path().join("shardgate.yaml");
        std::fs::write(&config_path, text).expect("write config");
        let mut gw = Gateway {
            child: spawn(program, &config_path, dir.path()),
            program: program.to_path_buf(),
            port,
            admin_port,
            listening,
            dir,
            config_path,
        };
        gw.wait_ready();
        gw
    }

    /// Waits until the gateway listens on every port of the config (each
    /// proxy listener, the admin): they start as separate services, in any
    /// order. Its own sockets, not just ports that accept: a port someone
    /// else holds accepts too, while Pingora retries its bind for 30 s.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let pid = self.child.id();
        let listening = |port: u16| listens(pid, port);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("shardgate exited early: {status}");
            }
            if listening(self.port) && self.listening.iter().all(|&p| listening(p)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "shardgate did not listen on {} (admin {}) in time",
            self.port, self.admin_port
        );
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (`libc`-free: through `kill(1)`).
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status();
    }

    /// Waits for the process to exit; returns whether it did in time.
    pub fn wait_exit(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// A GET with the given Host (and extra header lines).
    pub fn get(&self, host: &str, path: &str) -> Response {
        self.send(&format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        ))
    }

    pub fn send(&self, raw: &str) -> Response {
        send_raw(self.port, raw.as_bytes())
    }

    /// An admin API call (`token` as the bearer, if any).
    pub fn admin(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        token: Option<&str>,
    ) -> Response {
        let body = body.unwrap_or("");
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len(),
            port = self.admin_port,
        );
        send_raw(self.admin_port, raw.as_bytes())
    }

    /// Whether the admin API reports shard `id` healthy.
    pub fn shard_healthy(&self, id: &str) -> bool {
        let shards = self.admin("GET", "/v1/shards", None, None).json();
        shards
            .as_array()
            .is_some_and(|all| all.iter().any(|s| s["id"] == id && s["healthy"] == true))
    }

    /// The gateway's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default()
    }

    /// Restarts the process on the same config and ports (after it exited
    /// or was killed).
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(&self.program, &self.config_path, self.dir.path());
        self.wait_ready();
    }

    /// Kills the process with SIGKILL and waits for it.
    pub fn kill9(&mut self) {
        self.signal("KILL");
        let _ = self.child.wait();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failing test shows what its gateway said (CI keeps only the
        // test output): the last lines, which a panic or a refused bind
        // would be among.
        if std::thread::panicking() {
            let log = std::fs::read(self.dir.path().join("gateway.log")).unwrap_or_default();
            let log = String::from_utf8_lossy(&log);
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            let _ = writeln!(
                std::io::stderr(),
                "--- the gateway on port {} (pid {}), last lines of its log:\n{tail}\n---",
                self.port,
                self.child.id()
            );
        }
    }
}

fn spawn(program: &std::path::Path, config: &std::path::Path, dir: &std::path::Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("gateway.log"))
        .expect("log file");
    Command::new(program)
        .arg("-c")
        .arg(config)
        .env(
            "RUST_LOG",
            std::env::var("SHARDGATE_TEST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn shardgate")
}

/// A response read off a socket.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// Sends raw bytes on a new connection and reads one response.
pub fn send_raw(port: u16, raw: &[u8]) -> Response {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to gateway");
    stream.set_read_timeout(Some(Duration::from_secs(30))).ok();
    stream.write_all(raw).expect("write request");
    let mut reader = BufReader::new(stream);
    read_response(&mut reader).expect("read response")
}

/// Reads one response (Content-Length, chunked, or until close).
pub fn read_response(reader: &mut impl BufRead) -> std::io::Result<Response> {
    read_response_to(reader, false)
}

/// Reads one response to a request that was a HEAD (`head`: no body,
/// whatever its fields say) or not.
pub fn read_response_to(reader: &mut impl BufRead, head: bool) -> std::io::Result<Response> {
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed before a response",
            ));
        }
        if !line.trim().is_empty() {
            break;
        }
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let mut resp = Response {
        status,
        headers,
        body: Vec::new(),
    };
    if head || status == 101 || status == 204 || status == 304 || (100..200).contains(&status) {
        return Ok(resp);
    }
    if resp
        .header("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        loop {
            line.clear();
            reader.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size {line:?}")))?;
            if size == 0 {
                line.clear();
                reader.read_line(&mut line)?;
                break;
            }
            let mut chunk = vec![0; size];
            reader.read_exact(&mut chunk)?;
            resp.body.extend_from_slice(&chunk);
            line.clear();
            reader.read_line(&mut line)?;
        }
    } else if let Some(len) = resp
        .header("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        resp.body = vec![0; len];
        reader.read_exact(&mut resp.body)?;
    } else {
        reader.read_to_end(&mut resp.body)?;
    }
    Ok(resp)
}

/// Polls `f` until it returns true or `within` passes.
pub fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One request as it arrived at a [`RawBackend`], byte for byte.
#[derive(Clone, Debug)]
pub struct RawRequest {
    pub head: String,
    pub body: Vec<u8>,
}

impl RawRequest {
    pub fn request_line(&self) -> &str {
        self.head.lines().next().unwrap_or("")
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

/// A backend that frames requests itself (Content-Length or chunked, as
/// RFC 9112 says) and records the exact bytes of each, answering `ok`.
/// What it records is what a shard would see: two entries where the client
/// sent one request is smuggling.
pub struct RawBackend {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<RawRequest>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RawBackend {
    pub fn start() -> RawBackend {
        let listener = runtime()
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let requests: Arc<Mutex<Vec<RawRequest>>> = Arc::default();
        let rec = Arc::clone(&requests);
        let task = runtime().spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let rec = Arc::clone(&rec);
                tokio::spawn(raw_connection(stream, rec));
            }
        });
        RawBackend {
            addr,
            requests,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<RawRequest> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The content of a chunked body as text (chunks of one line each, as the
/// tests send them), up to its last chunk.
pub fn chunked_content(body: &str) -> String {
    body.split("\r\n")
        .take_while(|line| *line != "0")
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s)
        .collect()
}

/// Where a chunked body at the start of `buf` ends (after its trailer
/// section), if it is all there: sizes in hex (extensions ignored).
fn chunked_end(buf: &[u8]) -> Option<usize> {
    let line_end = |from: usize| {
        buf.get(from..)?
            .windows(2)
            .position(|w| w == b"\r\n")
            .map(|i| from + i)
    };
    let mut at = 0;
    loop {
        let end = line_end(at)?;
        let line = std::str::from_utf8(&buf[at..end]).ok()?;
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        at = end + 2;
        if size == 0 {
            loop {
                let end = line_end(at)?;
                let blank = end == at;
                at = end + 2;
                if blank {
                    return Some(at);
                }
            }
        }
        at += size + 2;
        if at > buf.len() {
            return None;
        }
    }
}

async fn raw_connection(mut stream: tokio::net::TcpStream, rec: Arc<Mutex<Vec<RawRequest>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        // A head.
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        buf.drain(..head_end);
        let req = RawRequest {
            head,
            body: Vec::new(),
        };
        let chunked = req
            .header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        let length: usize = req
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut req = req;
        if chunked {
            // Keep the chunked bytes as they came, up to the end of the
            // last chunk's trailer section.
            loop {
                if let Some(end) = chunked_end(&buf) {
                    req.body = buf.drain(..end).collect();
                    break;
                }
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        } else {
            while buf.len() < length {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            req.body = buf.drain(..length).collect();
        }
        let upgrade = req.header("upgrade").is_some();
        rec.lock().unwrap().push(req);
        let reply: &[u8] = if upgrade {
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nno"
        } else {
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        };
        if stream.write_all(reply).await.is_err() {
            return;
        }
    }
}

/// Sends raw bytes, then reads whatever comes back until the gateway
/// closes or `wait` passes; returns the status codes seen, in order.
pub fn exchange(port: u16, raw: &[u8], wait: Duration) -> (Vec<u16>, String) {
    use std::io::Read;
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .ok();
    let _ = stream.write_all(raw);
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&got).to_string();
    let statuses = text
        .match_indices("HTTP/1.")
        .filter_map(|(i, _)| text[i..].split_whitespace().nth(1)?.parse().ok())
        .collect();
    (statuses, text)
}

/// iptables rules that silently drop a loopback port's traffic both ways,
/// removed on drop — so a test that panics (an assertion failed) removes
/// them too, and no rule outlives the test.
pub struct Blackhole {
    port: u16,
}

impl Blackhole {
    fn rules(port: u16) -> [Vec<String>; 2] {
        let p = port.to_string();
        [
            [
                "INPUT", "-p", "tcp", "-i", "lo", "--dport", &p, "-j", "DROP",
            ]
            .map(String::from)
            .to_vec(),
            [
                "OUTPUT", "-p", "tcp", "-o", "lo", "--sport", &p, "-j", "DROP",
            ]
            .map(String::from)
            .to_vec(),
        ]
    }

    pub fn start(port: u16) -> Option<Blackhole> {
        for rule in Blackhole::rules(port) {
            let ok = std::process::Command::new("iptables")
                .arg("-I")
                .args(&rule)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                return None;
            }
        }
        Some(Blackhole { port })
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        for rule in Blackhole::rules(self.port) {
            let _ = std::process::Command::new("iptables")
                .arg("-D")
                .args(&rule)
                .status();
        }
    }
}

/// A TLS client verifier that takes any certificate: TLS tests compare
/// the certificate served instead of validating it.
#[derive(Debug)]
pub struct AnyCert;

impl tokio_rustls::rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &tokio_rustls::rustls::pki_types::CertificateDer<'_>,
        _: &[tokio_rustls::rustls::pki_types::CertificateDer<'_>],
        _: &tokio_rustls::rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: tokio_rustls::rustls::pki_types::UnixTime,
    ) -> Result<tokio_rustls::rustls::client::danger::ServerCertVerified, tokio_rustls::rustls::Error>
    {
        Ok(tokio_rustls::rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &tokio_rustls::rustls::pki_types::CertificateDer<'_>,
        dss: &tokio_rustls::rustls::DigitallySignedStruct,
    ) -> Result<
        tokio_rustls::rustls::client::danger::HandshakeSignatureValid,
        tokio_rustls::rustls::Error,
    > {
        let algs = tokio_rustls::rustls::crypto::ring::default_provider()
            .signature_verification_algorithms;
        tokio_rustls::rustls::crypto::verify_tls12_signature(message, cert, dss, &algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &tokio_rustls::rustls::pki_types::CertificateDer<'_>,
        dss: &tokio_rustls::rustls::DigitallySignedStruct,
    ) -> Result<
        tokio_rustls::rustls::client::danger::HandshakeSignatureValid,
        tokio_rustls::rustls::Error,
    > {
        let algs = tokio_rustls::rustls::crypto::ring::default_provider()
            .signature_verification_algorithms;
        tokio_rustls::rustls::crypto::verify_tls13_signature(message, cert, dss, &algs)
    }

    fn supported_verify_schemes(&self) -> Vec<tokio_rustls::rustls::SignatureScheme> {
        tokio_rustls::rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The admin listener's Prometheus text.
pub fn metrics_text(admin_port: u16) -> String {
    send_raw(
        admin_port,
        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .text()
}

/// The Prometheus text once counter `name` reaches `at_least`, or after
/// 5 s for the caller's assertion to show: for what the gateway counts
/// after the client already saw it happen.
pub fn metrics_reaching(admin_port: u16, name: &str, at_least: u64) -> String {
    let mut text = String::new();
    eventually(Duration::from_secs(5), || {
        text = metrics_text(admin_port);
        metric_value(&text, name) >= at_least
    });
    text
}

/// A counter's value in Prometheus text (`name` with its labels), 0 if
/// absent.
pub fn metric_value(text: &str, name: &str) -> u64 {
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A `redis-server` of our own, killed on drop.
pub struct Redis {
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl Redis {
    pub fn start() -> Redis {
        Redis::on(free_port(), &[])
    }

    pub fn on(port: u16, extra: &[&str]) -> Redis {
        Redis::try_on(port, extra).expect("redis-server did not listen")
    }

    /// A Redis Cluster node: its port and its cluster bus port (the port +
    /// 10 000, which may be taken by anyone's connection: it lies in the
    /// kernel's ephemeral range) both free, another pair tried if Redis
    /// could not bind them after all.
    pub fn cluster_node(extra: &[&str]) -> Redis {
        for _ in 0..5 {
            let port = free_port();
            let bus_free = std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok();
            if let Some(redis) = bus_free.then(|| Redis::try_on(port, extra)).flatten() {
                return redis;
            }
        }
        panic!("no Redis Cluster node could listen");
    }

    /// Starts on `port`; `None` if it does not listen within 10 s.
    pub fn try_on(port: u16, extra: &[&str]) -> Option<Redis> {
        let dir = tempfile::tempdir().expect("temp dir");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let child = spawn_redis(port, dir.path(), &extra)?;
        Some(Redis {
            port,
            child,
            _dir: dir,
            extra,
        })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts again on the same port (empty: nothing was saved).
    pub fn restart(&mut self) {
        self.kill9();
        self.child = spawn_redis(self.port, self._dir.path(), &self.extra)
            .expect("redis-server did not listen");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A `redis-server` on `port`, once it listens (`None`: not within 10 s;
/// it is killed).
pub fn spawn_redis(port: u16, dir: &std::path::Path, extra: &[String]) -> Option<Child> {
    let child = Command::new("redis-server")
        .arg("--port")
        .arg(port.to_string())
        .arg("--bind")
        .arg("127.0.0.1")
        .arg("--save")
        .arg("")
        .arg("--appendonly")
        .arg("no")
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (scripts/prereqs.sh installs it)");
    let mut child = child;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listens(child.id(), port) {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child)
}

/// A span as a test OTLP receiver decoded it (IDs in lowercase hex).
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_id: String,
    pub name: String,
    /// 2: server, 3: client (OTLP's `SpanKind`).
    pub kind: i32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: BTreeMap<String, String>,
    /// OTLP's status code: 0 unset, 2 error.
    pub status: i32,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// A test OTLP/HTTP collector on 127.0.0.1: every POST's body is decoded
/// as the real `ExportTraceServiceRequest` protobuf (opentelemetry-proto),
/// and answered 200.
pub struct OtlpReceiver {
    pub port: u16,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    /// Requests whose path or content type was not OTLP's.
    pub wrong: Arc<Mutex<Vec<String>>>,
}

impl OtlpReceiver {
    pub fn start() -> OtlpReceiver {
        let listener = StdListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let spans: Arc<Mutex<Vec<ReceivedSpan>>> = Arc::default();
        let wrong: Arc<Mutex<Vec<String>>> = Arc::default();
        let (into, wrong_into) = (Arc::clone(&spans), Arc::clone(&wrong));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (into, wrong_into) = (Arc::clone(&into), Arc::clone(&wrong_into));
                std::thread::spawn(move || otlp_connection(stream, &into, &wrong_into));
            }
        });
        OtlpReceiver { port, spans, wrong }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans of `trace_id` once at least `n` have arrived (within 10 s;
    /// batches leave every second).
    pub fn trace(&self, trace_id: &str, n: usize) -> Vec<ReceivedSpan> {
        let of = || -> Vec<ReceivedSpan> {
            let spans = self.spans.lock().unwrap();
            spans
                .iter()
                .filter(|s| s.trace_id == trace_id)
                .cloned()
                .collect()
        };
        eventually(Duration::from_secs(10), || of().len() >= n);
        of()
    }
}

fn otlp_connection(
    mut stream: TcpStream,
    into: &Mutex<Vec<ReceivedSpan>>,
    wrong: &Mutex<Vec<String>>,
) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use prost::Message;
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        let mut content_type = String::new();
        loop {
            let mut field = String::new();
            if reader.read_line(&mut field).unwrap_or(0) == 0 {
                return;
            }
            let field = field.trim_end();
            if field.is_empty() {
                break;
            }
            let (name, value) = field.split_once(':').unwrap_or((field, ""));
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().unwrap_or(0),
                "content-type" => content_type = value.trim().to_string(),
                _ => {}
            }
        }
        let mut body = vec![0u8; length];
        if std::io::Read::read_exact(&mut reader, &mut body).is_err() {
            return;
        }
        if !line.starts_with("POST /v1/traces HTTP/1.1") || content_type != "application/x-protobuf"
        {
            wrong
                .lock()
                .unwrap()
                .push(format!("{} {content_type}", line.trim_end()));
        }
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let text = |v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match v
            .as_ref()
            .and_then(|v| v.value.as_ref())
        {
            Some(Value::StringValue(s)) => s.clone(),
            Some(Value::IntValue(i)) => i.to_string(),
            Some(Value::BoolValue(b)) => b.to_string(),
            Some(Value::DoubleValue(d)) => d.to_string(),
            other => format!("{other:?}"),
        };
        match ExportTraceServiceRequest::decode(&body[..]) {
            Ok(request) => {
                let mut got = Vec::new();
                for rs in request.resource_spans {
                    let service = (rs.resource.iter())
                        .flat_map(|r| r.attributes.iter())
                        .find(|a| a.key == "service.name")
                        .map(|a| text(&a.value))
                        .unwrap_or_default();
                    for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                        got.push(ReceivedSpan {
                            service: service.clone(),
                            trace_id: hex(&span.trace_id),
                            span_id: hex(&span.span_id),
                            parent_id: hex(&span.parent_span_id),
                            name: span.name,
                            kind: span.kind,
                            start_ns: span.start_time_unix_nano,
                            end_ns: span.end_time_unix_nano,
                            attributes: (span.attributes.iter())
                                .map(|a| (a.key.clone(), text(&a.value)))
                                .collect(),
                            status: span.status.map_or(0, |s| s.code),
                        });
                    }
                }
                into.lock().unwrap().extend(got);
            }
            Err(e) => wrong.lock().unwrap().push(format!("undecodable: {e}")),
        }
        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    }
}

/// The `traceparent` a shard received, split: (trace ID, parent span ID,
/// flags).
pub fn traceparent_parts(value: &str) -> (String, String, String) {
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "{value}");
    assert_eq!(parts[0], "00", "{value}");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

/// The answer to a GET for the first tenant `gw` places on `resetter` (its
/// request reset there, then retried elsewhere).
pub fn retried_after_a_reset(gw: &Gateway, resetter: &Resetter) -> Response {
    for t in 0..60 {
        let before = resetter.received.load(Ordering::SeqCst);
        let r = gw.get(&format!("t{t}.localhost"), "/");
        if resetter.received.load(Ordering::SeqCst) > before {
            return r;
        }
    }
    panic!("no tenant placed on the resetting shard");
}

/// Serves each connection to loopback `port` (0: any) with `serve` on the
/// shared runtime until the sender returned is dropped (the listener and
/// every connection's task stop then); and the port bound. The same port
/// is retried a while: its last listener may still be closing.
pub fn serve_each<F, Fut>(port: u16, serve: F) -> (u16, tokio::sync::watch::Sender<()>)
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut bound = None;
    eventually(Duration::from_secs(5), || {
        bound = StdListener::bind(("127.0.0.1", port)).ok();
        bound.is_some()
    });
    let listener = bound.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    listener.set_nonblocking(true).expect("nonblocking");
    let (stop, stopped) = tokio::sync::watch::channel(());
    runtime().spawn(until_stopped(stopped.clone(), async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(until_stopped(stopped.clone(), serve(tcp)));
        }
    }));
    (port, stop)
}

/// Runs `work` until it ends or the sender of `stop` is dropped.
async fn until_stopped(
    mut stop: tokio::sync::watch::Receiver<()>,
    work: impl std::future::Future<Output = ()>,
) {
    tokio::select! {
        _ = work => {}
        _ = stop.changed() => {}
    }
}
