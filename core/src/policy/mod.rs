//! The routing decision: which pod gets a request, and why.
//!
//! A decision is a value (pod + [`Reason`]) so that metrics, the debug response header and the
//! tests all speak about the same thing. [`decide`] takes it in steps, whatever the policy:
//!
//! 1. the candidates: the healthy pods, or every pod by load alone when none is known healthy
//!    (`Fallback`: affinity could keep sending a prefix to a dead owner);
//! 2. the baselines (`round_robin`, `random`, `least_loaded`: [`baseline`]) choose there;
//! 3. a prompt shorter than one block goes to the least-loaded pod (`ShortPrompt`);
//! 4. each candidate's match: the deepest probed block of the prompt's leading chain it owns;
//! 5. [`prefix`] weighs the matches against load, and a spill against what it costs;
//! 6. the other healthy pods are ranked as fallbacks.

pub mod baseline;
pub mod prefix;

use crate::block::BlockHash;
use crate::pod_costs::{CostPrior, PodCosts};
use crate::table::WAYS;
use serde::Deserialize;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Why a pod was chosen.
///
/// Each variant's name is written once, here: its kind ([`ReasonKind`], derived) gives the
/// kebab-case value of the debug header (`prefix-hit`) and, with `_` for `-`, the metric name
/// (`prefix_router_decisions{reason="prefix_hit"}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::EnumDiscriminants)]
#[strum_discriminants(
    name(ReasonKind),
    derive(strum::IntoStaticStr, strum::EnumIter, strum::EnumCount),
    strum(serialize_all = "kebab-case")
)]
pub enum Reason {
    /// `blocks` leading blocks of the prompt are owned by the chosen pod.
    PrefixHit { blocks: usize },
    /// No block of the prompt is owned by a live pod: rendezvous hash of the first block.
    Cold,
    /// No live pod holds the prompt yet, but the chosen one is computing its prefix for an
    /// earlier request: waiting for it costs less than computing it elsewhere, or it is among
    /// the idlest anyway.
    Computing,
    /// The prompt has no full block: least loaded.
    ShortPrompt,
    /// Load overrode cache affinity (imbalance guard, or a busy owner scored lower), and the
    /// request is predicted to see its first token sooner on the colder pod.
    Imbalanced,
    /// Nothing to reuse by prefix (`/v1/models`, embeddings, pooling, a continued
    /// response): least loaded in the request's model's pool.
    Passthrough,
    /// The router's own state is broken: fail open to plain balancing.
    Fallback,
    /// Policy `round_robin`.
    RoundRobin,
    /// Policy `random`.
    Random,
    /// Policy `least_loaded`.
    LeastLoaded,
}

impl ReasonKind {
    /// Stable kebab-case name (`prefix-hit`): the debug header's value.
    pub fn header_value(self) -> &'static str {
        self.into()
    }

    /// The name as a metric-name part (`prefix_hit`).
    pub fn metric_suffix(self) -> String {
        self.header_value().replace('-', "_")
    }

    /// Dense index (0..`ReasonKind::COUNT`) for per-reason arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl Reason {
    /// The reason's kind (the variant without its data).
    pub fn kind(&self) -> ReasonKind {
        ReasonKind::from(self)
    }

    /// Stable kebab-case name, used in the debug header.
    pub fn as_str(&self) -> &'static str {
        self.kind().header_value()
    }

    /// Leading blocks matched (0 unless a prefix hit).
    pub fn matched_blocks(&self) -> usize {
        match self {
            Reason::PrefixHit { blocks } => *blocks,
            _ => 0,
        }
    }
}

/// A routing decision: index into the configured pod list, plus the reason, plus where the
/// request goes if that pod cannot take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub pod: usize,
    pub reason: Reason,
    /// Other healthy pods to retry on, best first (written after `pod` in the destination
    /// header; Envoy moves on to the next one on a connect failure or reset).
    pub fallbacks: Fallbacks,
}

impl Decision {
    /// A decision without fallbacks.
    pub fn new(pod: usize, reason: Reason) -> Self {
        Decision {
            pod,
            reason,
            fallbacks: Fallbacks::default(),
        }
    }
}

/// How many fallback pods a decision names at most: with the chosen pod that is three tries
/// before Envoy's own balancing takes over; a bound on what one dead pod can cost a request.
pub const MAX_FALLBACKS: usize = 2;

/// Ranked fallback pods (indices), best first; a fixed array so a [`Decision`] stays `Copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Fallbacks([Option<usize>; MAX_FALLBACKS]);

impl Fallbacks {
    /// The first [`MAX_FALLBACKS`] of `ranked`.
    pub fn from_ranked(ranked: impl IntoIterator<Item = usize>) -> Self {
        let mut out = [None; MAX_FALLBACKS];
        for (slot, pod) in out.iter_mut().zip(ranked) {
            *slot = Some(pod);
        }
        Fallbacks(out)
    }

    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().flatten().copied()
    }
}

/// Selectable policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Cache affinity against load, spills weighed by their cost. `cost`, a policy of its own
    /// until 2026-12 (it won no measured workload), is read as this one.
    #[default]
    #[serde(alias = "cost")]
    Prefix,
    RoundRobin,
    Random,
    LeastLoaded,
}

/// Weights of the prefix policy (all configurable in the plugin configuration).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Weights {
    /// Score of a full prefix match, in units of load (one in-flight request = 1).
    pub prefix: f64,
    /// Load per request this router has in flight on the pod.
    pub inflight: f64,
    /// Load per request waiting in the pod's queue (from its last poll).
    pub waiting: f64,
    /// Load at 100% KV-cache usage.
    pub kv_cache: f64,
    /// Imbalance guard: absolute load gap…
    pub imbalance_abs: f64,
    /// …and ratio between busiest and idlest pod that switch to least-loaded.
    pub imbalance_ratio: f64,
    /// A cold prompt goes to the first pod in its rendezvous order whose load is within this
    /// much of the idlest pod's (0: the idlest pods, rendezvous among equals). A burst of a
    /// new prefix then spreads over idle pods while it is computed, rather than queueing on
    /// the one computing it: those requests miss either way, and each idle pod that takes one
    /// becomes another owner (measured: about +7 % req/s with a few hot groups, +6 % with
    /// many, against 8).
    pub cold_slack: f64,
    /// A cold prompt chooses only among the first this many pods in its rendezvous order
    /// (0: among all), unless each of them is more than `imbalance_abs` busier than the
    /// idlest pod. With 2, each prefix has two homes it returns to whenever it is computed
    /// again (after an eviction, say), picking the less busy: a prefix is not copied all over
    /// the fleet by chance, yet no home is overloaded (the power of two choices).
    pub cold_choices: usize,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            prefix: 8.0,
            inflight: 1.0,
            waiting: 1.0,
            kv_cache: 2.0,
            imbalance_abs: 8.0,
            imbalance_ratio: 2.0,
            cold_slack: 0.0,
            cold_choices: 0,
        }
    }
}

/// What the router knows about one pod's state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PodLoad {
    pub healthy: bool,
    /// This router's requests in flight on the pod.
    pub inflight: u32,
    /// Requests the pod said it was computing / queueing at its last poll.
    pub running: u32,
    pub waiting: u32,
    pub kv_cache_usage: f64,
    /// What a request costs there (learned, or the prior).
    pub costs: PodCosts,
}

impl Default for PodLoad {
    fn default() -> Self {
        PodLoad {
            healthy: true,
            inflight: 0,
            running: 0,
            waiting: 0,
            kv_cache_usage: 0.0,
            costs: PodCosts::resolve(&Default::default(), &CostPrior::default()),
        }
    }
}

impl PodLoad {
    /// Requests on the pod: this router's in flight, or what the pod last said it runs and
    /// queues, whichever is more (other routers' requests count too).
    pub fn outstanding(&self) -> u32 {
        self.inflight.max(self.running.saturating_add(self.waiting))
    }

    /// What sending a request here costs, in seconds: its own time to first token (a wait of
    /// at least `not_before_s`, then the prefill of its `uncached` tokens) plus the work it
    /// makes for others: the tokens that do not fit in the cache's free space evict as many
    /// of other prefixes, which their next requests compute again, and all of that work is
    /// counted once more in the share of the pod's slots that are taken (on an idle pod it
    /// costs nobody anything; on a saturated one it is capacity its other requests lose).
    /// A request's own time to first token alone would make every spill to an idle pod look
    /// free, however much it costs the fleet.
    pub fn placement_cost_s(&self, uncached: usize, not_before_s: f64) -> f64 {
        let c = &self.costs;
        let outstanding = self.outstanding();
        let busy = (f64::from(outstanding) / c.slots).min(1.0);
        let evict = c.per_token_s * c.evicted_tokens(uncached, self.kv_cache_usage);
        let work = c.prefill_s(uncached) + evict;
        c.wait_s(outstanding).max(not_before_s) + work + work * busy
    }
}

impl Weights {
    pub fn load(&self, p: &PodLoad) -> f64 {
        self.inflight * f64::from(p.inflight)
            + self.waiting * f64::from(p.waiting)
            + self.kv_cache * p.kv_cache_usage.clamp(0.0, 1.0)
    }
}

/// Rendezvous (highest-random-weight) order key of `pod` for `key`.
pub(crate) fn rendezvous_key(pod: &str, key: BlockHash) -> u64 {
    xxh3_64_with_seed(pod.as_bytes(), key.0)
}

/// Rendezvous choice among `pods` for `key`; `None` without pods.
pub fn rendezvous<S: AsRef<str>>(key: BlockHash, pods: &[S]) -> Option<usize> {
    pods.iter()
        .enumerate()
        .max_by_key(|(_, p)| rendezvous_key(p.as_ref(), key))
        .map(|(i, _)| i)
}

/// The blocks of a prompt's chain that a router records as owned and looks up: 0, 1, 3, 7,
/// …, 2^k − 1, and the last one. Block hashes are chained, so a pod that holds block `i` holds
/// every block before it: probing these finds the owned prefix to within a factor of two (and
/// exactly for a repeated prompt) with O(log n) table reads and writes per request instead of
/// n, which was a third of the filter's cost on 2k-token prompts (measured). The pods' cache
/// events still record every block they store.
pub fn probe_positions(blocks: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(usize::BITS as usize + 1);
    let mut next = 1usize;
    while next - 1 < blocks {
        out.push(next - 1);
        next = next.saturating_mul(2);
    }
    if blocks > 0 && out.last() != Some(&(blocks - 1)) {
        out.push(blocks - 1);
    }
    out
}

/// Everything [`decide`] looks at.
pub struct Inputs<'a, S: AsRef<str>> {
    pub policy: Policy,
    pub weights: &'a Weights,
    pub pods: &'a [S],
    /// Same length and order as `pods` (missing entries count as healthy and idle).
    pub loads: &'a [PodLoad],
    pub hashes: &'a [BlockHash],
    /// The prompt's length in tokens, and the block size (what a pod holding `i` blocks still
    /// computes: the prefill a spill costs).
    pub prompt_tokens: usize,
    pub block_size: usize,
    /// A per-router counter for rotation (round-robin and tie-breaks).
    pub counter: u64,
    /// A random number for the `random` policy.
    pub random: u64,
    /// A pod that an earlier request sent the prompt's first block to and that is still
    /// computing it (recorded, not yet ready). A cold prompt follows it there while it is
    /// among the idlest pods (`cold_slack`), or when waiting for it is predicted sooner than
    /// computing the prompt cold on the idlest ([`prefix`]).
    pub computing: Option<Computing>,
}

/// A pod still computing a prompt's leading blocks for an earlier request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Computing {
    pub pod: usize,
    /// How many leading blocks it will hold (to within the probed depths).
    pub blocks: usize,
    /// When it is predicted to hold them, seconds from now.
    pub ready_in_s: f64,
}

/// The live owners (pod indices) of one block: the table keeps at most [`WAYS`].
pub type Owners = [Option<usize>; WAYS];

/// One block's table entries among the current members: (pod index, the entry's stamp: when
/// the pod is predicted to hold the block, router clock in ns). A stamp after `now` is a pod
/// still computing the block for an earlier request.
pub type Entries = [Option<(usize, u64)>; WAYS];

/// The pods of `entries` that hold the block at `now` (not those still computing it).
pub fn ready_owners(entries: Entries, now: u64) -> Owners {
    entries.map(|e| e.filter(|&(_, at)| at <= now).map(|(p, _)| p))
}

impl Computing {
    /// For a prompt no pod holds yet (its first block has no ready owner): the pod computing
    /// its first block for an earlier request (the latest recorded, if several), how deep
    /// its entries go along the probed blocks, and when they are predicted ready. `entries`
    /// reads a block's table entries.
    pub fn of(
        hashes: &[BlockHash],
        entries: impl Fn(BlockHash) -> Entries,
        now: u64,
    ) -> Option<Self> {
        let &first = hashes.first()?;
        let at_first = entries(first);
        if ready_owners(at_first, now).iter().any(Option::is_some) {
            return None;
        }
        let (stamp, pod) = at_first
            .into_iter()
            .flatten()
            .filter(|&(_, at)| at > now)
            .map(|(pod, at)| (at, pod))
            .max()?;
        let has = |h: BlockHash| entries(h).into_iter().flatten().any(|(p, _)| p == pod);
        let blocks = probe_positions(hashes.len())
            .into_iter()
            .take_while(|&i| hashes.get(i).is_some_and(|&h| has(h)))
            .last()
            .map_or(1, |i| i + 1);
        Some(Computing {
            pod,
            blocks,
            ready_in_s: stamp.saturating_sub(now) as f64 / 1e9,
        })
    }
}

/// Chooses a pod, and ranks the other healthy pods as its fallbacks: those holding more of
/// the prompt first, then the less loaded (ties in pod order). `owners(h)` returns the live
/// owners of block `h`.
pub fn decide<S: AsRef<str>>(
    input: &Inputs<'_, S>,
    owners: impl FnMut(BlockHash) -> Owners,
) -> Option<Decision> {
    let mut matched = vec![0usize; input.pods.len()];
    let (pod, reason) = choose(input, owners, &mut matched)?;
    let healthy = |i: &usize| input.loads.get(*i).is_none_or(|l| l.healthy);
    let mut rest: Vec<usize> = (0..input.pods.len())
        .filter(|&i| i != pod)
        .filter(healthy)
        .collect();
    let load = |i: usize| {
        let l = input.loads.get(i).copied().unwrap_or_default();
        input.weights.load(&l)
    };
    rest.sort_by(|&a, &b| {
        matched[b]
            .cmp(&matched[a])
            .then(load(a).total_cmp(&load(b)))
            .then(a.cmp(&b))
    });
    Some(Decision {
        pod,
        reason,
        fallbacks: Fallbacks::from_ranked(rest),
    })
}

/// The choice itself, step by step; fills `matched` (per pod, leading blocks it owns) when it
/// looks them up.
fn choose<S: AsRef<str>>(
    input: &Inputs<'_, S>,
    owners: impl FnMut(BlockHash) -> Owners,
    matched: &mut [usize],
) -> Option<(usize, Reason)> {
    let cands = Candidates::of(input)?;
    if let Some(chosen) = baseline::choose(input, &cands) {
        return Some(chosen);
    }
    if cands.none_healthy {
        // Nothing is known to work: spread over every pod rather than follow affinity to an
        // owner that may be dead (it would get all of its prefix's traffic, every request
        // failing, until it came back).
        return Some((cands.least_loaded(), Reason::Fallback));
    }
    let Some(&first) = input.hashes.first() else {
        return Some((cands.least_loaded(), Reason::ShortPrompt));
    };
    lookup_matches(input, &cands, owners, matched);
    Some(prefix::choose(input, &cands, matched, first))
}

/// The pods a request may go to (step 1), with their loads as the weights count them.
pub struct Candidates<'a, S: AsRef<str>> {
    input: &'a Inputs<'a, S>,
    /// Pod indices, in pod order.
    pub pods: Vec<usize>,
    /// No pod is known healthy: these are all the pods.
    pub none_healthy: bool,
}

impl<'a, S: AsRef<str>> Candidates<'a, S> {
    /// The healthy pods, else every pod; `None` without pods.
    fn of(input: &'a Inputs<'a, S>) -> Option<Self> {
        let n = input.pods.len();
        if n == 0 {
            return None;
        }
        let healthy = |i: &usize| input.loads.get(*i).is_none_or(|l| l.healthy);
        let pods: Vec<usize> = (0..n).filter(healthy).collect();
        let none_healthy = pods.is_empty();
        let pods = if none_healthy { (0..n).collect() } else { pods };
        Some(Candidates {
            input,
            pods,
            none_healthy,
        })
    }

    /// Pod `i`'s load, as the weights count it.
    pub fn load(&self, i: usize) -> f64 {
        let l = self.input.loads.get(i).copied().unwrap_or_default();
        self.input.weights.load(&l)
    }

    /// The least loaded, rotating the starting point so that equals share the work.
    pub fn least_loaded(&self) -> usize {
        let k = self.pods.len();
        let start = (self.input.counter % k as u64) as usize;
        let mut best = self.pods[start];
        for j in 1..k {
            let c = self.pods[(start + j) % k];
            if self.load(c) < self.load(best) {
                best = c;
            }
        }
        best
    }

    /// The smallest and largest load among them.
    pub fn load_range(&self) -> (f64, f64) {
        self.pods.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &c| {
            (lo.min(self.load(c)), hi.max(self.load(c)))
        })
    }

    /// Them in the rendezvous order of `first`: ties and cold prompts resolve identically on
    /// every router.
    pub fn rendezvous_order(&self, first: BlockHash) -> Vec<usize> {
        let mut order = self.pods.clone();
        order.sort_by_key(|&c| {
            std::cmp::Reverse(rendezvous_key(self.input.pods[c].as_ref(), first))
        });
        order
    }
}

/// Step 4: per candidate, the deepest probed block of the prompt's leading chain it owns
/// (hashes are chained, so owning block *i* means having computed blocks 0..=i); the probing
/// stops at the first block no candidate owns.
fn lookup_matches<S: AsRef<str>>(
    input: &Inputs<'_, S>,
    cands: &Candidates<'_, S>,
    mut owners: impl FnMut(BlockHash) -> Owners,
    matched: &mut [usize],
) {
    for i in probe_positions(input.hashes.len()) {
        let Some(&h) = input.hashes.get(i) else {
            break;
        };
        let mut owned = false;
        for p in owners(h).into_iter().flatten() {
            if cands.pods.contains(&p) {
                matched[p] = i + 1;
                owned = true;
            }
        }
        if !owned {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const PODS: [&str; 3] = ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"];

    fn h(n: u64) -> BlockHash {
        BlockHash(n)
    }

    /// Entries of a table in which `rows` (block, pod, ready at ns) were recorded.
    fn entries_of(rows: &[(u64, usize, u64)]) -> impl Fn(BlockHash) -> Entries + '_ {
        move |b: BlockHash| {
            let mut e: Entries = [None; WAYS];
            for (slot, &(_, pod, at)) in e.iter_mut().zip(rows.iter().filter(|r| r.0 == b.0)) {
                *slot = Some((pod, at));
            }
            e
        }
    }

    #[test]
    fn a_prompt_computing_on_a_pod_is_found_as_deep_as_its_entries_go() {
        let hashes: Vec<BlockHash> = (10..20).map(h).collect();
        let now = 1_000_000_000;
        // pod 2 records blocks 0, 1 and 3 of the chain, ready in 0.25 s; pod 0 an older
        // computation of block 0 only, ready sooner
        let rows = [
            (10, 2, now + 250_000_000),
            (11, 2, now + 250_000_000),
            (13, 2, now + 250_000_000),
            (10, 0, now + 100_000_000),
        ];
        let c = Computing::of(&hashes, entries_of(&rows), now).unwrap();
        assert_eq!(
            (c.pod, c.blocks),
            (2, 4),
            "the latest recorded; probed 0, 1, 3"
        );
        assert!((c.ready_in_s - 0.25).abs() < 1e-9);
        // once ready anywhere, the first block is held: nothing is being waited for
        let ready = [(10, 1, now), (10, 2, now + 5)];
        assert_eq!(Computing::of(&hashes, entries_of(&ready), now), None);
        assert_eq!(Computing::of(&hashes, entries_of(&[]), now), None);
        assert_eq!(Computing::of(&[], entries_of(&rows), now), None);
        assert_eq!(
            ready_owners(entries_of(&ready)(h(10)), now),
            [Some(1), None, None, None]
        );
    }

    fn idle() -> Vec<PodLoad> {
        vec![PodLoad::default(); 3]
    }

    fn busy(inflight: [u32; 3]) -> Vec<PodLoad> {
        inflight
            .iter()
            .map(|&i| PodLoad {
                inflight: i,
                ..PodLoad::default()
            })
            .collect()
    }

    fn run(
        policy: Policy,
        loads: &[PodLoad],
        hashes: &[BlockHash],
        owners: &[(u64, usize)],
        counter: u64,
    ) -> Decision {
        run_computing(policy, loads, hashes, owners, counter, None)
    }

    fn run_computing(
        policy: Policy,
        loads: &[PodLoad],
        hashes: &[BlockHash],
        owners: &[(u64, usize)],
        counter: u64,
        computing: Option<usize>,
    ) -> Decision {
        let mut by_hash: HashMap<u64, Vec<usize>> = HashMap::new();
        for &(k, p) in owners {
            by_hash.entry(k).or_default().push(p);
        }
        let w = Weights::default();
        let input = Inputs {
            policy,
            weights: &w,
            pods: &PODS,
            loads,
            hashes,
            prompt_tokens: hashes.len() * 4,
            block_size: 4,
            counter,
            random: 7,
            // still 100 ms from holding the prompt's one block
            computing: computing.map(|pod| Computing {
                pod,
                blocks: 1,
                ready_in_s: 0.1,
            }),
        };
        decide(&input, |x| {
            let v = by_hash.get(&x.0);
            let at = |i: usize| v.and_then(|v| v.get(i)).copied();
            std::array::from_fn(at)
        })
        .unwrap()
    }

    #[test]
    fn probes_double_then_take_the_last_block() {
        assert_eq!(probe_positions(0), Vec::<usize>::new());
        assert_eq!(probe_positions(1), [0]);
        assert_eq!(probe_positions(3), [0, 1, 2]);
        assert_eq!(probe_positions(4), [0, 1, 3]);
        assert_eq!(probe_positions(16), [0, 1, 3, 7, 15]);
        assert_eq!(probe_positions(17), [0, 1, 3, 7, 15, 16]);
        assert_eq!(probe_positions(63), [0, 1, 3, 7, 15, 31, 62]);
    }

    #[test]
    fn a_long_prompt_matches_its_deepest_probed_block() {
        let hashes: Vec<BlockHash> = (1..=20).map(h).collect();
        // pod 1 recorded a 10-block prompt that shares the first 10 (probed: 0, 1, 3, 7, 9);
        // pod 2 holds the whole 20 (as a repeat records: 0, 1, 3, 7, 15, 19)
        let ten: Vec<(u64, usize)> = [1, 2, 4, 8, 10].map(|k| (k, 1)).to_vec();
        let d = run(Policy::Prefix, &idle(), &hashes, &ten, 0);
        assert_eq!((d.pod, d.reason), (1, Reason::PrefixHit { blocks: 8 }));
        let mut both = ten.clone();
        both.extend([1, 2, 4, 8, 16, 20].map(|k| (k, 2)));
        let d = run(Policy::Prefix, &idle(), &hashes, &both, 0);
        assert_eq!((d.pod, d.reason), (2, Reason::PrefixHit { blocks: 20 }));
        // a block that is not probed is never asked for
        let lookups = std::cell::Cell::new(0);
        let w = Weights::default();
        let input = Inputs {
            policy: Policy::Prefix,
            weights: &w,
            pods: &PODS,
            loads: &idle(),
            hashes: &hashes,
            prompt_tokens: 80,
            block_size: 4,
            counter: 0,
            random: 0,
            computing: None,
        };
        decide(&input, |x| {
            assert!(
                [1, 2, 4, 8, 16, 20].contains(&x.0),
                "block {} asked for",
                x.0
            );
            lookups.set(lookups.get() + 1);
            [Some(0), None, None, None]
        });
        assert_eq!(lookups.get(), 6);
    }

    #[test]
    fn prefix_policy_table() {
        let down1 = {
            let mut l = idle();
            l[1].healthy = false;
            l
        };
        let cold1 = rendezvous(h(1), &PODS).unwrap();
        struct Case {
            name: &'static str,
            loads: Vec<PodLoad>,
            hashes: Vec<BlockHash>,
            owners: Vec<(u64, usize)>,
            pod: usize,
            reason: Reason,
        }
        let cases = vec![
            Case {
                name: "short prompt → least loaded",
                loads: busy([3, 0, 2]),
                hashes: vec![],
                owners: vec![],
                pod: 1,
                reason: Reason::ShortPrompt,
            },
            Case {
                name: "cold → rendezvous",
                loads: idle(),
                hashes: vec![h(1), h(2)],
                owners: vec![],
                pod: cold1,
                reason: Reason::Cold,
            },
            Case {
                name: "full hit",
                loads: idle(),
                hashes: vec![h(1), h(2)],
                owners: vec![(1, 1), (2, 1)],
                pod: 1,
                reason: Reason::PrefixHit { blocks: 2 },
            },
            Case {
                name: "deeper owner wins",
                loads: idle(),
                hashes: vec![h(1), h(2), h(3)],
                owners: vec![(1, 0), (2, 2)],
                pod: 2,
                reason: Reason::PrefixHit { blocks: 2 },
            },
            Case {
                name: "gap stops the chain",
                loads: idle(),
                hashes: vec![h(1), h(2), h(3)],
                owners: vec![(1, 0), (3, 2)],
                pod: 0,
                reason: Reason::PrefixHit { blocks: 1 },
            },
            Case {
                name: "owner down → cold elsewhere",
                loads: down1.clone(),
                hashes: vec![h(1)],
                owners: vec![(1, 1)],
                pod: rendezvous(h(1), &[PODS[0], PODS[2]])
                    .map(|i| if i == 0 { 0 } else { 2 })
                    .unwrap(),
                reason: Reason::Cold,
            },
            Case {
                name: "busy owner still wins below the affinity weight",
                loads: busy([5, 0, 0]),
                hashes: vec![h(1)],
                owners: vec![(1, 0)],
                pod: 0,
                reason: Reason::PrefixHit { blocks: 1 },
            },
            Case {
                name: "imbalance guard → least loaded",
                loads: busy([12, 1, 3]),
                hashes: vec![h(1)],
                owners: vec![(1, 0)],
                pod: 1,
                reason: Reason::Imbalanced,
            },
            Case {
                name: "imbalance guard → a second, not overloaded owner keeps the hit",
                loads: busy([12, 1, 3]),
                hashes: vec![h(1), h(2)],
                owners: vec![(1, 0), (2, 0), (1, 2), (2, 2)],
                pod: 2,
                reason: Reason::PrefixHit { blocks: 2 },
            },
            Case {
                name: "two owners: the less loaded one",
                loads: busy([4, 0, 1]),
                hashes: vec![h(1)],
                owners: vec![(1, 0), (1, 2)],
                pod: 2,
                reason: Reason::PrefixHit { blocks: 1 },
            },
            Case {
                name: "partial match outscored by load",
                loads: busy([7, 0, 0]),
                hashes: vec![h(1), h(2), h(3), h(4)],
                owners: vec![(1, 0)],
                pod: rendezvous(h(1), &[PODS[1], PODS[2]])
                    .map(|i| i + 1)
                    .unwrap(),
                reason: Reason::Imbalanced,
            },
        ];
        for c in cases {
            let d = run(Policy::Prefix, &c.loads, &c.hashes, &c.owners, 0);
            assert_eq!((d.pod, d.reason), (c.pod, c.reason), "{}", c.name);
        }
    }

    #[test]
    fn cold_goes_to_the_idlest_pods_in_rendezvous_order() {
        // a key whose rendezvous order is 0, then 1 or 2
        let key = (0..1000u64)
            .map(h)
            .find(|k| rendezvous(*k, &PODS) == Some(0))
            .unwrap();
        let next = rendezvous(key, &[PODS[1], PODS[2]]).unwrap() + 1;
        let cold = |loads: [u32; 3], computing| {
            let d = run_computing(Policy::Prefix, &busy(loads), &[key], &[], 0, computing);
            let follows = computing == Some(d.pod);
            let want = if follows {
                Reason::Computing
            } else {
                Reason::Cold
            };
            assert_eq!(d.reason, want);
            d.pod
        };
        assert_eq!(cold([0, 0, 0], None), 0, "all idle: the rendezvous choice");
        assert_eq!(
            cold([1, 0, 0], None),
            next,
            "one request more: the next idle"
        );
        assert_eq!(cold([1, 1, 0], None), 2);
        // a burst of the same new prefix: the pod computing it takes the next request only
        // while it is among the idlest, else an idle pod becomes another owner
        assert_eq!(cold([1, 1, 1], Some(1)), 1);
        assert_eq!(cold([0, 1, 0], Some(1)), 0);
        let mut down = busy([0, 0, 0]);
        down[1].healthy = false;
        let d = run_computing(Policy::Prefix, &down, &[key], &[], 0, Some(1));
        assert_ne!(d.pod, 1, "never follows to an unhealthy pod");
        // the old allowance (within 8 of the idlest) keeps the rendezvous pod
        let w = Weights {
            cold_slack: 8.0,
            ..Weights::default()
        };
        let input = Inputs {
            policy: Policy::Prefix,
            weights: &w,
            pods: &PODS,
            loads: &busy([6, 0, 0]),
            hashes: &[key],
            prompt_tokens: 4,
            block_size: 4,
            counter: 0,
            random: 0,
            computing: None,
        };
        assert_eq!(decide(&input, |_| [None; WAYS]).map(|d| d.pod), Some(0));
        // two homes: the less busy of the first two in rendezvous order, though the third
        // pod is idler; with all of its homes too busy, the idlest
        let w = Weights {
            cold_choices: 2,
            ..Weights::default()
        };
        let mut loads = [0u32; 3];
        loads[next] = 1;
        loads[0] = 2;
        let input = Inputs {
            policy: Policy::Prefix,
            weights: &w,
            pods: &PODS,
            loads: &busy(loads),
            hashes: &[key],
            prompt_tokens: 4,
            block_size: 4,
            counter: 0,
            random: 0,
            computing: None,
        };
        assert_eq!(decide(&input, |_| [None; WAYS]).map(|d| d.pod), Some(next));
        let w = Weights {
            cold_choices: 2,
            imbalance_abs: 0.5,
            // (not the imbalance guard)
            imbalance_ratio: 100.0,
            ..Weights::default()
        };
        let loads = busy(loads.map(|l| l + 1));
        let input = Inputs {
            weights: &w,
            loads: &loads,
            ..input
        };
        let d = decide(&input, |_| [None; WAYS]).unwrap();
        assert_eq!((d.pod, d.reason), (3 - next, Reason::Cold));
        // 9 − 0 > 8 and 9 > 2×0: the imbalance guard moves it whatever the slack
        assert_ne!(run(Policy::Prefix, &busy([9, 0, 0]), &[key], &[], 0).pod, 0);
    }

    #[test]
    fn a_cold_prompt_waits_for_the_pod_computing_it_when_that_is_sooner() {
        // pod 0 computes the prompt's 32 leading blocks (4,096 tokens of 4,136) for an
        // earlier request, ready in 300 ms, with 6 requests on it; pods 1, 2 are idle
        let hashes: Vec<BlockHash> = (1..=32).map(h).collect();
        let w = Weights::default();
        let go = |ready_in_s: f64, blocks: usize| {
            let input = Inputs {
                policy: Policy::Prefix,
                weights: &w,
                pods: &PODS,
                loads: &busy([6, 0, 0]),
                hashes: &hashes,
                prompt_tokens: 4136,
                block_size: 128,
                counter: 0,
                random: 0,
                computing: Some(Computing {
                    pod: 0,
                    blocks,
                    ready_in_s,
                }),
            };
            let d = decide(&input, |_| [None; WAYS]).unwrap();
            let want = if d.pod == 0 {
                Reason::Computing
            } else {
                Reason::Cold
            };
            assert_eq!(d.reason, want);
            d.pod
        };
        // there: max(⌈6 + 1 − 4⌉ × 25 ms, 300 ms) + 2 × (5 ms + 40 tokens) = 318 ms; cold
        // on an idle pod: 5 + 413.6 ms
        assert_eq!(go(0.3, 32), 0);
        // ready in 450 ms: 468 > 418.6, an idle pod computes it
        assert_ne!(go(0.45, 32), 0);
        // only the first block will be there: 300 ms + 2 × 405.8 > 418.6
        assert_ne!(go(0.3, 1), 0);
    }

    /// Pod 0 owns the whole prompt (`blocks` of 128 tokens) with `outstanding` requests on
    /// it; pods 1 and 2 hold none and have `others` each. Costs: the prior (5 ms + 100 µs per
    /// token prefill, a request holds one of 4 slots for 100 ms), with every pod's learned
    /// per-token cost `per_token_us` µs when given.
    fn spill(blocks: u64, outstanding: u32, others: u32, per_token_us: Option<f64>) -> Decision {
        let mut loads = busy([outstanding, others, others]);
        if let Some(us) = per_token_us {
            for l in &mut loads {
                l.costs.per_token_s = us / 1e6;
            }
        }
        spill_with(&loads, blocks)
    }

    /// Pod 0 owns the whole prompt (`blocks` of 128 tokens, then a 40-token tail).
    fn spill_with(loads: &[PodLoad], blocks: u64) -> Decision {
        let hashes: Vec<BlockHash> = (1..=blocks).map(h).collect();
        let w = Weights::default();
        let input = Inputs {
            policy: Policy::Prefix,
            weights: &w,
            pods: &PODS,
            loads,
            hashes: &hashes,
            prompt_tokens: blocks as usize * 128 + 40,
            block_size: 128,
            counter: 0,
            random: 0,
            computing: None,
        };
        decide(&input, |_| [Some(0), None, None, None]).unwrap()
    }

    #[test]
    fn a_spill_must_pay_for_itself() {
        // 32 blocks (4,136 tokens): cold, 5 + 413.6 = 418.6 ms on an idle pod (no one else's
        // work displaced there); the owner with 12 on it waits ⌈12 + 1 − 4⌉ × 100/4 = 225 ms,
        // then prefills the 40-token tail, 9 ms, counted twice on a saturated pod: 243 ms. The
        // imbalance guard (12 − 0 > 8, 12 > 2 × 0) would spill; the cost keeps it.
        let d = spill(32, 12, 0, None);
        assert_eq!((d.pod, d.reason), (0, Reason::PrefixHit { blocks: 32 }));
        // with 20 on the owner, 425 + 2 × 9 ms > 418.6: the spill pays
        let d = spill(32, 20, 0, None);
        assert_eq!(d.reason, Reason::Imbalanced);
        assert_ne!(d.pod, 0);
        // one block (168 tokens): a cold prefill of 21.8 ms beats that queue
        let d = spill(1, 12, 0, None);
        assert_eq!(d.reason, Reason::Imbalanced);
        // learned costs decide, not the prompt's length alone: where prefill costs 10 µs a
        // token, the 4k-token cold prefill (46 ms) beats the owner's 225 ms queue
        let d = spill(32, 12, 0, Some(10.0));
        assert_eq!(d.reason, Reason::Imbalanced);
        // load outscoring affinity (not the guard: 21 < 2 × 12): at the owner 450 + 2 × 9 ms,
        // at a saturated colder pod 225 + 2 × 418.6: the owner keeps it; with a 1-block
        // prompt (225 + 2 × 21.8) it spills
        let d = spill(32, 21, 12, None);
        assert_eq!((d.pod, d.reason), (0, Reason::PrefixHit { blocks: 32 }));
        assert_eq!(spill(1, 21, 12, None).reason, Reason::Imbalanced);
        // an unhealthy owner is never kept, whatever it saves
        let mut loads = busy([0, 0, 0]);
        loads[0].healthy = false;
        assert_ne!(spill_with(&loads, 32).pod, 0);
    }

    #[test]
    fn a_placement_costs_the_wait_the_prefill_and_the_work_again_by_busy_share() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let mut l = PodLoad {
            inflight: 2,
            running: 4,
            waiting: 3,
            ..PodLoad::default()
        };
        // the pod's own count (7) is more than this router's (2): ⌈7 + 1 − 4⌉ × 25 ms, then
        // 5 + 100 ms of prefill, counted again on a saturated pod
        assert_eq!(l.outstanding(), 7);
        assert!(close(l.placement_cost_s(1000, 0.0), 0.1 + 2.0 * 0.105));
        // not before the given time
        assert!(close(l.placement_cost_s(1000, 0.5), 0.5 + 2.0 * 0.105));
        // half the slots taken: the work counts one and a half times
        l = PodLoad {
            inflight: 2,
            ..PodLoad::default()
        };
        assert!(close(l.placement_cost_s(1000, 0.0), 1.5 * 0.105));
        // a full cache of 10k tokens: the 1,000 computed evict as many, 100 ms more work
        l.kv_cache_usage = 1.0;
        l.costs.cache_tokens = Some(10_000.0);
        assert!(close(l.placement_cost_s(1000, 0.0), 1.5 * 0.205));
    }

    #[test]
    fn fallbacks_rank_by_held_prefix_then_load_and_skip_the_unhealthy() {
        // pod 0 holds both blocks, pod 2 the first; pod 1 is idle
        let owners = [(1, 0), (2, 0), (1, 2)];
        let d = run(Policy::Prefix, &busy([0, 0, 3]), &[h(1), h(2)], &owners, 0);
        assert_eq!((d.pod, d.reason), (0, Reason::PrefixHit { blocks: 2 }));
        // the second owner first although it is busier: a retry there still skips a block
        assert_eq!(d.fallbacks.iter().collect::<Vec<_>>(), [2, 1]);
        // a cold prompt: by load, then pod order; never the chosen pod itself
        let d = run(Policy::Prefix, &busy([1, 0, 0]), &[h(9)], &[], 0);
        let expect = if d.pod == 0 {
            vec![1, 2]
        } else {
            vec![3 - d.pod, 0]
        };
        assert_eq!(d.fallbacks.iter().collect::<Vec<_>>(), expect, "{d:?}");
        // an unhealthy pod is never a fallback
        let mut l = idle();
        l[1].healthy = false;
        let d = run(Policy::Prefix, &l, &[h(1), h(2)], &owners, 0);
        assert_eq!(d.fallbacks.iter().collect::<Vec<_>>(), [2]);
        // with one pod there is nothing to fall back on
        assert_eq!(Fallbacks::from_ranked([]), Fallbacks::default());
        assert_eq!(
            Fallbacks::from_ranked([4, 5, 6]).iter().count(),
            MAX_FALLBACKS
        );
    }

    #[test]
    fn other_policies() {
        let l = busy([2, 0, 1]);
        assert_eq!(run(Policy::RoundRobin, &l, &[h(1)], &[], 4).pod, 1);
        assert_eq!(
            run(Policy::RoundRobin, &l, &[h(1)], &[], 4).reason,
            Reason::RoundRobin
        );
        assert_eq!(run(Policy::Random, &l, &[h(1)], &[], 0).pod, 7 % 3);
        assert_eq!(
            run(Policy::LeastLoaded, &l, &[h(1)], &[(1, 0)], 0),
            Decision {
                pod: 1,
                reason: Reason::LeastLoaded,
                fallbacks: Fallbacks::from_ranked([2, 0]),
            }
        );
        // unhealthy pods are never chosen by any policy
        let mut l = idle();
        l[0].healthy = false;
        l[2].healthy = false;
        for p in [
            Policy::Prefix,
            Policy::RoundRobin,
            Policy::Random,
            Policy::LeastLoaded,
        ] {
            for c in 0..5 {
                assert_eq!(run(p, &l, &[h(c)], &[(c, 0)], c).pod, 1, "{p:?}");
            }
        }
    }

    #[test]
    fn with_no_pod_known_healthy_affinity_is_dropped() {
        let mut l = idle();
        for p in &mut l {
            p.healthy = false;
        }
        let mut chosen = std::collections::BTreeSet::new();
        for c in 0..3 {
            // pod 0 owns the prompt, but nothing is known to work: spread by load
            let d = run(Policy::Prefix, &l, &[h(1), h(2)], &[(1, 0), (2, 0)], c);
            assert_eq!(d.reason, Reason::Fallback);
            chosen.insert(d.pod);
        }
        assert_eq!(chosen.len(), 3, "rotates over every pod");
    }

    #[test]
    fn no_pods_no_decision() {
        let empty: [&str; 0] = [];
        let w = Weights::default();
        let input = Inputs {
            policy: Policy::Prefix,
            weights: &w,
            pods: &empty,
            loads: &[],
            hashes: &[],
            prompt_tokens: 0,
            block_size: 4,
            counter: 0,
            random: 0,
            computing: None,
        };
        assert!(decide(&input, |_| [None; WAYS]).is_none());
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
        let two = &PODS[..2];
        for i in 0..500u64 {
            let k = BlockHash(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let p = rendezvous(k, &PODS).unwrap();
            if p < 2 {
                assert_eq!(
                    rendezvous(k, two),
                    Some(p),
                    "removing a pod only moves its own keys"
                );
            }
        }
    }

    #[test]
    fn reason_names() {
        assert_eq!(Reason::PrefixHit { blocks: 3 }.as_str(), "prefix-hit");
        assert_eq!(Reason::PrefixHit { blocks: 3 }.matched_blocks(), 3);
        assert_eq!(Reason::Imbalanced.as_str(), "imbalanced");
        assert_eq!(Reason::Cold.matched_blocks(), 0);
    }

    #[test]
    fn reason_names_derive_from_the_enum() {
        use strum::{EnumCount, IntoEnumIterator};
        let kinds: Vec<ReasonKind> = ReasonKind::iter().collect();
        assert_eq!(kinds.len(), ReasonKind::COUNT);
        for (i, k) in kinds.iter().enumerate() {
            assert_eq!(k.index(), i, "indices are dense and in declaration order");
        }
        let headers: Vec<&str> = kinds.iter().map(|k| k.header_value()).collect();
        assert_eq!(
            headers,
            [
                "prefix-hit",
                "cold",
                "computing",
                "short-prompt",
                "imbalanced",
                "passthrough",
                "fallback",
                "round-robin",
                "random",
                "least-loaded"
            ]
        );
        assert_eq!(ReasonKind::PrefixHit.metric_suffix(), "prefix_hit");
        assert_eq!(Reason::PrefixHit { blocks: 3 }.as_str(), "prefix-hit");
        assert_eq!(Reason::LeastLoaded.kind(), ReasonKind::LeastLoaded);
    }
}
