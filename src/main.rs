//! `shardgate -c FILE` runs the gateway; `shardgate -t -c FILE` checks the
//! configuration and exits. Pingora's own flags (`-d` daemon, `-u` graceful
//! upgrade) keep their meaning.

use pingora::server::configuration::Opt;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use shardgate::config::Config;
use shardgate::proxy::hooks::DefaultHooks;
use shardgate::server::Shardgate;
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    if std::env::args().any(|a| a == "-V" || a == "--version") {
        println!("shardgate {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let mut opt = Opt::parse_args();
    let Some(path) = opt.conf.take() else {
        eprintln!(
            "error: no configuration file: run `shardgate -c FILE` (or `-t -c FILE` to check one)"
        );
        return ExitCode::from(2);
    };
    let config = match Config::load(&path) {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::FAILURE;
        }
    };
    if opt.test {
        println!("{path}: configuration OK");
        return ExitCode::SUCCESS;
    }
    match Shardgate::build(config, Some(opt), Arc::new(DefaultHooks)) {
        Ok(gateway) => gateway.run(),
        Err(e) => {
            eprintln!("error: {path}: {e}");
            ExitCode::FAILURE
        }
    }
}
