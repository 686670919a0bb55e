//! `compression` (DESIGN §10): which codings, from what size, for which
//! types, at which levels.

use super::Checker;
use crate::config::raw::RawCompression;
use crate::wire::compress::encoder::Levels;
use crate::wire::compress::{Coding, Policy, TypePattern};

/// `compression.algorithms` when the section does not say: the client's
/// weights decide first, then this order. Brotli last: at its fast
/// levels (this build's encoder) it compresses no smaller than gzip at
/// level 4 and costs more CPU (docs/compression.md).
const DEFAULT_ALGORITHMS: [Coding; 3] = [Coding::Zstd, Coding::Gzip, Coding::Br];

/// `compression.types` when the section does not say: text, and the
/// textual application types apps send.
const DEFAULT_TYPES: [&str; 5] = [
    "text/*",
    "application/json",
    "application/javascript",
    "application/xml",
    "image/svg+xml",
];

pub(super) fn check_compression(c: &mut Checker<'_>, raw: RawCompression) -> Policy {
    let algorithms = match raw.algorithms {
        None => DEFAULT_ALGORITHMS.to_vec(),
        Some(names) => check_algorithms(c, &names),
    };
    let types = match raw.types {
        None => DEFAULT_TYPES
            .iter()
            .filter_map(|t| TypePattern::parse(t).ok())
            .collect(),
        Some(types) => (types.iter().enumerate())
            .filter_map(|(i, t)| match TypePattern::parse(t) {
                Ok(pattern) => Some(pattern),
                Err(why) => {
                    c.error(format!("compression.types[{i}]"), format!("`{t}`: {why}"));
                    None
                }
            })
            .collect(),
    };
    let defaults = Levels::default();
    let mut level =
        |name: &str, value: Option<i64>, range: std::ops::RangeInclusive<i64>, default| match value
        {
            None => default,
            Some(v) if range.contains(&v) => v,
            Some(_) => {
                let (lo, hi) = (range.start(), range.end());
                c.error(
                    format!("compression.levels.{name}"),
                    format!("must be between {lo} and {hi}"),
                );
                default
            }
        };
    let l = &raw.levels;
    let levels = Levels {
        gzip: level(
            "gzip",
            l.gzip.map(i64::from),
            1..=9,
            i64::from(defaults.gzip),
        ) as u32,
        br: level("br", l.br.map(i64::from), 0..=11, i64::from(defaults.br)) as u32,
        zstd: level(
            "zstd",
            l.zstd.map(i64::from),
            1..=19,
            i64::from(defaults.zstd),
        ) as i32,
    };
    let max_streams = match raw.max_streams {
        None => 1024,
        Some(n @ 1..=1_000_000) => n as usize,
        Some(_) => {
            c.error("compression.max_streams", "must be between 1 and 1000000");
            1024
        }
    };
    Policy {
        algorithms,
        max_streams,
        min_bytes: raw.min_bytes.unwrap_or(1024),
        types,
        levels,
    }
}

/// `compression.algorithms`: known codings, each once, at least one.
fn check_algorithms(c: &mut Checker<'_>, names: &[String]) -> Vec<Coding> {
    let mut algorithms = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let field = format!("compression.algorithms[{i}]");
        match Coding::of_token(name.as_bytes()).filter(|_| !name.eq_ignore_ascii_case("x-gzip")) {
            Some(coding) if algorithms.contains(&coding) => {
                c.error(field, format!("`{name}` is listed twice"));
            }
            Some(coding) => algorithms.push(coding),
            None => c.error(field, format!("unknown coding `{name}` (zstd, br or gzip)")),
        }
    }
    if names.is_empty() {
        c.error(
            "compression.algorithms",
            "at least one of zstd, br, gzip (leave `compression` out to compress nothing)",
        );
    }
    algorithms
}
