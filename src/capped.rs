//! A client's string shown at most so many bytes long: what a log line or
//! a span keeps of it, so that what they hold is bounded whatever a
//! client sends (DESIGN §2, "Bounded in bytes").

use std::fmt::Write as _;

/// What marks a value cut short.
pub const CUT: &str = "…";

/// A value shown with at most `.1` bytes of its text (cut on a character
/// boundary), and [`CUT`] after it when cut: what a log line or a span
/// keeps of a client's string.
pub struct Capped<'a>(pub &'a dyn std::fmt::Display, pub usize);

impl std::fmt::Display for Capped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut bounded = Bounded {
            out: &mut *f,
            left: self.1,
            cut: false,
        };
        write!(bounded, "{}", self.0)?;
        match bounded.cut {
            true => f.write_str(CUT),
            false => Ok(()),
        }
    }
}

/// Passes at most `left` bytes on, whole characters only.
struct Bounded<'a, 'f> {
    out: &'a mut std::fmt::Formatter<'f>,
    left: usize,
    cut: bool,
}

impl std::fmt::Write for Bounded<'_, '_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if s.len() <= self.left {
            self.left -= s.len();
            return self.out.write_str(s);
        }
        let mut end = self.left;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.left = 0;
        self.cut = true;
        self.out.write_str(&s[..end])
    }
}
