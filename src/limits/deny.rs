//! The deny list: the static part of the allow decision, editable at
//! runtime. The router publishes it inside the same immutable snapshot as
//! the shard membership, so the request path reads both with one load.

use compact_str::CompactString;
use std::collections::BTreeSet;

type DenySet = hashbrown::HashSet<CompactString, foldhash::fast::RandomState>;

#[derive(Clone, Debug, Default)]
pub struct DenyList {
    set: DenySet,
}

impl DenyList {
    pub fn new<I, S>(tenants: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        DenyList {
            set: tenants
                .into_iter()
                .map(|t| CompactString::from(t.as_ref()))
                .collect(),
        }
    }

    #[inline]
    pub fn contains(&self, tenant: &str) -> bool {
        !self.set.is_empty() && self.set.contains(tenant)
    }

    /// Adds a tenant; returns whether it was new.
    pub fn deny(&mut self, tenant: &str) -> bool {
        self.set.insert(CompactString::from(tenant))
    }

    /// Removes a tenant; returns whether it was there.
    pub fn allow(&mut self, tenant: &str) -> bool {
        self.set.remove(tenant)
    }

    /// The denied tenants, sorted.
    pub fn list(&self) -> Vec<String> {
        self.set
            .iter()
            .map(|t| t.to_string())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_and_listing() {
        let mut deny = DenyList::new(["suspended"]);
        assert!(deny.contains("suspended"));
        assert!(!deny.contains("acme"));
        assert!(deny.deny("acme"));
        assert!(!deny.deny("acme"));
        assert!(deny.contains("acme"));
        assert!(deny.allow("suspended"));
        assert!(!deny.contains("suspended"));
        assert_eq!(deny.list(), vec!["acme".to_string()]);
    }
}
