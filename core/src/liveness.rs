//! What a router believes about one pod, and the rules that change it: health, load, cache
//! generation. Pure state transitions, so every rule is tested table-driven here and the
//! filter only stores the result.
//!
//! - A successful poll makes the pod healthy and records its load.
//! - A new process epoch (restart) starts a new cache *generation*: every ownership entry of
//!   the old one stops counting at once, with no need to list keys; its events are re-read
//!   from the start.
//! - The first contact with a pod also starts a generation of its own (it may have restarted
//!   before anyone polled it); its whole event history then re-records what it holds.
//! - `reset` (the router fell behind the pod's bounded history) and `AllCleared` start a new
//!   generation too; only the events after the page's last `AllCleared` are applied.
//! - A pod without the events endpoint (vLLM, SGLang, llama.cpp: [`PodKind::Metrics`]) is
//!   followed through its health and Prometheus metrics instead: load from the metrics, a
//!   restart from a new process start time or a monotonic counter going backwards (a new
//!   generation: the blocks the router recorded for it are gone). A pod that could not be
//!   reached at all (connection refused: no process was listening) and answers again is a new
//!   process too, unless it reports the same start time: llama.cpp reports none, and a
//!   counter cannot go back if the router never saw it move before the crash. A poll that
//!   only timed out (a busy pod) says nothing about a restart.
//! - `down_after_failures` failed polls in a row mark the pod down; one good poll brings it
//!   back. A connection refused or reset on the request path (Envoy answers 502/503 itself,
//!   without the pod's header) marks it down at once.

use crate::pod_costs::{CostModel, CostPrior, PodCosts};
use crate::policy::PodLoad;
use crate::protocol::pod_metrics::MetricsReport;
use crate::protocol::{EventsPage, LoadReport};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

/// How the router follows a pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PodKind {
    /// Not known yet: the poller asks for cache events first.
    #[default]
    Unknown,
    /// Serves the cache-events page (this project's server): precise ownership and load.
    Events,
    /// No events endpoint: health from `/health`, load and restarts from `/metrics`.
    Metrics,
    /// No events endpoint and no model-server load metrics (`llama-server` started without
    /// `--metrics`, say): health from `/health` only; load unknown (counted as idle, so the
    /// router's own in-flight count is all that balances it), a restart seen only when the
    /// pod could not be reached and answers again.
    Health,
}

/// One pod's state as last learned by the poller (and by failed responses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PodState {
    /// How the pod is followed.
    pub kind: PodKind,
    /// [`PodKind::Metrics`]: the last value of the pod's monotonic counter.
    pub counter: Option<f64>,
    /// Ownership-table entries are valid only while this matches theirs.
    pub generation: u64,
    /// The pod process's epoch (empty before the first successful poll).
    pub epoch: String,
    /// Last cache-event sequence number applied.
    pub seq: u64,
    pub healthy: bool,
    pub fails: u32,
    pub running: u32,
    pub waiting: u32,
    pub kv_cache_usage: f64,
    /// Router clock (ns) of the last successful poll; 0 = never.
    pub last_ok_ns: u64,
    /// Router clock (ns) of the last refused connection on the request path; 0 = none.
    pub refused_ns: u64,
    /// The pod could not be reached at all (connection refused or reset) since its last good
    /// answer: whatever answers next at this address may be a new process.
    pub unreachable: bool,
    /// What a request costs on the pod, learned from its work counters.
    pub cost: CostModel,
}

impl Default for PodState {
    fn default() -> Self {
        PodState {
            kind: PodKind::Unknown,
            counter: None,
            generation: 0,
            epoch: String::new(),
            seq: 0,
            healthy: true,
            fails: 0,
            running: 0,
            waiting: 0,
            kv_cache_usage: 0.0,
            last_ok_ns: 0,
            refused_ns: 0,
            unreachable: false,
            cost: CostModel::default(),
        }
    }
}

impl PodState {
    /// The routing view of the pod, with this router's in-flight count; costs not learned
    /// yet are `prior`'s.
    pub fn load(&self, inflight: u32, prior: &CostPrior) -> PodLoad {
        PodLoad {
            healthy: self.healthy,
            inflight,
            running: self.running,
            waiting: self.waiting,
            kv_cache_usage: self.kv_cache_usage,
            costs: PodCosts::resolve(&self.cost.learned(prior), prior),
        }
    }

    /// Whether requests may go to the pod. Healthy pods may. Without polling (`retry` is the
    /// time after which a refused pod is tried again) nothing would ever bring a pod back
    /// that refused a connection, so it is tried again once `retry` has passed.
    pub fn usable(&self, now_ns: u64, retry_ns: Option<u64>) -> bool {
        self.healthy
            || retry_ns.is_some_and(|r| {
                self.refused_ns != 0 && now_ns >= self.refused_ns.saturating_add(r)
            })
    }

    /// What the router hears from the pod (the `prefix_router_pod<i>_signals` gauge): 0 before
    /// its first good poll, 1 its cache events (this project's server), 2 its health and
    /// metrics (vLLM, SGLang, llama.cpp), 3 its health only (no load metrics).
    pub fn signals(&self) -> u64 {
        match (self.last_ok_ns, self.kind) {
            (0, _) | (_, PodKind::Unknown) => 0,
            (_, PodKind::Events) => 1,
            (_, PodKind::Metrics) => 2,
            (_, PodKind::Health) => 3,
        }
    }

    /// Milliseconds since the last successful poll (0 before the first).
    pub fn lag_ms(&self, now_ns: u64) -> u64 {
        if self.last_ok_ns == 0 {
            0
        } else {
            now_ns.saturating_sub(self.last_ok_ns) / 1_000_000
        }
    }

    fn set_load(&mut self, load: &LoadReport) {
        self.running = load.running;
        self.waiting = load.waiting;
        self.kv_cache_usage = load.kv_cache_usage;
        self.cost.observe(&load.work, load.running);
    }
}

/// What a successful poll's page means for the pod's blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageEffect {
    /// The pod's generation changed (first contact, restart, reset or clear).
    pub new_generation: bool,
    /// The pod came back from down.
    pub recovered: bool,
    /// The pod restarted: this page belongs to the old sequence; re-read from 0 at once and
    /// apply none of it.
    pub restarted: bool,
}

fn next_generation(old: u64, salt: &str, seq: u64) -> u64 {
    let mut b = old.to_le_bytes().to_vec();
    b.extend_from_slice(salt.as_bytes());
    b.extend_from_slice(&seq.to_le_bytes());
    xxh3_64(&b).max(1)
}

/// A good answer: healthy, with this load.
fn answered(st: &mut PodState, load: &LoadReport, now_ns: u64) -> PageEffect {
    let fx = PageEffect {
        recovered: !st.healthy,
        ..PageEffect::default()
    };
    st.healthy = true;
    st.fails = 0;
    st.unreachable = false;
    st.set_load(load);
    st.last_ok_ns = now_ns;
    fx
}

/// Applies a successful poll's page to `st`.
pub fn on_page(st: &mut PodState, page: &EventsPage, now_ns: u64) -> PageEffect {
    let mut fx = answered(st, &page.load, now_ns);
    st.kind = PodKind::Events;
    if !st.epoch.is_empty() && st.epoch != page.epoch {
        // restarted: everything it had is gone; re-read its events from the start
        st.generation = next_generation(st.generation, &page.epoch, 0);
        st.epoch.clone_from(&page.epoch);
        st.seq = 0;
        fx.new_generation = true;
        fx.restarted = true;
        return fx;
    }
    if st.epoch.is_empty() {
        // First contact: entries recorded before it cannot be trusted (the pod may have
        // restarted since); the events of this page on (all of them, since=0) re-record what
        // it really holds.
        st.generation = next_generation(st.generation, &page.epoch, 0);
        fx.new_generation = true;
    }
    st.epoch.clone_from(&page.epoch);
    if page.reset || page.clears() {
        st.generation = next_generation(st.generation, &page.epoch, page.seq);
        fx.new_generation = true;
    }
    st.seq = page.seq;
    fx
}

/// Applies a metrics-only pod's good health check and `/metrics` reading to `st`.
///
/// The first reading keeps what the router recorded before it (nothing says the pod
/// restarted; a wrong guess costs one cache miss). Afterwards a different process start time,
/// a monotonic counter that went backwards, or an answer after the pod could not be reached
/// (without the same start time to prove it is the same process) is a restart: a new
/// generation.
pub fn on_metrics(st: &mut PodState, m: &MetricsReport, now_ns: u64) -> PageEffect {
    followed(st, m, now_ns, PodKind::Metrics)
}

/// A metrics-less pod's good health check ([`PodKind::Health`]): healthy, load unknown (zero),
/// a restart only when it answers after it could not be reached.
pub fn on_health_only(st: &mut PodState, now_ns: u64) -> PageEffect {
    followed(st, &MetricsReport::default(), now_ns, PodKind::Health)
}

fn followed(st: &mut PodState, m: &MetricsReport, now_ns: u64, kind: PodKind) -> PageEffect {
    let was_unreachable = st.unreachable;
    let mut fx = answered(st, &m.load, now_ns);
    let epoch = m
        .start_time
        .map(|t| format!("start:{t}"))
        .unwrap_or_default();
    let known = matches!(st.kind, PodKind::Metrics | PodKind::Health);
    let same_start = !epoch.is_empty() && epoch == st.epoch;
    let new_start = known && !epoch.is_empty() && !st.epoch.is_empty() && epoch != st.epoch;
    let went_back =
        known && matches!((st.counter, m.monotonic), (Some(old), Some(new)) if new < old);
    let came_back = known && was_unreachable && !same_start;
    if new_start || went_back || came_back {
        st.generation = next_generation(st.generation, &epoch, now_ns);
        fx.new_generation = true;
    }
    st.kind = kind;
    st.epoch = epoch;
    st.counter = m.monotonic;
    fx
}

/// The pod has no cache-events endpoint (it answered 404): follow it by its metrics.
pub fn on_no_events(st: &mut PodState) {
    st.kind = PodKind::Metrics;
}

/// The pod left the fleet (it is no longer a member of the pods cluster): whatever the router
/// recorded for it stops counting (a new generation), and if its address joins again it is
/// met as a stranger.
pub fn on_left(st: &mut PodState) {
    *st = PodState {
        generation: next_generation(st.generation, "left", 0),
        ..PodState::default()
    };
}

/// A poll that failed (no answer, non-200, a body that is not a page); `unreachable`: no
/// connection could be made ([`is_unreachable_reply`]). Returns whether the pod went down
/// with it.
pub fn on_poll_failure(st: &mut PodState, down_after: u32, unreachable: bool) -> bool {
    let was = st.healthy;
    st.unreachable |= unreachable;
    st.fails = st.fails.saturating_add(1);
    if st.fails >= down_after {
        st.healthy = false;
    }
    was && !st.healthy
}

/// The request path saw the pod refuse or reset a connection: down now, not after polls.
pub fn on_connect_failure(st: &mut PodState, down_after: u32, now_ns: u64) {
    st.fails = st.fails.max(down_after);
    st.healthy = false;
    st.unreachable = true;
    st.refused_ns = now_ns.max(1);
}

/// Whether a poll's answer is Envoy's own reply for a pod it could not connect to (or that
/// reset the connection before answering): status 503 with Envoy's "upstream connect error"
/// text. A pod's own 503 (llama.cpp while it loads the model, say) and a timeout (no answer)
/// are not.
pub fn is_unreachable_reply(status: Option<&str>, body: &[u8]) -> bool {
    status == Some("503") && body.starts_with(b"upstream connect error")
}

/// Whether a response means the chosen pod never answered: Envoy's own 502/503, which carries
/// no pod header (every response of the project's server carries one). The header is asked
/// for only when the status could be Envoy's (each read is a host call in the filter).
pub fn is_connect_failure(status: &str, has_pod_header: impl FnOnce() -> bool) -> bool {
    matches!(status, "502" | "503") && !has_pod_header()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{CacheEvent, SeqEvent};
    use crate::BlockHash;

    fn page(epoch: &str, seq: u64, reset: bool, events: Vec<CacheEvent>) -> EventsPage {
        EventsPage {
            epoch: epoch.into(),
            seq,
            reset,
            snapshot: reset.then(Vec::new),
            events: events
                .into_iter()
                .enumerate()
                .map(|(i, event)| SeqEvent {
                    seq: i as u64 + 1,
                    event,
                })
                .collect(),
            more: false,
            pod: "p".into(),
            load: LoadReport {
                running: 1,
                waiting: 2,
                kv_cache_usage: 0.5,
                ..LoadReport::default()
            },
        }
    }

    fn stored(n: u64) -> CacheEvent {
        CacheEvent::BlockStored {
            hashes: vec![BlockHash(n)],
        }
    }

    fn known(epoch: &str, seq: u64) -> PodState {
        PodState {
            generation: 7,
            epoch: epoch.into(),
            seq,
            ..PodState::default()
        }
    }

    #[test]
    fn pages_move_the_generation() {
        // (name, state before, page, new generation?, restarted?, seq after)
        let cases = [
            (
                "first contact",
                PodState::default(),
                page("e1", 3, false, vec![stored(1)]),
                true,
                false,
                3,
            ),
            (
                "same epoch, new events",
                known("e1", 3),
                page("e1", 5, false, vec![stored(2)]),
                false,
                false,
                5,
            ),
            (
                "same epoch, nothing new",
                known("e1", 5),
                page("e1", 5, false, vec![]),
                false,
                false,
                5,
            ),
            (
                "restart",
                known("e1", 5),
                page("e2", 9, false, vec![stored(3)]),
                true,
                true,
                0,
            ),
            (
                "reset",
                known("e1", 5),
                page("e1", 90, true, vec![]),
                true,
                false,
                90,
            ),
            (
                "cleared",
                known("e1", 5),
                page("e1", 7, false, vec![stored(4), CacheEvent::AllCleared]),
                true,
                false,
                7,
            ),
        ];
        for (name, mut st, page, new_gen, restarted, seq) in cases {
            let before = st.generation;
            let fx = on_page(&mut st, &page, 42);
            assert_eq!(fx.new_generation, new_gen, "{name}");
            assert_eq!(st.generation != before, new_gen, "{name}");
            assert_eq!(fx.restarted, restarted, "{name}");
            assert_eq!(st.seq, seq, "{name}");
            assert_eq!(st.epoch, page.epoch, "{name}");
            assert_eq!(
                (st.running, st.waiting, st.last_ok_ns),
                (1, 2, 42),
                "{name}"
            );
            assert!(st.healthy && st.fails == 0, "{name}");
        }
    }

    #[test]
    fn only_events_after_the_last_clear_are_live() {
        let p = page(
            "e",
            4,
            false,
            vec![stored(1), CacheEvent::AllCleared, stored(2), stored(3)],
        );
        assert!(p.clears());
        let live: Vec<u64> = p.live_events().iter().map(|e| e.seq).collect();
        assert_eq!(live, [3, 4], "block 1 was stored, then cleared");
        let p = page("e", 1, false, vec![stored(1), CacheEvent::AllCleared]);
        assert!(p.live_events().is_empty());
        let p = page("e", 1, false, vec![stored(1)]);
        assert_eq!(p.live_events().len(), 1);
        assert!(!p.clears());
    }

    #[test]
    fn failures_and_recovery() {
        // (down_after, failed polls, healthy after)
        for (down_after, polls, healthy) in
            [(1, 1, false), (2, 1, true), (2, 2, false), (3, 2, true)]
        {
            let mut st = PodState::default();
            let mut went_down = 0;
            for _ in 0..polls {
                went_down += u32::from(on_poll_failure(&mut st, down_after, false));
            }
            assert_eq!(st.healthy, healthy, "{down_after}/{polls}");
            assert_eq!(
                went_down,
                u32::from(!healthy),
                "reported once, when it happens"
            );
            let fx = on_page(&mut st, &page("e", 0, false, vec![]), 1);
            assert_eq!(fx.recovered, !healthy);
            assert!(st.healthy && st.fails == 0);
        }
        let mut st = PodState::default();
        on_connect_failure(&mut st, 2, 1_000);
        assert!(!st.healthy);
        // polled: only a good poll brings it back; not polled: tried again after `retry`
        assert!(!st.usable(1_000_000_000, None));
        assert!(!st.usable(1_000 + 499, Some(500)));
        assert!(st.usable(1_000 + 500, Some(500)));
        assert!(
            !PodState {
                healthy: false,
                ..PodState::default()
            }
            .usable(9, Some(1)),
            "never refused"
        );
        assert!(
            !on_poll_failure(&mut st, 2, false),
            "already down: not reported again"
        );
    }

    fn metrics(running: u32, start: Option<f64>, counter: Option<f64>) -> MetricsReport {
        MetricsReport {
            load: LoadReport {
                running,
                waiting: 1,
                kv_cache_usage: 0.2,
                ..LoadReport::default()
            },
            start_time: start,
            monotonic: counter,
        }
    }

    #[test]
    fn metrics_pods_restart_on_a_new_start_time_or_a_counter_going_back() {
        /// What happened between the two readings.
        #[derive(Clone, Copy)]
        enum Between {
            Nothing,
            /// polls timed out (a busy pod)
            Timeouts,
            /// polls found nobody listening
            Refused,
            /// the request path could not connect
            RequestRefused,
        }
        use Between::*;
        // (name, first reading, between, second reading, restart?)
        let cases = [
            (
                "same process",
                metrics(1, Some(10.0), Some(5.0)),
                Nothing,
                metrics(2, Some(10.0), Some(9.0)),
                false,
            ),
            (
                "new start time",
                metrics(1, Some(10.0), Some(5.0)),
                Nothing,
                metrics(2, Some(20.0), Some(9.0)),
                true,
            ),
            (
                "counter went back",
                metrics(1, None, Some(500.0)),
                Nothing,
                metrics(2, None, Some(3.0)),
                true,
            ),
            (
                "counter unchanged",
                metrics(1, None, Some(500.0)),
                Nothing,
                metrics(2, None, Some(500.0)),
                false,
            ),
            (
                "nothing to tell by",
                metrics(1, None, None),
                Nothing,
                metrics(2, None, None),
                false,
            ),
            (
                "start time appears",
                metrics(1, None, None),
                Nothing,
                metrics(2, Some(7.0), None),
                false,
            ),
            // killed before its counter was ever seen to move (llama.cpp: no start time)
            (
                "refused, then back",
                metrics(1, None, Some(0.0)),
                Refused,
                metrics(2, None, Some(0.0)),
                true,
            ),
            (
                "refused on a request",
                metrics(1, None, Some(0.0)),
                RequestRefused,
                metrics(2, None, Some(0.0)),
                true,
            ),
            (
                "busy: timeouts only",
                metrics(1, None, Some(0.0)),
                Timeouts,
                metrics(2, None, Some(0.0)),
                false,
            ),
            (
                "refused, same start time",
                metrics(1, Some(10.0), None),
                Refused,
                metrics(2, Some(10.0), None),
                false,
            ),
        ];
        for (name, first, between, second, restart) in cases {
            let mut st = PodState::default();
            on_no_events(&mut st);
            let fx = on_metrics(&mut st, &first, 1);
            assert!(
                !fx.new_generation,
                "{name}: the first reading keeps the records"
            );
            assert_eq!(st.kind, PodKind::Metrics);
            let before = st.generation;
            match between {
                Nothing => {}
                Timeouts => (0..3).for_each(|_| {
                    on_poll_failure(&mut st, 2, false);
                }),
                Refused => (0..3).for_each(|_| {
                    on_poll_failure(&mut st, 2, true);
                }),
                RequestRefused => on_connect_failure(&mut st, 2, 5),
            }
            let fx = on_metrics(&mut st, &second, 2);
            assert_eq!(fx.new_generation, restart, "{name}");
            assert_eq!(st.generation != before, restart, "{name}");
            assert_eq!((st.running, st.waiting, st.last_ok_ns), (2, 1, 2), "{name}");
            assert!(
                st.healthy && !st.unreachable,
                "{name}: a good answer clears it"
            );
        }
        // down, then a good reading brings it back
        let mut st = PodState::default();
        on_metrics(&mut st, &metrics(0, None, None), 1);
        on_poll_failure(&mut st, 1, false);
        assert!(on_metrics(&mut st, &metrics(0, None, None), 2).recovered);
        assert!(st.healthy);
    }

    #[test]
    fn health_only_pods_are_idle_and_restart_only_after_being_unreachable() {
        let mut st = PodState::default();
        on_no_events(&mut st);
        assert_eq!(st.signals(), 0, "nothing heard yet");
        let fx = on_health_only(&mut st, 1);
        assert!(!fx.new_generation, "the first answer keeps the records");
        assert_eq!((st.kind, st.signals()), (PodKind::Health, 3));
        assert_eq!(
            st.load(4, &CostPrior::default()),
            PodState::default().load(4, &CostPrior::default()),
            "load unknown: idle"
        );
        // timeouts (a busy pod) are no restart
        on_poll_failure(&mut st, 2, false);
        on_poll_failure(&mut st, 2, false);
        assert!(!st.healthy);
        let fx = on_health_only(&mut st, 2);
        assert!(fx.recovered && !fx.new_generation);
        // nobody listening, then an answer: a new process
        let before = st.generation;
        on_poll_failure(&mut st, 2, true);
        let fx = on_health_only(&mut st, 3);
        assert!(fx.new_generation && st.generation != before);
        // a pod that gains metrics later (restarted with --metrics) is followed by them
        on_metrics(&mut st, &metrics(3, None, Some(1.0)), 4);
        assert_eq!(
            (st.kind, st.running, st.signals()),
            (PodKind::Metrics, 3, 2)
        );
    }

    #[test]
    fn connect_failures_are_envoys_own_errors() {
        for (status, pod_header, want) in [
            ("503", false, true),
            ("502", false, true),
            ("503", true, false),
            ("500", false, false),
            ("200", false, false),
            ("429", false, false),
        ] {
            assert_eq!(
                is_connect_failure(status, || pod_header),
                want,
                "{status} {pod_header}"
            );
        }
    }

    #[test]
    fn lag_and_load() {
        let st = PodState {
            last_ok_ns: 1_000_000,
            waiting: 3,
            ..PodState::default()
        };
        assert_eq!(st.lag_ms(5_000_000), 4);
        assert_eq!(PodState::default().lag_ms(5_000_000), 0);
        assert_eq!(st.load(2, &CostPrior::default()).inflight, 2);
        assert_eq!(st.load(2, &CostPrior::default()).waiting, 3);
    }

    #[test]
    fn only_envoys_connect_failure_reply_means_unreachable() {
        let envoy = b"upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, transport failure reason: delayed connect error: Connection refused";
        assert!(is_unreachable_reply(Some("503"), envoy));
        let loading =
            br#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;
        assert!(
            !is_unreachable_reply(Some("503"), loading),
            "the pod's own 503"
        );
        assert!(!is_unreachable_reply(None, b""), "a timeout");
        assert!(!is_unreachable_reply(Some("500"), envoy));
    }
}
