//! Where each field sits in the YAML text, so that an error found while
//! validating (after parsing) can still point at a line and column.
//! Paths are written as the errors write them: `shards[1].url`,
//! `limits.routes./api/export.tokens`.

use std::collections::HashMap;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// `(line, column)`, both 1-based.
pub type Position = (usize, usize);

enum Frame {
    Map { path: String, key: Option<String> },
    Seq { path: String, index: usize },
}

#[derive(Default)]
struct Locator {
    stack: Vec<Frame>,
    positions: HashMap<String, Position>,
}

impl Locator {
    /// The path of the node that starts now, advancing the parent.
    fn next_path(&mut self) -> Option<String> {
        match self.stack.last_mut() {
            None => Some(String::new()),
            Some(Frame::Seq { path, index }) => {
                let p = format!("{path}[{index}]");
                *index += 1;
                Some(p)
            }
            Some(Frame::Map { path, key }) => key.take().map(|k| {
                if path.is_empty() {
                    k
                } else {
                    format!("{path}.{k}")
                }
            }),
        }
    }

    /// A scalar in key position becomes the pending key; returns true.
    fn take_key(&mut self, scalar: &str) -> bool {
        if let Some(Frame::Map { key, .. }) = self.stack.last_mut() {
            if key.is_none() {
                *key = Some(scalar.to_string());
                return true;
            }
        }
        false
    }

    /// Values overwrite the position their key left.
    fn record(&mut self, path: &str, mark: Marker) {
        self.positions
            .insert(path.to_string(), (mark.line(), mark.col() + 1));
    }

    fn record_key(&mut self, path: &str, mark: Marker) {
        self.positions
            .entry(path.to_string())
            .or_insert((mark.line(), mark.col() + 1));
    }
}

impl MarkedEventReceiver for Locator {
    fn on_event(&mut self, event: Event, mark: Marker) {
        match event {
            Event::Scalar(value, ..) => {
                if self.take_key(&value) {
                    // A key: its own position is where errors about the key
                    // (and, until the value starts, the field) point.
                    if let Some(Frame::Map { path, key: Some(k) }) = self.stack.last() {
                        let p = if path.is_empty() {
                            k.clone()
                        } else {
                            format!("{path}.{k}")
                        };
                        self.record_key(&p, mark);
                    }
                } else if let Some(p) = self.next_path() {
                    self.record(&p, mark);
                }
            }
            Event::MappingStart(..) => {
                let path = self.next_path().unwrap_or_default();
                self.record(&path, mark);
                self.stack.push(Frame::Map { path, key: None });
            }
            Event::SequenceStart(..) => {
                let path = self.next_path().unwrap_or_default();
                self.record(&path, mark);
                self.stack.push(Frame::Seq { path, index: 0 });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
            }
            Event::Alias(_) => {
                let _ = self.next_path();
            }
            _ => {}
        }
    }
}

/// Positions of every node of the document (empty if it does not parse;
/// the serde parser reports those errors itself).
pub fn positions(text: &str) -> HashMap<String, Position> {
    let mut locator = Locator::default();
    let mut parser = Parser::new_from_str(text);
    if parser.load(&mut locator, false).is_err() {
        return HashMap::new();
    }
    locator.positions
}

/// The position of `path`, or of its nearest located ancestor.
pub fn find(positions: &HashMap<String, Position>, path: &str) -> Option<Position> {
    let mut p = path;
    loop {
        if let Some(pos) = positions.get(p) {
            return Some(*pos);
        }
        let cut = p.rfind(['.', '['])?;
        p = &p[..cut];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nested_fields_and_sequence_items() {
        let text = "listen:\n  - addr: 0.0.0.0:80\nshards:\n  - { id: a, url: x }\n  - id: b\n    url: \"ftp://y\"\nlimits:\n  routes:\n    /api/export: { tokens: -1, refill_per_second: 1 }\n";
        let pos = positions(text);
        assert_eq!(find(&pos, "shards[1].url"), Some((6, 10)));
        assert_eq!(find(&pos, "shards[0].url"), Some((4, 19)));
        assert_eq!(
            find(&pos, "limits.routes./api/export.tokens"),
            Some((9, 28))
        );
        // Unknown leaf: the nearest ancestor (the mapping, on its line).
        assert_eq!(find(&pos, "shards[1].weight").map(|p| p.0), Some(5));
    }
}
