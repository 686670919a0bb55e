//! Buffers, reused per thread: a request's head buffer, the head the
//! shard receives, a response's read buffer, its field list and the head
//! the client receives come from this thread's free lists and go back to
//! them once used (the field list when the client's head is written, the
//! others when the exchange is over), so a steady stream of requests
//! allocates none of them (the larger ones were mimalloc's slower
//! allocations, over 1 KiB, with their frees). A connection idle between requests holds none: the
//! lists are the thread's.
//!
//! Bounded: at most [`KEPT`] buffers per list and thread, each of at most
//! [`LARGEST`] bytes (one that grew past it, for a long head or a large
//! body read, is freed), and 32 field lists of at most 256 fields (8 KiB
//! each), so a thread keeps at most 2.25 MiB here, beside
//! blocks a kept view shares with a part still alive elsewhere (see
//! [`give`]).

use bytes::{Bytes, BytesMut};
use std::cell::RefCell;
use std::ops::Range;
use std::thread::LocalKey;

/// Buffers kept per thread: more than the requests one thread has in
/// flight between two looks at its list, under any load the rig makes.
pub(crate) const KEPT: usize = 32;

/// The largest buffer kept, in bytes.
const LARGEST: usize = 32 * 1024;

/// A response head's fields, as ranges of its name and value in the head.
pub type FieldRanges = Vec<(Range<usize>, Range<usize>)>;

/// The most fields a kept list has room for (a response head's limit).
const MOST_FIELDS: usize = 256;

thread_local! {
    static FREE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    static FREE_VECS: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    static FREE_FIELDS: RefCell<Vec<FieldRanges>> = const { RefCell::new(Vec::new()) };
}

/// The last buffer kept in `list`, if any.
fn reuse<T>(list: &'static LocalKey<RefCell<Vec<T>>>) -> Option<T> {
    list.try_with(|free| free.borrow_mut().pop()).ok().flatten()
}

/// Keeps `buf` in `list`, if it has room.
fn keep<T>(list: &'static LocalKey<RefCell<Vec<T>>>, buf: T) {
    let _ = list.try_with(|free| {
        let mut free = free.borrow_mut();
        if free.len() < KEPT {
            free.push(buf);
        }
    });
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
    keep(&FREE, buf);
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
fn take_list<T>(list: &'static LocalKey<RefCell<Vec<Vec<T>>>>, room: usize) -> Vec<T> {
    let mut items = reuse(list).unwrap_or_default();
    items.reserve(room);
    items
}

/// Keeps `items` in `list`, emptied, if it has room for 1 to `most`.
fn give_list<T>(list: &'static LocalKey<RefCell<Vec<Vec<T>>>>, mut items: Vec<T>, most: usize) {
    items.clear();
    if (1..=most).contains(&items.capacity()) {
        keep(list, items);
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
    fn a_thread_keeps_at_most_kept_buffers() {
        // On a fresh thread, so that no other test's buffers are counted.
        let kept = std::thread::spawn(|| {
            let bufs: Vec<BytesMut> = (0..KEPT * 2).map(|_| take(1024)).collect();
            bufs.into_iter().for_each(give);
            kept()
        })
        .join()
        .unwrap_or_default();
        assert_eq!(kept, KEPT);
    }
}
