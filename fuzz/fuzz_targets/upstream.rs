//! The fast transport's parsers on arbitrary bytes: a shard's response
//! head and body framing (`parse_response`, `response_head`, `Framing`)
//! and a client's request head (`parse_head`, and the head the shard
//! receives from it). They never panic, and the invariants of
//! `shardgate::proxy::fast::fuzzing` hold: one well-formed head for the
//! client and for the shard, no hop-by-hop fields, never both framings,
//! the same body length however the bytes arrive.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use shardgate::proxy::fast::fuzzing;

#[derive(Arbitrary, Debug)]
struct Input {
    head_only: bool,
    websocket: bool,
    split: u16,
    bytes: Vec<u8>,
}

fuzz_target!(|input: Input| {
    fuzzing::response(
        &input.bytes,
        input.head_only,
        input.websocket,
        usize::from(input.split),
    );
    fuzzing::request(&input.bytes);
});
