//! Counters that every worker thread bumps on every request. Each thread
//! writes its own cache line (a stripe) and readers sum the stripes, so the
//! metrics never become the one line all cores fight over. A thread that
//! owns its stripe even counts without a locked instruction.

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

pub(crate) const STRIPES: usize = 16;

/// A thread's claim on a stripe. The first `STRIPES` threads alive at once
/// own one each (returned when the thread exits); any further thread shares
/// the overflow stripe `STRIPES` and counts atomically there.
struct StripeClaim {
    index: usize,
}

static FREE_STRIPES: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

impl StripeClaim {
    fn claim() -> Self {
        if let Some(index) = FREE_STRIPES.lock().pop() {
            return StripeClaim { index };
        }
        let next = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed);
        StripeClaim {
            index: next.min(STRIPES),
        }
    }
}

impl Drop for StripeClaim {
    fn drop(&mut self) {
        if self.index < STRIPES {
            // The mutex orders this thread's last writes before the next
            // owner's first.
            FREE_STRIPES.lock().push(self.index);
        }
    }
}

thread_local! {
    static STRIPE: StripeClaim = StripeClaim::claim();
}

/// This thread's stripe: `< STRIPES` if owned exclusively, `STRIPES` if
/// shared.
#[inline]
pub(crate) fn stripe() -> usize {
    STRIPE.try_with(|s| s.index).unwrap_or(STRIPES)
}

/// A monotonically increasing counter.
pub struct StripedCounter {
    cells: [CachePadded<AtomicU64>; STRIPES + 1],
}

impl StripedCounter {
    pub fn new() -> Self {
        StripedCounter {
            cells: std::array::from_fn(|_| CachePadded::new(AtomicU64::new(0))),
        }
    }

    #[inline]
    pub fn incr(&self) {
        let i = stripe();
        let cell = &self.cells[i];
        if i < STRIPES {
            // Only this thread writes this stripe: no read-modify-write
            // instruction needed.
            cell.store(cell.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        } else {
            cell.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn get(&self) -> u64 {
        self.cells.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

impl Default for StripedCounter {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for StripedCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.get())
    }
}

/// One stripe of a gauge. Guards hold an `Arc` to the stripe they bumped, so
/// even the reference count stays on the acquiring thread's cache line.
pub(crate) type GaugeCell = Arc<CachePadded<AtomicI64>>;

/// A live count (connections on a shard) that goes up and down, possibly on
/// different threads; the sum of the stripes is the value.
pub struct Gauge {
    cells: [GaugeCell; STRIPES + 1],
    /// Set by the first acquire: metrics list a gauge once it was used.
    touched: AtomicBool,
}

impl Gauge {
    pub fn new() -> Self {
        Gauge {
            cells: std::array::from_fn(|_| Arc::new(CachePadded::new(AtomicI64::new(0)))),
            touched: AtomicBool::new(false),
        }
    }

    /// Adds one on this thread's stripe and returns the stripe, to be handed
    /// to [`Gauge::release`] exactly once.
    #[inline]
    pub(crate) fn acquire(&self) -> GaugeCell {
        if !self.touched.load(Ordering::Relaxed) {
            self.touched.store(true, Ordering::Relaxed);
        }
        let cell = &self.cells[stripe()];
        cell.fetch_add(1, Ordering::Relaxed);
        Arc::clone(cell)
    }

    #[inline]
    pub(crate) fn release(cell: &GaugeCell) {
        cell.fetch_sub(1, Ordering::Relaxed);
    }

    /// Counts one until the ticket drops.
    pub fn ticket(&self) -> GaugeTicket {
        GaugeTicket(self.acquire())
    }

    /// Whether any admission was ever counted here.
    pub fn is_touched(&self) -> bool {
        self.touched.load(Ordering::Relaxed)
    }

    /// The live count; never reported below zero.
    pub fn get(&self) -> i64 {
        self.cells
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum::<i64>()
            .max(0)
    }

    /// Overwrites the value (restoring a snapshot). Guards taken before keep
    /// decrementing their stripes, as the reference's release does.
    pub(crate) fn set(&self, value: i64) {
        self.touched.store(true, Ordering::Relaxed);
        for (i, c) in self.cells.iter().enumerate() {
            c.store(if i == 0 { value } else { 0 }, Ordering::Relaxed);
        }
    }
}

/// One unit of a [`Gauge`], released when dropped.
pub struct GaugeTicket(GaugeCell);

impl Drop for GaugeTicket {
    fn drop(&mut self) {
        Gauge::release(&self.0);
    }
}

impl std::fmt::Debug for GaugeTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GaugeTicket")
    }
}

impl Default for Gauge {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Gauge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.get())
    }
}

/// The duration of a recent operation across all threads: each stripe
/// remembers when its last measured operation ended and how long it took.
/// Each thread measures its first operation and then one in
/// [`LastDuration::SAMPLE_EVERY`]: a second clock read on every route would
/// cost more than a tenth of the route itself.
pub struct LastDuration {
    cells: [CachePadded<(AtomicU64, AtomicU64)>; STRIPES + 1],
}

impl LastDuration {
    pub const SAMPLE_EVERY: u32 = 16;

    /// Whether this thread should measure its current operation.
    #[inline]
    pub fn sample(&self) -> bool {
        thread_local! {
            static COUNTDOWN: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
        }
        COUNTDOWN
            .try_with(|c| {
                let n = c.get();
                c.set(if n == 0 {
                    LastDuration::SAMPLE_EVERY - 1
                } else {
                    n - 1
                });
                n == 0
            })
            .unwrap_or(false)
    }

    pub fn new() -> Self {
        LastDuration {
            cells: std::array::from_fn(|_| {
                CachePadded::new((AtomicU64::new(0), AtomicU64::new(0)))
            }),
        }
    }

    #[inline]
    pub fn record(&self, ended_at_ms: f64, duration_ms: f64) {
        let cell = &self.cells[stripe()];
        cell.0.store(ended_at_ms.to_bits(), Ordering::Relaxed);
        cell.1.store(duration_ms.to_bits(), Ordering::Relaxed);
    }

    /// Milliseconds the latest recorded operation took (0 before any).
    pub fn get(&self) -> f64 {
        let mut latest = f64::NEG_INFINITY;
        let mut duration = 0.0;
        for c in &self.cells {
            let at = f64::from_bits(c.0.load(Ordering::Relaxed));
            let d = f64::from_bits(c.1.load(Ordering::Relaxed));
            let recorded = d.to_bits() != 0 || at.to_bits() != 0;
            if recorded && at >= latest {
                latest = at;
                duration = d;
            }
        }
        duration
    }
}

impl Default for LastDuration {
    fn default() -> Self {
        Self::new()
    }
}

/// A histogram of durations (seconds) with fixed bucket bounds; each thread
/// counts into its own stripe, readers add the stripes up.
pub struct StripedHistogram {
    bounds: &'static [f64],
    /// Per stripe: one count per bound, one for `+Inf`, then the sum in
    /// microseconds.
    cells: Box<[CachePadded<Box<[AtomicU64]>>]>,
}

/// A histogram's cumulative view, as Prometheus wants it.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramView {
    /// `(upper bound, cumulative count)`, without `+Inf`.
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum: f64,
}

impl StripedHistogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        StripedHistogram {
            bounds,
            cells: (0..=STRIPES)
                .map(|_| {
                    CachePadded::new(
                        (0..bounds.len() + 2)
                            .map(|_| AtomicU64::new(0))
                            .collect::<Box<[AtomicU64]>>(),
                    )
                })
                .collect(),
        }
    }

    #[inline]
    pub fn observe(&self, seconds: f64) {
        let i = stripe();
        let cells = &self.cells[i];
        let bucket = self
            .bounds
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(self.bounds.len());
        let micros = (seconds.max(0.0) * 1e6) as u64;
        let sum = &cells[self.bounds.len() + 1];
        if i < STRIPES {
            let c = &cells[bucket];
            c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            sum.store(sum.load(Ordering::Relaxed) + micros, Ordering::Relaxed);
        } else {
            cells[bucket].fetch_add(1, Ordering::Relaxed);
            sum.fetch_add(micros, Ordering::Relaxed);
        }
    }

    pub fn view(&self) -> HistogramView {
        let n = self.bounds.len();
        let mut counts = vec![0u64; n + 1];
        let mut sum_micros = 0u64;
        for cells in self.cells.iter() {
            for (i, c) in counts.iter_mut().enumerate() {
                *c += cells[i].load(Ordering::Relaxed);
            }
            sum_micros += cells[n + 1].load(Ordering::Relaxed);
        }
        let mut cumulative = 0;
        let buckets = self
            .bounds
            .iter()
            .zip(&counts)
            .map(|(b, c)| {
                cumulative += c;
                (*b, cumulative)
            })
            .collect();
        HistogramView {
            buckets,
            count: cumulative + counts[n],
            sum: sum_micros as f64 / 1e6,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_counts_cumulatively() {
        static BOUNDS: [f64; 3] = [0.01, 0.1, 1.0];
        let h = StripedHistogram::new(&BOUNDS);
        for s in [0.005, 0.05, 0.05, 0.5, 5.0] {
            h.observe(s);
        }
        let v = h.view();
        assert_eq!(v.buckets, vec![(0.01, 1), (0.1, 3), (1.0, 4)]);
        assert_eq!(v.count, 5);
        assert!((v.sum - 5.605).abs() < 1e-6);
    }

    #[test]
    fn counter_sums_across_threads() {
        let c = Arc::new(StripedCounter::new());
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || (0..1000).for_each(|_| c.incr()))
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(c.get(), 4000);
    }

    #[test]
    fn gauge_released_on_another_thread_sums_to_zero() {
        let g = Arc::new(Gauge::new());
        let cells: Vec<GaugeCell> = (0..10).map(|_| g.acquire()).collect();
        assert_eq!(g.get(), 10);
        std::thread::spawn(move || cells.iter().for_each(Gauge::release))
            .join()
            .unwrap();
        assert_eq!(g.get(), 0);
    }
}
