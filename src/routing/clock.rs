//! Time for the routing core. Every rule that depends on time (token refill,
//! route duration) reads it through [`Clock`], so tests drive it by hand and
//! the gateway uses a monotonic clock that wall-clock steps cannot disturb.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A source of milliseconds. Values only need to be comparable with each
/// other: the routing core never mixes them with wall-clock time (the state
/// file converts, see `RouterSnapshot::shift_time`).
pub trait Clock: Send + Sync {
    /// Current time in milliseconds (fractions allowed).
    fn now_ms(&self) -> f64;
}

/// Monotonic milliseconds since the clock was created.
#[derive(Debug)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        MonotonicClock {
            origin: Instant::now(),
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
        self.origin.elapsed().as_secs_f64() * 1000.0
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
}
