//! The routing decision: which pod gets a request, and why.
//!
//! A decision is a value (pod + [`Reason`]) so that metrics, the debug response header and the
//! tests all speak about the same thing.
//!
//! - The longest leading chain of the prompt's blocks that has a known owner decides: the
//!   owner of the deepest matched block computed that whole prefix (hashes are chained).
//! - A cold prompt (no owned block) goes to the pod chosen by rendezvous hashing of its first
//!   block hash, so independent router replicas agree without sharing any state.
//! - A prompt shorter than one block can never hit, so it is simply balanced.

use crate::block::BlockHash;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Why a pod was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// `blocks` leading blocks of the prompt are owned by the chosen pod.
    PrefixHit { blocks: usize },
    /// No block of the prompt is owned anywhere: rendezvous hash of the first block.
    Cold,
    /// The prompt has no full block: plain balancing.
    ShortPrompt,
    /// Not an inference request (e.g. `/v1/models`): plain balancing.
    Passthrough,
    /// The router's own state is broken: fail open to plain balancing.
    Fallback,
}

impl Reason {
    /// Stable kebab-case name, used in the debug header and metric names.
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::PrefixHit { .. } => "prefix-hit",
            Reason::Cold => "cold",
            Reason::ShortPrompt => "short-prompt",
            Reason::Passthrough => "passthrough",
            Reason::Fallback => "fallback",
        }
    }

    /// Leading blocks matched (0 unless a prefix hit).
    pub fn matched_blocks(&self) -> usize {
        match self {
            Reason::PrefixHit { blocks } => *blocks,
            _ => 0,
        }
    }
}

/// A routing decision: index into the configured pod list, plus the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub pod: usize,
    pub reason: Reason,
}

/// Rendezvous (highest-random-weight) choice of a pod for `key`; `None` without pods.
pub fn rendezvous<S: AsRef<str>>(key: BlockHash, pods: &[S]) -> Option<usize> {
    pods.iter()
        .enumerate()
        .max_by_key(|(_, p)| xxh3_64_with_seed(p.as_ref().as_bytes(), key.0))
        .map(|(i, _)| i)
}

/// Chooses a pod for a prompt with block `hashes`. `owner(h)` looks a block up in the
/// ownership table and returns the owning pod's index; `balance` is the plain-balancing
/// choice used for prompts without a full block.
pub fn choose<S: AsRef<str>>(
    pods: &[S],
    hashes: &[BlockHash],
    mut owner: impl FnMut(BlockHash) -> Option<usize>,
    balance: usize,
) -> Option<Decision> {
    if pods.is_empty() {
        return None;
    }
    let Some(&first) = hashes.first() else {
        return Some(Decision {
            pod: balance % pods.len(),
            reason: Reason::ShortPrompt,
        });
    };
    let mut deepest = None;
    for (i, &h) in hashes.iter().enumerate() {
        match owner(h).filter(|&p| p < pods.len()) {
            Some(p) => deepest = Some((i + 1, p)),
            None => break,
        }
    }
    Some(match deepest {
        Some((blocks, pod)) => Decision {
            pod,
            reason: Reason::PrefixHit { blocks },
        },
        None => Decision {
            pod: rendezvous(first, pods)?,
            reason: Reason::Cold,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const PODS: [&str; 3] = ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"];

    fn h(n: u64) -> BlockHash {
        BlockHash(n)
    }

    #[test]
    fn table_driven() {
        struct Case {
            name: &'static str,
            hashes: Vec<BlockHash>,
            owners: Vec<(u64, usize)>,
            want_pod: Option<usize>,
            want: Reason,
        }
        let cases = vec![
            Case {
                name: "short prompt balances",
                hashes: vec![],
                owners: vec![],
                want_pod: Some(2),
                want: Reason::ShortPrompt,
            },
            Case {
                name: "cold uses rendezvous",
                hashes: vec![h(1), h(2)],
                owners: vec![],
                want_pod: rendezvous(h(1), &PODS),
                want: Reason::Cold,
            },
            Case {
                name: "full hit",
                hashes: vec![h(1), h(2)],
                owners: vec![(1, 1), (2, 1)],
                want_pod: Some(1),
                want: Reason::PrefixHit { blocks: 2 },
            },
            Case {
                name: "deepest owner wins",
                hashes: vec![h(1), h(2), h(3)],
                owners: vec![(1, 0), (2, 2)],
                want_pod: Some(2),
                want: Reason::PrefixHit { blocks: 2 },
            },
            Case {
                name: "gap stops the chain",
                hashes: vec![h(1), h(2), h(3)],
                owners: vec![(1, 0), (3, 2)],
                want_pod: Some(0),
                want: Reason::PrefixHit { blocks: 1 },
            },
            Case {
                name: "first block unknown is cold",
                hashes: vec![h(9), h(2)],
                owners: vec![(2, 1)],
                want_pod: rendezvous(h(9), &PODS),
                want: Reason::Cold,
            },
            Case {
                name: "owner outside pod list ignored",
                hashes: vec![h(1)],
                owners: vec![(1, 7)],
                want_pod: rendezvous(h(1), &PODS),
                want: Reason::Cold,
            },
        ];
        for c in cases {
            let owners: HashMap<u64, usize> = c.owners.into_iter().collect();
            let d = choose(&PODS, &c.hashes, |x| owners.get(&x.0).copied(), 5).unwrap();
            assert_eq!(Some(d.pod), c.want_pod, "{}", c.name);
            assert_eq!(d.reason, c.want, "{}", c.name);
        }
    }

    #[test]
    fn no_pods_no_decision() {
        let empty: [&str; 0] = [];
        assert!(choose(&empty, &[h(1)], |_| None, 0).is_none());
    }

    #[test]
    fn rendezvous_spreads_and_is_stable() {
        let mut counts = [0usize; 3];
        for i in 0..3000u64 {
            let k = BlockHash(xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes()));
            let p = rendezvous(k, &PODS).unwrap();
            assert_eq!(rendezvous(k, &PODS), Some(p));
            counts[p] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
        // removing a pod only moves the keys that were on it
        let two = &PODS[..2];
        for i in 0..500u64 {
            let k = BlockHash(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let p = rendezvous(k, &PODS).unwrap();
            if p < 2 {
                assert_eq!(rendezvous(k, two), Some(p));
            }
        }
    }

    #[test]
    fn reason_names() {
        assert_eq!(Reason::PrefixHit { blocks: 3 }.as_str(), "prefix-hit");
        assert_eq!(Reason::PrefixHit { blocks: 3 }.matched_blocks(), 3);
        assert_eq!(Reason::Cold.matched_blocks(), 0);
    }
}
