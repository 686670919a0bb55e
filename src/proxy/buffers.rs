//! Buffers, reused per thread: a request's head buffer, the head the
//! shard receives, a response's read buffer, its field list and the head
//! the client receives come from this thread's free lists and go back to
//! them once used (the field list when the client's head is written, the
//! others when the exchange is over), so a steady stream of requests
//! allocates none of them (the larger ones were mimalloc's slower
//! allocations, over 1 KiB, with their frees). A connection idle between requests holds none: the
//! lists are the thread's.
//!
//! Bounded ([`FreeList`]): a list keeps at most [`KEPT`] items per thread,
//! and at most [`KEPT_BYTES`] of buffers (each counted as the largest
//! kept, [`LARGEST`]: a view's own room does not tell its block's size,
//! so 512 buffers), [`KEPT_VEC_BYTES`] of head vectors and of field lists
//! (each counted at its size) and 2 MiB of request blocks (`blocks.rs`):
//! 20 MiB a thread at most, beside blocks a kept view shares with a part
//! still alive elsewhere (see [`give`]). A buffer or head vector that
//! grew past [`LARGEST`] (a long head, a large body read) is freed, as a
//! field list of more than 256 fields is. With 32 buffers and blocks
//! kept, a thread serving 256 connections allocated again (4.4
//! allocations a GET); with these bounds, 0.7. What a burst left and the
//! load since has not needed is freed as the lists are used
//! ([`FreeList::take`]).

use bytes::{Bytes, BytesMut};
use std::cell::RefCell;
use std::ops::Range;
use std::thread::LocalKey;

/// Items a list keeps per thread at most (the buffer list's byte bound
/// keeps fewer buffers): 256 connections' requests on one thread (the
/// rig's most) hold up to three buffers each, some of them only briefly.
pub(crate) const KEPT: usize = 1024;

/// Bytes the buffer list keeps per thread at most: 512 buffers, each
/// counted as [`LARGEST`].
pub(crate) const KEPT_BYTES: usize = 16 << 20;

/// Bytes the head vectors, and the field lists, keep per thread at most.
const KEPT_VEC_BYTES: usize = 1 << 20;

/// Takes from a list between two looks at what it did not need.
const TRIM_EVERY: u32 = 4096;

/// The largest buffer kept, in bytes: a head read takes 4 KiB, a
/// shard's response 8 KiB, and a body read grows it by 16 KiB (beyond
/// the part already split off), to 24 KiB or so.
const LARGEST: usize = 32 * 1024;

/// A response head's fields, as ranges of its name and value in the head.
pub type FieldRanges = Vec<(Range<usize>, Range<usize>)>;

/// The most fields a kept list has room for (a response head's limit).
const MOST_FIELDS: usize = 256;

/// A thread's list of items to reuse, the last kept first: at most
/// [`KEPT`] items, of a bound's bytes in all. Every [`TRIM_EVERY`]
/// takes, the items none of them reached (the list never got that short)
/// are freed: after a burst, what the load no longer needs goes back to
/// the allocator (a thread that serves nothing more keeps what it holds,
/// within the bounds).
pub(crate) struct FreeList<T> {
    items: Vec<(T, usize)>,
    bytes: usize,
    /// The most bytes kept.
    most: usize,
    /// The fewest items the list held since the last trim.
    low: usize,
    takes: u32,
}

impl<T> FreeList<T> {
    /// A list that keeps at most `most` bytes (and [`KEPT`] items).
    pub(crate) const fn new(most: usize) -> FreeList<T> {
        FreeList {
            items: Vec::new(),
            bytes: 0,
            most,
            low: 0,
            takes: 0,
        }
    }

    /// The item kept last, if any.
    pub(crate) fn take(&mut self) -> Option<T> {
        let item = self.items.pop().map(|(item, size)| {
            self.bytes -= size;
            item
        });
        self.low = self.low.min(self.items.len());
        self.takes += 1;
        if self.takes >= TRIM_EVERY {
            // The oldest `low` were not needed since the last trim.
            let spare = self.items.drain(..self.low);
            self.bytes -= spare.map(|(_, size)| size).sum::<usize>();
            (self.low, self.takes) = (self.items.len(), 0);
        }
        item
    }

    /// Keeps `item` of `size` bytes if the list has room (else drops it).
    pub(crate) fn keep(&mut self, item: T, size: usize) {
        if self.items.len() < KEPT && self.bytes + size <= self.most {
            self.bytes += size;
            self.items.push((item, size));
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }
}

thread_local! {
    static FREE: RefCell<FreeList<BytesMut>> = const { RefCell::new(FreeList::new(KEPT_BYTES)) };
    // Heads written for shards and clients: 512 bytes, nearly always.
    static FREE_VECS: RefCell<FreeList<Vec<u8>>> = const { RefCell::new(FreeList::new(KEPT_VEC_BYTES)) };
    // A response head's field ranges: 32 bytes a field.
    static FREE_FIELDS: RefCell<FreeList<FieldRanges>> = const { RefCell::new(FreeList::new(KEPT_VEC_BYTES)) };
}

/// The last buffer kept in `list`, if any.
fn reuse<T>(list: &'static LocalKey<RefCell<FreeList<T>>>) -> Option<T> {
    list.try_with(|free| free.borrow_mut().take())
        .ok()
        .flatten()
}

/// Keeps `buf` of `size` bytes in `list`, if it has room.
fn keep<T>(list: &'static LocalKey<RefCell<FreeList<T>>>, buf: T, size: usize) {
    let _ = list.try_with(|free| free.borrow_mut().keep(buf, size));
}

/// An empty buffer with room for at least `room` bytes: a kept one when
/// this thread has one, else a new one.
pub fn take(room: usize) -> BytesMut {
    let mut buf = reuse(&FREE).unwrap_or_default();
    buf.reserve(room);
    buf
}

/// Gives `buf` back for reuse, emptied, unless it or its block is too
/// large (then it is freed). One that shares its block with a part split off
/// and alive elsewhere is kept too, and checked by its own room only: it
/// holds that block until [`take`] hands it out again, whose reserve then
/// reclaims the whole block if that part is gone, else makes a new one.
pub fn give(mut buf: BytesMut) {
    buf.clear();
    // Room for more than the largest kept: from the view itself, or from
    // the block behind it when no one else holds a part of it (a view on
    // the front or the tail of a read buffer grown for a long head, then
    // split). Such a buffer is freed, not kept for its small view.
    if buf.capacity() == 0 || buf.try_reclaim(LARGEST + 1) {
        return;
    }
    // Its block is at most LARGEST, unless a part alive elsewhere shares
    // it: its own room says less.
    keep(&FREE, buf, LARGEST);
}

/// An empty `Vec` with room for at least `room` bytes, for a head written
/// field by field (a `Vec` takes small writes in place, where a
/// `BytesMut` calls memcpy for each): as [`take`].
pub fn take_vec(room: usize) -> Vec<u8> {
    take_list(&FREE_VECS, room)
}

/// Gives `out` back for reuse, emptied, unless it is too large: as
/// [`give`].
pub fn give_vec(out: Vec<u8>) {
    give_list(&FREE_VECS, out, LARGEST);
}

/// An empty `Vec` from `list` (or a new one) with room for `room` items.
fn take_list<T>(list: &'static LocalKey<RefCell<FreeList<Vec<T>>>>, room: usize) -> Vec<T> {
    let mut items = reuse(list).unwrap_or_default();
    items.reserve(room);
    items
}

/// Keeps `items` in `list`, emptied, if it has room for 1 to `most`.
fn give_list<T>(
    list: &'static LocalKey<RefCell<FreeList<Vec<T>>>>,
    mut items: Vec<T>,
    most: usize,
) {
    items.clear();
    if (1..=most).contains(&items.capacity()) {
        let size = items.capacity() * std::mem::size_of::<T>();
        keep(list, items, size);
    }
}

/// Gives `buf` back once `bytes`, shared out of it ([`share`]), is no
/// longer needed.
pub fn give_shared(buf: BytesMut, bytes: Bytes) {
    drop(bytes);
    give(buf);
}

/// An empty field list with room for at least `room` fields: as [`take`].
pub fn take_fields(room: usize) -> FieldRanges {
    take_list(&FREE_FIELDS, room)
}

/// Gives `fields` back for reuse, emptied, unless it has room for more
/// than a response head's limit: as [`give`].
pub fn give_fields(fields: FieldRanges) {
    give_list(&FREE_FIELDS, fields, MOST_FIELDS);
}

/// What `buf` holds, as `Bytes` sharing its block, `buf` left empty: give
/// `buf` back once those bytes are dropped, and the block is kept whole.
/// (A `BytesMut` made `Bytes` and back, instead, counts its holders in a
/// new allocation each time.) Shared from then on, the block is split
/// with no allocation.
pub fn share(buf: &mut BytesMut) -> Bytes {
    buf.split().freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_keeps_within_its_bounds() {
        let mut list = FreeList::new(KEPT_BYTES);
        for i in 0..KEPT + 10 {
            list.keep(i, 8);
        }
        assert_eq!(list.len(), KEPT);
        assert_eq!(list.take(), Some(KEPT - 1));
        let mut list = FreeList::new(KEPT_BYTES);
        for i in 0..10 {
            list.keep(i, KEPT_BYTES / 4);
        }
        assert_eq!(list.len(), 4);
        list.keep(99, 1);
        assert_eq!(list.len(), 4, "no byte left");
        assert_eq!(list.take(), Some(3));
        list.keep(98, KEPT_BYTES / 4);
        assert_eq!(list.len(), 4, "a taken item's bytes are free again");
    }

    #[test]
    fn what_the_load_did_not_need_is_freed() {
        let mut list = FreeList::new(KEPT_BYTES);
        // A burst left 100 items; then the load needs 3 at a time.
        for i in 0..100 {
            list.keep(i, 64);
        }
        let mut rounds = 0;
        while list.len() > 3 {
            let held: Vec<_> = (0..3).filter_map(|_| list.take()).collect();
            assert_eq!(held.len(), 3, "taken from the list, not made");
            for item in held {
                list.keep(item, 64);
            }
            rounds += 1;
            assert!(rounds <= 2 * TRIM_EVERY as usize, "never trimmed");
        }
        assert_eq!(list.len(), 3);
        // The busiest stretch sets what stays: a burst of 50 again.
        let held: Vec<_> = (0..50).map(|i| list.take().unwrap_or(1000 + i)).collect();
        for item in held {
            list.keep(item, 64);
        }
        assert_eq!(list.len(), 50);
        assert_eq!(list.bytes, 50 * 64);
    }

    #[test]
    fn a_buffer_given_back_is_the_next_one_taken() {
        let mut buf = take(4096);
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let at = buf.as_ptr();
        give(buf);
        let again = take(4096);
        assert_eq!(again.as_ptr(), at);
        assert!(again.is_empty() && again.capacity() >= 4096);
    }

    /// How many buffers this thread keeps.
    fn kept() -> usize {
        FREE.with(|free| free.borrow().len())
    }

    #[test]
    fn oversized_buffers_are_not_kept() {
        std::thread::spawn(|| {
            give(BytesMut::with_capacity(LARGEST + 1));
            give_vec(Vec::with_capacity(LARGEST + 1));
            give_fields(Vec::with_capacity(MOST_FIELDS + 1));
            assert_eq!(FREE_FIELDS.with(|free| free.borrow().len()), 0);
            let fields = take_fields(12);
            let at = fields.as_ptr();
            give_fields(fields);
            let again = take_fields(12);
            assert_eq!(again.as_ptr(), at);
            assert_eq!(kept(), 0);
            // A small tail or front of a large block, the rest gone: the
            // block's size counts.
            let mut big = BytesMut::with_capacity(4 * LARGEST);
            big.resize(4 * LARGEST - 100, b'h');
            drop(big.split_to(4 * LARGEST - 100));
            assert!(big.capacity() <= 100);
            give(big);
            let mut big = BytesMut::with_capacity(4 * LARGEST);
            big.resize(2 * LARGEST, b'h');
            drop(big.split_off(100));
            assert!(big.capacity() <= 100);
            give(big);
            assert_eq!(kept(), 0);
            // The same while the rest is alive elsewhere: kept, on its own
            // room, until taken again.
            let mut big = BytesMut::with_capacity(4 * LARGEST);
            big.resize(2 * LARGEST, b'h');
            let rest = big.split_off(100);
            give(big);
            assert_eq!(kept(), 1);
            drop(rest);
            assert_eq!(FREE_VECS.with(|free| free.borrow().len()), 0);
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    }

    #[test]
    fn a_shared_block_comes_back_whole() {
        std::thread::spawn(|| {
            // Shared while the shard's head is sent, given back once it
            // is dropped: the next buffer taken is that block, whole.
            let mut buf = take(512);
            let (at, room) = (buf.as_ptr(), buf.capacity());
            buf.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
            let bytes = share(&mut buf);
            assert_eq!(&bytes[..], b"GET / HTTP/1.1\r\n\r\n");
            drop(bytes);
            give(buf);
            let again = take(512);
            assert_eq!((again.as_ptr(), again.capacity()), (at, room));
            // A part still alive elsewhere: its bytes stay as they are.
            let mut buf = again;
            buf.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\nbody");
            let head = buf.split_to(19).freeze();
            give(buf);
            let mut next = take(room);
            next.extend_from_slice(&[b'x'; 64]);
            assert_eq!(&head[..], b"HTTP/1.1 200 OK\r\n\r\n");
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    }

    #[test]
    fn a_thread_keeps_what_the_bounds_allow() {
        // On a fresh thread, so that no other test's buffers are counted.
        let kept = std::thread::spawn(|| {
            // Small views count as the largest block they might be a view of.
            let bufs: Vec<BytesMut> = (0..KEPT * 2).map(|_| take(100)).collect();
            bufs.into_iter().for_each(give);
            kept()
        })
        .join()
        .unwrap_or_default();
        assert_eq!(kept, KEPT_BYTES / LARGEST);
        let vecs = std::thread::spawn(|| {
            (0..KEPT * 2).for_each(|_| give_vec(take_vec(100)));
            let vecs: Vec<Vec<u8>> = (0..KEPT * 2).map(|_| take_vec(100)).collect();
            vecs.into_iter().for_each(give_vec);
            FREE_VECS.with(|free| free.borrow().len())
        })
        .join()
        .unwrap_or_default();
        assert_eq!(vecs, KEPT, "100-byte vectors: the item bound");
    }
}
