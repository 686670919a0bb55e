//! A request's state, in a block reused per thread: the future that
//! serves one HTTP/1 request (5.9 KiB) is held apart from its
//! connection's, so that a connection idle between requests does not hold
//! it, and the block it is held in comes from this thread's free list and
//! goes back to the free list of the thread that ends the request (with
//! work stealing, not always the same one). A steady stream of requests
//! allocates none (it was the last allocation of a GET: mimalloc's slower
//! path, for a block over 1 KiB, and its free).
//!
//! Bounded as the buffers are ([`FreeList`]): at most 256 blocks of
//! [`BLOCK`]'s 8 KiB per thread (2 MiB), freed as the load stops needing
//! them. A future that does not fit one is
//! allocated on its own, as a `Box` would. A block is not cleared: the
//! bytes a future leaves unwritten in it are the last one's, unreadable
//! (a future reads only what it wrote).

use super::buffers::FreeList;
use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::cell::RefCell;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

/// A block's size and alignment: room for the request's state, with some
/// to spare (a future larger than it still works, allocated on its own);
/// aligned as the allocator's plain blocks are (a larger alignment takes
/// its slower path).
const BLOCK: Layout = match Layout::from_size_align(8192, 16) {
    Ok(layout) => layout,
    Err(_) => panic!("a block's layout"),
};

/// A block of [`BLOCK`]'s layout, freed when dropped.
struct Block(NonNull<u8>);

impl Block {
    fn new() -> Block {
        // SAFETY: BLOCK's size is not zero.
        let at = unsafe { alloc(BLOCK) };
        NonNull::new(at)
            .map(Block)
            .unwrap_or_else(|| handle_alloc_error(BLOCK))
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: allocated with BLOCK's layout (Block::new), and held by
        // this Block alone.
        unsafe { dealloc(self.0.as_ptr(), BLOCK) }
    }
}

/// Bytes of blocks kept per thread at most: 256 blocks.
const KEPT_BYTES: usize = 2 << 20;

thread_local! {
    static FREE: RefCell<FreeList<Block>> = const { RefCell::new(FreeList::new(KEPT_BYTES)) };
}

/// A future pinned in a block: as `Box::pin`, from this thread's free
/// list when the future fits a block.
pub struct InBlock<F> {
    at: NonNull<F>,
    /// In a block (else allocated with `F`'s own layout, or, sized zero,
    /// nowhere).
    pooled: bool,
    /// Owns an `F`: dropping it drops one.
    _owns: PhantomData<F>,
}

// SAFETY: an InBlock is the only holder of its F, as a Box is.
unsafe impl<F: Send> Send for InBlock<F> {}
// SAFETY: as above; a shared InBlock gives no access to its F.
unsafe impl<F: Sync> Sync for InBlock<F> {}
// Moving an InBlock moves the pointer, never its F (as a Box).
impl<F> Unpin for InBlock<F> {}

impl<F> InBlock<F> {
    pub fn new(future: F) -> InBlock<F> {
        let own = Layout::new::<F>();
        let pooled = own.size() <= BLOCK.size() && own.align() <= BLOCK.align();
        let at = match pooled {
            true => {
                let kept = FREE
                    .try_with(|free| free.borrow_mut().take())
                    .ok()
                    .flatten();
                let block = kept.unwrap_or_else(Block::new);
                let at = block.0.cast::<F>();
                std::mem::forget(block); // its memory is the InBlock's now
                at
            }
            // Sized zero (and aligned past a block): no memory at all.
            false if own.size() == 0 => NonNull::dangling(),
            // SAFETY: the size is above zero.
            false => NonNull::new(unsafe { alloc(own) })
                .unwrap_or_else(|| handle_alloc_error(own))
                .cast::<F>(),
        };
        // SAFETY: `at` is fresh memory with room and alignment for an F
        // (a block's are at least F's; a zero-sized F needs only a
        // dangling pointer aligned for it), owned by this InBlock from here.
        unsafe { at.as_ptr().write(future) };
        InBlock {
            at,
            pooled,
            _owns: PhantomData,
        }
    }
}

impl<F: Future> Future for InBlock<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: the F is never moved out of its memory: it is dropped
        // there (Drop), before the memory is freed or reused.
        unsafe { Pin::new_unchecked(&mut *self.at.as_ptr()) }.poll(cx)
    }
}

impl<F> Drop for InBlock<F> {
    fn drop(&mut self) {
        // SAFETY: the F written in `new`, dropped once, in place.
        unsafe { std::ptr::drop_in_place(self.at.as_ptr()) };
        if !self.pooled {
            let own = Layout::new::<F>();
            if own.size() > 0 {
                // SAFETY: allocated in `new` with F's layout.
                unsafe { dealloc(self.at.as_ptr().cast(), own) };
            }
            return;
        }
        // Its F gone, the block is a block again: kept, or freed.
        let block = Block(self.at.cast());
        let _ = FREE.try_with(|free| free.borrow_mut().keep(block, BLOCK.size()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    fn kept() -> usize {
        FREE.with(|free| free.borrow().len())
    }

    #[tokio::test]
    async fn a_block_given_back_is_the_next_one_taken() {
        let first = InBlock::new(async { 1 });
        let at = first.at.as_ptr() as usize;
        let before = kept();
        assert_eq!(first.await, 1);
        assert_eq!(kept(), before + 1);
        let second = InBlock::new(async {
            let held = [7u8; 4000];
            tokio::task::yield_now().await;
            held[3999]
        });
        assert_eq!(second.at.as_ptr() as usize, at);
        assert_eq!(kept(), before);
        assert_eq!(second.await, 7);
    }

    #[tokio::test]
    async fn a_future_larger_than_a_block_is_allocated_on_its_own() {
        let large = InBlock::new(async {
            let held = [9u8; 9000];
            tokio::task::yield_now().await;
            held[8999]
        });
        assert!(!large.pooled);
        assert_eq!(large.await, 9);
    }

    /// A future sized zero whose alignment is past a block's.
    #[repr(align(128))]
    struct Aligned;

    impl Future for Aligned {
        type Output = u8;

        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<u8> {
            Poll::Ready(5)
        }
    }

    #[tokio::test]
    async fn a_future_sized_zero_and_aligned_past_a_block_is_held_nowhere() {
        assert_eq!(std::mem::size_of::<Aligned>(), 0);
        let held = InBlock::new(Aligned);
        assert!(!held.pooled && held.at.as_ptr() as usize % 128 == 0);
        assert_eq!(held.await, 5);
    }

    #[test]
    fn its_future_is_dropped_with_it_once() {
        let held = Rc::new(());
        let future = {
            let held = held.clone();
            async move { drop(held) }
        };
        let boxed = InBlock::new(future);
        assert_eq!(Rc::strong_count(&held), 2);
        drop(boxed);
        assert_eq!(Rc::strong_count(&held), 1);
    }

    #[test]
    fn a_thread_keeps_at_most_kept_blocks() {
        std::thread::spawn(|| {
            let most = KEPT_BYTES / BLOCK.size();
            let many: Vec<_> = (0..most + 8).map(|_| InBlock::new(async {})).collect();
            drop(many);
            assert_eq!(kept(), most);
        })
        .join()
        .expect("the thread");
    }
}
