//! Time for the routing core. Every rule that depends on time (token refill,
//! route duration) reads it through [`Clock`], so tests drive it by hand and
//! the gateway uses a monotonic clock that wall-clock steps cannot disturb.

use std::sync::atomic::{AtomicU64, Ordering};

/// A source of milliseconds. Values only need to be comparable with each
/// other: the routing core never mixes them with wall-clock time (the state
/// file converts, see `RouterSnapshot::shift_time`).
pub trait Clock: Send + Sync {
    /// Current time in milliseconds (fractions allowed): what buckets refill by.
    fn now_ms(&self) -> f64;

    /// A finer reading for measuring short durations (a route takes well
    /// under a microsecond). Defaults to [`Clock::now_ms`].
    fn precise_ms(&self) -> f64 {
        self.now_ms()
    }
}

/// Monotonic milliseconds since the clock was created.
///
/// `now_ms` reads the kernel's coarse monotonic clock (a few nanoseconds,
/// advancing once per scheduler tick, 1–4 ms): token refill then lags real
/// time by at most one tick and never runs ahead of it. `precise_ms` reads
/// the CPU's time-stamp counter (falling back to the OS clock) for measuring
/// route durations.
#[derive(Debug)]
pub struct MonotonicClock {
    coarse_origin: u64,
    fine: quanta::Clock,
    fine_origin: u64,
}

/// coarsetime ticks are 2^-32 s.
const MS_PER_COARSE_TICK: f64 = 1000.0 / 4_294_967_296.0;

impl MonotonicClock {
    pub fn new() -> Self {
        let fine = quanta::Clock::new();
        let fine_origin = fine.raw();
        MonotonicClock {
            coarse_origin: coarsetime::Instant::now_without_cache_update().as_ticks(),
            fine,
            fine_origin,
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_ms(&self) -> f64 {
        let now = coarsetime::Instant::now_without_cache_update().as_ticks();
        now.saturating_sub(self.coarse_origin) as f64 * MS_PER_COARSE_TICK
    }

    #[inline]
    fn precise_ms(&self) -> f64 {
        self.fine.delta_as_nanos(self.fine_origin, self.fine.raw()) as f64 * 1e-6
    }
}

/// A clock that only moves when told to: for tests and simulations.
#[derive(Debug, Default)]
pub struct ManualClock {
    bits: AtomicU64,
}

impl ManualClock {
    pub fn new(start_ms: f64) -> Self {
        ManualClock {
            bits: AtomicU64::new(start_ms.to_bits()),
        }
    }

    pub fn set(&self, ms: f64) {
        self.bits.store(ms.to_bits(), Ordering::SeqCst);
    }

    pub fn advance(&self, ms: f64) {
        let now = self.now_ms();
        self.set(now + ms);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> f64 {
        f64::from_bits(self.bits.load(Ordering::SeqCst))
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now_ms(&self) -> f64 {
        (**self).now_ms()
    }

    fn precise_ms(&self) -> f64 {
        (**self).precise_ms()
    }
}
