//! Heap allocations counted, for `benches/load/counts.sh` (only with the
//! `alloc-counts` feature): a global allocator that counts every
//! allocation (and reallocation) and the bytes it asked for, then hands
//! it to the real one. The counts are the metrics
//! `shardgate_heap_allocations_total` and
//! `shardgate_heap_allocated_bytes_total`; a build without the feature
//! has neither the allocator nor the metrics.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Allocations and reallocations made.
pub static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Bytes they asked for (a reallocation: its new size).
pub static BYTES: AtomicU64 = AtomicU64::new(0);

/// `A`, counted.
pub struct Counting<A>(pub A);

fn count(size: usize) {
    ALLOCATIONS.fetch_add(1, Relaxed);
    BYTES.fetch_add(size as u64, Relaxed);
}

// SAFETY: every call is passed on to `A` unchanged.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.dealloc(ptr, layout) }
    }
}
