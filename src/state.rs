//! The state file: what a restart must not forget. Token balances (with
//! wall-clock timestamps, so time spent down still refills), health and
//! drain state, region assignments and overrides, and the runtime changes
//! made through the admin API as a diff from the configuration — at start
//! the configuration is loaded, then the diff replayed, so edits to the
//! YAML still take effect. Written atomically (temp file, fsync, rename)
//! every `state.interval_ms` and at shutdown; read at start. A file that
//! cannot be read is moved aside and the gateway starts from the
//! configuration.

use crate::control::Control;
/// Where it lived before it moved into [`crate::control`].
pub use crate::control::RuntimeDiff;
use crate::routing::region::RegionSnapshot;
use crate::routing::RouterSnapshot;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The file's content.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateSnapshot {
    pub version: u32,
    /// Wall-clock milliseconds since the Unix epoch when it was written.
    pub written_at_ms: f64,
    /// Token timestamps in wall-clock milliseconds.
    pub router: RouterSnapshot,
    pub regions: Option<RegionSnapshot>,
    pub changes: RuntimeDiff,
}

fn wall_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Captures the state to persist. Tenants (and route buckets) whose
/// buckets are full are left out: restoring them is the same as not
/// knowing them; they are skipped before anything of them is copied, so
/// idle tenants cost the writer a look each. In cluster mode no tenant is
/// kept: a restore throws lease balances away (Redis holds the buckets;
/// a node opens a new lease), so the writer does not even look.
pub fn capture(control: &Control) -> StateSnapshot {
    let router = &control.router;
    // Full by each tenant's own plan.
    let plans = router.plans();
    let unfull = |e: &crate::limits::TenantEntry, state: &crate::limits::TenantState| {
        let limits = plans.limits_for(e.id());
        let b = &state.buckets;
        // Route buckets are judged below, by name.
        e.active() > 0 || b.tenant.tokens < limits.rate().tokens || !b.routes.is_empty()
    };
    let mut snap = router.snapshot_of(control.cluster.is_none().then_some(&unfull));
    snap.tenants.retain(|t| {
        let full = t.tokens.0 >= plans.limits_for(&t.tenant).rate().tokens;
        t.active > 0 || !full
    });
    snap.route_buckets.retain(|r| {
        let limits = plans.limits_for(&r.tenant);
        (limits.route_index(&r.route))
            .and_then(|i| limits.holds(i))
            .is_some_and(|rule| r.tokens.0 < rule.tokens)
    });
    // Clock domain → wall clock.
    let offset = wall_ms() - router.clock().now_ms();
    snap.shift_time(offset);
    StateSnapshot {
        version: 1,
        written_at_ms: wall_ms(),
        router: snap,
        regions: control.regions.as_ref().map(|d| d.snapshot()),
        changes: control.diff(),
    }
}

/// Applies a state snapshot to a control freshly built from the config.
pub fn apply(control: &Control, mut state: StateSnapshot) {
    control.apply_diff(&state.changes);
    let offset = control.router.clock().now_ms() - wall_ms();
    state.router.shift_time(offset);
    // Only shards that exist now get their health and drain state back.
    let set = control.router.shard_set();
    state
        .router
        .shards
        .retain(|s| set.get(s.shard.id.as_str()).is_some());
    control.router.restore(&state.router, true);
    if let (Some(directory), Some(regions)) = (&control.regions, &state.regions) {
        directory.restore(regions);
    }
}

/// Writes `bytes` to `path` atomically: a temp file beside it, fsync,
/// rename, fsync of the folder. Each call has its own temp file (pid and a
/// counter), so two writes can never mix their bytes in one file, and a
/// failed write removes its own.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("state"),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let written = write_synced(&tmp, bytes, slowed_for_tests(path))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::File::open(dir)?.sync_all()
}

/// Creates `tmp` (failing if it exists: it is this write's alone) with
/// `bytes`, synced to disk.
fn write_synced(tmp: &Path, bytes: &[u8], slow: Option<Duration>) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)?;
    match slow {
        None => f.write_all(bytes)?,
        Some(pause) => {
            for chunk in bytes.chunks(256) {
                f.write_all(chunk)?;
                std::thread::sleep(pause);
            }
        }
    }
    f.sync_all()
}

/// Debug builds only: `SHARDGATE_TEST_SLOW_STATE_WRITE=<ms>:<path>` makes
/// writes of that one file pause `ms` after every 256 bytes, so a test can
/// land a signal while a write is in flight. Release builds never read it.
fn slowed_for_tests(path: &Path) -> Option<Duration> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let knob = std::env::var("SHARDGATE_TEST_SLOW_STATE_WRITE").ok()?;
    let (ms, slowed) = knob.split_once(':')?;
    let ms = ms.parse::<u64>().ok()?.min(1_000);
    (Path::new(slowed) == path).then(|| Duration::from_millis(ms))
}

/// What reading the state file found.
#[derive(Debug)]
pub enum Loaded {
    /// No file: a first start.
    Missing,
    Restored,
    /// Unreadable or invalid: moved to the given path.
    MovedAside(PathBuf),
}

/// Reads the state file at start and applies it. Never fails: a bad file
/// is logged and moved to `<path>.corrupt-<unix seconds>`.
pub fn load(control: &Control, path: &Path) -> Loaded {
    remove_stale_temp_files(path);
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Loaded::Missing,
        Err(e) => return move_aside(path, &format!("cannot read it: {e}")),
    };
    match serde_json::from_slice::<StateSnapshot>(&text) {
        Ok(state) if state.version == 1 => {
            apply(control, state);
            log::info!("state restored from {}", path.display());
            Loaded::Restored
        }
        Ok(state) => move_aside(path, &format!("unknown version {}", state.version)),
        Err(e) => move_aside(path, &format!("invalid: {e}")),
    }
}

/// Removes the temporary files a process that died mid-write left beside
/// `path` ([`write_atomically`]'s `.<name>.tmp-<pid>-<n>`): those of a pid
/// no process has, or this process's own (a container starts under the
/// same pid every time, and a leftover would fail its exclusive create).
/// A live process's (the old one of a graceful upgrade, still draining)
/// are its to finish.
fn remove_stale_temp_files(path: &Path) {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("state");
    let prefix = format!(".{name}.tmp-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(pid) = (file.to_str())
            .and_then(|f| f.strip_prefix(&prefix))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = Path::new(&format!("/proc/{pid}")).exists();
        if pid == std::process::id() || !alive {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => log::warn!(
                    "removed {}, left by a write cut short",
                    entry.path().display()
                ),
                Err(e) => log::warn!("cannot remove {}: {e}", entry.path().display()),
            }
        }
    }
}

fn move_aside(path: &Path, why: &str) -> Loaded {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = PathBuf::from(format!("{}.corrupt-{secs}", path.display()));
    match std::fs::rename(path, &aside) {
        Ok(()) => log::error!(
            "state file {} {why}; moved to {} and starting from the configuration",
            path.display(),
            aside.display()
        ),
        Err(e) => log::error!(
            "state file {} {why}; could not move it aside ({e}); starting from the configuration",
            path.display()
        ),
    }
    Loaded::MovedAside(aside)
}

/// Saves the state now (logging, not failing, on error). Callers that
/// may run at once go through one [`StateFile`] instead.
pub fn save(control: &Control, path: &Path) {
    let state = capture(control);
    match serde_json::to_vec(&state) {
        Ok(bytes) => {
            if let Err(e) = write_atomically(path, &bytes) {
                log::error!("cannot write state file {}: {e}", path.display());
            }
        }
        Err(e) => log::error!("cannot encode state: {e}"),
    }
}

/// The state file of one server, written one save at a time: the last
/// save at shutdown waits for a periodic one in flight (on SIGINT Pingora
/// does not stop the background services before the last save runs), then
/// captures the state after it, and no periodic save follows it.
pub struct StateFile {
    control: Arc<Control>,
    path: PathBuf,
    /// Held for a whole save, capture included; `true` once the last save
    /// is done.
    closed: Mutex<bool>,
}

impl StateFile {
    pub fn new(control: Arc<Control>, path: PathBuf) -> StateFile {
        StateFile {
            control,
            path,
            closed: Mutex::new(false),
        }
    }

    /// A periodic save; nothing once the last save is done.
    pub fn save(&self) {
        let closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        if !*closed {
            save(&self.control, &self.path);
        }
    }

    /// The save at shutdown: after any save in flight, and the last one.
    pub fn save_last(&self) {
        let mut closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        if !*closed {
            save(&self.control, &self.path);
            *closed = true;
        }
    }

    /// [`StateFile::save_last`], waited for `deadline` at most: a disk
    /// that hangs (a stalled network mount) does not keep the process
    /// from exiting. The file is then the last whole save (every write
    /// goes through a temporary file, renamed once synced); the
    /// temporary file left behind is removed at the next start.
    pub fn save_last_within(self: &Arc<Self>, deadline: Duration) -> bool {
        let file = Arc::clone(self);
        let done = within(deadline, move || file.save_last());
        if !done {
            log::error!(
                "the last state save did not finish in {} s: exiting without it ({} holds \
                 the last whole save)",
                deadline.as_secs(),
                self.path.display()
            );
        }
        done
    }
}

/// How long the last save at shutdown may take.
pub const LAST_SAVE_DEADLINE: Duration = Duration::from_secs(30);

/// Runs `f` on a thread of its own; whether it finished within `deadline`
/// (if not, it runs on, and is abandoned when the process exits).
/// (No thread to be had: it runs here, with no deadline.)
fn within(deadline: Duration, f: impl FnOnce() + Send + 'static) -> bool {
    let (done, finished) = std::sync::mpsc::channel();
    let job = Arc::new(Mutex::new(Some(f)));
    let queued = Arc::clone(&job);
    let spawned = std::thread::Builder::new()
        .name("state-save".into())
        .spawn(move || {
            let f = queued.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(f) = f {
                f();
            }
            let _ = done.send(());
        });
    if spawned.is_err() {
        let f = job.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(f) = f {
            f();
        }
        return true;
    }
    finished.recv_timeout(deadline).is_ok()
}

/// The background service writing the state every interval and once more
/// when shutdown starts.
pub struct StateWriter {
    pub file: Arc<StateFile>,
    pub interval: Duration,
}

#[async_trait::async_trait]
impl BackgroundService for StateWriter {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => {
                    self.write().await;
                    return;
                }
                _ = tick.tick() => self.write().await,
            }
        }
    }
}

impl StateWriter {
    async fn write(&self) {
        let file = Arc::clone(&self.file);
        // fsync blocks: keep it off the runtime's worker threads.
        let _ = tokio::task::spawn_blocking(move || file.save()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::{Shard, ShardId};

    #[test]
    fn a_save_that_hangs_is_abandoned_at_its_deadline() {
        let started = std::time::Instant::now();
        assert!(!within(Duration::from_millis(100), || {
            std::thread::sleep(Duration::from_secs(5))
        }));
        assert!(started.elapsed() < Duration::from_secs(4));
        assert!(within(Duration::from_secs(5), || ()));
    }

    #[test]
    fn diff_records_net_changes() {
        let mut d = RuntimeDiff::default();
        d.shard_added(&Shard::new("x", "http://127.0.0.1:1"));
        d.shard_removed("x", false);
        assert!(d.shards_added.is_empty() && d.shards_removed.is_empty());
        d.shard_removed("cfg", true);
        assert_eq!(d.shards_removed, vec![ShardId::new("cfg")]);
        d.domain_put("App.Example.com:80", "t");
        d.domain_put("app.example.com", "u");
        assert_eq!(d.domains_put.len(), 1);
        assert_eq!(d.domains_put[0].tenant, "u");
        d.domain_deleted("app.example.com", false);
        assert!(d.domains_put.is_empty() && d.domains_deleted.is_empty());
        d.denied("a", false);
        d.undenied("a", false);
        assert!(d.deny_added.is_empty() && d.deny_removed.is_empty());
        d.undenied("cfg", true);
        assert_eq!(d.deny_removed, vec!["cfg".to_string()]);
    }

    #[test]
    fn temp_files_of_a_dead_write_are_removed_at_start_not_a_live_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let tmp = |pid: u32| dir.path().join(format!(".state.json.tmp-{pid}-0"));
        // pid_max is at most 2^22: no process has this one.
        let (dead, own, live) = (tmp(u32::MAX), tmp(std::process::id()), tmp(1));
        for file in [&dead, &own, &live] {
            std::fs::write(file, b"{ cut sho").unwrap();
        }
        remove_stale_temp_files(&path);
        assert!(!dead.exists() && !own.exists());
        assert!(live.exists(), "pid 1 is alive: its write is its own");
        write_atomically(&path, b"{}").unwrap();
    }

    #[test]
    fn atomic_write_replaces_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested").join("state.json");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let leftovers = std::fs::read_dir(path.parent().unwrap()).unwrap().count();
        assert_eq!(leftovers, 1, "no temp file left behind");
    }
}

/// The state writer in cluster mode.
#[cfg(test)]
mod cluster_tests {
    use crate::config::Config;
    use crate::control::Control;
    use crate::hooks::DefaultHooks;
    use std::sync::Arc;
    use std::time::Instant;

    fn control(cluster: bool) -> Control {
        let section = if cluster {
            "cluster: { redis: \"redis://127.0.0.1:1\", node_id: gw-1 }\n"
        } else {
            ""
        };
        let yaml = format!(
            "listen: [{{ addr: \"127.0.0.1:1\" }}]\nstate: false\n\
             shards: [{{ id: a, url: \"http://127.0.0.1:2\" }}]\n\
             domains: {{ fallback_suffix: .localhost }}\n\
             limits: {{ max_tracked_tenants: 200000, rate: {{ tokens: 5, refill_per_second: 0.001 }} }}\n{section}"
        );
        let config = Config::parse(&yaml, Some("test.yaml")).expect("config");
        Control::new(config, Arc::new(DefaultHooks)).expect("control")
    }

    /// `n` invented tenants as a cluster node keeps them once idle: a
    /// lease given back, its buckets emptied until Redis says how full.
    fn invent(control: &Control, n: usize) {
        let router = &control.router;
        for i in 0..n {
            let tenant = format!("invented-{i}");
            drop(router.acquire(&tenant, None));
            router.with_tenant(&tenant, |_, state| {
                state.buckets.tenant.tokens = 0.0;
                let slot = state.shared.get_or_insert_with(Box::default);
                slot.dormant = Some((0.0, 0.0));
            });
        }
    }

    /// The state writer's pass (capture and encoding), its time per tick.
    fn write_time(control: &Control) -> (std::time::Duration, usize) {
        let started = Instant::now();
        let mut bytes = 0;
        for _ in 0..5 {
            let state = super::capture(control);
            bytes = serde_json::to_vec(&state).map_or(0, |b| b.len());
        }
        (started.elapsed() / 5, bytes)
    }

    /// In cluster mode the state file holds no lease balance (a restore
    /// throws them away), and the writer does not look at idle tenants:
    /// its time does not grow with them.
    #[test]
    fn the_state_writer_keeps_no_lease_and_does_not_grow_with_idle_tenants() {
        let control = control(true);
        let (empty, _) = write_time(&control);
        invent(&control, 100_000);
        assert!(control.router.tenant_count() >= 100_000);
        let (full, bytes) = write_time(&control);
        eprintln!("state writer per tick, cluster: 0 tenants {empty:?}, 100 000 idle {full:?} ({bytes} bytes)");
        let state = super::capture(&control);
        assert!(state.router.tenants.is_empty(), "lease balances saved");
        assert!(state.router.route_buckets.is_empty());
        assert!(full < empty * 20 + std::time::Duration::from_millis(20));
    }
}
