//! The embedding example (`examples/embed.rs`) runs as another Pingora
//! server's proxy: shardgate's routing plus the embedder's own phase and
//! hooks.

mod common;
#[path = "../examples/embed.rs"]
mod embed;

use common::*;
use pingora::server::RunArgs;
use shardgate::config::Config;

#[test]
fn a_wrapping_proxy_adds_its_phase_around_shardgate() {
    let a = Backend::start("a");
    let port = free_port();
    let yaml = format!(
        "listen: [{{ addr: \"127.0.0.1:{port}\" }}]\nadmin: {{ addr: \"127.0.0.1:{}\" }}\nstate: false\n\
         shards:\n  - {{ id: a, url: \"{}\" }}\ndomains:\n  fallback_suffix: .localhost\n",
        free_port(),
        a.url()
    );
    let config = Config::parse(&yaml, None).unwrap();
    let server = embed::build_server(config).unwrap();
    std::thread::spawn(move || server.run(RunArgs::default()));
    assert!(eventually(std::time::Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    }));
    let r = send_raw(
        port,
        b"GET / HTTP/1.1\r\nHost: acme.localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-served-by"),
        Some("my-platform"),
        "the embedder's phase ran"
    );
    assert_eq!(r.header("x-shard"), Some("a"));
    assert_eq!(r.json()["tenant"], "acme", "shardgate's phases ran");
    let r = send_raw(
        port,
        b"GET / HTTP/1.1\r\nHost: expired-corp.localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 403, "the embedder's allow hook refused");
    assert_eq!(r.json()["decision"], "denied");
}
