//! The pipeline's planning step (`Gateway::plan`: host → domain map →
//! request check → route prefix → route and admit), as both transports
//! call it, with the binary's hooks and with hooks that override the
//! request check and response edit with no-ops: the hooks' cost when not
//! overridden must not be measurable, and when overridden stays small.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use shardgate::config::Config;
use shardgate::control::Control;
use shardgate::proxy::ctx::RequestCtx;
use shardgate::proxy::hooks::{
    DefaultHooks, GatewayHooks, RequestCheck, RequestView, ResponseEdit,
};
use shardgate::proxy::Gateway;
use shardgate::routing::ShardId;
use std::sync::Arc;

const CONFIG: &str = "listen: [{ addr: \"127.0.0.1:1\" }]\nstate: false\n\
shards:\n  - { id: a, url: \"http://127.0.0.1:2\" }\n  - { id: b, url: \"http://127.0.0.1:3\" }\n\
domains:\n  fallback_suffix: .localhost\n";

/// Hooks that override the request check and the response edit, doing
/// nothing.
struct NoOpHooks;

impl GatewayHooks for NoOpHooks {
    fn check_request(&self, _tenant: &str, request: &RequestView<'_>) -> RequestCheck {
        black_box(request.method);
        RequestCheck::Proceed
    }

    fn edit_response(&self, _tenant: &str, _shard: &ShardId, response: &mut ResponseEdit) {
        black_box(response.status());
    }
}

fn gateway(hooks: Arc<dyn GatewayHooks>) -> Gateway {
    let config = Config::parse(CONFIG, None).expect("config");
    Gateway::new(Arc::new(Control::new(config, hooks).expect("control")))
}

fn bench_plan(c: &mut Criterion) {
    let fields: Vec<(&str, &[u8])> = vec![
        ("Host", b"tenant-7.localhost"),
        ("User-Agent", b"wrk"),
        ("Accept", b"*/*"),
    ];
    let view = RequestView::from_raw("GET", "/api/x?y=1", "/api/x", &fields);
    let mut group = c.benchmark_group("plan");
    for (name, hooks) in [
        (
            "default hooks",
            Arc::new(DefaultHooks) as Arc<dyn GatewayHooks>,
        ),
        ("no-op overridden hooks", Arc::new(NoOpHooks)),
    ] {
        let gw = gateway(hooks);
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut ctx = RequestCtx::default();
                let planned = gw.plan(black_box(&view), None, &mut ctx);
                black_box(planned.is_ok());
                // Dropping the context releases the admission.
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
