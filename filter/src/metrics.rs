//! Filter metrics, defined through proxy-wasm so they appear in Envoy's `/stats/prometheus`.
//! Per-pod series are named by the pod's position in the configured `pods` list
//! (`prefix_router_pod0_healthy`, …), since wasm metrics carry no labels.

use prefix_core::policy::Reason;
use proxy_wasm::hostcalls::{define_metric, increment_metric, record_metric};
use proxy_wasm::types::MetricType;

#[derive(Default, Clone, Copy)]
struct Id(Option<u32>);

impl Id {
    fn def(kind: MetricType, name: &str) -> Id {
        Id(define_metric(kind, name).ok())
    }
    fn inc(self, by: i64) {
        if let (Some(id), true) = (self.0, by != 0) {
            let _ = increment_metric(id, by);
        }
    }
    fn set(self, v: u64) {
        if let Some(id) = self.0 {
            let _ = record_metric(id, v);
        }
    }
}

#[derive(Default, Clone, Copy)]
struct PodIds {
    healthy: Id,
    inflight: Id,
    event_lag_ms: Id,
}

#[derive(Default, Clone)]
pub struct Metrics {
    reasons: [Id; 9],
    matched_blocks: Id,
    table_entries: Id,
    table_replacements: Id,
    table_conflicts: Id,
    fail_open: Id,
    rejected: Id,
    route_us: Id,
    prepare_us: Id,
    events_stored: Id,
    events_removed: Id,
    generations: Id,
    polls_failed: Id,
    pods: Vec<PodIds>,
}

const REASONS: [&str; 9] = [
    "prefix_hit",
    "cold",
    "short_prompt",
    "imbalanced",
    "passthrough",
    "fallback",
    "round_robin",
    "random",
    "least_loaded",
];

fn reason_index(r: Reason) -> usize {
    match r {
        Reason::PrefixHit { .. } => 0,
        Reason::Cold => 1,
        Reason::ShortPrompt => 2,
        Reason::Imbalanced => 3,
        Reason::Passthrough => 4,
        Reason::Fallback => 5,
        Reason::RoundRobin => 6,
        Reason::Random => 7,
        Reason::LeastLoaded => 8,
    }
}

impl Metrics {
    /// Defines every metric (idempotent per VM). A metric that cannot be defined is skipped.
    pub fn define(pods: usize) -> Self {
        use MetricType::{Counter, Gauge, Histogram};
        let mut reasons = [Id::default(); 9];
        for (i, r) in REASONS.iter().enumerate() {
            reasons[i] = Id::def(Counter, &format!("prefix_router_decisions_{r}"));
        }
        Metrics {
            reasons,
            matched_blocks: Id::def(Counter, "prefix_router_matched_blocks"),
            table_entries: Id::def(Gauge, "prefix_router_table_entries"),
            table_replacements: Id::def(Counter, "prefix_router_table_replacements"),
            table_conflicts: Id::def(Counter, "prefix_router_table_conflicts"),
            fail_open: Id::def(Counter, "prefix_router_fail_open"),
            rejected: Id::def(Counter, "prefix_router_rejected"),
            route_us: Id::def(Histogram, "prefix_router_route_us"),
            prepare_us: Id::def(Histogram, "prefix_router_tokenize_us"),
            events_stored: Id::def(Counter, "prefix_router_events_blocks_stored"),
            events_removed: Id::def(Counter, "prefix_router_events_blocks_removed"),
            generations: Id::def(Counter, "prefix_router_pod_generation_changes"),
            polls_failed: Id::def(Counter, "prefix_router_polls_failed"),
            pods: (0..pods)
                .map(|i| PodIds {
                    healthy: Id::def(Gauge, &format!("prefix_router_pod{i}_healthy")),
                    inflight: Id::def(Gauge, &format!("prefix_router_pod{i}_inflight")),
                    event_lag_ms: Id::def(Gauge, &format!("prefix_router_pod{i}_event_lag_ms")),
                })
                .collect(),
        }
    }

    pub fn decision(&self, reason: Reason) {
        if let Reason::PrefixHit { blocks } = reason {
            self.matched_blocks.inc(blocks as i64);
        }
        if reason == Reason::Fallback {
            self.fail_open.inc(1);
        }
        self.reasons[reason_index(reason)].inc(1);
    }

    /// (Zero increments are skipped: each is a host call, and most requests change nothing.)
    pub fn table(&self, filled: u32, replaced: u32, conflicts: u32) {
        for (id, n) in [
            (&self.table_entries, filled),
            (&self.table_replacements, replaced),
            (&self.table_conflicts, conflicts),
        ] {
            if n > 0 {
                id.inc(n.into());
            }
        }
    }

    pub fn rejected(&self) {
        self.rejected.inc(1);
    }

    /// Whole routing time, and the part of it spent rendering, tokenizing and hashing.
    pub fn route_time(&self, micros: u64, prepare_micros: u64) {
        self.route_us.set(micros);
        self.prepare_us.set(prepare_micros);
    }

    pub fn events(&self, stored: u32, removed: u32, new_generation: bool) {
        self.events_stored.inc(stored.into());
        self.events_removed.inc(removed.into());
        if new_generation {
            self.generations.inc(1);
        }
    }

    pub fn poll_failed(&self) {
        self.polls_failed.inc(1);
    }

    pub fn pod(&self, i: usize, healthy: bool, inflight: u32, lag_ms: u64) {
        if let Some(p) = self.pods.get(i) {
            p.healthy.set(u64::from(healthy));
            p.inflight.set(u64::from(inflight));
            p.event_lag_ms.set(lag_ms);
        }
    }
}
