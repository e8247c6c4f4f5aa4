//! Per-request routing, independent of proxy-wasm: body in, decision (or client error) out.
//!
//! The filter's contexts only move bytes and headers; everything that decides lives here and
//! in `prefix-core`, and is unit-tested against a fake host.

use crate::host::Store;
use crate::ownership::{OwnershipTable, RecordStats};
use crate::pods::{parse_state, Inflight, Keys, PodState};
use prefix_core::policy::{decide, Decision, Inputs, PodLoad, Policy, Reason};
use prefix_core::request::{parse_request, Endpoint};
use prefix_core::router_config::RouterConfig;
use prefix_core::table::{Entry, TableLayout};
use prefix_core::{ApiError, BlockHash, ModelBundle};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// With polling off (`poll_interval_ms: 0`), how long a pod that refused a connection is
/// left out before requests try it again (nothing else would ever bring it back).
pub const RETRY_REFUSED_NS: u64 = 5_000_000_000;

/// Everything a worker's requests share: built once per VM in `on_configure`.
pub struct Router {
    pub config: RouterConfig,
    /// `None` when the tokenizer failed to load: every request then fails open.
    pub bundle: Option<ModelBundle>,
    pub layout: TableLayout,
    pub keys: Keys,
    /// Table entries name pods by address; this maps them back to positions in `pods`.
    pod_index: HashMap<String, usize>,
    /// Per pod: its state key (built once).
    state_keys: Vec<String>,
    /// The key every pod-state write bumps.
    states_version_key: String,
    /// The fleet's packed in-flight counts.
    pub inflight_key: String,
    /// Every pod's state as last read, under the CAS token of the states-version key at that
    /// read. States change only when the poller or a failed response writes them (and bump
    /// the version), so most requests read one key instead of one per pod.
    states: RefCell<Option<(u32, Rc<Vec<PodState>>)>>,
    counter: Cell<u64>,
    rng: Cell<u64>,
}

/// What one request knows about the pods: their states, loads, and the in-flight counts read.
pub struct Fleet {
    pub states: Rc<Vec<PodState>>,
    pub loads: Vec<PodLoad>,
    pub inflight: Inflight,
}

/// The outcome for one inference request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    pub decision: Decision,
    pub table: RecordStats,
    /// Hash of the prompt's last full block (it names the whole hashed prefix); `None` for
    /// prompts shorter than a block or when the filter failed open.
    pub prefix_hash: Option<BlockHash>,
    /// The chosen pod's in-flight counter was incremented (decrement when the stream ends).
    pub counted: bool,
    /// Time spent rendering, tokenizing and hashing the prompt (µs); the rest of the
    /// routing time is the shared-data work (pod states, table lookups and writes).
    pub prepare_us: u64,
}

impl Router {
    pub fn new(config: RouterConfig, bundle: Option<ModelBundle>, seed: u64) -> Self {
        // The namespace names everything that changes what a table key means, so two differently
        // configured plugins in one Envoy never read each other's state as their own.
        let namespace = format!(
            "prefix-router/v3/{}/{}",
            config.model_name,
            config.block_size.get()
        );
        let layout = TableLayout::new(&format!("{namespace}/table"), config.table_capacity);
        let keys = Keys::new(&namespace);
        Router {
            pod_index: config
                .pod_addrs()
                .enumerate()
                .map(|(i, p)| (p.to_owned(), i))
                .collect(),
            state_keys: config.pod_addrs().map(|p| keys.state(p)).collect(),
            states_version_key: keys.states_version(),
            inflight_key: keys.inflight(&config.pods),
            states: RefCell::new(None),
            keys,
            config,
            bundle,
            layout,
            counter: Cell::new(seed),
            rng: Cell::new(seed | 1),
        }
    }

    /// The address of pod `i`.
    pub fn pod(&self, i: usize) -> &str {
        self.config.pods.get(i).map(|p| p.as_str()).unwrap_or("")
    }

    /// Number of configured pods.
    pub fn pods(&self) -> usize {
        self.config.pods.len()
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
        let states = match (version, cached.as_ref()) {
            (Some(v), Some((seen, states))) if *seen == v => Rc::clone(states),
            _ => {
                let states: Rc<Vec<PodState>> = Rc::new(
                    self.state_keys
                        .iter()
                        .map(|k| store.shared_get(k).map(|(v, _)| parse_state(&v)))
                        .map(Option::unwrap_or_default)
                        .collect(),
                );
                *cached = version.map(|v| (v, Rc::clone(&states)));
                states
            }
        };
        let inflight = Inflight::read(store, &self.inflight_key, states.len());
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
                ..st.load(inflight.of(i))
            })
            .collect();
        Fleet {
            states,
            loads,
            inflight,
        }
    }

    /// The pod an entry names, if it is configured here and the entry is of the pod's current
    /// cache generation (older entries are dead).
    fn live_owner(&self, fleet: &Fleet, e: &Entry) -> Option<usize> {
        let i = *self.pod_index.get(&e.pod)?;
        (fleet.states.get(i)?.generation == e.generation).then_some(i)
    }

    fn choose<S: Store>(
        &self,
        table: &OwnershipTable<'_, S>,
        policy: Policy,
        hashes: &[BlockHash],
        fleet: &Fleet,
    ) -> Option<Decision> {
        let input = Inputs {
            policy,
            weights: &self.config.weights,
            pods: &self.config.pods,
            loads: &fleet.loads,
            hashes,
            counter: self.next_counter(),
            random: self.next_random(),
        };
        decide(&input, |h| {
            table
                .owners(h)
                .map(|e| e.and_then(|e| self.live_owner(fleet, &e)))
        })
    }

    /// Plain balancing (least loaded among healthy pods, rotating among equals), e.g. for
    /// `/v1/models` or when the router cannot read the prompt.
    pub fn plain<S: Store>(&self, store: &S, reason: Reason) -> Decision {
        let fleet = self.fleet(store);
        let table = OwnershipTable::new(store, &self.layout);
        let d = self.choose(&table, Policy::LeastLoaded, &[], &fleet);
        match d {
            Some(d) => Decision { reason, ..d },
            None => Decision::new(0, reason),
        }
    }

    /// Routes an inference request body (already bounded by `max_body_bytes`). `Err` is a
    /// client error to answer with (4xx), exactly as the server would; the router's own
    /// failures never surface here, they fall back.
    pub fn route<S: Store>(
        &self,
        store: &S,
        endpoint: Endpoint,
        body: &[u8],
    ) -> Result<Routed, ApiError> {
        let req = parse_request(endpoint, body)?;
        let fallback = |this: &Self| Routed {
            decision: this.plain(store, Reason::Fallback),
            table: RecordStats::default(),
            prefix_hash: None,
            counted: false,
            prepare_us: 0,
        };
        let Some(bundle) = &self.bundle else {
            return Ok(fallback(self));
        };
        let started = store.now_nanos();
        let prompt = bundle.prepare(&req)?;
        let prepare_us = store.now_nanos().saturating_sub(started) / 1_000;
        let fleet = self.fleet(store);
        // one table for lookup and record, so the buckets the lookup read are not read again
        let owners = OwnershipTable::new(store, &self.layout);
        let Some(decision) = self.choose(&owners, self.config.policy, &prompt.hashes, &fleet)
        else {
            return Ok(fallback(self));
        };
        let generation = fleet.states.get(decision.pod).map_or(0, |s| s.generation);
        let table = owners.record(&prompt.hashes, self.pod(decision.pod), generation);
        // the in-flight read above is usually still current: one write, no second read
        let counted = fleet
            .inflight
            .add(store, &self.inflight_key, decision.pod, 1)
            .is_some();
        Ok(Routed {
            decision,
            table,
            prefix_hash: prompt.hashes.last().copied(),
            counted,
            prepare_us,
        })
    }

    /// The request's stream ended: release its in-flight slot on `pod`.
    pub fn release<S: Store>(&self, store: &S, pod: usize) {
        Inflight::read(store, &self.inflight_key, self.pods()).add(
            store,
            &self.inflight_key,
            pod,
            -1,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;
    use crate::testing::tiny_bundle;

    fn router(bundle: Option<ModelBundle>) -> Router {
        Router::new(crate::testing::config(""), bundle, 0)
    }

    /// The request finished: release its in-flight slot, as the filter does in `on_log`.
    fn done(r: &Router, host: &FakeHost, routed: &Routed) {
        if routed.counted {
            r.release(host, routed.decision.pod);
        }
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
            crate::pods::update_state(&host, &r.keys, r.pod(1), |s| {
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
    fn a_request_reads_the_fleet_in_two_host_calls() {
        let host = crate::host::fake::Counting::default();
        let r = router(None);
        crate::poller::mark_down(&host, &r.keys, r.pod(2), 1).unwrap();
        let first = r.fleet(&host);
        assert!(!first.states[2].healthy);
        host.gets.set(0);
        // unchanged states: the version key and the packed in-flight counts, nothing else
        let again = r.fleet(&host);
        assert_eq!(host.gets.get(), 2);
        assert_eq!(again.states, first.states);
        // counting a request is then one write
        host.sets.set(0);
        assert_eq!(again.inflight.add(&host, &r.inflight_key, 1, 1), Some(1));
        assert_eq!((host.gets.get(), host.sets.get()), (2, 1));
        assert_eq!(r.fleet(&host).loads[1].inflight, 1);
    }

    #[test]
    fn cold_then_hits_on_same_pod() {
        let host = FakeHost::default();
        let r = router(Some(tiny_bundle(4)));
        let first = r
            .route(&host, Endpoint::Completions, &body("abcdefghij"))
            .unwrap();
        assert_eq!(first.decision.reason, Reason::Cold);
        assert_eq!(first.table.written, 2);
        assert!(first.prefix_hash.is_some());
        done(&r, &host, &first);
        for _ in 0..5 {
            let again = r
                .route(&host, Endpoint::Completions, &body("abcdefghij"))
                .unwrap();
            done(&r, &host, &again);
            assert_eq!(again.decision.pod, first.decision.pod);
            assert_eq!(again.decision.reason, Reason::PrefixHit { blocks: 2 });
        }
        // shares only the first block
        let partial = r
            .route(&host, Endpoint::Completions, &body("abcdXXXXzz"))
            .unwrap();
        assert_eq!(
            (partial.decision.pod, partial.decision.reason),
            (first.decision.pod, Reason::PrefixHit { blocks: 1 })
        );
    }

    #[test]
    fn short_prompts_are_balanced_by_load() {
        let host = FakeHost::default();
        let r = router(Some(tiny_bundle(4)));
        let mut counts = [0usize; 3];
        for _ in 0..6 {
            let d = r.route(&host, Endpoint::Completions, &body("abc")).unwrap();
            assert_eq!(d.decision.reason, Reason::ShortPrompt);
            assert!(d.counted);
            assert_eq!(d.table.written, 0, "short prompts record nothing");
            counts[d.decision.pod] += 1;
        }
        // nothing ever finished, so in-flight load spreads them evenly
        assert_eq!(counts, [2, 2, 2]);
    }

    #[test]
    fn dead_and_restarted_pods() {
        let host = FakeHost::default();
        let r = router(Some(tiny_bundle(4)));
        let routed = r
            .route(&host, Endpoint::Completions, &body("abcdefgh"))
            .unwrap();
        done(&r, &host, &routed);
        let first = routed.decision;
        let owner = r.pod(first.pod).to_owned();
        // the owner goes down: the repeat is cold elsewhere
        crate::poller::mark_down(&host, &r.keys, &owner, 2).unwrap();
        let routed = r
            .route(&host, Endpoint::Completions, &body("abcdefgh"))
            .unwrap();
        done(&r, &host, &routed);
        let d = routed.decision;
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
        let again = r
            .route(&host, Endpoint::Completions, &body("abcdefgh"))
            .unwrap()
            .decision;
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
        let d = r
            .route(&host, Endpoint::Completions, &body("abcdefgh"))
            .unwrap();
        assert_eq!(d.decision.reason, Reason::Fallback);
        // unreadable table: every lookup misses, the request is still routed (cold)
        let host = FakeHost::default();
        host.fail_reads.set(true);
        let r = router(Some(tiny_bundle(4)));
        let d = r
            .route(&host, Endpoint::Completions, &body("abcdefgh"))
            .unwrap();
        assert_eq!(d.decision.reason, Reason::Cold);
    }

    #[test]
    fn a_refused_pod_comes_back_by_poll_or_without_polling_after_a_while() {
        for (polling, back) in [("", false), (r#""poll_interval_ms":0"#, true)] {
            let host = FakeHost::default();
            let r = Router::new(crate::testing::config(polling), Some(tiny_bundle(4)), 0);
            crate::poller::mark_down(&host, &r.keys, r.pod(1), 2).unwrap();
            assert!(!r.fleet(&host).loads[1].healthy, "{polling}");
            host.clock.set(host.clock.get() + RETRY_REFUSED_NS);
            assert_eq!(r.fleet(&host).loads[1].healthy, back, "{polling}");
        }
    }
}
