//! The deny list: the static part of the allow decision, editable at
//! runtime. Readers see an immutable set (no lock on the request path);
//! writers publish a new one.

use arc_swap::ArcSwap;
use compact_str::CompactString;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::Arc;

type DenySet = hashbrown::HashSet<CompactString, foldhash::fast::RandomState>;

pub struct DenyList {
    set: ArcSwap<DenySet>,
    write: Mutex<()>,
}

impl DenyList {
    pub fn new<I, S>(tenants: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let set: DenySet = tenants
            .into_iter()
            .map(|t| CompactString::from(t.as_ref()))
            .collect();
        DenyList {
            set: ArcSwap::from_pointee(set),
            write: Mutex::new(()),
        }
    }

    #[inline]
    pub fn contains(&self, tenant: &str) -> bool {
        let set = self.set.load();
        !set.is_empty() && set.contains(tenant)
    }

    /// Adds a tenant; returns whether it was new.
    pub fn deny(&self, tenant: &str) -> bool {
        self.edit(|set| set.insert(CompactString::from(tenant)))
    }

    /// Removes a tenant; returns whether it was there.
    pub fn allow(&self, tenant: &str) -> bool {
        self.edit(|set| set.remove(tenant))
    }

    /// Replaces the whole list.
    pub fn replace<I, S>(&self, tenants: I)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let _w = self.write.lock();
        let set: DenySet = tenants
            .into_iter()
            .map(|t| CompactString::from(t.as_ref()))
            .collect();
        self.set.store(Arc::new(set));
    }

    /// The denied tenants, sorted.
    pub fn list(&self) -> Vec<String> {
        let set = self.set.load();
        set.iter()
            .map(|t| t.to_string())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    fn edit(&self, f: impl FnOnce(&mut DenySet) -> bool) -> bool {
        let _w = self.write.lock();
        let mut next = DenySet::clone(&self.set.load());
        let changed = f(&mut next);
        if changed {
            self.set.store(Arc::new(next));
        }
        changed
    }
}

impl Default for DenyList {
    fn default() -> Self {
        DenyList::new(std::iter::empty::<&str>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_take_effect_for_the_next_lookup() {
        let deny = DenyList::new(["suspended"]);
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
