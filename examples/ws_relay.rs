//! The two ends of `benches/load/ws-relay.sh`: a WebSocket echo server and
//! a client that relays messages through a proxy and times each round trip.
//!
//! ```text
//! cargo run --release --example ws_relay -- server PORT...
//! cargo run --release --example ws_relay -- client HOST:PORT CONNS SIZE SECS
//! ```
//!
//! The client opens CONNS WebSockets (`Host: t<i>.localhost`), then each
//! sends a binary message of SIZE bytes, waits for its echo, and sends the
//! next, for SECS seconds. It prints one line:
//! `RESULT messages=N secs=S p50_us=.. p99_us=.. failed=..`.

use futures_util::{SinkExt, StreamExt};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let code = match args.first().map(String::as_str) {
        Some("server") if args.len() > 1 => runtime.block_on(server(&args[1..])),
        Some("client") if args.len() == 5 => runtime.block_on(client(&args[1..])),
        _ => {
            eprintln!("usage: ws_relay server PORT... | ws_relay client HOST:PORT CONNS SIZE SECS");
            2
        }
    };
    std::process::exit(code);
}

async fn server(ports: &[String]) -> i32 {
    let mut listeners = Vec::new();
    for port in ports {
        match tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await {
            Ok(l) => listeners.push(l),
            Err(e) => {
                eprintln!("bind {port}: {e}");
                return 1;
            }
        }
    }
    for listener in listeners {
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let _ = tcp.set_nodelay(true);
                tokio::spawn(async move {
                    let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                        return;
                    };
                    while let Some(Ok(msg)) = ws.next().await {
                        if (msg.is_binary() || msg.is_text()) && ws.send(msg).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }
    std::future::pending::<()>().await;
    0
}

async fn client(args: &[String]) -> i32 {
    let (target, conns, size, secs) = (
        args[0].clone(),
        args[1].parse::<usize>().unwrap_or(0),
        args[2].parse::<usize>().unwrap_or(0),
        args[3].parse::<f64>().unwrap_or(0.0),
    );
    if conns == 0 || size == 0 || secs <= 0.0 {
        eprintln!("CONNS, SIZE and SECS must be positive");
        return 2;
    }
    let mut sockets = Vec::new();
    for i in 0..conns {
        let Ok(mut req) = format!("ws://{target}/relay").into_client_request() else {
            eprintln!("bad target {target}");
            return 2;
        };
        if let Ok(host) = format!("t{}.localhost", i % 1000).parse() {
            req.headers_mut().insert("host", host);
        }
        match tokio_tungstenite::connect_async(req).await {
            Ok((ws, _)) => sockets.push(ws),
            Err(e) => {
                eprintln!("connection {i}: {e}");
                return 1;
            }
        }
    }
    let payload = vec![0x5au8; size];
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = sockets
        .into_iter()
        .map(|mut ws| {
            let payload = payload.clone();
            tokio::spawn(async move {
                let mut times = Vec::new();
                let mut failed = 0u64;
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    if ws.send(Message::Binary(payload.clone())).await.is_err() {
                        failed += 1;
                        break;
                    }
                    match ws.next().await {
                        Some(Ok(Message::Binary(back))) if back.len() == payload.len() => {
                            times.push(sent.elapsed().as_micros() as u32);
                        }
                        _ => {
                            failed += 1;
                            break;
                        }
                    }
                }
                let _ = ws.close(None).await;
                (times, failed)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut failed = 0;
    for task in tasks {
        if let Ok((times, f)) = task.await {
            all.extend(times);
            failed += f;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "RESULT messages={} secs={elapsed:.2} p50_us={} p99_us={} failed={failed}",
        all.len(),
        pct(0.50),
        pct(0.99)
    );
    i32::from(failed > 0)
}
