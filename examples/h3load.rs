//! An HTTP/3 load client for the benchmarks (`benches/load/http3.sh`):
//! neither h2load nor wrk speaks HTTP/3 here, so this one does, on quinn
//! and the h3 crate. CONNS connections, STREAMS requests in flight on
//! each, for SECS seconds (or REQUESTS requests per stream), GET or a POST
//! of BODY bytes; it prints one line: requests, errors, bytes read,
//! seconds, requests per second, MB/s.
//!
//!   cargo run --release --example h3load -- ADDR HOST PATH \
//!       [--conns 32] [--streams 10] [--secs 5] [--requests N] [--body BYTES] [--threads 1]
//!       [--hold SECS]   (the connections stay open, idle, that long after)
//!       [--print]       (each response's head and body, for a one-off request)
//!
//! Certificates are not verified (a benchmark against a local gateway).

use bytes::{Buf, Bytes};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_rustls::rustls;

/// What the run asks for.
struct Args {
    addr: SocketAddr,
    host: String,
    path: String,
    conns: usize,
    streams: usize,
    secs: f64,
    requests: Option<u64>,
    body: usize,
    threads: usize,
    /// Seconds the connections are held open, idle, after the run.
    hold: f64,
    /// Print each response's status, fields and body (a one-off request).
    print: bool,
}

fn args() -> Result<Args, String> {
    let mut raw = std::env::args().skip(1);
    let usage = "h3load ADDR HOST PATH [--conns N] [--streams N] [--secs S] [--requests N] [--body BYTES] [--threads N] [--hold S] [--print]";
    let addr = raw
        .next()
        .ok_or(usage)?
        .parse()
        .map_err(|e| format!("ADDR: {e}"))?;
    let host = raw.next().ok_or(usage)?;
    let path = raw.next().ok_or(usage)?;
    let mut args = Args {
        addr,
        host,
        path,
        conns: 32,
        streams: 10,
        secs: 5.0,
        requests: None,
        body: 0,
        threads: 1,
        hold: 0.0,
        print: false,
    };
    while let Some(flag) = raw.next() {
        if flag == "--print" {
            args.print = true;
            continue;
        }
        let value = raw.next().ok_or(format!("{flag} wants a value"))?;
        let number = |v: &str| v.parse::<f64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--conns" => args.conns = number(&value)? as usize,
            "--streams" => args.streams = number(&value)? as usize,
            "--secs" => args.secs = number(&value)?,
            "--requests" => args.requests = Some(number(&value)? as u64),
            "--body" => args.body = number(&value)? as usize,
            "--threads" => args.threads = number(&value)? as usize,
            "--hold" => args.hold = number(&value)?,
            other => return Err(format!("unknown flag {other}\n{usage}")),
        }
    }
    Ok(args)
}

/// Accepts any certificate: the gateway under test is local.
#[derive(Debug)]
struct AnyCert;

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// What the run counts.
#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
}

fn client_config() -> quinn::ClientConfig {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut tls = rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("quic tls");
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    // Room for a fast download.
    transport.stream_receive_window((16u32 << 20).into());
    transport.receive_window((32u32 << 20).into());
    config.transport_config(Arc::new(transport));
    config
}

/// One stream's loop: requests one after the other until the end.
async fn stream_loop(
    mut sender: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    args: Arc<Args>,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
) {
    let body = Bytes::from(vec![b'x'; args.body]);
    let mut done = 0u64;
    while !stop.load(Ordering::Relaxed) && args.requests.is_none_or(|n| done < n) {
        done += 1;
        match one(&mut sender, &args, &body).await {
            Ok(bytes) => {
                counts.requests.fetch_add(1, Ordering::Relaxed);
                counts.bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            Err(e) => {
                if args.print {
                    eprintln!("h3load: {e}");
                }
                counts.errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
}

/// One request; the body bytes read.
async fn one(
    sender: &mut h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    args: &Args,
    body: &Bytes,
) -> Result<u64, String> {
    let method = if args.body > 0 { "POST" } else { "GET" };
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("https://{}{}", args.host, args.path));
    if !body.is_empty() {
        req = req.header("content-length", body.len());
    }
    let req = req.body(()).map_err(|e| e.to_string())?;
    let mut stream = sender.send_request(req).await.map_err(|e| e.to_string())?;
    if !body.is_empty() {
        stream
            .send_data(body.clone())
            .await
            .map_err(|e| e.to_string())?;
    }
    stream.finish().await.map_err(|e| e.to_string())?;
    let head = stream.recv_response().await.map_err(|e| e.to_string())?;
    if !head.status().is_success() && !args.print {
        return Err(format!("status {}", head.status()));
    }
    if args.print {
        println!("{:?} {}", head.version(), head.status());
        for (name, value) in head.headers() {
            println!("{name}: {}", String::from_utf8_lossy(value.as_bytes()));
        }
        println!();
    }
    let mut read = 0u64;
    while let Some(mut data) = stream.recv_data().await.map_err(|e| e.to_string())? {
        read += data.remaining() as u64;
        if args.print {
            print!("{}", String::from_utf8_lossy(data.chunk()));
        }
        data.advance(data.remaining());
    }
    Ok(read)
}

async fn run(args: Arc<Args>) -> Result<(), String> {
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    let mut endpoints = Vec::new();
    let mut senders = Vec::new();
    for _ in 0..args.conns {
        let any: SocketAddr = match args.addr {
            SocketAddr::V4(_) => ([0, 0, 0, 0], 0).into(),
            SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let mut endpoint = quinn::Endpoint::client(any).map_err(|e| e.to_string())?;
        endpoint.set_default_client_config(client_config());
        let conn = endpoint
            .connect(args.addr, &args.host)
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let (mut driver, sender) = h3::client::new(h3_quinn::Connection::new(conn))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        for _ in 0..args.streams {
            let (sender, args, counts, stop) = (
                sender.clone(),
                Arc::clone(&args),
                Arc::clone(&counts),
                Arc::clone(&stop),
            );
            tasks.push(tokio::spawn(stream_loop(sender, args, counts, stop)));
        }
        endpoints.push(endpoint);
        senders.push(sender);
    }
    let begun = Instant::now();
    let all = futures_util::future::join_all(tasks);
    let _ = tokio::time::timeout(Duration::from_secs_f64(args.secs), all).await;
    stop.store(true, Ordering::Relaxed);
    let secs = begun.elapsed().as_secs_f64();
    if args.print {
        println!();
    }
    let requests = counts.requests.load(Ordering::Relaxed);
    let bytes = counts.bytes.load(Ordering::Relaxed);
    println!(
        "requests {requests} errors {} bytes {bytes} secs {secs:.3} rps {:.0} MB/s {:.1}",
        counts.errors.load(Ordering::Relaxed),
        requests as f64 / secs,
        bytes as f64 / secs / 1_048_576.0
    );
    if args.hold > 0.0 {
        println!("holding {} connections", senders.len());
        tokio::time::sleep(Duration::from_secs_f64(args.hold)).await;
    }
    drop(senders);
    Ok(())
}

fn main() {
    let args = match args() {
        Ok(args) => Arc::new(args),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
        .expect("runtime");
    if let Err(e) = runtime.block_on(run(args)) {
        eprintln!("h3load: {e}");
        std::process::exit(1);
    }
}
