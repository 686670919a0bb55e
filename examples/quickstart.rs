//! A ready-made local setup: three demo shards and shardgate in front of
//! them, with `conf/quickstart.yaml`. Run it, then:
//!
//! ```sh
//! curl http://acme.localhost:8080/          # which shard and tenant answered
//! curl http://beta.localhost:8080/hello
//! curl -i http://suspended.localhost:8080/  # 403 denied
//! curl -i http://nope.example:8080/ --resolve nope.example:8080:127.0.0.1  # 404
//! ```

#[path = "demo_shards.rs"]
mod demo_shards;
#[path = "common/grpc_echo_shard.rs"]
mod grpc_echo_shard;

use shardgate::config::Config;
use shardgate::proxy::hooks::DefaultHooks;
use shardgate::server::Shardgate;
use std::sync::Arc;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/quickstart.yaml");
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    // The demo shards run on their own runtime beside the gateway's.
    std::thread::spawn(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("demo runtime");
        rt.block_on(async {
            // The gRPC shard (`protocol: h2`): HTTP/2 with prior knowledge.
            match tokio::net::TcpListener::bind("127.0.0.1:3004").await {
                Ok(listener) => drop(tokio::spawn(grpc_echo_shard::serve(listener))),
                Err(e) => eprintln!("the gRPC demo shard (127.0.0.1:3004): {e}"),
            }
            demo_shards::serve(&[("shard-1", 3001), ("shard-2", 3002), ("shard-3", 3003)]).await
        });
    });
    println!(
        "shardgate quickstart: demo shards on 127.0.0.1:3001-3003, a gRPC echo shard on \
         127.0.0.1:3004, gateway on http://127.0.0.1:8080"
    );
    println!("try:  curl http://acme.localhost:8080/   (Ctrl-C to stop)");
    match Shardgate::build(config, None, Arc::new(DefaultHooks)) {
        Ok(gateway) => gateway.run(),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
