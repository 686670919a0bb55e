//! The domain map: normalisation and resolution never panic, and agree
//! with themselves (resolving a host equals resolving its normal form;
//! an exact entry added is what its host resolves to).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use shardgate::routing::domain::normalize;
use shardgate::routing::{DomainMap, DomainMatch, Fallback};

#[derive(Arbitrary, Debug)]
struct Input {
    entries: Vec<(String, String)>,
    suffix: Option<String>,
    hosts: Vec<String>,
}

fuzz_target!(|input: Input| {
    let fallback = input.suffix.as_deref().map_or(Fallback::None, Fallback::suffix);
    let map = DomainMap::new(fallback);
    for (host, tenant) in &input.entries {
        if map.add(host, tenant).is_ok() && !host.contains('*') {
            // An exact entry answers its own host (unless a later entry for
            // the same normal form replaced it: check right away).
            let r = map.lookup(host).expect("an added host resolves");
            assert_eq!(r.matched, DomainMatch::Exact);
            assert_eq!(r.tenant.as_str(), tenant.as_str());
        }
    }
    for host in &input.hosts {
        let n = normalize(host);
        assert_eq!(normalize(&n), n, "normalisation is idempotent");
        assert_eq!(map.lookup(host), map.lookup(&n));
        let _ = map.resolve(host);
    }
    let listed = map.list();
    assert_eq!(listed.len(), map.len());
});
