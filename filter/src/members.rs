//! The fleet's current members, as every worker sees them.
//!
//! The assignment of pods to slots ([`Slots`], rules in `prefix_core::membership`) lives in
//! one shared-data value. Without `discovery` it is the configured `pods` list and never
//! changes; with it, the poller rewrites it when Envoy's pods cluster changes, then bumps the
//! pod-states version, so requests re-read the members only after a change (the version is
//! read on every request anyway).
//!
//! A request's decision indexes the compact member list it was made with ([`Members`]); the
//! stream keeps that list, so a membership change in the middle of a request never makes it
//! release another pod's in-flight count or name another pod in its headers.

use crate::host::{SetOutcome, Store};
use crate::pods::Keys;
use prefix_core::membership::Slots;
use prefix_core::policy::Decision;
use prefix_core::router_config::PodAddr;
use std::collections::HashMap;
use std::rc::Rc;

/// The members in slot order, compact: position `i` is what a [`Decision`] names.
#[derive(Debug, Default)]
pub struct Members {
    addrs: Vec<PodAddr>,
    slots: Vec<usize>,
    width: usize,
    index: HashMap<String, usize>,
    state_keys: Vec<String>,
}

impl Members {
    pub fn new(slots: &Slots, keys: &Keys) -> Members {
        let mut m = Members {
            width: slots.width(),
            ..Members::default()
        };
        for (slot, addr) in slots.members() {
            // the poller writes only addresses Envoy reported as ip:port; anything else is skipped
            let Ok(a) = PodAddr::try_from(addr.to_owned()) else {
                continue;
            };
            m.index.insert(addr.to_owned(), m.addrs.len());
            m.state_keys.push(keys.state(addr));
            m.addrs.push(a);
            m.slots.push(slot);
        }
        m
    }

    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// Member `i`'s address ("" when out of range).
    pub fn addr(&self, i: usize) -> &str {
        self.addrs.get(i).map_or("", PodAddr::as_str)
    }

    pub fn addrs(&self) -> &[PodAddr] {
        &self.addrs
    }

    /// Member `i`'s slot (its position in the packed in-flight counts).
    pub fn slot(&self, i: usize) -> Option<usize> {
        self.slots.get(i).copied()
    }

    /// Slots in use, free ones in between included.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The member with this address.
    pub fn index_of(&self, addr: &str) -> Option<usize> {
        self.index.get(addr).copied()
    }

    pub fn state_keys(&self) -> &[String] {
        &self.state_keys
    }
}

/// The stored assignment; `None` when never written or unreadable.
pub fn read_slots<S: Store>(store: &S, key: &str) -> (Option<Slots>, Option<u32>) {
    match store.shared_get(key) {
        Some((v, cas)) => (serde_json::from_slice(&v).ok(), cas),
        None => (None, None),
    }
}

/// Writes the assignment (compare-and-swap against `cas`).
pub fn write_slots<S: Store>(store: &S, key: &str, slots: &Slots, cas: Option<u32>) -> SetOutcome {
    match serde_json::to_vec(slots) {
        Ok(v) => store.shared_set(key, &v, cas),
        Err(_) => SetOutcome::Failed,
    }
}

/// A decision with the members it indexes: what the stream writes to the destination header,
/// names in debug headers and releases when it ends.
#[derive(Debug, Clone)]
pub struct Placement {
    pub decision: Decision,
    pub members: Rc<Members>,
    /// Which of the router's model names the request named (0: the base model, or none;
    /// `i + 1`: `adapters[i]`): the `model` label of its decision counter.
    pub model: usize,
}

impl Placement {
    /// The chosen pod's address.
    pub fn pod(&self) -> &str {
        self.members.addr(self.decision.pod)
    }

    /// The chosen pod's slot.
    pub fn slot(&self) -> Option<usize> {
        self.members.slot(self.decision.pod)
    }

    /// The fallbacks' addresses, best first.
    pub fn fallbacks(&self) -> impl Iterator<Item = &str> {
        self.decision.fallbacks.iter().map(|i| self.members.addr(i))
    }

    /// `x-gateway-destination-endpoint`: the chosen pod, then its fallbacks (`ip:port,…`).
    pub fn destination(&self) -> String {
        let mut v = self.pod().to_owned();
        for f in self.fallbacks() {
            v.push(',');
            v.push_str(f);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;
    use prefix_core::policy::Reason;

    #[test]
    fn compact_members_keep_their_slots() {
        let keys = Keys::new("ns");
        let slots = Slots(vec![
            Some("127.0.0.1:1".into()),
            None,
            Some("127.0.0.1:3".into()),
            Some("not an address".into()),
        ]);
        let m = Members::new(&slots, &keys);
        assert_eq!((m.len(), m.width()), (2, 4));
        assert_eq!((m.addr(1), m.slot(1)), ("127.0.0.1:3", Some(2)));
        assert_eq!(m.index_of("127.0.0.1:3"), Some(1));
        assert_eq!(m.index_of("127.0.0.1:2"), None);
        assert_eq!(m.state_keys()[1], keys.state("127.0.0.1:3"));
        let d = Decision {
            fallbacks: prefix_core::policy::Fallbacks::from_ranked([0]),
            ..Decision::new(1, Reason::Cold)
        };
        let p = Placement {
            decision: d,
            members: Rc::new(m),
            model: 0,
        };
        assert_eq!(p.destination(), "127.0.0.1:3,127.0.0.1:1");
        assert_eq!(p.slot(), Some(2));
    }

    #[test]
    fn stored_slots_round_trip() {
        let h = FakeHost::default();
        assert_eq!(read_slots(&h, "k"), (None, None));
        let s = Slots::from_list(&["127.0.0.1:1"]);
        assert_eq!(write_slots(&h, "k", &s, None), SetOutcome::Written);
        let (back, cas) = read_slots(&h, "k");
        assert_eq!(back, Some(s));
        assert!(cas.is_some());
        h.shared_set("k", b"garbage", None);
        assert_eq!(read_slots(&h, "k").0, None);
    }
}
