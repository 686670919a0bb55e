//! `server` and `listen`: the process Pingora runs and the sockets it
//! accepts on.

use super::{socket_addr, Checker};
use crate::config::raw::{RawListen, RawListenTls, RawServer};
use crate::config::{Cidr, Listener, ListenerTls, Scheme, ServerSettings};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub(super) fn check_server(c: &mut Checker<'_>, s: RawServer) -> ServerSettings {
    let threads = s.threads.unwrap_or(2);
    if threads == 0 {
        c.error("server.threads", "must be at least 1");
    }
    let listener_tasks_per_fd = s.listener_tasks_per_fd.unwrap_or(1);
    if listener_tasks_per_fd == 0 {
        c.error("server.listener_tasks_per_fd", "must be at least 1");
    }
    ServerSettings {
        threads,
        pid_file: s
            .pid_file
            .unwrap_or_else(|| "/tmp/shardgate.pid".to_string()),
        upgrade_sock: s
            .upgrade_sock
            .unwrap_or_else(|| "/tmp/shardgate_upgrade.sock".to_string()),
        daemon: s.daemon.unwrap_or(false),
        error_log: s.error_log,
        user: s.user,
        group: s.group,
        working_directory: s.working_directory.map(PathBuf::from),
        grace_period_seconds: s.grace_period_seconds.unwrap_or(5),
        graceful_shutdown_timeout_seconds: s.graceful_shutdown_timeout_seconds.unwrap_or(5),
        work_stealing: s.work_stealing.unwrap_or(true),
        fast_path: s.fast_path.unwrap_or(true),
        listener_tasks_per_fd,
        upstream_keepalive_pool_size: s.upstream_keepalive_pool_size.unwrap_or(1024),
        ca_file: s.ca_file,
    }
}

/// The listeners: TCP ones, and the UDP addresses of the `quic` ones.
pub(super) fn check_listen(
    c: &mut Checker<'_>,
    listen: Vec<RawListen>,
) -> (Vec<Listener>, Vec<SocketAddr>) {
    if listen.is_empty() {
        c.error("listen", "at least one listener is needed");
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut quic = Vec::new();
    for (i, l) in listen.into_iter().enumerate() {
        let field = format!("listen[{i}].addr");
        let Some(addr) = socket_addr(c, &field, &l.addr) else {
            continue;
        };
        // A TCP and a UDP listener may share an address (HTTP/3 on 443).
        if !seen.insert((addr, l.quic)) {
            c.error(field, format!("`{addr}` is listed twice"));
        }
        if l.quic {
            check_quic_listener(c, i, &l);
            quic.push(addr);
            continue;
        }
        let tls = match l.tls {
            None | Some(RawListenTls::Section(false)) => ListenerTls::Off,
            Some(RawListenTls::Section(true)) => ListenerTls::Section,
            Some(RawListenTls::Files(t)) => {
                for (name, path) in [("cert", &t.cert), ("key", &t.key)] {
                    if !Path::new(path).is_file() {
                        c.error(
                            format!("listen[{i}].tls.{name}"),
                            format!("`{path}`: no such file"),
                        );
                    }
                }
                ListenerTls::Files(PathBuf::from(t.cert), PathBuf::from(t.key))
            }
        };
        if l.redirect_https && tls.is_on() {
            c.error(
                format!("listen[{i}].redirect_https"),
                "a TLS listener cannot redirect to https: it is https",
            );
        }
        let proxy_protocol = check_proxy_protocol(c, i, l.proxy_protocol, l.proxy_protocol_from);
        out.push(Listener {
            addr,
            tls,
            redirect_https: l.redirect_https,
            proxy_protocol,
        });
    }
    (out, quic)
}

/// A `quic` listener: the `tls` section's certificates (`tls: true` may
/// say so), nothing TCP's.
fn check_quic_listener(c: &mut Checker<'_>, i: usize, l: &RawListen) {
    if let Some(RawListenTls::Files(_) | RawListenTls::Section(false)) = l.tls {
        c.error(
            format!("listen[{i}].tls"),
            "a `quic` listener serves the `tls` section's certificates: leave `tls` out or \
             say `true`",
        );
    }
    if l.redirect_https {
        c.error(
            format!("listen[{i}].redirect_https"),
            "not for a `quic` listener (it is https)",
        );
    }
    if l.proxy_protocol || l.proxy_protocol_from.is_some() {
        c.error(
            format!("listen[{i}].proxy_protocol"),
            "not for a `quic` listener: the PROXY protocol is TCP's",
        );
    }
}

/// `listen[i].proxy_protocol` and the peers it is taken from, which it
/// requires (a header from anyone would let anyone name any address).
fn check_proxy_protocol(
    c: &mut Checker<'_>,
    i: usize,
    on: bool,
    from: Option<Vec<String>>,
) -> Option<Vec<Cidr>> {
    let field = format!("listen[{i}].proxy_protocol_from");
    match (on, from) {
        (false, None) => None,
        (false, Some(_)) => {
            c.error(field, "set without `proxy_protocol: true`");
            None
        }
        (true, None) => {
            c.error(
                field,
                "required with `proxy_protocol`: the balancers' addresses (e.g. [10.0.0.0/8])",
            );
            None
        }
        (true, Some(blocks)) => {
            if blocks.is_empty() {
                c.error(&field, "at least one address block");
            }
            let mut out = Vec::new();
            for (j, block) in blocks.iter().enumerate() {
                match Cidr::parse(block) {
                    Ok(cidr) => out.push(cidr),
                    Err(e) => c.error(format!("{field}[{j}]"), e),
                }
            }
            Some(out)
        }
    }
}

/// `public_protocol`: the scheme clients used in front of shardgate, when a
/// load balancer ahead of it ends TLS.
pub(super) fn check_public_protocol(c: &mut Checker<'_>, protocol: Option<&str>) -> Option<Scheme> {
    protocol.and_then(|p| match p {
        "http" => Some(Scheme::Http),
        "https" => Some(Scheme::Https),
        other => {
            c.error(
                "public_protocol",
                format!("`{other}`: expected http or https"),
            );
            None
        }
    })
}
