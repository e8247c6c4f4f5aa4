//! Policy `prefix` (the default): cache affinity weighed against load.
//!
//! - Imbalance guard (after SGLang's cache-aware policy): when the busiest candidate's load
//!   exceeds the idlest's by more than `imbalance_abs` *and* by a factor `imbalance_ratio`,
//!   only pods within `imbalance_abs` of the idlest may take the request: an owner among them
//!   if there is one (a block can have several owners), else the least-loaded pod (`Imbalanced`).
//! - Otherwise each pod scores `prefix × matched/total blocks − load`, where a pod's match is
//!   the deepest block of the prompt's leading chain it owns. Ties go to the rendezvous order
//!   of the first block.
//! - A cold prompt (no block owned) goes to the first pod in the rendezvous order of its
//!   first block among the idlest (within `cold_slack`), so router replicas that see the same
//!   loads agree without shared state. If a pod is still computing that block for an earlier
//!   request, the prompt follows it only while it is among those idlest pods: the request
//!   misses either way, and an idle pod that takes it becomes one more owner.

use super::{Candidates, Inputs, Reason};
use crate::block::BlockHash;

pub(super) fn choose<S: AsRef<str>>(
    input: &Inputs<'_, S>,
    cands: &Candidates<'_, S>,
    matched: &[usize],
    first: BlockHash,
) -> (usize, Reason) {
    let w = input.weights;
    let (min_load, max_load) = cands.load_range();
    let imbalanced =
        max_load - min_load > w.imbalance_abs && max_load > w.imbalance_ratio * min_load;
    if imbalanced {
        return guarded(cands, matched, min_load + w.imbalance_abs);
    }
    let order = cands.rendezvous_order(first);
    if matched.iter().all(|&m| m == 0) {
        return (cold(input, cands, &order, min_load), Reason::Cold);
    }
    let total = input.hashes.len() as f64;
    let score = |c: usize| w.prefix * matched[c] as f64 / total - cands.load(c);
    let mut best = order[0];
    for &c in &order[1..] {
        if score(c) > score(best) {
            best = c;
        }
    }
    match matched[best] {
        0 => (best, Reason::Imbalanced),
        blocks => (best, Reason::PrefixHit { blocks }),
    }
}

/// Affinity only among pods that are not overloaded (load up to `ceiling`): a warm owner takes
/// the request if there is one, else the least-loaded pod (a miss, which then becomes an owner
/// too).
fn guarded<S: AsRef<str>>(
    cands: &Candidates<'_, S>,
    matched: &[usize],
    ceiling: f64,
) -> (usize, Reason) {
    let warm = cands
        .pods
        .iter()
        .copied()
        .filter(|&c| matched[c] > 0 && cands.load(c) <= ceiling)
        .max_by(|&a, &b| {
            matched[a]
                .cmp(&matched[b])
                .then(cands.load(b).total_cmp(&cands.load(a)))
        });
    match warm {
        Some(p) => (p, Reason::PrefixHit { blocks: matched[p] }),
        None => (cands.least_loaded(), Reason::Imbalanced),
    }
}

/// Where a cold prompt goes: the pod still computing its first block while that one is among
/// the idlest (within `cold_slack`), else the first of those idlest in rendezvous order.
fn cold<S: AsRef<str>>(
    input: &Inputs<'_, S>,
    cands: &Candidates<'_, S>,
    order: &[usize],
    min_load: f64,
) -> usize {
    let idle = |p: usize| cands.load(p) <= min_load + input.weights.cold_slack;
    input
        .computing
        .filter(|&p| cands.pods.contains(&p) && idle(p))
        .or_else(|| order.iter().copied().find(|&c| idle(c)))
        .unwrap_or(order[0])
}
