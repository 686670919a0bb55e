//! The PROXY protocol header reader: any bytes give a header, "not yet",
//! or a refusal, never a panic; a header found is whole in itself (the
//! same header read from its own bytes), and never longer than its input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardgate::proxy::proxy_protocol::parse;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(Some((client, len))) = parse(bytes) {
        assert!(len <= bytes.len());
        assert_eq!(parse(&bytes[..len]), Ok(Some((client, len))));
    }
});
