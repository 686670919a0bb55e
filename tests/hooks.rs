//! `GatewayHooks`' request check and response-head edit run on every
//! request, on both transports: the server is built in-process with the
//! builder, as an embedder that only needs hooks would, and each test runs
//! once with the fast transport and once through Pingora's proxy.

mod common;

use common::*;
use http::{HeaderName, HeaderValue};
use pingora::server::RunArgs;
use shardgate::config::Config;
use shardgate::proxy::hooks::{GatewayHooks, RequestCheck, RequestView, ResponseEdit};
use shardgate::routing::ShardId;
use shardgate::server::Shardgate;
use std::sync::Arc;
use std::time::Duration;

struct TestHooks;

impl GatewayHooks for TestHooks {
    fn check_request(&self, tenant: &str, request: &RequestView<'_>) -> RequestCheck {
        if request.header("x-forbidden").is_some() {
            return RequestCheck::Refuse {
                status: 451,
                body: format!("{{\"error\":\"forbidden\",\"tenant\":\"{tenant}\"}}"),
            };
        }
        if request.path.starts_with("/plan") {
            return RequestCheck::AddFields(vec![
                (
                    HeaderName::from_static("x-plan"),
                    HeaderValue::from_static("gold"),
                ),
                // Owned by shardgate: ignored.
                (
                    HeaderName::from_static("x-tenant-id"),
                    HeaderValue::from_static("someone-else"),
                ),
            ]);
        }
        RequestCheck::Proceed
    }

    fn edit_response(&self, tenant: &str, shard: &ShardId, response: &mut ResponseEdit) {
        response.insert(
            HeaderName::from_static("x-served"),
            HeaderValue::from_str(&format!("{tenant}@{shard}:{}", response.status()))
                .expect("text"),
        );
        response.remove(HeaderName::from_static("x-internal"));
    }
}

/// The in-process server on `backend`, fast transport as the test run
/// says (`SHARDGATE_TEST_FAST_PATH`).
fn start(backend: &Backend) -> u16 {
    let port = free_port();
    let yaml = config_yaml(
        &format!(
            "listen: [{{ addr: \"127.0.0.1:{port}\" }}]\nadmin: {{ addr: \"127.0.0.1:{}\" }}\nstate: false\n\
             server: {{ fast_path: {} }}\n",
            free_port(),
            fast_path_on()
        ),
        &[("a", backend.url())],
        "",
    );
    let config = Config::parse(&yaml, None).expect("config");
    let gateway = Shardgate::builder(config)
        .hooks(Arc::new(TestHooks))
        .build()
        .expect("build");
    std::thread::spawn(move || gateway.server.run(RunArgs::default()));
    assert!(eventually(Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    }));
    port
}

#[test]
fn a_request_check_refuses_before_routing_on_both_transports() {
    let a = Backend::with("a", |_| Reply::ok("fine"));
    let port = start(&a);
    let r = send_raw(
        port,
        b"GET / HTTP/1.1\r\nHost: acme.localhost\r\nX-Forbidden: 1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 451);
    assert_eq!(r.json()["tenant"], "acme");
    assert!(r.header("date").is_some());
    assert_eq!(a.count(), 0, "nothing went upstream");
}

#[test]
fn a_request_check_adds_upstream_fields_but_not_owned_ones() {
    let a = Backend::start("a");
    let port = start(&a);
    let r = send_raw(
        port,
        b"GET /plan HTTP/1.1\r\nHost: acme.localhost\r\nX-Plan: client\r\nX_Plan: look-alike\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    let seen = a.requests();
    let req = seen.last().expect("reached the shard");
    assert_eq!(req.header("x-plan"), Some("gold"), "{:?}", req.headers);
    assert_eq!(req.header_count("x-plan"), 1, "the client's is replaced");
    assert_eq!(req.header("x_plan"), None, "and so is its look-alike");
    assert_eq!(req.header_count("x-tenant-id"), 1);
    assert_eq!(req.header("x-tenant-id"), Some("acme"));
}

#[test]
fn a_response_edit_runs_on_every_proxied_response() {
    let a = Backend::with("a", |_| {
        Reply::Full(
            200,
            vec![("x-internal".into(), "secret".into())],
            b"fine".to_vec(),
        )
    });
    let port = start(&a);
    for raw in [
        &b"GET / HTTP/1.1\r\nHost: acme.localhost\r\nConnection: close\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nHost: acme.localhost\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    ] {
        let r = send_raw(port, raw);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-served"), Some("acme@a:200"));
        assert_eq!(r.header("x-internal"), None, "removed by the edit");
    }
}
