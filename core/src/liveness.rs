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
//! - `down_after_failures` failed polls in a row mark the pod down; one good poll brings it
//!   back. A connection refused or reset on the request path (Envoy answers 502/503 itself,
//!   without the pod's header) marks it down at once.

use crate::policy::PodLoad;
use crate::protocol::{EventsPage, LoadReport};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

/// One pod's state as last learned by the poller (and by failed responses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PodState {
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
}

impl Default for PodState {
    fn default() -> Self {
        PodState {
            generation: 0,
            epoch: String::new(),
            seq: 0,
            healthy: true,
            fails: 0,
            running: 0,
            waiting: 0,
            kv_cache_usage: 0.0,
            last_ok_ns: 0,
        }
    }
}

impl PodState {
    /// The routing view of the pod, with this router's in-flight count.
    pub fn load(&self, inflight: u32) -> PodLoad {
        PodLoad {
            healthy: self.healthy,
            inflight,
            waiting: self.waiting,
            kv_cache_usage: self.kv_cache_usage,
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
    /// Record the page's snapshot (a reset) and its live events under the new state.
    pub apply: bool,
}

fn next_generation(old: u64, salt: &str, seq: u64) -> u64 {
    let mut b = old.to_le_bytes().to_vec();
    b.extend_from_slice(salt.as_bytes());
    b.extend_from_slice(&seq.to_le_bytes());
    xxh3_64(&b).max(1)
}

/// Applies a successful poll's page to `st`.
pub fn on_page(st: &mut PodState, page: &EventsPage, now_ns: u64) -> PageEffect {
    let mut fx = PageEffect {
        recovered: !st.healthy,
        ..PageEffect::default()
    };
    st.healthy = true;
    st.fails = 0;
    st.set_load(&page.load);
    st.last_ok_ns = now_ns;
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
    fx.apply = true;
    fx
}

/// A poll that failed (no answer, non-200, a body that is not a page). Returns whether the
/// pod went down with it.
pub fn on_poll_failure(st: &mut PodState, down_after: u32) -> bool {
    let was = st.healthy;
    st.fails = st.fails.saturating_add(1);
    if st.fails >= down_after {
        st.healthy = false;
    }
    was && !st.healthy
}

/// The request path saw the pod refuse or reset a connection: down now, not after polls.
pub fn on_connect_failure(st: &mut PodState, down_after: u32) {
    st.fails = st.fails.max(down_after);
    st.healthy = false;
}

/// Whether a response means the chosen pod never answered: Envoy's own 502/503, which carries
/// no pod header (every response of the project's server carries one).
pub fn is_connect_failure(status: &str, has_pod_header: bool) -> bool {
    matches!(status, "502" | "503") && !has_pod_header
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
            assert_eq!(fx.apply, !restarted, "{name}");
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
                went_down += u32::from(on_poll_failure(&mut st, down_after));
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
        on_connect_failure(&mut st, 2);
        assert!(!st.healthy);
        assert!(
            !on_poll_failure(&mut st, 2),
            "already down: not reported again"
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
                is_connect_failure(status, pod_header),
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
        assert_eq!(st.load(2).inflight, 2);
        assert_eq!(st.load(2).waiting, 3);
    }
}
