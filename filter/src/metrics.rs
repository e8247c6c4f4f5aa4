//! The filter's metrics, defined through the host so they appear in Envoy's
//! `/stats/prometheus`. Wasm metrics carry no labels, so per-pod gauges carry the pod's
//! address in their name and Envoy's stats tag turns it into a label
//! ([`prefix_core::protocol::stats`]): Prometheus sees
//! `prefix_router_pod_healthy{pod="10.0.0.5:8000"}`. They are defined as pods
//! first appear, at most [`MAX_POD_STATS`] addresses per VM (Envoy never deletes a stat, and
//! pod addresses churn in a rollout); a pod that left reads 0.
//! Decision counters are named from [`ReasonKind`], like the debug header, and the model; the
//! gauges of one model's fleet, tokenizer and table carry the model in their names too (one
//! `Metrics` per model a filter serves; the counters they share add up).

use crate::host::{Host, MetricKind};
use crate::members::Members;
use crate::pods::Inflight;
use crate::poller::Applied;
use prefix_core::liveness::PodState;
use prefix_core::policy::{Reason, ReasonKind};
use prefix_core::protocol::stats;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use strum::IntoEnumIterator;

#[derive(Default, Clone, Copy)]
struct Id(Option<u32>);

#[derive(Default, Clone, Copy)]
struct PodIds {
    healthy: Id,
    inflight: Id,
    event_lag_ms: Id,
    signals: Id,
    /// a member at the last update (a leaver's gauges are zeroed once)
    member: bool,
}

pub struct Metrics<H: Host> {
    host: Rc<H>,
    /// per model name (the base model, then each adapter), indexed by [`ReasonKind::index`]
    reasons: Vec<Vec<Id>>,
    matched_blocks: Id,
    hashed_blocks: Id,
    read_short: Id,
    table_entries: Id,
    table_replacements: Id,
    table_conflicts: Id,
    rejected: Id,
    served_elsewhere: Id,
    route_us: Id,
    prepare_us: Id,
    events_stored: Id,
    events_removed: Id,
    generations: Id,
    polls_failed: Id,
    members: Id,
    membership_changes: Id,
    tokenizer_loaded: Id,
    tokenizer_loads: Id,
    tokenizer_failures: Id,
    /// per pod address, defined as pods first appear
    pods: RefCell<HashMap<String, PodIds>>,
}

/// Most pod addresses one VM defines gauges for (four gauges each).
pub const MAX_POD_STATS: usize = 4096;

/// The decision counter's name for a reason and model (Envoy's stats tags make both labels:
/// `prefix_router_decisions{reason="prefix_hit",model="…"}`).
pub fn decision_metric(kind: ReasonKind, model: &str) -> String {
    stats::decision_stat_name(&kind.metric_suffix(), model)
}

impl<H: Host> Metrics<H> {
    /// Defines every metric (idempotent per VM), decisions for the served `model` and each of
    /// its `adapters`. A metric that cannot be defined is skipped.
    pub fn define(host: Rc<H>, model: &str, adapters: &[String]) -> Self {
        use MetricKind::{Counter, Gauge, Histogram};
        let def = |kind, name: &str| Id(host.define_metric(kind, name));
        Metrics {
            reasons: std::iter::once(model)
                .chain(adapters.iter().map(String::as_str))
                .map(|m| {
                    ReasonKind::iter()
                        .map(|k| def(Counter, &decision_metric(k, m)))
                        .collect()
                })
                .collect(),
            matched_blocks: def(Counter, "prefix_router_matched_blocks"),
            hashed_blocks: def(Counter, "prefix_router_hashed_blocks"),
            read_short: def(Counter, "prefix_router_prompts_read_in_part"),
            table_entries: def(Gauge, &stats::model_stat_name("table_entries", model)),
            table_replacements: def(Counter, "prefix_router_table_replacements"),
            table_conflicts: def(Counter, "prefix_router_table_conflicts"),
            rejected: def(Counter, "prefix_router_rejected"),
            served_elsewhere: def(Counter, "prefix_router_served_by_fallback"),
            route_us: def(Histogram, "prefix_router_route_us"),
            prepare_us: def(Histogram, "prefix_router_tokenize_us"),
            events_stored: def(Counter, "prefix_router_events_blocks_stored"),
            events_removed: def(Counter, "prefix_router_events_blocks_removed"),
            generations: def(Counter, "prefix_router_pod_generation_changes"),
            polls_failed: def(Counter, "prefix_router_polls_failed"),
            members: def(Gauge, &stats::model_stat_name("members", model)),
            membership_changes: def(Counter, "prefix_router_membership_changes"),
            tokenizer_loaded: def(Gauge, &stats::model_stat_name("tokenizer_loaded", model)),
            tokenizer_loads: def(Counter, "prefix_router_tokenizer_loads"),
            tokenizer_failures: def(Counter, "prefix_router_tokenizer_load_failures"),
            pods: RefCell::default(),
            host,
        }
    }

    /// Defines the gauges of these pods now (the configured ones: visible from the start).
    pub fn define_pods(&self, addrs: &[impl AsRef<str>]) {
        for a in addrs {
            self.pod_ids(a.as_ref());
        }
    }

    /// A pod's gauges, defined on first use; `None` beyond [`MAX_POD_STATS`] addresses.
    fn pod_ids(&self, addr: &str) -> Option<PodIds> {
        use MetricKind::Gauge;
        let mut pods = self.pods.borrow_mut();
        if let Some(ids) = pods.get(addr) {
            return Some(*ids);
        }
        if pods.len() >= MAX_POD_STATS {
            return None;
        }
        let def = |name: &str| {
            Id(self
                .host
                .define_metric(Gauge, &stats::pod_stat_name(addr, name)))
        };
        let ids = PodIds {
            healthy: def("healthy"),
            inflight: def("inflight"),
            event_lag_ms: def("event_lag_ms"),
            signals: def("signals"),
            member: false,
        };
        pods.insert(addr.to_owned(), ids);
        Some(ids)
    }

    /// Adds `by` (zero increments are skipped: each is a host call, and most requests change
    /// nothing).
    fn inc(&self, id: Id, by: i64) {
        if let (Some(id), true) = (id.0, by != 0) {
            self.host.increment_metric(id, by);
        }
    }

    fn set(&self, id: Id, v: u64) {
        if let Some(id) = id.0 {
            self.host.record_metric(id, v);
        }
    }

    /// A decision for the request that named model `model` (0: the base model, `i + 1`:
    /// adapter `i`).
    pub fn decision(&self, reason: Reason, model: usize) {
        self.inc(self.matched_blocks, reason.matched_blocks() as i64);
        let ids = self.reasons.get(model).or_else(|| self.reasons.first());
        if let Some(&id) = ids.and_then(|ids| ids.get(reason.kind().index())) {
            self.inc(id, 1);
        }
    }

    /// Table writes of one request: ways filled (the entries gauge grows), entries replaced,
    /// writes lost to concurrent writers.
    pub fn table(&self, filled: u32, replaced: u32, conflicts: u32) {
        self.inc(self.table_entries, filled.into());
        self.inc(self.table_replacements, replaced.into());
        self.inc(self.table_conflicts, conflicts.into());
    }

    pub fn rejected(&self) {
        self.inc(self.rejected, 1);
    }

    /// Envoy retried a request away from the chosen pod and another one answered it.
    pub fn served_elsewhere(&self) {
        self.inc(self.served_elsewhere, 1);
    }

    /// Whole routing time, and the part of it spent rendering, tokenizing, hashing and looking
    /// the blocks up.
    pub fn route_time(&self, micros: u64, prepare_micros: u64) {
        self.set(self.route_us, micros);
        self.set(self.prepare_us, prepare_micros);
    }

    /// Blocks of a prompt hashed and looked up: one when no pod holds its first block, else
    /// all of them, as always with debug headers. Beside `matched_blocks`, how much
    /// tokenizing routing took.
    pub fn hashed(&self, blocks: usize) {
        self.inc(self.hashed_blocks, blocks as i64);
    }

    /// A prompt read only up to `max_prompt_tokens`' worth of text.
    pub fn read_short(&self) {
        self.inc(self.read_short, 1);
    }

    /// Cache events applied by the poller: stored blocks may fill ways, removed blocks empty
    /// theirs (the entries gauge counts ways holding an entry, stale generations included).
    pub fn events(&self, a: &Applied) {
        self.inc(self.events_stored, a.stored.into());
        self.inc(self.events_removed, a.removed.into());
        self.inc(
            self.table_entries,
            i64::from(a.filled) - i64::from(a.removed),
        );
        self.inc(self.generations, i64::from(a.new_generation));
    }

    pub fn poll_failed(&self) {
        self.inc(self.polls_failed, 1);
    }

    /// Every member's gauges: health, this router's requests in flight to it, time since its
    /// last good poll, and what the router hears from it ([`PodState::signals`]); zeros for a
    /// pod that is no longer a member. And the number of members.
    pub fn members(&self, m: &Members, states: &[PodState], inflight: &Inflight, now_ns: u64) {
        self.set(self.members, m.len() as u64);
        for (i, st) in states.iter().enumerate().take(m.len()) {
            let Some(p) = self.pod_ids(m.addr(i)) else {
                continue;
            };
            self.set(p.healthy, u64::from(st.healthy));
            let slot = m.slot(i);
            self.set(p.inflight, slot.map_or(0, |s| u64::from(inflight.of(s))));
            self.set(p.event_lag_ms, st.lag_ms(now_ns));
            self.set(p.signals, st.signals());
        }
        let mut pods = self.pods.borrow_mut();
        for (addr, p) in pods.iter_mut() {
            let member = m.index_of(addr).is_some();
            if p.member && !member {
                for id in [p.healthy, p.inflight, p.event_lag_ms, p.signals] {
                    self.set(id, 0);
                }
            }
            p.member = member;
        }
    }

    /// Whether this VM has its tokenizer (1) or balances by load until it does (0); each
    /// load is also counted (every VM loads its own: Envoy's workers and its main thread),
    /// which is how a harness knows all of them route by prefix.
    pub fn tokenizer_loaded(&self, loaded: bool) {
        self.set(self.tokenizer_loaded, u64::from(loaded));
        if loaded {
            self.inc(self.tokenizer_loads, 1);
        }
    }

    /// A fetch of the tokenizer failed (it is retried).
    pub fn tokenizer_failed(&self) {
        self.inc(self.tokenizer_failures, 1);
    }

    /// The poller stored a new member list.
    pub fn membership_changed(&self) {
        self.inc(self.membership_changes, 1);
    }
}
