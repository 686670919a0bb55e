//! The PROXY protocol on listeners (DESIGN §10): the client a balancer's
//! header names is the client everywhere (here: the forwarding fields the
//! shard gets), over plain HTTP/1.1, TLS and HTTP/2; refused peers, a
//! missing, malformed or slow header close the connection. (scripts/test.sh
//! runs these on both transports.)

mod common;

use common::*;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

fn behind_balancer(backend: &Backend, from: &str, extra: &str) -> Gateway {
    behind_balancer_with_state(backend, from, "false", extra)
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: t.localhost\r\nConnection: close\r\n\r\n";

/// A v2 header (`command` 1: PROXY, 0: LOCAL) for TCP over IPv4.
fn v2(command: u8, source: [u8; 4], port: u16) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[0x20 | command, 0x11, 0, 12]);
    h.extend_from_slice(&source);
    h.extend_from_slice(&[127, 0, 0, 1]);
    h.extend_from_slice(&port.to_be_bytes());
    h.extend_from_slice(&443u16.to_be_bytes());
    h
}

/// A client connection whose first write carries a PROXY header in front
/// of the protocol's first bytes (a TLS ClientHello, the HTTP/2 preface),
/// as a balancer sends them: in one segment, read by the gateway at once.
struct Prefixed {
    tcp: tokio::net::TcpStream,
    /// Bytes taken from a write (the header and that write's), not yet
    /// sent; the header, until the first write.
    pending: Vec<u8>,
    header: Option<Vec<u8>>,
}

impl Prefixed {
    async fn connect(port: u16, header: &[u8]) -> Prefixed {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let header = Some(header.to_vec());
        Prefixed {
            tcp,
            pending: Vec::new(),
            header,
        }
    }

    /// Sends what is pending.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while !self.pending.is_empty() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.pending))?;
            self.pending.drain(..n);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if let Some(mut header) = this.header.take() {
            // Taken whole: sent with the header, now or at the next flush.
            header.extend_from_slice(buf);
            this.pending = header;
            return match this.poll_pending(cx) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Ready(Ok(buf.len())),
            };
        }
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// The last request's `X-Forwarded-For` at `backend`.
fn forwarded_for(backend: &Backend) -> String {
    let seen = backend.requests();
    let last = seen.last().expect("a request reached the shard");
    last.header("x-forwarded-for")
        .unwrap_or_default()
        .to_string()
}

/// Whether the gateway closes a connection that sent `bytes`, without an
/// answer, within `within`.
fn closed_unanswered(port: u16, bytes: &[u8], within: Duration) -> bool {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(within)).ok();
    let _ = stream.write_all(bytes);
    let mut answer = Vec::new();
    // Closed with the request unread, the socket may be reset instead.
    match stream.read_to_end(&mut answer) {
        Ok(_) => answer.is_empty(),
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset && answer.is_empty(),
    }
}

#[test]
fn the_client_a_header_names_is_the_client() {
    let backend = Backend::start("a");
    let gw = behind_balancer(&backend, "127.0.0.0/8", "");
    let v1 = [
        b"PROXY TCP4 203.0.113.7 127.0.0.1 5555 80\r\n".as_slice(),
        GET,
    ]
    .concat();
    assert_eq!(send_raw(gw.port, &v1).status, 200);
    assert_eq!(forwarded_for(&backend), "203.0.113.7");
    let v1 = [b"PROXY TCP6 2001:db8::7 ::1 5555 80\r\n".as_slice(), GET].concat();
    assert_eq!(send_raw(gw.port, &v1).status, 200);
    assert_eq!(forwarded_for(&backend), "2001:db8::7");
    // v2, the request in the same write as the header.
    let v2_request = [v2(1, [198, 51, 100, 9], 4000).as_slice(), GET].concat();
    assert_eq!(send_raw(gw.port, &v2_request).status, 200);
    assert_eq!(forwarded_for(&backend), "198.51.100.9");
    // LOCAL (the balancer's health check) and UNKNOWN keep the peer's.
    let local = [v2(0, [198, 51, 100, 9], 4000).as_slice(), GET].concat();
    assert_eq!(send_raw(gw.port, &local).status, 200);
    assert_eq!(forwarded_for(&backend), "127.0.0.1");
    let unknown = [b"PROXY UNKNOWN\r\n".as_slice(), GET].concat();
    assert_eq!(send_raw(gw.port, &unknown).status, 200);
    assert_eq!(forwarded_for(&backend), "127.0.0.1");
    // The header comes once: a keep-alive connection's next request is a
    // request, the same client's.
    let mut stream = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let keep = b"GET / HTTP/1.1\r\nHost: t.localhost\r\n\r\n";
    let first = [b"PROXY TCP4 192.0.2.1 127.0.0.1 1 80\r\n".as_slice(), keep].concat();
    stream.write_all(&first).expect("write");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    assert_eq!(read_response(&mut reader).expect("first").status, 200);
    stream.write_all(keep).expect("write");
    assert_eq!(read_response(&mut reader).expect("second").status, 200);
    assert_eq!(forwarded_for(&backend), "192.0.2.1");
    assert_eq!(backend.count(), 7);
}

#[test]
fn no_header_a_bad_one_or_a_peer_not_allowed_is_closed() {
    let backend = Backend::start("a");
    let gw = behind_balancer(
        &backend,
        "127.0.0.0/8",
        "limits: { header_timeout_ms: 500 }\n",
    );
    let second = Duration::from_secs(5);
    assert!(closed_unanswered(gw.port, GET, second), "no header");
    let bad = [b"PROXY TCP4 999.1.1.1 127.0.0.1 1 80\r\n".as_slice(), GET].concat();
    assert!(
        closed_unanswered(gw.port, &bad, second),
        "a malformed header"
    );
    // Half a header, then nothing: closed at the head's deadline.
    let began = Instant::now();
    assert!(
        closed_unanswered(gw.port, b"PROXY TCP4 203.0", second),
        "a slow header"
    );
    assert!(
        began.elapsed() >= Duration::from_millis(400),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(backend.count(), 0);
    // A header from a peer the listener does not take them from.
    let gw = behind_balancer(&backend, "10.0.0.0/8, \"fd00::/8\"", "");
    let v1 = [
        b"PROXY TCP4 203.0.113.7 127.0.0.1 5555 80\r\n".as_slice(),
        GET,
    ]
    .concat();
    assert!(
        closed_unanswered(gw.port, &v1, second),
        "a peer not allowed"
    );
    assert_eq!(backend.count(), 0);
}

/// What `shardgate -t` says of `yaml` (with a `domains` section): whether
/// it passed, and its errors.
fn checked(yaml: &str) -> (bool, String) {
    let dir = tempfile::tempdir().expect("dir");
    let conf = dir.path().join("shardgate.yaml");
    let yaml = format!("{yaml}domains: {{ fallback_suffix: .localhost }}\n");
    std::fs::write(&conf, yaml).expect("conf");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardgate"))
        .args(["-t", "-c"])
        .arg(&conf)
        .output()
        .expect("run");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn a_listener_taking_headers_must_say_from_whom() {
    let check = |listen: &str| {
        checked(&format!(
            "listen: [{{ addr: \"127.0.0.1:8080\", {listen} }}]
shards: [{{ id: a, url: \"http://127.0.0.1:9\" }}]
"
        ))
    };
    let (ok, err) = check("proxy_protocol: true");
    assert!(
        !ok && err.contains("listen[0].proxy_protocol_from"),
        "{err}"
    );
    let (ok, err) = check("proxy_protocol_from: [10.0.0.0/8]");
    assert!(
        !ok && err.contains("listen[0].proxy_protocol_from"),
        "{err}"
    );
    let (ok, err) = check("proxy_protocol: true, proxy_protocol_from: [10.0.0.0/33]");
    assert!(
        !ok && err.contains("listen[0].proxy_protocol_from[0]"),
        "{err}"
    );
    let (ok, err) = check("proxy_protocol: true, proxy_protocol_from: [10.0.0.0/8]");
    assert!(ok, "{err}");
}

/// The header comes before the TLS handshake (in the ClientHello's
/// segment); the client it names is the one behind TLS.
#[test]
fn a_tls_listener_reads_the_header_before_the_handshake() {
    use tokio_rustls::rustls;
    let backend = Backend::start("a");
    let dir = tempfile::tempdir().expect("dir");
    let (cert, crt, key) = self_signed_files(dir.path());
    let head = format!(
        "listen: [{{ addr: \"127.0.0.1:{{port}}\", tls: {{ cert: \"{}\", key: \"{}\" }}, \
         proxy_protocol: true, proxy_protocol_from: [127.0.0.1] }}]\n\
         admin: {{ addr: \"127.0.0.1:{{admin}}\" }}\nstate: false\n",
        crt.display(),
        key.display()
    );
    let gw = Gateway::start(&config_yaml(&head, &[("a", backend.url())], ""));
    let connector = connector_trusting(&cert);
    let port = gw.port;
    let answer = runtime().block_on(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tcp = Prefixed::connect(port, &v2(1, [198, 51, 100, 20], 4000)).await;
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let mut tls = connector.connect(name, tcp).await.expect("handshake");
        tls.write_all(GET).await.expect("write");
        let mut answer = Vec::new();
        let _ = tls.read_to_end(&mut answer).await;
        String::from_utf8_lossy(&answer).to_string()
    });
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(forwarded_for(&backend), "198.51.100.20");
}

/// HTTP/2 with prior knowledge after the header (the preface in its
/// segment): every stream's client is the one the header names.
#[test]
fn http2_streams_after_the_header_are_its_clients() {
    let backend = Backend::start("a");
    let gw = behind_balancer(&backend, "127.0.0.0/8", "");
    let port = gw.port;
    let statuses = runtime().block_on(async move {
        let header = b"PROXY TCP4 203.0.113.44 127.0.0.1 5555 80\r\n";
        let tcp = Prefixed::connect(port, header).await;
        let (send, conn) = h2::client::handshake(tcp).await.expect("handshake");
        tokio::spawn(conn);
        let mut statuses = Vec::new();
        for _ in 0..2 {
            let request = http::Request::get("http://t.localhost/")
                .body(())
                .expect("request");
            let mut send = send.clone().ready().await.expect("ready");
            let (response, _) = send.send_request(request, true).expect("send");
            statuses.push(response.await.expect("response").status().as_u16());
        }
        statuses
    });
    assert_eq!(statuses, [200, 200]);
    let seen = backend.requests();
    assert_eq!(seen.len(), 2);
    for request in &seen {
        assert_eq!(request.header("x-forwarded-for"), Some("203.0.113.44"));
    }
}

/// A shard that takes connections opening with a PROXY v2 header: answers
/// each request with the client the header named; counts connections that
/// opened with one (the gateway's health probes open none).
struct ProxiedShard {
    port: u16,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl ProxiedShard {
    fn start() -> ProxiedShard {
        use std::sync::atomic::AtomicUsize;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let connections = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&connections);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let counted = std::sync::Arc::clone(&counted);
                std::thread::spawn(move || serve_proxied(stream, &counted));
            }
        });
        ProxiedShard { port, connections }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// One connection: the v2 header (else closed, not counted), then
/// requests, each answered with the header's source address.
fn serve_proxied(mut stream: TcpStream, counted: &std::sync::atomic::AtomicUsize) {
    let mut fixed = [0u8; 16];
    if stream.read_exact(&mut fixed).is_err() || &fixed[..12] != b"\r\n\r\n\0\r\nQUIT\n" {
        return;
    }
    let mut rest = vec![0u8; usize::from(u16::from_be_bytes([fixed[14], fixed[15]]))];
    if stream.read_exact(&mut rest).is_err() {
        return;
    }
    let whole = [fixed.as_slice(), &rest].concat();
    let client = match ppp::v2::Header::try_from(whole.as_slice()).map(|h| h.addresses) {
        Ok(ppp::v2::Addresses::IPv4(a)) => format!("{}:{}", a.source_address, a.source_port),
        Ok(ppp::v2::Addresses::IPv6(a)) => format!("[{}]:{}", a.source_address, a.source_port),
        other => format!("{other:?}"),
    };
    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            match std::io::BufRead::read_line(&mut reader, &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => head.push_str(&line),
            }
        }
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{client}",
            client.len()
        );
        if stream.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// `proxy_protocol: v2` on a shard: each connection to it opens with a
/// header naming the client (here one a balancer's header named to the
/// gateway), and serves that client's one request (never pooled).
#[test]
fn a_shard_with_proxy_protocol_is_told_each_client() {
    if !fast_path_on() {
        // Pingora's path shares connections between clients: refused.
        return;
    }
    let shard = ProxiedShard::start();
    let head = "listen: [{ addr: \"127.0.0.1:{port}\", proxy_protocol: true, proxy_protocol_from: [127.0.0.1] }]\n\
                admin: { addr: \"127.0.0.1:{admin}\" }\nstate: false\n";
    let shards = format!(
        "shards: [{{ id: a, url: \"{}\", proxy_protocol: v2 }}]\n",
        shard.url()
    );
    let gw = Gateway::start(&format!(
        "{head}{shards}domains: {{ fallback_suffix: .localhost }}\n"
    ));
    let keep = b"GET / HTTP/1.1\r\nHost: t.localhost\r\n\r\n";
    for (client, port) in [("203.0.113.1", 1111), ("203.0.113.2", 2222)] {
        let mut stream = TcpStream::connect(("127.0.0.1", gw.port)).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
        let header = format!("PROXY TCP4 {client} 127.0.0.1 {port} 80\r\n");
        stream
            .write_all(&[header.as_bytes(), keep].concat())
            .expect("write");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        for i in 0..2 {
            if i > 0 {
                stream.write_all(keep).expect("write");
            }
            let r = read_response(&mut reader).expect("response");
            assert_eq!((r.status, r.text()), (200, format!("{client}:{port}")));
        }
    }
    // Four requests, four connections: none served another request.
    assert_eq!(shard.connections(), 4);
}

#[test]
fn a_shard_takes_proxy_protocol_v2_over_http1_on_the_fast_transport_only() {
    let check = |server: &str, shard: &str| {
        checked(&format!(
            "{server}listen: [{{ addr: \"127.0.0.1:8080\" }}]
shards: [{{ id: a, url: \"http://127.0.0.1:9\", {shard} }}]
"
        ))
    };
    assert!(check("", "proxy_protocol: v2").0);
    for (server, shard) in [
        ("", "proxy_protocol: v1"),
        ("", "proxy_protocol: v2, protocol: h2"),
        ("server: { fast_path: false }\n", "proxy_protocol: v2"),
    ] {
        let (ok, err) = check(server, shard);
        assert!(
            !ok && err.contains("shards[0].proxy_protocol"),
            "{shard}: {err}"
        );
    }
}

/// The admin API takes a shard's `proxy_protocol` by the configuration's
/// rule, and the shard it adds gets the header.
#[test]
fn the_admin_api_adds_a_shard_that_is_told_each_client() {
    if !fast_path_on() {
        return;
    }
    let shard = ProxiedShard::start();
    let gw = behind_balancer(&Backend::start("a"), "127.0.0.0/8", "");
    let add = |fields: &str| {
        let body = format!(
            "{{\"id\": \"p\", \"url\": \"{}\", \"tenants\": [\"p\"], {fields}}}",
            shard.url()
        );
        gw.admin("POST", "/v1/shards", Some(&body), None)
    };
    let refused = add("\"protocol\": \"h2\", \"proxy_protocol\": \"v2\"");
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert!(
        refused.text().contains("proxy_protocol"),
        "{}",
        refused.text()
    );
    assert_eq!(add("\"proxy_protocol\": \"v2\"").status, 201);
    let listed = gw.admin("GET", "/v1/shards", None, None).json();
    let added = listed
        .as_array()
        .and_then(|all| all.iter().find(|s| s["id"] == "p"));
    let added = added.expect("listed");
    assert_eq!(
        (added["protocol"].as_str(), added["proxy_protocol"].as_str()),
        (Some("http1"), Some("v2"))
    );
    let v1 = [
        b"PROXY TCP4 198.51.100.3 127.0.0.1 3333 80\r\n".as_slice(),
        b"GET / HTTP/1.1\r\nHost: p.localhost\r\nConnection: close\r\n\r\n",
    ]
    .concat();
    let r = send_raw(gw.port, &v1);
    assert_eq!((r.status, r.text()), (200, "198.51.100.3:3333".to_string()));
}
