//! How the certificate store scales: writes N certificate pairs (ECDSA
//! P-256, one name each, plus a wildcard every 10th) into a scratch
//! directory, then loads them with the store the gateway uses and reports
//! load time, the resident memory the store added per certificate, a
//! no-change reload and a lookup.
//!
//!   cargo run --release --example cert_scale -- [N=10000]

use shardgate::tls::store::{CertStore, Source};
use std::time::Instant;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let dir = tempfile::tempdir().expect("scratch directory");
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key).expect("ca");
    let started = Instant::now();
    for i in 0..n {
        let name = if i % 10 == 0 {
            format!("*.t{i}.example.com")
        } else {
            format!("t{i}.example.com")
        };
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec![name])
            .expect("params")
            .signed_by(&key, &ca, &ca_key)
            .expect("cert");
        // The chain as served: leaf, then the CA.
        let chain = format!("{}{}", cert.pem(), ca.pem());
        std::fs::write(dir.path().join(format!("t{i}.crt")), chain).expect("write");
        std::fs::write(dir.path().join(format!("t{i}.key")), key.serialize_pem()).expect("write");
    }
    println!("wrote {n} pairs in {:.1?}", started.elapsed());
    let store = CertStore::new(vec![(dir.path().to_path_buf(), Source::File)], None);
    let before = rss_kib();
    let started = Instant::now();
    let report = store.reload();
    let took = started.elapsed();
    let after = rss_kib();
    println!(
        "loaded {} certificates ({} errors) in {took:.1?}: {:.0} µs per certificate",
        report.certs,
        report.errors.len(),
        took.as_secs_f64() * 1e6 / n as f64
    );
    println!(
        "resident memory: +{} KiB, {:.2} KiB per certificate (chain of 2, key, names, listing)",
        after.saturating_sub(before),
        after.saturating_sub(before) as f64 / n as f64
    );
    let started = Instant::now();
    let again = store.reload();
    println!(
        "reload with nothing changed: {:.1?} ({} parsed again)",
        started.elapsed(),
        again.parsed
    );
    let started = Instant::now();
    let mut found = 0;
    for i in 0..100_000 {
        let name = format!("t{}.example.com", (i * 7) % n);
        found += usize::from(store.resolve(Some(&name)).is_some());
    }
    println!(
        "lookup: {:.0} ns per SNI ({found} of 100000 found)",
        started.elapsed().as_secs_f64() * 1e9 / 100_000.0
    );
}
