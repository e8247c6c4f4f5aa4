//! Per-request routing, independent of proxy-wasm: body in, decision (or client error) out.
//!
//! The filter's contexts only move bytes and headers; everything that decides lives here and
//! in `prefix-core`, and is unit-tested against a fake host.

use crate::host::Store;
use crate::members::{read_slots, Members, Placement};
use crate::ownership::{OwnershipTable, RecordStats};
use crate::pods::{fleet_id, parse_state, Inflight, Keys, PodState};
use crate::ticket::{Pending, RouteCost, Ticket};
use prefix_core::membership::Slots;
use prefix_core::policy::{
    decide, probe_positions, ready_owners, Computing, Decision, Entries, Inputs, PodLoad, Policy,
    Reason,
};
use prefix_core::prompt_blocks::PromptBlocks;
use prefix_core::request::InferenceRequest;
use prefix_core::router_config::RouterConfig;
use prefix_core::table::{Bucket, Entry, TableLayout};
use prefix_core::{ApiError, BlockHash, ModelBundle};
use std::cell::{Cell, OnceCell, RefCell};
use std::rc::Rc;

/// With polling off (`poll_interval_ms: 0`), how long a pod that refused a connection is
/// left out before requests try it again (nothing else would ever bring it back).
pub const RETRY_REFUSED_NS: u64 = 5_000_000_000;

/// Everything a worker's requests share: built once per VM in `on_configure`.
pub struct Router {
    pub config: RouterConfig,
    /// The tokenizer and chat template: set once, when the fetch from `config.tokenizer`
    /// completes. Empty until then, or when it failed to load (or there is no source): every
    /// request is then balanced by load (reason `fallback`).
    pub bundle: OnceCell<ModelBundle>,
    pub layout: TableLayout,
    pub keys: Keys,
    /// The key every pod-state (and membership) write bumps.
    states_version_key: String,
    /// The fleet's packed in-flight counts, one per member slot.
    pub inflight_key: String,
    /// The fleet's member slots ([`crate::members`]).
    pub members_key: String,
    /// The members before anything was stored: the configured `pods`.
    configured: Slots,
    /// The members and every member's state as last read, under the CAS token of the
    /// states-version key at that read. Both change only when the poller or a failed
    /// response writes them (and bump the version), so most requests read one key instead
    /// of one per pod.
    states: RefCell<Option<SeenStates>>,
    /// The header the filter's own calls to pods carry (`pod_credentials`), resolved from
    /// Envoy's environment when the VM starts; never logged.
    pub pod_auth: Option<(String, String)>,
    counter: Cell<u64>,
    rng: Cell<u64>,
}

/// The members and their states as read under one states-version CAS token.
struct SeenStates {
    /// The version key's CAS token; `None` while the key does not exist (no state or
    /// membership was ever written: every write creates it), which is as cacheable as any.
    version: Option<u32>,
    members: Rc<Members>,
    states: Rc<Vec<PodState>>,
}

/// What one request knows about the pods: who they are, their states, loads, and the
/// in-flight counts read (all indexed by member position, except the counts: by slot).
pub struct Fleet {
    pub members: Rc<Members>,
    pub states: Rc<Vec<PodState>>,
    pub loads: Vec<PodLoad>,
    pub inflight: Inflight,
}

/// What [`decide`] is told of a prompt: its block hashes so far, its (estimated) length in
/// tokens, and what the table says of the block already read (not read again).
struct PromptView<'a> {
    hashes: &'a [BlockHash],
    tokens: usize,
    looked_up: Option<(BlockHash, Entries)>,
}

impl PromptView<'_> {
    /// No prompt (balancing by load).
    const NONE: PromptView<'static> = PromptView {
        hashes: &[],
        tokens: 0,
        looked_up: None,
    };
}

impl Router {
    pub fn new(config: RouterConfig, bundle: Option<ModelBundle>, seed: u64) -> Self {
        // The namespace names everything that changes what a table key means, so two differently
        // configured plugins in one Envoy never read each other's state as their own.
        let namespace = format!(
            "prefix-router/v4/{}/{}",
            config.model_name,
            config.block_size.get()
        );
        let layout = TableLayout::new(&format!("{namespace}/table"), config.table_capacity);
        let bundle = bundle
            .map(|b| {
                OnceCell::from(
                    b.with_adapters(config.adapters.clone())
                        .with_aliases(config.aliases.clone()),
                )
            })
            .unwrap_or_default();
        let keys = Keys::new(&namespace);
        let fleet = fleet_id(
            &config.pods,
            config.discovery.as_ref().map(|d| d.cluster.as_str()),
        );
        Router {
            states_version_key: keys.states_version(),
            inflight_key: keys.inflight(fleet),
            members_key: keys.members(fleet),
            configured: Slots::from_list(&config.pods),
            states: RefCell::new(None),
            pod_auth: None,
            keys,
            config,
            bundle,
            layout,
            counter: Cell::new(seed),
            rng: Cell::new(seed | 1),
        }
    }

    /// The member slots as stored, or the configured pods before anything was stored.
    pub fn slots<S: Store>(&self, store: &S) -> Slots {
        read_slots(store, &self.members_key)
            .0
            .unwrap_or_else(|| self.configured.clone())
    }

    fn next_counter(&self) -> u64 {
        let n = self.counter.get();
        self.counter.set(n.wrapping_add(1));
        n
    }

    fn next_random(&self) -> u64 {
        // xorshift64*
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Every pod's state and in-flight count, and its routing view.
    pub fn fleet<S: Store>(&self, store: &S) -> Fleet {
        let version = store
            .shared_get(&self.states_version_key)
            .and_then(|(_, cas)| cas);
        let mut cached = self.states.borrow_mut();
        let (members, states) = match (version, cached.as_ref()) {
            (v, Some(seen)) if seen.version == v => {
                (Rc::clone(&seen.members), Rc::clone(&seen.states))
            }
            _ => {
                let members = Rc::new(Members::new(&self.slots(store), &self.keys));
                let states: Rc<Vec<PodState>> = Rc::new(
                    members
                        .state_keys()
                        .iter()
                        .map(|k| store.shared_get(k).map(|(v, _)| parse_state(&v)))
                        .map(Option::unwrap_or_default)
                        .collect(),
                );
                *cached = Some(SeenStates {
                    version,
                    members: Rc::clone(&members),
                    states: Rc::clone(&states),
                });
                (members, states)
            }
        };
        let inflight = Inflight::read(store, &self.inflight_key, members.width());
        // without polling, a pod that refused a connection is tried again after a while
        let retry = (self.config.poll_interval_ms == 0).then_some(RETRY_REFUSED_NS);
        let now = if retry.is_some() {
            store.now_nanos()
        } else {
            0
        };
        let loads = states
            .iter()
            .enumerate()
            .map(|(i, st)| PodLoad {
                healthy: st.usable(now, retry),
                ..st.load(
                    members.slot(i).map_or(0, |s| inflight.of(s)),
                    &self.config.cost,
                )
            })
            .collect();
        Fleet {
            members,
            states,
            loads,
            inflight,
        }
    }

    /// The pod an entry names, if it is configured here and the entry is of the pod's current
    /// cache generation (older entries are dead).
    fn current_pod(&self, fleet: &Fleet, e: &Entry) -> Option<usize> {
        let i = fleet.members.index_of(&e.pod)?;
        (fleet.states.get(i)?.generation == e.generation).then_some(i)
    }

    /// A bucket's entries of current members (a pod restarted since holds nothing).
    fn entries(&self, fleet: &Fleet, bucket: &Bucket) -> Entries {
        std::array::from_fn(|i| {
            let e = bucket[i].as_ref()?;
            Some((self.current_pod(fleet, e)?, e.stamp))
        })
    }

    /// Tokenizes and hashes the prompt's first block and looks it up: when no healthy pod
    /// holds it or is computing it, none can hold a block past it, and a unique prompt costs
    /// one block's work. Otherwise the whole prompt is hashed (as with debug headers on, which
    /// name the whole prompt's prefix), so the chosen pod is recorded as deep as it will hold
    /// the prompt. Hashing only as deep as the table already went (1, 2, 4, … blocks per
    /// repeat) left a young prefix recorded a block or two deep until the pod's events came,
    /// so its owner looked as if it held little (a small gain on long prefixes, measured in
    /// `docs/benchmarks.md`, "Fresher events; the whole prompt once its first block is
    /// held"). Returns the first block's lookup, for [`Router::decide`] to use rather than read
    /// again.
    fn prepare<S: Store>(
        &self,
        prompt: &mut PromptBlocks<'_>,
        table: &OwnershipTable<'_, S>,
        fleet: &Fleet,
    ) -> Option<(BlockHash, Entries)> {
        let deepest = self.config.max_prompt_blocks();
        if self.config.debug_headers {
            prompt.extend_to(deepest);
            prompt.truncate(deepest);
            return None;
        }
        let healthy = |i: usize| fleet.loads.get(i).is_none_or(|l| l.healthy);
        prompt.extend_to(1);
        let first = *prompt.hashes().first()?;
        let held = self.entries(fleet, &table.owners(first));
        // ready or still being computed: either way deeper blocks may be there
        if held.into_iter().flatten().any(|(p, _)| healthy(p)) {
            prompt.extend_to(deepest);
            prompt.truncate(deepest);
        } else if !prompt.is_complete() {
            // only what was looked at is recorded
            prompt.truncate(1);
        }
        Some((first, held))
    }

    /// Decides among the fleet for a prompt (as seen by [`Router::prepare`]) with the pure
    /// [`decide`], given each block's table entries, the ready owners and a pod computing the
    /// prompt derived from them in core.
    fn decide<S: Store>(
        &self,
        table: &OwnershipTable<'_, S>,
        policy: Policy,
        prompt: &PromptView<'_>,
        now: u64,
        fleet: &Fleet,
    ) -> Option<Decision> {
        // buckets read while hashing are not read again
        let entries = |h: BlockHash| match prompt.looked_up.filter(|(k, _)| *k == h) {
            Some((_, held)) => held,
            None => self.entries(fleet, &table.owners(h)),
        };
        // a pod still computing a block does not hold it yet (`OwnershipTable::record`)
        let owners = |h: BlockHash| ready_owners(entries(h), now);
        let computing = (policy == Policy::Prefix)
            .then(|| Computing::of(prompt.hashes, entries, now))
            .flatten();
        let input = Inputs {
            policy,
            weights: &self.config.weights,
            pods: fleet.members.addrs(),
            loads: &fleet.loads,
            hashes: prompt.hashes,
            prompt_tokens: prompt.tokens,
            block_size: self.config.block_size.get() as usize,
            counter: self.next_counter(),
            random: self.next_random(),
            computing,
        };
        decide(&input, owners)
    }

    /// Plain balancing (least loaded among healthy pods, rotating among equals), e.g. for
    /// `/v1/models` or when the router cannot read the prompt.
    /// `None` when there are no members at all (Envoy then balances on its own).
    pub fn plain<S: Store>(&self, store: &S, reason: Reason) -> Option<Placement> {
        let fleet = self.fleet(store);
        let table = OwnershipTable::new(store, &self.layout);
        let d = self.decide(&table, Policy::LeastLoaded, &PromptView::NONE, 0, &fleet)?;
        Some(Placement {
            decision: Decision { reason, ..d },
            members: fleet.members,
            model: 0,
        })
    }

    /// Routes an inference request body: parses it and [`Router::route_request`]s it (the
    /// HTTP context parses once itself, to find the model first; this is for the tests).
    #[cfg(test)]
    pub fn route<S: Store>(
        &self,
        store: &S,
        endpoint: prefix_core::request::Endpoint,
        body: &[u8],
    ) -> Result<Option<Ticket>, ApiError> {
        self.route_request(store, &prefix_core::request::parse_request(endpoint, body)?)
    }

    /// A request balanced by load alone, for the model at index `model` of
    /// [`Placement::model`]: `fallback` when the prompt cannot be read here or the model is
    /// not one the filter knows, `passthrough` when the body holds nothing to route by (a
    /// continued response). `None` when there are no members at all.
    pub fn by_load<S: Store>(&self, store: &S, model: usize, reason: Reason) -> Option<Ticket> {
        self.plain(store, reason)
            .map(|placed| Ticket::by_load(Placement { model, ..placed }))
    }

    /// Routes a parsed inference request: [`Router::prepare`] its prompt, [`Router::decide`]
    /// a pod, [`Router::record`] the decision. `Err` is a client error to answer with (4xx),
    /// exactly as the server would; the router's own failures never surface here, they fall
    /// back. `Ok(None)`: no members at all (Envoy balances the request on its own).
    pub fn route_request<S: Store>(
        &self,
        store: &S,
        req: &InferenceRequest,
    ) -> Result<Option<Ticket>, ApiError> {
        let model = req
            .model
            .as_ref()
            .and_then(|m| self.config.adapters.iter().position(|a| a == m))
            .map_or(0, |i| i + 1);
        let fallback = || Ok(self.by_load(store, model, Reason::Fallback));
        let Some(bundle) = self.bundle.get() else {
            return fallback();
        };
        let started = store.now_nanos();
        // bounded work whatever the prompt: a hostile one-word megabyte is not read at all
        let mut blocks = match bundle.blocks_within(req, self.config.read_limit_bytes()) {
            Ok(p) => p,
            // the pod's own renderer decides: never reject what it may accept
            Err(e) if e.is_unrenderable() => return fallback(),
            Err(e) => return Err(e),
        };
        let fleet = self.fleet(store);
        // one table for lookup and record, so the buckets the lookup read are not read again
        let table = OwnershipTable::new(store, &self.layout);
        let looked_up = self.prepare(&mut blocks, &table, &fleet);
        let prompt = PromptView {
            hashes: blocks.hashes(),
            tokens: blocks.estimated_tokens(),
            looked_up,
        };
        let now = store.now_nanos();
        let prepare_us = now.saturating_sub(started) / 1_000;
        let Some(decision) = self.decide(&table, self.config.policy, &prompt, now, &fleet) else {
            return fallback();
        };
        let placed = Placement {
            decision,
            members: Rc::clone(&fleet.members),
            model,
        };
        let (table_stats, pending, slot_held) =
            self.record(store, &table, &placed, &prompt, now, fleet);
        let cost = RouteCost {
            table: table_stats,
            hashed_blocks: prompt.hashes.len(),
            prepare_us,
        };
        Ok(Some(Ticket::new(
            placed,
            prompt.hashes.last().copied(),
            blocks.stopped_short(),
            cost,
            slot_held,
            pending,
        )))
    }

    /// Records a decision: the probed blocks as the chosen pod's from when its predicted
    /// prefill of what it lacks is over (those not ready yet come back as [`Pending`], to
    /// settle when its answer starts), and one more request in flight on it. Returns the
    /// table's counts, the pending blocks and whether the slot is held.
    fn record<S: Store>(
        &self,
        store: &S,
        table: &OwnershipTable<'_, S>,
        placed: &Placement,
        prompt: &PromptView<'_>,
        now: u64,
        fleet: Fleet,
    ) -> (RecordStats, Option<Pending>, bool) {
        let d = placed.decision;
        let generation = fleet.states.get(d.pod).map_or(0, |s| s.generation);
        // only the blocks lookups probe (the pod's events fill in the rest)
        let probed: Vec<BlockHash> = probe_positions(prompt.hashes.len())
            .into_iter()
            .filter_map(|i| prompt.hashes.get(i).copied())
            .collect();
        let computed = prompt
            .tokens
            .saturating_sub(d.reason.matched_blocks() * self.config.block_size.get() as usize);
        let prefill_s = fleet
            .loads
            .get(d.pod)
            .map_or(0.0, |l| l.costs.prefill_s(computed));
        let ready_at = now.saturating_add((prefill_s.clamp(0.0, 60.0) * 1e9) as u64);
        let mut not_ready = Vec::new();
        let stats = table.record_into(
            &probed,
            placed.pod(),
            generation,
            (now, Some(ready_at)),
            &mut not_ready,
        );
        // only blocks not yet ready wait for the answer (a repeated prompt's, already the
        // pod's, cost the response side no table reads)
        let pending = (!not_ready.is_empty()).then_some(Pending {
            hashes: not_ready,
            generation,
            ready_at,
        });
        // the in-flight read above is usually still current: one write, no second read
        let slot_held = placed
            .slot()
            .and_then(|s| fleet.inflight.add(store, &self.inflight_key, s, 1))
            .is_some();
        (stats, pending, slot_held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;
    use crate::testing::{tiny_bundle, PODS};
    use prefix_core::request::Endpoint;

    fn router(bundle: Option<ModelBundle>) -> Router {
        Router::new(crate::testing::config(""), bundle, 0)
    }

    /// The request finished: its ticket releases the in-flight slot, as in `on_log`.
    fn done(r: &Router, host: &FakeHost, routed: &Ticket) {
        routed.clone().end(host, r, None, true);
    }

    /// Routes a request that has members to go to.
    fn route(r: &Router, host: &impl Store, body: &[u8]) -> Result<Ticket, ApiError> {
        r.route(host, Endpoint::Completions, body)
            .map(|routed| routed.expect("there are members"))
    }

    fn body(prompt: &str) -> Vec<u8> {
        serde_json::json!({ "prompt": prompt })
            .to_string()
            .into_bytes()
    }

    #[test]
    fn fleet_sees_every_state_change() {
        let host = FakeHost::default();
        let r = router(None);
        let states = r.fleet(&host).states;
        assert!(states.iter().all(|s| s.healthy && s.generation == 0));
        for round in 1..=3u64 {
            crate::pods::update_state(&host, &r.keys, PODS[1], |s| {
                s.generation = round;
                s.waiting = round as u32;
            })
            .unwrap();
            // read twice: the second read reuses the parse, and must agree
            for _ in 0..2 {
                let Fleet { states, loads, .. } = r.fleet(&host);
                assert_eq!(states[1].generation, round);
                assert_eq!(loads[1].waiting, round as u32);
                assert_eq!(states[0].generation, 0);
            }
        }
    }

    #[test]
    fn before_any_state_is_written_the_fleet_is_read_once_too() {
        // polling off (`poll_interval_ms: 0`) writes no state until a pod fails
        let host = FakeHost::default();
        let r = router(None);
        r.fleet(&host);
        host.take_tally();
        r.fleet(&host);
        assert_eq!(
            host.shared_calls(),
            (2, 0),
            "the version key and the in-flight counts"
        );
        crate::pods::mark_down(&host, &r.keys, PODS[0], 1).unwrap();
        assert!(!r.fleet(&host).states[0].healthy, "the first write is seen");
    }

    #[test]
    fn a_request_reads_the_fleet_in_two_host_calls() {
        let host = FakeHost::default();
        let r = router(None);
        crate::pods::mark_down(&host, &r.keys, PODS[2], 1).unwrap();
        let first = r.fleet(&host);
        assert!(!first.states[2].healthy);
        host.take_tally();
        // unchanged states: the version key and the packed in-flight counts, nothing else
        let again = r.fleet(&host);
        assert_eq!(host.shared_calls(), (2, 0));
        assert_eq!(again.states, first.states);
        // counting a request is then one write
        assert_eq!(again.inflight.add(&host, &r.inflight_key, 1, 1), Some(1));
        assert_eq!(host.shared_calls(), (2, 1));
        assert_eq!(r.fleet(&host).loads[1].inflight, 1);
    }

    #[test]
    fn a_pod_still_prefilling_a_prompt_is_not_yet_its_owner() {
        // 1 ms per token: a 10-token prompt is predicted to prefill for 10 ms
        let host = FakeHost::default();
        let config = crate::testing::config(r#""cost":{"base_ms":0,"prefill_us_per_token":1000}"#);
        let r = Router::new(config, Some(tiny_bundle(4)), 0);
        let first = route(&r, &host, &body("abcdefghij")).unwrap();
        assert_eq!(first.placed.decision.reason, Reason::Cold);
        // nothing is cached there yet: the burst misses wherever it goes, so it goes to an
        // idle pod, which becomes another owner
        let burst = route(&r, &host, &body("abcdefghij")).unwrap();
        assert_eq!(burst.placed.decision.reason, Reason::Cold);
        assert_ne!(burst.placed.decision.pod, first.placed.decision.pod);
        // …until the pods computing it are as idle as any: then it follows the latest of them
        let third = route(&r, &host, &body("abcdefghij")).unwrap();
        assert_eq!(third.placed.decision.reason, Reason::Cold);
        let busy = [first.placed.decision.pod, burst.placed.decision.pod];
        assert!(!busy.contains(&third.placed.decision.pod), "the third pod");
        let fourth = route(&r, &host, &body("abcdefghij")).unwrap();
        assert_eq!(
            (fourth.placed.decision.pod, fourth.placed.decision.reason),
            (third.placed.decision.pod, Reason::Computing)
        );
        for routed in [&first, &burst, &third, &fourth] {
            done(&r, &host, routed);
        }
        host.clock.set(host.clock.get() + 20_000_000);
        let later = route(&r, &host, &body("abcdefghij")).unwrap();
        assert_eq!(
            (later.placed.decision.pod, later.placed.decision.reason),
            (first.placed.decision.pod, Reason::PrefixHit { blocks: 2 }),
            "after the predicted prefill it holds the prefix"
        );
        // the first request's answer would settle its blocks; the later one's has nothing to
        assert_eq!(first.pending().map(|p| p.hashes.len()), Some(2));
        assert!(
            later.pending().is_none(),
            "its blocks were ready when it was routed"
        );
    }

    #[test]
    fn a_prompt_waits_for_the_pod_computing_it_when_that_is_sooner() {
        // 1 ms per token: the 10-token prompt's first request prefills for 10 ms
        let host = FakeHost::default();
        let config = crate::testing::config(r#""cost":{"base_ms":0,"prefill_us_per_token":1000}"#);
        let r = Router::new(config, Some(tiny_bundle(4)), 0);
        let first = route(&r, &host, &body("abcdefghij")).unwrap();
        // 6 ms later it holds both blocks in 4 ms: 4 + 2 (the tail) < 10 cold on an idle pod
        host.clock.set(host.clock.get() + 6_000_000);
        let second = route(&r, &host, &body("abcdefghij")).unwrap();
        assert_eq!(
            (second.placed.decision.pod, second.placed.decision.reason),
            (first.placed.decision.pod, Reason::Computing),
            "follows the pod computing it, busier though it is"
        );
        for routed in [&first, &second] {
            done(&r, &host, routed);
        }
    }

    /// Without debug headers a prompt no pod holds is tokenized and hashed one block deep (a
    /// unique prompt costs one block's work); once its first block is held, whole, so its
    /// pod is recorded as deep as it will hold it and the next repeat matches all of it (the
    /// real vocabulary: the tiny one has no lazy encoder). With them, always whole.
    #[test]
    fn a_prompt_is_hashed_whole_once_a_pod_holds_its_first_block() {
        let text = "Drain the node, page the on-call engineer, and rotate the keys. ".repeat(20);
        let bundle = || crate::testing::installed_bundle(&crate::testing::config(""));
        let req = prefix_core::request::parse_request(Endpoint::Completions, &body(&text));
        let whole = bundle().prepare(&req.unwrap()).unwrap().hashes;
        assert!(whole.len() > 8, "{} blocks", whole.len());

        let host = FakeHost::default();
        let r = Router::new(crate::testing::config(""), Some(bundle()), 0);
        let first = route(&r, &host, &body(&text)).unwrap();
        done(&r, &host, &first);
        assert_eq!(first.placed.decision.reason, Reason::Cold);
        assert_eq!(
            first.prefix_hash,
            whole.first().copied(),
            "one block looked at"
        );
        assert_eq!(first.cost.table.written, 1);
        let second = route(&r, &host, &body(&text)).unwrap();
        done(&r, &host, &second);
        assert_eq!(second.placed.pod(), first.placed.pod());
        assert_eq!(
            second.placed.decision.reason,
            Reason::PrefixHit { blocks: 1 }
        );
        assert_eq!(second.prefix_hash, whole.last().copied(), "hashed whole");
        let third = route(&r, &host, &body(&text)).unwrap();
        done(&r, &host, &third);
        assert_eq!(third.placed.pod(), first.placed.pod());
        assert_eq!(
            third.placed.decision.reason,
            Reason::PrefixHit {
                blocks: whole.len()
            }
        );
        let other = route(&r, &host, &body(&format!("another {text}"))).unwrap();
        assert_eq!(other.placed.decision.reason, Reason::Cold);
        assert_eq!(
            other.cost.hashed_blocks, 1,
            "a prompt no pod holds: one block"
        );

        let debug = crate::testing::config(r#""debug_headers":true"#);
        let r = Router::new(debug, Some(bundle()), 0);
        let first = route(&r, &host, &body(&format!("other {text}"))).unwrap();
        assert_eq!(first.placed.decision.reason, Reason::Cold);
        let req = prefix_core::request::parse_request(
            Endpoint::Completions,
            &body(&format!("other {text}")),
        );
        let whole = bundle().prepare(&req.unwrap()).unwrap().hashes;
        assert_eq!(first.prefix_hash, whole.last().copied());
    }

    #[test]
    fn cold_then_hits_on_same_pod() {
        let host = FakeHost::default();
        let r = router(Some(tiny_bundle(4)));
        let first = route(&r, &host, &body("abcdefghij")).unwrap();
        assert_eq!(first.placed.decision.reason, Reason::Cold);
        assert_eq!(first.cost.table.written, 2);
        assert!(first.prefix_hash.is_some());
        done(&r, &host, &first);
        for _ in 0..5 {
            let again = route(&r, &host, &body("abcdefghij")).unwrap();
            done(&r, &host, &again);
            assert_eq!(again.placed.decision.pod, first.placed.decision.pod);
            assert_eq!(
                again.placed.decision.reason,
                Reason::PrefixHit { blocks: 2 }
            );
        }
        // shares only the first block
        let partial = route(&r, &host, &body("abcdXXXXzz")).unwrap();
        assert_eq!(
            (partial.placed.decision.pod, partial.placed.decision.reason),
            (first.placed.decision.pod, Reason::PrefixHit { blocks: 1 })
        );
    }

    #[test]
    fn short_prompts_are_balanced_by_load() {
        let host = FakeHost::default();
        let r = router(Some(tiny_bundle(4)));
        let mut counts = [0usize; 3];
        for _ in 0..6 {
            let d = route(&r, &host, &body("abc")).unwrap();
            assert_eq!(d.placed.decision.reason, Reason::ShortPrompt);
            assert!(d.holds_slot());
            assert_eq!(d.cost.table.written, 0, "short prompts record nothing");
            counts[d.placed.decision.pod] += 1;
        }
        // nothing ever finished, so in-flight load spreads them evenly
        assert_eq!(counts, [2, 2, 2]);
    }

    #[test]
    fn dead_and_restarted_pods() {
        let host = FakeHost::default();
        let r = router(Some(tiny_bundle(4)));
        let routed = route(&r, &host, &body("abcdefgh")).unwrap();
        done(&r, &host, &routed);
        let first = routed.placed.decision;
        let owner = routed.placed.pod().to_owned();
        // the owner goes down: the repeat is cold elsewhere
        crate::pods::mark_down(&host, &r.keys, &owner, 2).unwrap();
        let routed = route(&r, &host, &body("abcdefgh")).unwrap();
        done(&r, &host, &routed);
        let d = routed.placed.decision;
        assert_ne!(d.pod, first.pod);
        assert_eq!(d.reason, Reason::Cold);
        // it comes back, then restarts (new epoch): its old entries are dead, and the
        // blocks now belong to the pod that took over
        let ok =
            |epoch: &str| serde_json::json!({"epoch": epoch, "seq": 0, "events": []}).to_string();
        crate::poller::apply_body(&host, &r.keys, &r.layout, &owner, ok("e1").as_bytes(), 1)
            .unwrap();
        crate::poller::apply_body(&host, &r.keys, &r.layout, &owner, ok("e2").as_bytes(), 2)
            .unwrap();
        let again = route(&r, &host, &body("abcdefgh")).unwrap().placed.decision;
        assert_eq!(
            (again.pod, again.reason),
            (d.pod, Reason::PrefixHit { blocks: 2 })
        );
    }

    #[test]
    fn client_errors_match_the_server() {
        let host = FakeHost::default();
        let r = router(Some(tiny_bundle(4)));
        assert_eq!(
            r.route(&host, Endpoint::Completions, b"{oops")
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            r.route(&host, Endpoint::ChatCompletions, br#"{"messages":[]}"#)
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            r.route(
                &host,
                Endpoint::Completions,
                br#"{"model":"other","prompt":"x"}"#
            )
            .unwrap_err()
            .status,
            404
        );
    }

    #[test]
    fn broken_state_fails_open() {
        let host = FakeHost::default();
        let r = router(None);
        let d = route(&r, &host, &body("abcdefgh")).unwrap();
        assert_eq!(d.placed.decision.reason, Reason::Fallback);
        // unreadable table: every lookup misses, the request is still routed (cold)
        let host = FakeHost::default();
        host.fail_reads.set(true);
        let r = router(Some(tiny_bundle(4)));
        let d = route(&r, &host, &body("abcdefgh")).unwrap();
        assert_eq!(d.placed.decision.reason, Reason::Cold);
    }

    #[test]
    fn a_refused_pod_comes_back_by_poll_or_without_polling_after_a_while() {
        for (polling, back) in [("", false), (r#""poll_interval_ms":0"#, true)] {
            let host = FakeHost::default();
            let r = Router::new(crate::testing::config(polling), Some(tiny_bundle(4)), 0);
            crate::pods::mark_down(&host, &r.keys, PODS[1], 2).unwrap();
            assert!(!r.fleet(&host).loads[1].healthy, "{polling}");
            host.clock.set(host.clock.get() + RETRY_REFUSED_NS);
            assert_eq!(r.fleet(&host).loads[1].healthy, back, "{polling}");
        }
    }
}
