//! Which pods are in the fleet, each at a stable *slot*.
//!
//! Pods come and go while Envoy runs (a Kubernetes rollout, a DNS answer, an EDS update): the
//! poller reads the pods cluster's members from Envoy and keeps this assignment in shared data,
//! where every worker reads it. A pod keeps its slot for as long as it is a member; a new one
//! takes the lowest free slot. The slot is where the pod's in-flight count sits in the one
//! packed value every request reads, and what its per-pod stats are numbered by, so both stay
//! bounded (at most [`MAX_MEMBERS`] slots) however many pods pass through over time.

use serde::{Deserialize, Serialize};

/// Most pods one router follows (the configured `pods` list has the same bound).
pub const MAX_MEMBERS: usize = 1024;

/// The slot assignment: `slots[i]` is the address (`ip:port`) in slot `i`, `None` when free.
/// Trailing free slots are trimmed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slots(pub Vec<Option<String>>);

/// What an update changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    pub slots: Slots,
    pub joined: Vec<String>,
    pub left: Vec<String>,
    /// Members beyond [`MAX_MEMBERS`], left out.
    pub dropped: usize,
}

impl Change {
    pub fn is_empty(&self) -> bool {
        self.joined.is_empty() && self.left.is_empty()
    }
}

impl Slots {
    /// Slots `0..n` for a configured list.
    pub fn from_list<S: AsRef<str>>(pods: &[S]) -> Slots {
        Slots(pods.iter().map(|p| Some(p.as_ref().to_owned())).collect())
    }

    /// The members, in slot order: `(slot, address)`.
    pub fn members(&self) -> impl Iterator<Item = (usize, &str)> {
        self.0
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.as_deref().map(|a| (i, a)))
    }

    /// Number of slots (free ones in between included).
    pub fn width(&self) -> usize {
        self.0.len()
    }

    /// The assignment for `current` members: pods still there keep their slots, pods gone
    /// free theirs, new pods take the lowest free slots (in `current`'s order).
    pub fn update(&self, current: &[String]) -> Change {
        let mut seen = std::collections::HashSet::new();
        let mut current: Vec<&str> = current
            .iter()
            .map(String::as_str)
            .filter(|a| seen.insert(*a))
            .collect();
        let dropped = current.len().saturating_sub(MAX_MEMBERS);
        current.truncate(MAX_MEMBERS);
        let keep: std::collections::HashSet<&str> = current.iter().copied().collect();
        let mut left = Vec::new();
        let mut slots: Vec<Option<String>> = self
            .0
            .iter()
            .map(|a| match a {
                Some(a) if keep.contains(a.as_str()) => Some(a.clone()),
                Some(a) => {
                    left.push(a.clone());
                    None
                }
                None => None,
            })
            .collect();
        let held: std::collections::HashSet<String> = slots.iter().flatten().cloned().collect();
        let mut joined = Vec::new();
        let mut free = 0;
        for a in current.into_iter().filter(|a| !held.contains(*a)) {
            while slots.get(free).is_some_and(Option::is_some) {
                free += 1;
            }
            if free == slots.len() {
                slots.push(None);
            }
            if let Some(s) = slots.get_mut(free) {
                *s = Some(a.to_owned());
            }
            joined.push(a.to_owned());
        }
        while slots.last().is_some_and(Option::is_none) {
            slots.pop();
        }
        Change {
            slots: Slots(slots),
            joined,
            left,
            dropped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(v: &[Option<&str>]) -> Slots {
        Slots(v.iter().map(|a| a.map(str::to_owned)).collect())
    }

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn members_keep_their_slots() {
        // (name, before, current members, after, joined, left)
        #[allow(clippy::type_complexity)]
        let cases: &[(
            &str,
            &[Option<&str>],
            &[&str],
            &[Option<&str>],
            &[&str],
            &[&str],
        )] = &[
            (
                "first list",
                &[],
                &["a", "b"],
                &[Some("a"), Some("b")],
                &["a", "b"],
                &[],
            ),
            (
                "unchanged, any order",
                &[Some("a"), Some("b")],
                &["b", "a"],
                &[Some("a"), Some("b")],
                &[],
                &[],
            ),
            (
                "one leaves",
                &[Some("a"), Some("b"), Some("c")],
                &["a", "c"],
                &[Some("a"), None, Some("c")],
                &[],
                &["b"],
            ),
            (
                "a joiner takes the free slot",
                &[Some("a"), None, Some("c")],
                &["d", "a", "c"],
                &[Some("a"), Some("d"), Some("c")],
                &["d"],
                &[],
            ),
            (
                "the last leaves: trimmed",
                &[Some("a"), Some("b")],
                &["a"],
                &[Some("a")],
                &[],
                &["b"],
            ),
            (
                "all leave",
                &[Some("a"), Some("b")],
                &[],
                &[],
                &[],
                &["a", "b"],
            ),
            (
                "duplicates count once",
                &[],
                &["a", "a"],
                &[Some("a")],
                &["a"],
                &[],
            ),
            (
                "replaced at once",
                &[Some("a")],
                &["b"],
                &[Some("b")],
                &["b"],
                &["a"],
            ),
        ];
        for (name, before, current, after, joined, left) in cases {
            let c = slots(before).update(&list(current));
            assert_eq!(c.slots, slots(after), "{name}");
            assert_eq!(c.joined, list(joined), "{name}");
            assert_eq!(c.left, list(left), "{name}");
            assert_eq!(c.is_empty(), joined.is_empty() && left.is_empty(), "{name}");
        }
    }

    #[test]
    fn bounded() {
        let many: Vec<String> = (0..MAX_MEMBERS + 5)
            .map(|i| format!("10.0.{}.{}:80", i / 256, i % 256))
            .collect();
        let c = Slots::default().update(&many);
        assert_eq!((c.slots.width(), c.dropped), (MAX_MEMBERS, 5));
    }

    #[test]
    fn from_a_list_and_back() {
        let s = Slots::from_list(&["a", "b"]);
        assert_eq!(s.members().collect::<Vec<_>>(), [(0, "a"), (1, "b")]);
        let json = serde_json::to_string(&slots(&[Some("a"), None, Some("c")])).unwrap();
        assert_eq!(json, r#"["a",null,"c"]"#);
        assert_eq!(
            serde_json::from_str::<Slots>(&json)
                .unwrap()
                .members()
                .count(),
            2
        );
    }
}
