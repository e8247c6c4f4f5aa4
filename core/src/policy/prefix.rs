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
//!   request, the prompt follows it while it is among those idlest pods; when it is busier,
//!   an idle pod takes the prompt (and becomes one more owner) only if computing it cold
//!   there is predicted sooner than waiting for that pod: its slot and the end of its
//!   prefill, then the rest. A burst of a new 2k-token prefix spreads over idle pods; one of
//!   8k tokens waits for the pod computing it.
//! - **What a spill costs.** Whenever the steps above would send the request to a pod that
//!   holds less of the prompt than some owner does (the guard, or load outscoring affinity),
//!   the spill must also cost less: its time to first token there (wait for a slot + prefill
//!   of the tokens that pod lacks) and the work it makes for others there, against the same
//!   at the best deeper owner (its queue × its service time + the rest it computes), from the
//!   pods' learned costs ([`crate::pod_costs`], [`super::PodLoad::placement_cost_s`]).
//!   Otherwise the owner keeps it. Fixed weights cannot tell a 128-token prefix, cheaper to
//!   compute again than to queue for, from a 4k-token one whose cold prefill costs more than
//!   waiting behind several requests (what it changed, and what it did not yet:
//!   `docs/benchmarks.md`, long prefixes).

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
        let (pod, reason) = guarded(cands, matched, min_load + w.imbalance_abs);
        return worth_the_spill(input, cands, matched, pod).unwrap_or((pod, reason));
    }
    let order = cands.rendezvous_order(first);
    if matched.iter().all(|&m| m == 0) {
        return cold(input, cands, &order, min_load);
    }
    let total = input.hashes.len() as f64;
    let score = |c: usize| w.prefix * matched[c] as f64 / total - cands.load(c);
    let mut best = order[0];
    for &c in &order[1..] {
        if score(c) > score(best) {
            best = c;
        }
    }
    if let Some(owner) = worth_the_spill(input, cands, matched, best) {
        return owner;
    }
    match matched[best] {
        0 => (best, Reason::Imbalanced),
        blocks => (best, Reason::PrefixHit { blocks }),
    }
}

/// The last step: `spill` was chosen although other pods hold more of the prompt. Returns the
/// deeper owner where the request costs least, when it costs no more than at `spill` (the
/// request then stays where its prefix is); `None` keeps the spill.
fn worth_the_spill<S: AsRef<str>>(
    input: &Inputs<'_, S>,
    cands: &Candidates<'_, S>,
    matched: &[usize],
    spill: usize,
) -> Option<(usize, Reason)> {
    let cost = |c: usize| cost_at(input, c, matched[c], 0.0);
    let owner = cands
        .pods
        .iter()
        .copied()
        .filter(|&c| matched[c] > matched[spill])
        .min_by(|&a, &b| cost(a).total_cmp(&cost(b)))?;
    (cost(owner) <= cost(spill)).then(|| {
        let blocks = matched[owner];
        (owner, Reason::PrefixHit { blocks })
    })
}

/// What sending the request to `pod`, which holds its first `held_blocks` blocks, costs
/// ([`super::PodLoad::placement_cost_s`]), its wait lasting at least `not_before_s`.
fn cost_at<S: AsRef<str>>(
    input: &Inputs<'_, S>,
    pod: usize,
    held_blocks: usize,
    not_before_s: f64,
) -> f64 {
    let held = held_blocks.saturating_mul(input.block_size);
    let uncached = input.prompt_tokens.saturating_sub(held);
    let load = input.loads.get(pod).copied().unwrap_or_default();
    load.placement_cost_s(uncached, not_before_s)
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
/// the idlest (within `cold_slack`), else the first of those idlest in rendezvous order,
/// unless waiting for the computing pod is predicted sooner.
fn cold<S: AsRef<str>>(
    input: &Inputs<'_, S>,
    cands: &Candidates<'_, S>,
    order: &[usize],
    min_load: f64,
) -> (usize, Reason) {
    let w = input.weights;
    // its homes: the first `cold_choices` in rendezvous order, unless all are overloaded
    let homes = match w.cold_choices {
        0 => order,
        k => &order[..k.min(order.len())],
    };
    let homes_min = homes
        .iter()
        .map(|&p| cands.load(p))
        .fold(f64::INFINITY, f64::min);
    let (order, min_load) = if homes_min <= min_load + w.imbalance_abs {
        (homes, homes_min)
    } else {
        (order, min_load)
    };
    let idle = |p: usize| cands.load(p) <= min_load + w.cold_slack;
    let computing = input.computing.filter(|c| cands.pods.contains(&c.pod));
    if let Some(c) = computing.filter(|c| idle(c.pod)) {
        return (c.pod, Reason::Computing);
    }
    let target = order.iter().copied().find(|&c| idle(c)).unwrap_or(order[0]);
    let Some(c) = computing else {
        return (target, Reason::Cold);
    };
    let there = cost_at(input, c.pod, c.blocks, c.ready_in_s);
    let here = cost_at(input, target, 0, 0.0);
    if there <= here {
        (c.pod, Reason::Computing)
    } else {
        (target, Reason::Cold)
    }
}
