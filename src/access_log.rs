//! The access log (DESIGN §7): one line per request, refusals included,
//! as text (the historical `key=value` line) or JSON, to the process log or
//! to its own file.
//!
//! A file is written by its own thread: a request appends its line to a
//! shared buffer under a lock held for a copy, never for I/O, and the
//! thread writes the buffer out every [`FLUSH_EVERY`] (or sooner once it
//! holds [`FLUSH_AT`]). A buffer at [`MAX_PENDING`] drops lines and counts
//! them (`shardgate_access_log_dropped_total`): a slow or full disk never
//! blocks a request and never grows the process. SIGUSR1 reopens the file
//! (nginx's `reopen`), so logrotate can move it away.

use crate::capped::Capped;
use crate::summary::RequestSummary;
use crate::wire::text::escape_json;
use crate::wire::text::IpText;
use parking_lot::{Condvar, Mutex};
use pingora::protocols::l4::socket::SocketAddr;
use std::cell::Cell;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often the writer thread writes what is pending.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Pending bytes that wake the writer at once.
const FLUSH_AT: usize = 64 * 1024;
/// Pending bytes past which lines are dropped.
pub const MAX_PENDING: usize = 8 * 1024 * 1024;

/// Set by SIGUSR1; the writer reopens its file on its next round.
static REOPEN: AtomicBool = AtomicBool::new(false);

/// `log` (DESIGN §7): the access log's part of the configuration.
#[derive(Clone, Debug)]
pub struct LogConfig {
    /// Level of the per-request access log line; `None` = off.
    pub access: Option<log::Level>,
    pub access_format: AccessFormat,
    /// The access log's own file; `None`: the process log.
    pub access_path: Option<PathBuf>,
}

/// How an access log line reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessFormat {
    /// One line of `key=value` fields after the client and request line.
    Text,
    /// One JSON object per request (DESIGN §7).
    Json,
}

/// Where the access log goes, and how it reads.
pub struct AccessLog {
    /// `None`: off.
    level: Option<log::Level>,
    format: AccessFormat,
    file: Option<Arc<FileSink>>,
}

impl AccessLog {
    /// The access log `config` describes. A file is opened now (created
    /// if missing), as nginx does: before a daemon changes its directory
    /// or drops its privileges, so that the writer (started with the first
    /// line) holds it; SIGUSR1 reopens it by its absolute path.
    pub fn new(config: &LogConfig) -> Result<AccessLog, String> {
        let file = match (&config.access, &config.access_path) {
            (Some(_), Some(path)) => {
                let cannot = |e: std::io::Error| {
                    format!("log.access_path: cannot open {}: {e}", path.display())
                };
                let path = std::path::absolute(path).map_err(cannot)?;
                let file = open(&path).map_err(cannot)?;
                listen_for_reopen();
                Some(Arc::new(FileSink::new(path, file)))
            }
            _ => None,
        };
        Ok(AccessLog {
            level: config.access,
            format: config.access_format,
            file,
        })
    }

    /// A log that writes nothing.
    pub fn off() -> AccessLog {
        AccessLog {
            level: None,
            format: AccessFormat::Text,
            file: None,
        }
    }

    /// Whether a request's line would be written anywhere.
    pub fn enabled(&self) -> bool {
        match (self.level, &self.file) {
            (None, _) => false,
            (Some(_), Some(_)) => true,
            (Some(level), None) => log::log_enabled!(target: "shardgate::access", level),
        }
    }

    /// Writes the line of a request that ended at `ended` (its client's
    /// address also as `client`, for the JSON line's fast path).
    pub fn write(&self, summary: &RequestSummary<'_>, client: Option<&SocketAddr>, ended: Instant) {
        let Some(level) = self.level else {
            return;
        };
        let line = |out: &mut String| match self.format {
            AccessFormat::Text => text_line(out, summary),
            AccessFormat::Json => json_line(out, summary, client, wall_clock(ended)),
        };
        match &self.file {
            Some(file) => {
                let mut out = String::with_capacity(384);
                if self.format == AccessFormat::Text {
                    write_time(&mut out, wall_clock(ended));
                    out.push(' ');
                }
                line(&mut out);
                out.push('\n');
                file.push(out.as_bytes());
            }
            None if log::log_enabled!(target: "shardgate::access", level) => {
                let mut out = String::with_capacity(384);
                line(&mut out);
                log::log!(target: "shardgate::access", level, "{out}");
            }
            None => {}
        }
    }

    /// Lines dropped because the file's buffer was full (or the file could
    /// not be written).
    pub fn dropped(&self) -> u64 {
        self.file
            .as_ref()
            .map_or(0, |f| f.dropped.load(Ordering::Relaxed))
    }

    /// Writes out what is pending (at exit), unless the writer has been
    /// stuck in a write for a second. (A disk that hangs this write
    /// itself still holds the exit, as it would hold nginx's.)
    pub fn flush(&self) {
        if let Some(file) = &self.file {
            if let Some(mut out) = file.out.try_lock_for(Duration::from_secs(1)) {
                file.write_pending(&mut out);
            }
        }
    }
}

/// The file, its pending lines and its writer.
struct FileSink {
    path: PathBuf,
    pending: Mutex<Pending>,
    wake: Condvar,
    /// What only the writer touches (the writer thread, or a flush at
    /// exit): the file and the buffer it wrote last.
    out: Mutex<Out>,
    dropped: AtomicU64,
    writer: Once,
}

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    lines: u64,
}

struct Out {
    file: File,
    /// The buffer written last, empty, swapped in for the next lines (its
    /// capacity kept: no regrowth under the requests' lock).
    spare: Vec<u8>,
    /// A failed write left a line cut short: the next write starts on a
    /// line of its own.
    cut: bool,
}

impl FileSink {
    fn new(path: PathBuf, file: File) -> FileSink {
        FileSink {
            path,
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            out: Mutex::new(Out {
                file,
                spare: Vec::new(),
                cut: false,
            }),
            dropped: AtomicU64::new(0),
            writer: Once::new(),
        }
    }

    /// Queues one line (never waits for I/O).
    fn push(self: &Arc<Self>, line: &[u8]) {
        // Started with the first line, not before: a daemon forks after
        // the configuration is loaded, and a thread does not survive it.
        self.writer.call_once(|| {
            let sink = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("access-log".into())
                .spawn(move || sink.run());
            if let Err(e) = spawned {
                log::error!("access log: cannot start its writer: {e}");
            }
        });
        let mut pending = self.pending.lock();
        let wanted = pending.bytes.len() + line.len();
        if wanted > MAX_PENDING {
            drop(pending);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if wanted > pending.bytes.capacity() {
            // Doubling, but never past the bound.
            let grown = wanted.max(pending.bytes.capacity() * 2).min(MAX_PENDING);
            let more = grown - pending.bytes.len();
            pending.bytes.reserve_exact(more);
        }
        pending.bytes.extend_from_slice(line);
        pending.lines += 1;
        if pending.bytes.len() >= FLUSH_AT {
            self.wake.notify_one();
        }
    }

    /// The writer thread: every round, reopens the file if SIGUSR1 asked,
    /// and writes what is pending.
    fn run(&self) {
        loop {
            {
                let mut pending = self.pending.lock();
                if pending.bytes.len() < FLUSH_AT {
                    self.wake.wait_for(&mut pending, FLUSH_EVERY);
                }
            }
            let mut out = self.out.lock();
            if REOPEN.swap(false, Ordering::Relaxed) {
                match open(&self.path) {
                    Ok(file) => {
                        out.file = file;
                        // A line cut short stays in the old file.
                        out.cut = false;
                    }
                    // As nginx: the old file goes on being written.
                    Err(e) => log::error!(
                        "access log: cannot reopen {} (writing on to the file open before): {e}",
                        self.path.display()
                    ),
                }
            }
            self.write_pending(&mut out);
        }
    }

    /// Writes what is pending: the buffers are swapped under the lock,
    /// the write happens after it.
    fn write_pending(&self, out: &mut Out) {
        let lines = {
            let mut pending = self.pending.lock();
            if pending.bytes.is_empty() {
                return;
            }
            std::mem::swap(&mut pending.bytes, &mut out.spare);
            std::mem::take(&mut pending.lines)
        };
        if std::mem::take(&mut out.cut) && out.file.write_all(b"\n").is_err() {
            out.cut = true;
        }
        let bytes = std::mem::take(&mut out.spare);
        let mut written = 0;
        let failed = loop {
            match out.file.write(&bytes[written..]) {
                Ok(0) => break Some(std::io::Error::from(std::io::ErrorKind::WriteZero)),
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Some(e),
            }
            if written == bytes.len() {
                break None;
            }
        };
        if let Some(e) = failed {
            let rest = &bytes[written..];
            let lost = rest.iter().filter(|&&b| b == b'\n').count() as u64;
            // Nothing written: a line cut short before is still so.
            if written > 0 {
                out.cut = bytes[written - 1] != b'\n';
            }
            self.dropped.fetch_add(lost.min(lines), Ordering::Relaxed);
            log::error!(
                "access log: {lost} lines lost writing {}: {e}",
                self.path.display()
            );
        }
        out.spare = bytes;
        out.spare.clear();
    }
}

fn open(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Installs the SIGUSR1 handler (once): it only sets a flag the writer
/// reads. Without it SIGUSR1's default action would end the process.
fn listen_for_reopen() {
    static INSTALLED: Once = Once::new();
    extern "C" fn on_usr1(_: libc::c_int) {
        REOPEN.store(true, Ordering::Relaxed);
    }
    INSTALLED.call_once(|| {
        // SAFETY: the handler only stores to an atomic (async-signal-safe);
        // the sigaction struct is zeroed and then filled in.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()) != 0 {
                log::warn!("access log: cannot handle SIGUSR1: the file cannot be reopened");
            }
        }
    });
}

/// Today's text line (after the time in a file of its own): the client,
/// the request line, then `key=value` fields.
fn text_line(out: &mut String, s: &RequestSummary<'_>) {
    let _ = write!(
        out,
        "{} {} {} tenant={} shard={} decision={} status={} duration_ms={:.3} attempts={} request_id={}",
        s.client,
        Capped(&s.method, MAX_FIELD_BYTES),
        Capped(s.target, MAX_FIELD_BYTES),
        Capped(&s.tenant.unwrap_or("-"), MAX_FIELD_BYTES),
        s.shard.map_or("-", |s| s.as_str()),
        s.decision.map_or("-", |d| d.as_str()),
        s.status,
        s.duration.as_secs_f64() * 1000.0,
        s.attempts,
        Capped(&s.request_id, MAX_FIELD_BYTES),
    );
    if let Some(status) = s.grpc_status {
        let _ = write!(out, " grpc_status={status}");
    }
}

/// The wall-clock time at `now`: read once a second per thread, and moved
/// on by the monotonic clock the request's end was read with (a line costs
/// no clock read of its own).
fn wall_clock(now: Instant) -> SystemTime {
    thread_local! {
        static ANCHOR: Cell<Option<(Instant, SystemTime)>> = const { Cell::new(None) };
    }
    ANCHOR.with(|anchor| match anchor.get() {
        Some((at, wall)) if now >= at && now - at < Duration::from_secs(1) => wall + (now - at),
        _ => {
            let wall = SystemTime::now();
            anchor.set(Some((now, wall)));
            wall
        }
    })
}

/// One JSON object (DESIGN §7's fields, in its order).
fn json_line(
    out: &mut String,
    s: &RequestSummary<'_>,
    client: Option<&SocketAddr>,
    now: SystemTime,
) {
    out.push_str("{\"time\":\"");
    write_time(out, now);
    out.push_str("\",\"request_id\":");
    json_str(out, s.request_id);
    out.push_str(",\"client\":");
    match client.and_then(|c| c.as_inet()) {
        // The common case, without a formatter: `ip:port` (IPv6 in brackets).
        Some(inet) => {
            let ip = IpText::of(inet.ip());
            out.push('"');
            if inet.is_ipv6() {
                out.push('[');
                out.push_str(ip.as_str());
                out.push(']');
            } else {
                out.push_str(ip.as_str());
            }
            out.push(':');
            out.push_str(itoa::Buffer::new().format(inet.port()));
            out.push('"');
        }
        None => json_display(out, s.client),
    }
    out.push_str(",\"method\":");
    json_str(out, s.method);
    out.push_str(",\"path\":");
    json_display(out, s.target);
    out.push_str(",\"host\":");
    json_opt(out, s.host);
    out.push_str(",\"tenant\":");
    json_opt(out, s.tenant);
    out.push_str(",\"shard\":");
    json_opt(out, s.shard.map(|s| s.as_str()));
    out.push_str(",\"decision\":");
    json_opt(out, s.decision.map(|d| d.as_str()));
    let mut digits = itoa::Buffer::new();
    out.push_str(",\"status\":");
    out.push_str(digits.format(s.status));
    if let Some(status) = s.grpc_status {
        out.push_str(",\"grpc_status\":");
        out.push_str(digits.format(status));
    }
    out.push_str(",\"bytes_in\":");
    out.push_str(digits.format(s.bytes_in));
    out.push_str(",\"bytes_out\":");
    out.push_str(digits.format(s.bytes_out));
    // Milliseconds with three decimals, from whole microseconds.
    let micros = s.duration.as_micros();
    out.push_str(",\"duration_ms\":");
    out.push_str(digits.format(micros / 1000));
    out.push('.');
    push_padded(out, (micros % 1000) as u32, 3);
    out.push_str(",\"attempts\":");
    out.push_str(digits.format(s.attempts));
    out.push_str(",\"protocol\":\"");
    out.push_str(s.protocol);
    out.push_str("\",\"trace_id\":");
    json_opt(out, s.trace_id);
    out.push('}');
}

fn json_opt(out: &mut String, value: Option<&str>) {
    match value {
        Some(v) => json_str(out, v),
        None => out.push_str("null"),
    }
}

/// A value's text as a JSON string, escaped as it is written (no copy),
/// at most [`MAX_FIELD_BYTES`] of it.
fn json_display(out: &mut String, value: &dyn std::fmt::Display) {
    out.push('"');
    let _ = write!(Escaped(out), "{}", Capped(value, MAX_FIELD_BYTES));
    out.push('"');
}

/// A JSON string (the answers' escaping rule), at most
/// [`MAX_FIELD_BYTES`] of it.
fn json_str(out: &mut String, value: &str) {
    json_display(out, &value);
}

/// The most a log line keeps of one field a client chose (its path, Host,
/// tenant, method, request ID): a line, and the pending buffer, stay
/// bounded in bytes whatever a client sends.
pub const MAX_FIELD_BYTES: usize = 4096;

/// Writes into a JSON string's inside, escaping.
struct Escaped<'a>(&'a mut String);

impl std::fmt::Write for Escaped<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        escape_json(self.0, s);
        Ok(())
    }
}

/// RFC 3339 in UTC with milliseconds: `2026-12-03T21:30:59.123Z`.
fn write_time(out: &mut String, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, (secs % 86_400) as u32);
    let (year, month, day) = civil_from_days(days as i64);
    push_padded(out, year.clamp(0, 9999) as u32, 4);
    out.push('-');
    push_padded(out, month, 2);
    out.push('-');
    push_padded(out, day, 2);
    out.push('T');
    push_padded(out, rest / 3600, 2);
    out.push(':');
    push_padded(out, rest / 60 % 60, 2);
    out.push(':');
    push_padded(out, rest % 60, 2);
    out.push('.');
    push_padded(out, since.subsec_millis(), 3);
    out.push('Z');
}

/// `n` in decimal with leading zeros to `width` digits.
fn push_padded(out: &mut String, n: u32, width: usize) {
    let mut digits = itoa::Buffer::new();
    let text = digits.format(n);
    for _ in text.len()..width {
        out.push('0');
    }
    out.push_str(text);
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capped::CUT;
    use crate::routing::{Decision, ShardId};

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        let at = |secs: u64, millis: u64| {
            let mut s = String::new();
            write_time(
                &mut s,
                UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis),
            );
            s
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(at(1_796_333_459, 123), "2026-12-03T21:30:59.123Z");
        assert_eq!(at(4_107_542_399, 999), "2100-02-28T23:59:59.999Z");
    }

    #[test]
    fn the_wall_clock_moves_with_the_monotonic_one() {
        let near = |a: SystemTime, b: SystemTime| {
            let gap = a.duration_since(b).or_else(|e| Ok::<_, ()>(e.duration()));
            gap.is_ok_and(|g| g < Duration::from_millis(50))
        };
        let start = Instant::now();
        assert!(near(wall_clock(start), SystemTime::now()));
        std::thread::sleep(Duration::from_millis(20));
        // Read off the anchor, 20 ms on.
        assert!(near(wall_clock(Instant::now()), SystemTime::now()));
        assert!(wall_clock(Instant::now()) > wall_clock(start));
    }

    #[test]
    fn json_lines_parse_and_escape_what_clients_send() {
        let shard = ShardId::from("s-1");
        let summary = RequestSummary {
            request_id: "abc",
            client: &"127.0.0.1:5000",
            method: "GET",
            target: &"/a\"b\\c\u{1}?q=\n",
            host: Some("app.acme.test"),
            tenant: Some("acme"),
            shard: Some(&shard),
            decision: Some(Decision::Allow),
            status: 200,
            duration: Duration::from_micros(1500),
            attempts: 1,
            failure: None,
            bytes_in: 3,
            bytes_out: 12,
            protocol: "HTTP/1.1",
            trace_id: None,
            grpc_status: None,
        };
        let mut line = String::new();
        json_line(&mut line, &summary, None, UNIX_EPOCH);
        let v: serde_json::Value = serde_json::from_str(&line).expect(&line);
        assert_eq!(v["client"], "127.0.0.1:5000", "through Display");
        for (addr, shown) in [("10.1.2.3:443", "10.1.2.3:443"), ("[::1]:80", "[::1]:80")] {
            let inet = SocketAddr::Inet(addr.parse().expect("address"));
            let mut line = String::new();
            json_line(&mut line, &summary, Some(&inet), UNIX_EPOCH);
            let v: serde_json::Value = serde_json::from_str(&line).expect(&line);
            assert_eq!(v["client"], shown, "the fast path");
        }
        assert!(line.contains("\"duration_ms\":1.500,"), "{line}");
        assert_eq!(v["time"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["request_id"], "abc");
        assert_eq!(v["path"], "/a\"b\\c\u{1}?q=\n");
        assert_eq!(v["host"], "app.acme.test");
        assert_eq!(v["shard"], "s-1");
        assert_eq!(v["decision"], "allow");
        assert_eq!(v["status"], 200);
        assert_eq!(v["bytes_in"], 3);
        assert_eq!(v["bytes_out"], 12);
        assert_eq!(v["duration_ms"], 1.5);
        assert_eq!(v["protocol"], "HTTP/1.1");
        assert!(v["trace_id"].is_null());
        let refused = RequestSummary {
            shard: None,
            decision: None,
            tenant: None,
            host: None,
            ..summary
        };
        let mut line = String::new();
        json_line(&mut line, &refused, None, UNIX_EPOCH);
        let v: serde_json::Value = serde_json::from_str(&line).expect(&line);
        for field in ["shard", "decision", "tenant", "host"] {
            assert!(v[field].is_null(), "{field}");
        }
        assert!(
            !line.contains("grpc_status"),
            "only when there is one: {line}"
        );
        // A gRPC call's answer: its status beside the HTTP one.
        let grpc = RequestSummary {
            grpc_status: Some(8),
            ..refused
        };
        let mut line = String::new();
        json_line(&mut line, &grpc, None, UNIX_EPOCH);
        let v: serde_json::Value = serde_json::from_str(&line).expect(&line);
        assert_eq!(
            (v["status"].as_u64(), v["grpc_status"].as_u64()),
            (Some(200), Some(8))
        );
        let mut text = String::new();
        text_line(&mut text, &grpc);
        assert!(text.ends_with(" grpc_status=8"), "{text}");
    }

    #[test]
    fn what_a_client_sent_is_kept_up_to_a_bound() {
        let long = format!("/{}", "é".repeat(20_000));
        let shown = Capped(&long, 1024).to_string();
        assert!(shown.len() <= 1024 + CUT.len(), "{}", shown.len());
        assert!(shown.ends_with(CUT) && long.starts_with(&shown[..shown.len() - CUT.len()]));
        assert_eq!(Capped(&"/short", 1024).to_string(), "/short");
        assert_eq!(Capped(&"/exact", 6).to_string(), "/exact");
        let summary = crate::summary::tests::client_strings(&long);
        let mut line = String::new();
        json_line(&mut line, &summary, None, UNIX_EPOCH);
        let v: serde_json::Value = serde_json::from_str(&line).expect(&line);
        for field in ["request_id", "method", "path", "host", "tenant"] {
            let kept = v[field].as_str().expect(field);
            assert!(kept.len() <= MAX_FIELD_BYTES + CUT.len(), "{field}");
            assert!(kept.ends_with(CUT), "{field}");
        }
        assert!(line.len() < 6 * (MAX_FIELD_BYTES + 8), "{}", line.len());
        let mut text = String::new();
        text_line(&mut text, &summary);
        assert!(text.len() < 5 * (MAX_FIELD_BYTES + 8), "{}", text.len());
    }
}
