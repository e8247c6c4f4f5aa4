//! The filter's metrics, defined through the host so they appear in Envoy's
//! `/stats/prometheus`. Per-pod series are named by the pod's position in the configured
//! `pods` list (`prefix_router_pod0_healthy`, …), since wasm metrics carry no labels.
//! Decision counters are named from [`ReasonKind`], like the debug header.

use crate::host::{Host, MetricKind};
use crate::poller::Applied;
use prefix_core::liveness::PodState;
use prefix_core::policy::{Reason, ReasonKind};
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
}

pub struct Metrics<H: Host> {
    host: Rc<H>,
    /// indexed by [`ReasonKind::index`]
    reasons: Vec<Id>,
    matched_blocks: Id,
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
    pods: Vec<PodIds>,
}

/// The decision counter's name for a reason.
pub fn decision_metric(kind: ReasonKind) -> String {
    format!("prefix_router_decisions_{}", kind.metric_suffix())
}

impl<H: Host> Metrics<H> {
    /// Defines every metric (idempotent per VM). A metric that cannot be defined is skipped.
    pub fn define(host: Rc<H>, pods: usize) -> Self {
        use MetricKind::{Counter, Gauge, Histogram};
        let def = |kind, name: &str| Id(host.define_metric(kind, name));
        Metrics {
            reasons: ReasonKind::iter()
                .map(|k| def(Counter, &decision_metric(k)))
                .collect(),
            matched_blocks: def(Counter, "prefix_router_matched_blocks"),
            table_entries: def(Gauge, "prefix_router_table_entries"),
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
            pods: (0..pods)
                .map(|i| PodIds {
                    healthy: def(Gauge, &format!("prefix_router_pod{i}_healthy")),
                    inflight: def(Gauge, &format!("prefix_router_pod{i}_inflight")),
                    event_lag_ms: def(Gauge, &format!("prefix_router_pod{i}_event_lag_ms")),
                    signals: def(Gauge, &format!("prefix_router_pod{i}_signals")),
                })
                .collect(),
            host,
        }
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

    pub fn decision(&self, reason: Reason) {
        self.inc(self.matched_blocks, reason.matched_blocks() as i64);
        if let Some(&id) = self.reasons.get(reason.kind().index()) {
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

    /// Whole routing time, and the part of it spent rendering, tokenizing and hashing.
    pub fn route_time(&self, micros: u64, prepare_micros: u64) {
        self.set(self.route_us, micros);
        self.set(self.prepare_us, prepare_micros);
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

    /// Pod `i`'s gauges: health, this router's requests in flight to it, time since its last
    /// good poll, and what the router hears from it ([`PodState::signals`]).
    pub fn pod(&self, i: usize, st: &PodState, inflight: u32, now_ns: u64) {
        if let Some(p) = self.pods.get(i) {
            self.set(p.healthy, u64::from(st.healthy));
            self.set(p.inflight, u64::from(inflight));
            self.set(p.event_lag_ms, st.lag_ms(now_ns));
            self.set(p.signals, st.signals());
        }
    }
}
