//! Shards named by host name follow their name (`upstream.dns_refresh_ms`):
//! the name moves from one address to another through `/etc/hosts`, which
//! the system's resolver reads at every lookup; when it stops resolving,
//! the last address stays and the failures are counted. Needs root (it
//! edits `/etc/hosts`, adding and removing one line of its own); skipped,
//! and says so, otherwise.

mod common;

use common::*;
use std::time::Duration;

/// One line of `/etc/hosts`, removed when dropped.
struct HostsLine {
    name: String,
}

impl HostsLine {
    /// Maps `name` to `ip`; `None` if `/etc/hosts` cannot be written.
    fn set(name: &str, ip: &str) -> Option<HostsLine> {
        let line = HostsLine {
            name: name.to_string(),
        };
        line.point(Some(ip)).then_some(line)
    }

    /// Rewrites the line (`None`: removes it), and any a killed run of
    /// this test left behind.
    fn point(&self, ip: Option<&str>) -> bool {
        use std::io::{Seek, Write};
        use std::os::fd::AsRawFd;
        // One suite at a time edits the file.
        let Ok(lock) = std::fs::File::create(std::env::temp_dir().join("shardgate-dns-test.lock"))
        else {
            return false;
        };
        // SAFETY: flock on a descriptor we own; released when it closes.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return false;
        }
        let Ok(text) = std::fs::read_to_string("/etc/hosts") else {
            return false;
        };
        let ours = |line: &str| {
            line.split_whitespace()
                .skip(1)
                .any(|n| n.ends_with(".dns-test.invalid"))
        };
        let mut kept: Vec<&str> = text.lines().filter(|l| !ours(l)).collect();
        let line = ip.map(|ip| format!("{ip} {}", self.name));
        kept.extend(line.as_deref());
        let new = kept.join("\n") + "\n";
        // In place (/etc/hosts may be a bind mount, which a rename would not
        // replace), and written whole before the file is cut to length:
        // an interrupted write leaves every line there.
        let Ok(mut file) = std::fs::OpenOptions::new().write(true).open("/etc/hosts") else {
            return false;
        };
        file.rewind().is_ok()
            && file.write_all(new.as_bytes()).is_ok()
            && file.set_len(new.len() as u64).is_ok()
    }
}

impl Drop for HostsLine {
    fn drop(&mut self) {
        self.point(None);
    }
}

#[test]
fn a_shard_named_by_host_name_follows_its_name_and_keeps_its_last_address() {
    let name = format!("shard-{}.dns-test.invalid", std::process::id());
    let Some(hosts) = HostsLine::set(&name, "127.0.0.1") else {
        eprintln!("skipped: /etc/hosts is not writable here (the test needs root)");
        return;
    };
    // Two shards' worth of backends on one port, at two loopback addresses.
    let first = Backend::at("first", "127.0.0.1", 0, |_| Reply::ok("first"));
    let Ok(second) = std::panic::catch_unwind(|| {
        Backend::at("second", "127.0.0.2", first.port(), |_| Reply::ok("second"))
    }) else {
        eprintln!("skipped: 127.0.0.2 cannot be bound here");
        return;
    };
    let url = format!("http://{name}:{}", first.port());
    let gw = Gateway::start(&config_yaml(
        "listen: [{ addr: \"127.0.0.1:{port}\" }]\nadmin: { addr: \"127.0.0.1:{admin}\" }\nstate: false\nupstream: { dns_refresh_ms: 200 }\nhealth: { interval_ms: 100000 }\n",
        &[("named", url)],
        "",
    ));
    assert_eq!(gw.get("t.localhost", "/").text(), "first");
    assert!(hosts.point(Some("127.0.0.2")));
    assert!(
        eventually(Duration::from_secs(5), || gw.get("t.localhost", "/").text()
            == "second"),
        "the shard did not follow its name"
    );
    // Idle connections to the old address are closed by the pools' sweep.
    drop(first);
    // The name stops resolving: the last address stays, failures count.
    assert!(hosts.point(None));
    assert!(eventually(Duration::from_secs(15), || {
        let text = metrics_text(gw.admin_port);
        metric_value(&text, "shardgate_dns_failures_total{shard=\"named\"}") >= 2
    }));
    assert_eq!(gw.get("t.localhost", "/").text(), "second");
    let shards = gw.admin("GET", "/v1/shards", None, None).json();
    assert_eq!(shards[0]["url"], format!("http://{name}:{}", second.port()));
}
