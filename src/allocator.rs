//! The binary's allocator: mimalloc, asked for plain blocks whenever a
//! plain block has the alignment asked for.
//!
//! The `mimalloc` crate's allocator asks mimalloc for an aligned block on
//! every call (`mi_malloc_aligned`). mimalloc serves that from its free
//! lists only for blocks of up to 1 KiB; a larger one that is not a power
//! of two (a request's boxed state, a head or response buffer) takes its
//! over-allocating path, and freeing it takes the slow path for aligned
//! blocks: 3 such allocations per GET, about 450 instructions of its 30 000
//! (`benches/load/counts.sh`). Every mimalloc block is at least
//! word-aligned, so an alignment of up to 8 bytes needs nothing more than
//! `mi_malloc`; one of 16 is checked, and only a block that does not have
//! it is given back for an aligned one; a larger one is asked for aligned.

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// The alignment every mimalloc block has (its smallest block is a word).
const WORD: usize = std::mem::size_of::<usize>();

/// The alignment most plain mimalloc blocks have (all of 16 bytes and
/// more, whose sizes are multiples of 16): worth a try with a plain block.
/// A larger one (tokio's task cells ask for 128) goes straight to the
/// aligned entry point.
const MOSTLY: usize = 16;

/// mimalloc, plain blocks first.
pub struct Mimalloc;

/// A block of `layout`'s size and alignment from `plain` (mimalloc's
/// `mi_malloc` or `mi_zalloc`) when a plain block has that alignment,
/// else from `aligned` (the same, aligned).
///
/// # Safety
/// `layout.size()` is not zero (`GlobalAlloc`'s contract).
#[inline]
unsafe fn block(
    layout: Layout,
    plain: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    let (size, align) = (layout.size(), layout.align());
    // SAFETY: mimalloc's allocation functions take any size, and any
    // power-of-two alignment (a `Layout`'s); `mi_free` takes a block of
    // either.
    unsafe {
        if align <= WORD {
            return plain(size).cast();
        }
        if align > MOSTLY {
            return aligned(size, align).cast();
        }
        let p = plain(size);
        if p.is_null() || (p as usize) & (align - 1) == 0 {
            return p.cast();
        }
        mi_free(p);
        aligned(size, align).cast()
    }
}

// SAFETY: every block comes from mimalloc with the layout's size and at
// least its alignment (a plain block only when it has it), and goes back
// to mimalloc (`mi_free` frees aligned and plain blocks alike).
unsafe impl GlobalAlloc for Mimalloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract (a size that is not zero).
        unsafe { block(layout, mi_malloc, mi_malloc_aligned) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe { block(layout, mi_zalloc, mi_zalloc_aligned) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from mimalloc (the caller's contract).
        unsafe { mi_free(ptr.cast()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from mimalloc with `layout` (the caller's
        // contract); the aligned reallocation keeps a larger alignment.
        unsafe {
            match layout.align() <= WORD {
                true => mi_realloc(ptr.cast(), new_size).cast(),
                false => mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_has_its_alignment_and_size() {
        let a = Mimalloc;
        for size in [1, 7, 8, 24, 48, 100, 1000, 1025, 4096, 7360, 70_000] {
            for align in [1, 2, 8, 16, 32, 64, 4096] {
                let Ok(layout) = Layout::from_size_align(size, align) else {
                    continue;
                };
                // SAFETY: a non-zero size; each block is written within
                // its size, then freed once with its layout.
                unsafe {
                    for p in [a.alloc(layout), a.alloc_zeroed(layout)] {
                        assert!(!p.is_null());
                        assert_eq!(p as usize % align, 0, "size {size}, align {align}");
                        p.write_bytes(0xa5, size);
                        let grown = a.realloc(p, layout, size * 3);
                        assert_eq!(grown as usize % align, 0, "size {size}, align {align}");
                        assert_eq!(*grown.add(size - 1), 0xa5);
                        a.dealloc(grown, Layout::from_size_align_unchecked(size * 3, align));
                    }
                    let z = a.alloc_zeroed(layout);
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
