//! The configuration parser: any text is refused with errors or accepted,
//! never a panic; every error names a field or gives a position.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardgate::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(errors) = Config::parse(text, Some("fuzz.yaml")) {
        assert!(!errors.0.is_empty());
        for e in &errors.0 {
            assert!(!e.message.is_empty());
            let _ = e.to_string();
        }
    }
});
