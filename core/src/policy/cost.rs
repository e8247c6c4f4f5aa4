//! Policy `cost`: send a request where it is predicted to see its first token soonest, and
//! warm another pod with its prefix when that pays for itself.
//!
//! For each healthy pod the predicted time to first token is
//!
//! ```text
//! ttft = wait for a slot + prefill of the tokens the pod does not hold
//!      = ceil(outstanding + 1 − slots)⁺ × service_s / slots  +  base_s + per_token_s × computed
//! ```
//!
//! with `outstanding` the larger of this router's in-flight count and what the pod last said it
//! runs and queues, and the costs learned per pod ([`crate::pod_costs`]). A choice is scored by
//! that plus what it costs *other* requests: the tokens it computes that do not fit in the
//! pod's free cache space evict as many of other prefixes, which their next requests compute
//! again (`evict = per_token_s × evicted tokens`). Without that, a router that
//! only minimizes each request's own TTFT keeps warming pods whose caches are full and
//! thrashes them (measured: the hit rate fell from 0.90 to 0.55 on the many-groups run).
//!
//! - The pod with the least predicted TTFT wins; pods within 5% of it count as equal: the warm
//!   one with the fewest requests on it, else the first in the rendezvous order of the
//!   prompt's first block.
//! - A cold prompt (no pod holds any of it) goes to the first pod in the rendezvous order of
//!   its first block that is not overloaded (its wait within one service time of the least
//!   queued pod's), so router replicas agree and new prefixes spread evenly.
//! - **Replication.** A single request rarely gains from a cold pod: its prefill costs more
//!   than waiting for a warm owner. But a prefix whose owners are saturated keeps queueing for
//!   as long as its demand lasts, while warming one more pod is paid once. So when the
//!   prefix's own demand exceeds its owners' slots, another pod `r` takes the request if it
//!   has room for the prefix (nothing evicted) and
//!   `(wait(owner) − wait(r)) × demand > prefill(r) − prefill(owner)`,
//!   `demand` being the requests of this prefix in flight, this one included: a few hot
//!   prefixes that fit everywhere spread over as many pods as their load needs, a prefix
//!   with one request in flight never leaves its owner for a colder pod.
//! - Reasons: `prefix-hit` (the chosen pod holds blocks of the prompt), `cold` (no pod does),
//!   `imbalanced` (some pod does, but a colder one is predicted faster even for this request),
//!   `replicate` (the rule above).

use super::{rendezvous_key, Inputs, Reason};
use crate::block::BlockHash;

/// Predictions within this fraction of the best count as equal.
const TOLERANCE: f64 = 0.05;

/// One candidate's prediction.
#[derive(Clone, Copy, Debug)]
struct Predicted {
    pod: usize,
    outstanding: u32,
    wait_s: f64,
    /// How long the pod's requests hold a slot.
    service_s: f64,
    /// Share of the pod's slots taken (0–1).
    busy: f64,
    prefill_s: f64,
    /// What the prefill costs others: into a cache this full, computing these tokens evicts
    /// about as many of other prefixes, which their next requests compute again.
    evict_s: f64,
}

impl Predicted {
    /// Work this request adds to the fleet on this pod (its prefill and what it evicts).
    fn work_s(&self) -> f64 {
        self.prefill_s + self.evict_s
    }

    /// What the choice costs: this request's time to first token, plus the evictions, with
    /// the work counted once more in the share `busy` of the pod's slots that are taken: work
    /// on a pod with idle slots costs nobody else anything, on a saturated pod it is capacity
    /// its other requests do not get.
    fn score_s(&self) -> f64 {
        self.wait_s + self.work_s() * (1.0 + self.busy)
    }
}

/// Chooses among `candidates` (healthy pod indices, non-empty); `matched[p]` is how many
/// leading blocks pod `p` holds.
pub(super) fn choose<S: AsRef<str>>(
    input: &Inputs<'_, S>,
    candidates: &[usize],
    matched: &[usize],
    first: BlockHash,
) -> (usize, Reason) {
    let mut order = candidates.to_vec();
    order.sort_by_key(|&c| std::cmp::Reverse(rendezvous_key(input.pods[c].as_ref(), first)));
    let predicted: Vec<Predicted> = order
        .iter()
        .map(|&pod| {
            let l = input.loads.get(pod).copied().unwrap_or_default();
            let held = matched.get(pod).copied().unwrap_or(0) * input.block_size;
            let outstanding = l.inflight.max(l.running.saturating_add(l.waiting));
            let computed = input.prompt_tokens.saturating_sub(held);
            Predicted {
                pod,
                outstanding,
                wait_s: l.costs.wait_s(outstanding),
                service_s: l.costs.service_s,
                busy: (f64::from(outstanding) / l.costs.slots).min(1.0),
                prefill_s: l.costs.prefill_s(computed),
                evict_s: l.costs.per_token_s * l.costs.evicted_tokens(computed, l.kv_cache_usage),
            }
        })
        .collect();
    let held = |p: &Predicted| matched.get(p.pod).copied().unwrap_or(0);
    let min = predicted
        .iter()
        .map(Predicted::score_s)
        .fold(f64::INFINITY, f64::min);
    // among near-equals: a warm pod with fewer requests on it, else the rendezvous order
    let best = predicted
        .iter()
        .enumerate()
        .filter(|(_, p)| p.score_s() <= min * (1.0 + TOLERANCE) + f64::EPSILON)
        .min_by_key(|(rank, p)| (if held(p) > 0 { p.outstanding } else { 0 }, *rank))
        .or(predicted.iter().enumerate().next())
        .map(|(_, p)| *p);
    let Some(best) = best else {
        return (candidates[0], Reason::Fallback);
    };
    let warm = predicted.iter().any(|p| held(p) > 0);
    if !warm {
        // A new prefix gets a home by rendezvous, as the prefix policy gives it: the first
        // pod in its order that is not overloaded (its wait within one service time of the
        // least queued pod's). Placing each new prefix on whichever pod is least queued at
        // that instant piles several prefixes' homes on one pod and leaves another with
        // none (measured: spread 1.5–1.9 on the many-groups run).
        let least_wait = predicted
            .iter()
            .map(|p| p.wait_s)
            .fold(f64::INFINITY, f64::min);
        let home = predicted
            .iter()
            .find(|p| p.wait_s <= least_wait + p.service_s)
            .map_or(best.pod, |p| p.pod);
        return (home, Reason::Cold);
    }
    if held(&best) == 0 {
        return (best.pod, Reason::Imbalanced);
    }
    // The prefix's own load needs more sequence slots than its owners have: warm one more
    // pod, the one whose warming saves the most, if it saves more than it costs. Only a pod
    // with room for the prefix: warming it is paid once and serves the prefix's demand; into
    // a full cache it only trades one prefix for another, which the choice above already
    // weighed for this request alone. (Comparing queues alone replicated on every passing
    // fluctuation: 8–10% of requests in steady state on the many-groups run, measured.)
    let demand = f64::from(input.demand.max(1));
    let owner_slots: f64 = predicted
        .iter()
        .filter(|p| held(p) > 0)
        .filter_map(|p| input.loads.get(p.pod))
        .map(|l| l.costs.slots)
        .sum();
    if demand > owner_slots {
        let net = |r: &Predicted| {
            (best.wait_s - r.wait_s) * demand - (r.work_s() - best.work_s()).max(0.0)
        };
        let replica = predicted
            .iter()
            .filter(|r| held(r) < held(&best) && r.evict_s <= 0.0 && net(r) > 0.0)
            .fold(None::<&Predicted>, |acc, r| match acc {
                Some(a) if net(a) >= net(r) => Some(a),
                _ => Some(r),
            });
        if let Some(r) = replica {
            return (r.pod, Reason::Replicate);
        }
    }
    (
        best.pod,
        Reason::PrefixHit {
            blocks: held(&best),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::super::{decide, PodLoad, Policy, Weights};
    use super::*;
    use crate::pod_costs::PodCosts;

    const PODS: [&str; 4] = [
        "127.0.0.1:8001",
        "127.0.0.1:8002",
        "127.0.0.1:8003",
        "127.0.0.1:8004",
    ];

    /// The sim pods of the benchmark: 5 ms + 100 µs per computed token, 4 slots of 80 ms.
    const SIM: PodCosts = PodCosts {
        base_s: 0.005,
        per_token_s: 100e-6,
        service_s: 0.08,
        slots: 4.0,
        cache_tokens: Some(32768.0),
    };

    fn pod(outstanding: u32) -> PodLoad {
        PodLoad {
            inflight: outstanding,
            costs: SIM,
            ..PodLoad::default()
        }
    }

    /// A pod whose cache is full: what it computes evicts other prefixes.
    fn full(outstanding: u32) -> PodLoad {
        PodLoad {
            kv_cache_usage: 1.0,
            ..pod(outstanding)
        }
    }

    /// A 32-block prompt (block size 128: 4096 tokens) whose every block pod `owners[i]` holds.
    fn run(loads: &[PodLoad], owners: &[usize], demand: u32) -> (usize, Reason) {
        let hashes: Vec<BlockHash> = (1..=32).map(BlockHash).collect();
        let w = Weights::default();
        let input = Inputs {
            policy: Policy::Cost,
            weights: &w,
            pods: &PODS,
            loads,
            hashes: &hashes,
            prompt_tokens: 32 * 128 + 50,
            block_size: 128,
            demand,
            counter: 0,
            random: 0,
            computing: None,
        };
        let mut o = [None; crate::table::WAYS];
        for (slot, &p) in o.iter_mut().zip(owners) {
            *slot = Some(p);
        }
        let d = decide(&input, |_| o).unwrap_or_else(|| unreachable!());
        (d.pod, d.reason)
    }

    fn cold_choice() -> usize {
        run(&[pod(0), pod(0), pod(0), pod(0)], &[], 1).0
    }

    #[test]
    fn decisions_table() {
        let cold = cold_choice();
        let hit = Reason::PrefixHit { blocks: 32 };
        let mut busy_cold = [pod(0), pod(0), pod(0), pod(0)];
        busy_cold[cold] = pod(12);
        let mut queued_cold = [pod(0), pod(0), pod(0), pod(0)];
        queued_cold[cold] = pod(6);
        // (what, loads, owners, demand, pod (None: any pod neither owning nor busy), reason)
        type Case = (
            &'static str,
            Vec<PodLoad>,
            Vec<usize>,
            u32,
            Option<usize>,
            Reason,
        );
        let cases: Vec<Case> = vec![
            (
                "idle owner keeps its prefix",
                vec![pod(0); 4],
                vec![2],
                1,
                Some(2),
                hit,
            ),
            (
                "an owner with a short queue still beats a 4k-token cold prefill",
                vec![pod(6), pod(0), pod(0), pod(0)],
                vec![0],
                1,
                Some(0),
                hit,
            ),
            (
                "a deep queue at the owner costs more than the cold prefill",
                vec![pod(40), pod(0), pod(0), pod(0)],
                vec![0],
                1,
                None,
                Reason::Imbalanced,
            ),
            (
                "many requests of the prefix queueing: warm another pod",
                vec![pod(8), pod(0), pod(0), pod(0)],
                vec![0],
                8,
                None,
                Reason::Replicate,
            ),
            (
                "many queueing, but the other caches are full: no replication",
                vec![pod(8), full(0), full(0), full(0)],
                vec![0],
                8,
                Some(0),
                hit,
            ),
            (
                "a deep queue still loses to a full cache's pod counting its evictions",
                vec![pod(30), full(0), full(0), full(0)],
                vec![0],
                1,
                Some(0),
                hit,
            ),
            (
                "two idle owners: the less loaded",
                vec![pod(3), pod(0), pod(1), pod(0)],
                vec![0, 2],
                8,
                Some(2),
                hit,
            ),
            (
                "owners with free slots: no replication however hot",
                vec![pod(2), pod(0), pod(3), pod(0)],
                vec![0, 2],
                30,
                Some(0),
                hit,
            ),
            (
                "cold: rendezvous",
                vec![pod(0); 4],
                vec![],
                1,
                Some(cold),
                Reason::Cold,
            ),
            (
                "cold, the rendezvous pod with a short queue: still its home",
                queued_cold.to_vec(),
                vec![],
                1,
                Some(cold),
                Reason::Cold,
            ),
            (
                "cold, the rendezvous pod overloaded: the next one",
                busy_cold.to_vec(),
                vec![],
                1,
                None,
                Reason::Cold,
            ),
        ];
        for (what, loads, owners, demand, want_pod, want_reason) in cases {
            let (p, r) = run(&loads, &owners, demand);
            assert_eq!(r, want_reason, "{what}");
            if let Some(w) = want_pod {
                assert_eq!(p, w, "{what}");
            } else {
                assert!(!owners.contains(&p), "{what}: went to an owner");
                assert!(loads[p].inflight < 4, "{what}: went to a busy pod {p}");
            }
        }
        let (p, _) = run(&busy_cold, &[], 1);
        assert_ne!(p, cold);
    }

    #[test]
    fn replication_stops_once_the_owners_keep_up() {
        // a hot prefix (8 in flight) on 4-slot pods: one owner queues, two owners do not
        let (_, r) = run(&[pod(8), pod(0), pod(0), pod(0)], &[0], 8);
        assert_eq!(r, Reason::Replicate);
        let (p, r) = run(&[pod(4), pod(3), pod(0), pod(0)], &[0, 1], 8);
        assert_eq!((p, r), (1, Reason::PrefixHit { blocks: 32 }));
    }

    #[test]
    fn learned_costs_change_the_choice() {
        // the same queue at the owner: on a pod with cheap prefill (GPU-like) the cold pod
        // is faster, on an expensive one the owner is
        let cheap = PodCosts {
            per_token_s: 1e-6,
            ..SIM
        };
        let mut loads = [pod(6), pod(0), pod(0), pod(0)];
        assert_eq!(run(&loads, &[0], 1).0, 0);
        for l in &mut loads {
            l.costs = cheap;
        }
        let (p, r) = run(&loads, &[0], 1);
        assert_ne!(p, 0);
        assert_eq!(r, Reason::Imbalanced);
    }
}
