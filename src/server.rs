//! Builds the Pingora server from a validated configuration: Pingora's own
//! settings come from the `server:` section (one file, not two), then the
//! services — the proxy on its listeners, the admin API, the health
//! checker and the state writer. The state file is read before anything
//! serves, and written once more after the last request finished.

use crate::admin::AdminApi;
use crate::config::{Config, ServerSettings};
use crate::control::Control;
use crate::health::HealthChecker;
use crate::proxy::fast::FastPath;
use crate::proxy::head::{HeadGuard, HeadLimits};
use crate::proxy::hooks::GatewayHooks;
use crate::proxy::Gateway;
use crate::state::StateWriter;
use pingora::listeners::tls::TlsSettings;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use std::sync::Arc;

/// Pingora's `ServerConf` for these settings.
pub fn server_conf(settings: &ServerSettings, retry_attempts: u32) -> ServerConf {
    ServerConf {
        threads: settings.threads,
        pid_file: settings.pid_file.clone(),
        upgrade_sock: settings.upgrade_sock.clone(),
        daemon: settings.daemon,
        error_log: settings.error_log.clone(),
        user: settings.user.clone(),
        group: settings.group.clone(),
        working_directory: settings.working_directory.clone(),
        grace_period_seconds: Some(settings.grace_period_seconds),
        graceful_shutdown_timeout_seconds: Some(settings.graceful_shutdown_timeout_seconds),
        work_stealing: settings.work_stealing,
        listener_tasks_per_fd: settings.listener_tasks_per_fd,
        upstream_keepalive_pool_size: settings.upstream_keepalive_pool_size,
        ca_file: settings.ca_file.clone(),
        // Our retry rules decide; Pingora's loop only needs room for them
        // (plus the one retry after a stale pooled connection).
        max_retries: retry_attempts.max(1) as usize + 1,
        ..ServerConf::default()
    }
}

/// A configured, bootstrapped server and the state it shares.
pub struct Shardgate {
    pub server: Server,
    pub control: Arc<Control>,
}

impl Shardgate {
    /// Builds the server for `config`. `opt` carries Pingora's command-line
    /// flags (`-d`, `-u`); its `conf` must already be taken out.
    pub fn build(
        config: Config,
        opt: Option<Opt>,
        hooks: Arc<dyn GatewayHooks>,
    ) -> Result<Shardgate, String> {
        let conf = server_conf(&config.server, config.retry.attempts);
        let control = Arc::new(Control::new(config, hooks)?);
        if let Some(state) = &control.config.state {
            crate::state::load(&control, &state.path);
        }
        let mut server = Server::new_with_opt_and_conf(opt, conf);
        server.bootstrap();
        let limits = &control.config.limits;
        let gateway = Gateway::new(Arc::clone(&control));
        let fast = control
            .config
            .server
            .fast_path
            .then(|| FastPath::new(gateway.clone()));
        let proxy = HeadGuard::new(
            pingora_proxy::http_proxy(&server.configuration, gateway),
            HeadLimits {
                header_timeout: limits.header_timeout,
                max_header_bytes: limits.max_header_bytes,
                max_headers: limits.max_headers,
                keepalive_timeout: limits.keepalive_timeout,
            },
        )
        .with_fast_path(fast);
        let mut proxy = Service::new("shardgate".to_string(), proxy);
        for listener in &control.config.listen {
            let addr = listener.addr.to_string();
            // No read buffer under the client connection: `HeadGuard`
            // reads request heads into buffers of its own, and Pingora's
            // default 64 KiB per connection was most of an idle
            // WebSocket's memory.
            let mut endpoint =
                ListenerConfig::tcp(addr.clone()).l4_buffer(L4BufferSettings::default().read(0));
            if let Some((cert, key)) = &listener.tls {
                let tls =
                    TlsSettings::intermediate(&cert.to_string_lossy(), &key.to_string_lossy())
                        .map_err(|e| format!("listen {addr}: {e}"))?;
                endpoint = endpoint.tls(tls);
            }
            proxy.add_listener(endpoint);
        }
        server.add_service(proxy);
        let mut admin = Service::new(
            "shardgate admin".to_string(),
            AdminApi::new(Arc::clone(&control)),
        );
        admin.add_tcp(&control.config.admin.addr.to_string());
        server.add_service(admin);
        server.add_service(background_service(
            "shardgate health",
            HealthChecker::new(Arc::clone(&control)),
        ));
        if let Some(state) = &control.config.state {
            server.add_service(background_service(
                "shardgate state",
                StateWriter {
                    control: Arc::clone(&control),
                    path: state.path.clone(),
                    interval: state.interval,
                },
            ));
        }
        Ok(Shardgate { server, control })
    }

    /// Serves until told to stop (SIGTERM, SIGINT or SIGQUIT), writes the
    /// state file a last time, and exits.
    pub fn run(self) -> ! {
        let Shardgate { server, control } = self;
        server.run(RunArgs::default());
        if let Some(state) = &control.config.state {
            crate::state::save(&control, &state.path);
        }
        std::process::exit(0)
    }
}
