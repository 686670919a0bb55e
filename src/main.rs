//! `shardgate -c FILE` runs the gateway; `shardgate -t -c FILE` checks the
//! configuration and exits. Pingora's own flags (`-d` daemon, `-u` graceful
//! upgrade) keep their meaning.

#[cfg(not(feature = "alloc-counts"))]
#[global_allocator]
static ALLOCATOR: shardgate::allocator::Mimalloc = shardgate::allocator::Mimalloc;

/// Every allocation counted (benches/load/counts.sh).
#[cfg(feature = "alloc-counts")]
#[global_allocator]
static ALLOCATOR: shardgate::alloc_counts::Counting<shardgate::allocator::Mimalloc> =
    shardgate::alloc_counts::Counting(shardgate::allocator::Mimalloc);

use shardgate::server::run_cli;
use std::process::ExitCode;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    run_cli(|builder| builder.build())
}
