//! What a request costs on each pod, learned online from what the pods report: what policy
//! `prefix` weighs a spill with, and when the filter counts a routed prompt's blocks as held.
//!
//! Weighing "requests in flight" against "blocks matched" in fixed units cannot know that a
//! cold 4k-token prefill costs as much as forty warm requests on one fleet and as little as
//! one on another. So a spill away from a prefix's owner is checked in seconds, from four
//! numbers per pod:
//!
//! - `per_token_s` and `base_s`: prefill time ≈ `base_s` + `per_token_s` × tokens computed
//!   (prompt tokens the pod's cache did not hold);
//! - `service_s`: how long a request holds one of the pod's sequence slots;
//! - `slots`: how many sequences the pod runs at once.
//!
//! The pods report cumulative counters ([`WorkCounters`]: our server on its events page;
//! vLLM, SGLang and llama.cpp in their Prometheus metrics). Between two polls their
//! differences are one *window*: requests prefilled, tokens computed, seconds spent. A
//! least-squares fit over recent windows (older ones decay by [`DECAY`] per window) gives
//! `base_s` and `per_token_s`; a prior (configured) stands in until a pod has reported
//! anything, and for what its windows cannot tell apart. Counters that go backwards (a restart) start afresh.

use serde::{Deserialize, Serialize};

/// Weight of a window relative to the next one: the fit follows roughly the last ten polls.
pub const DECAY: f64 = 0.9;

/// Cumulative counters of a pod's work since it started (each absent when the pod does not
/// report it). Part of the events page's load report; read from `/metrics` for other servers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkCounters {
    /// Requests whose prefill finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefills: Option<f64>,
    /// Seconds spent prefilling them (from getting a slot to the first token).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_seconds: Option<f64>,
    /// Prompt tokens the pod computed (prompt tokens not found in its cache).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub computed_tokens: Option<f64>,
    /// Requests that finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished: Option<f64>,
    /// Seconds those requests held a sequence slot (prefill and decode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot_seconds: Option<f64>,
    /// Sequences the pod runs at once (its `--max-num-seqs`), when it says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_num_seqs: Option<u32>,
    /// Tokens its prefix cache holds when full, when it says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_tokens: Option<f64>,
}

/// A pod's costs as far as they are known; the policy fills gaps from [`CostPrior`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LearnedCosts {
    pub base_s: Option<f64>,
    pub per_token_s: Option<f64>,
    pub service_s: Option<f64>,
    pub slots: Option<f64>,
    pub cache_tokens: Option<f64>,
}

/// What a pod is assumed to cost before it has said (plugin configuration `cost`). The
/// defaults describe a small CPU pod (and the benchmark's sim pods); a GPU fleet's pods
/// correct them within a few polls.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostPrior {
    /// Fixed part of a prefill, milliseconds.
    pub base_ms: f64,
    /// Prefill time per computed prompt token, microseconds.
    pub prefill_us_per_token: f64,
    /// Time a request holds a sequence slot, milliseconds.
    pub service_ms: f64,
    /// Sequences a pod runs at once.
    pub slots: u32,
}

impl Default for CostPrior {
    fn default() -> Self {
        CostPrior {
            base_ms: 5.0,
            prefill_us_per_token: 100.0,
            service_ms: 100.0,
            slots: 4,
        }
    }
}

/// The numbers the policy uses for one pod: learned where known, the prior elsewhere.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PodCosts {
    pub base_s: f64,
    pub per_token_s: f64,
    pub service_s: f64,
    pub slots: f64,
    /// Prefix-cache capacity in tokens (`None`: unknown).
    pub cache_tokens: Option<f64>,
}

impl PodCosts {
    pub fn resolve(learned: &LearnedCosts, prior: &CostPrior) -> Self {
        PodCosts {
            base_s: learned.base_s.unwrap_or(prior.base_ms / 1e3),
            per_token_s: learned
                .per_token_s
                .unwrap_or(prior.prefill_us_per_token / 1e6),
            service_s: learned.service_s.unwrap_or(prior.service_ms / 1e3),
            slots: learned.slots.unwrap_or(f64::from(prior.slots)).max(1.0),
            cache_tokens: learned.cache_tokens.filter(|&c| c > 0.0),
        }
    }

    /// Tokens of other prefixes that computing `computed` tokens evicts from a cache that is
    /// `usage` full: what does not fit in its free space (when the capacity is unknown, the
    /// computed tokens scaled by how full the cache is).
    pub fn evicted_tokens(&self, computed: usize, usage: f64) -> f64 {
        let computed = computed as f64;
        let usage = usage.clamp(0.0, 1.0);
        match self.cache_tokens {
            Some(cap) => (computed - (1.0 - usage) * cap).max(0.0),
            None => computed * usage,
        }
    }

    /// Predicted prefill time of `computed` prompt tokens.
    pub fn prefill_s(&self, computed: usize) -> f64 {
        self.base_s + self.per_token_s * computed as f64
    }

    /// Predicted wait for a slot with `outstanding` requests already on the pod: those beyond
    /// its slots queue, and a slot frees every `service_s / slots` on average.
    pub fn wait_s(&self, outstanding: u32) -> f64 {
        let ahead = (f64::from(outstanding) + 1.0 - self.slots).max(0.0);
        ahead.ceil() * self.service_s / self.slots
    }
}

/// The online fit of one pod's costs: decayed sums of the windows seen, and the counters of
/// the last poll.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CostModel {
    last: WorkCounters,
    /// Σ n², Σ n·m, Σ m², Σ n·y, Σ m·y over windows of n prefills, m computed tokens and y
    /// prefill seconds.
    nn: f64,
    nm: f64,
    mm: f64,
    ny: f64,
    my: f64,
    /// Σ slot seconds, Σ finished requests.
    slot_s: f64,
    finished: f64,
    /// Most sequences seen running at once.
    max_running: u32,
}

/// The difference of a counter between two readings, when both exist and it did not go back.
fn delta(new: Option<f64>, old: Option<f64>) -> Option<f64> {
    match (new, old) {
        (Some(n), Some(o)) if n >= o && (n - o).is_finite() => Some(n - o),
        _ => None,
    }
}

impl CostModel {
    /// Takes one poll's counters (and its running count, for pods that do not say their
    /// slots).
    pub fn observe(&mut self, now: &WorkCounters, running: u32) {
        self.max_running = self.max_running.max(running);
        let old = self.last;
        self.last = *now;
        let went_back =
            |n: Option<f64>, o: Option<f64>| matches!((n, o), (Some(n), Some(o)) if n < o);
        if went_back(now.computed_tokens, old.computed_tokens)
            || went_back(now.finished, old.finished)
        {
            // a new process: its counters start at zero, the old fit still describes the pod
            return;
        }
        let m = delta(now.computed_tokens, old.computed_tokens);
        let y = delta(now.prefill_seconds, old.prefill_seconds);
        if let (Some(m), Some(y)) = (m, y) {
            // without a prefill count (llama.cpp) the fit has only the per-token term
            let n = delta(now.prefills, old.prefills).unwrap_or(0.0);
            if n > 0.0 || m > 0.0 {
                self.nn = self.nn * DECAY + n * n;
                self.nm = self.nm * DECAY + n * m;
                self.mm = self.mm * DECAY + m * m;
                self.ny = self.ny * DECAY + n * y;
                self.my = self.my * DECAY + m * y;
            }
        }
        if let (Some(s), Some(f)) = (
            delta(now.slot_seconds, old.slot_seconds),
            delta(now.finished, old.finished),
        ) {
            if f > 0.0 {
                self.slot_s = self.slot_s * DECAY + s;
                self.finished = self.finished * DECAY + f;
            }
        }
    }

    /// The costs learned so far. The prefill terms are pulled toward `prior` with the weight
    /// of a hundredth of a request and of ten computed tokens: enough to settle what the
    /// windows cannot tell apart (a llama.cpp pod counts no prefills: its fixed part stays the
    /// prior's), too little to matter once a pod has prefilled anything.
    pub fn learned(&self, prior: &CostPrior) -> LearnedCosts {
        let (b0, c0) = (prior.base_ms / 1e3, prior.prefill_us_per_token / 1e6);
        let (lb, lc) = (1.0e-2, 1.0e2);
        let (a11, a12, a22) = (self.nn + lb, self.nm, self.mm + lc);
        let (r1, r2) = (self.ny + lb * b0, self.my + lc * c0);
        let det = a11 * a22 - a12 * a12;
        let fitted = self.mm > 0.0 && det.is_normal();
        let (base, per_token) = if fitted {
            let b = (r1 * a22 - a12 * r2) / det;
            let c = (a11 * r2 - a12 * r1) / det;
            // a negative term is noise around zero: refit the other alone
            match (b >= 0.0, c >= 0.0) {
                (true, true) => (b, c),
                (false, _) => (0.0, (r2 / a22).max(0.0)),
                (true, false) => ((r1 / a11).max(0.0), 0.0),
            }
        } else {
            (f64::NAN, f64::NAN)
        };
        let known = |v: f64| v.is_finite().then_some(v);
        LearnedCosts {
            base_s: known(base),
            per_token_s: known(per_token),
            service_s: (self.finished > 0.0).then(|| self.slot_s / self.finished),
            slots: self
                .last
                .max_num_seqs
                .filter(|&s| s > 0)
                .or((self.max_running > 0).then_some(self.max_running))
                .map(f64::from),
            cache_tokens: self.last.cache_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(prefills: f64, computed: f64, prefill_s: f64) -> WorkCounters {
        WorkCounters {
            prefills: Some(prefills),
            prefill_seconds: Some(prefill_s),
            computed_tokens: Some(computed),
            ..WorkCounters::default()
        }
    }

    /// A pod whose prefills cost exactly `base + per_token × tokens`, polled after each
    /// window of (requests, tokens).
    fn feed(model: &mut CostModel, base: f64, per_token: f64, windows: &[(f64, f64)]) {
        let (mut n, mut m, mut y) = (0.0, 0.0, 0.0);
        model.observe(&counters(n, m, y), 0);
        for &(dn, dm) in windows {
            n += dn;
            m += dm;
            y += base * dn + per_token * dm;
            model.observe(&counters(n, m, y), 0);
        }
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() <= 0.02 * b.abs() + 1e-9)
    }

    #[test]
    fn fits_base_and_per_token_cost_from_mixed_windows() {
        let prior = CostPrior::default();
        // a GPU-like pod: far cheaper per token than the prior, and a larger fixed part
        let mut m = CostModel::default();
        let windows: Vec<(f64, f64)> = (0..30)
            .map(|i| (f64::from(10 + i % 7), f64::from(20_000 + 3_000 * (i % 5))))
            .collect();
        feed(&mut m, 0.02, 2e-6, &windows);
        let l = m.learned(&prior);
        assert!(close(l.base_s, 0.02), "{l:?}");
        assert!(close(l.per_token_s, 2e-6), "{l:?}");
    }

    #[test]
    fn without_data_nothing_is_learned_and_the_prior_fills_in() {
        let prior = CostPrior::default();
        let l = CostModel::default().learned(&prior);
        assert_eq!(l, LearnedCosts::default());
        let c = PodCosts::resolve(&l, &prior);
        assert_eq!(c.per_token_s, 100e-6);
        assert_eq!(c.slots, 4.0);
    }

    #[test]
    fn per_token_cost_alone_when_the_pod_counts_no_prefills() {
        // llama.cpp: prompt seconds and prompt tokens, no request count
        let mut m = CostModel::default();
        let mut c = WorkCounters::default();
        for i in 0..10 {
            c.computed_tokens = Some(f64::from(i) * 1000.0);
            c.prefill_seconds = Some(f64::from(i) * 1000.0 * 3e-3);
            m.observe(&c, 1);
        }
        let l = m.learned(&CostPrior::default());
        assert!(close(l.per_token_s, 3e-3), "{l:?}");
        assert_eq!(l.slots, Some(1.0), "slots from the most seen running");
    }

    #[test]
    fn a_restart_does_not_poison_the_fit() {
        let mut m = CostModel::default();
        feed(
            &mut m,
            0.005,
            1e-4,
            &[(4.0, 4000.0), (2.0, 500.0), (8.0, 9000.0)],
        );
        let before = m.learned(&CostPrior::default());
        // the counters start again from zero: no negative window is taken
        m.observe(&counters(0.0, 0.0, 0.0), 0);
        assert_eq!(m.learned(&CostPrior::default()), before);
        m.observe(&counters(3.0, 3000.0, 0.315), 0);
        assert!(close(m.learned(&CostPrior::default()).per_token_s, 1e-4));
    }

    #[test]
    fn service_time_and_reported_slots() {
        let mut m = CostModel::default();
        let mut c = WorkCounters {
            max_num_seqs: Some(8),
            ..WorkCounters::default()
        };
        for i in 0..5 {
            c.finished = Some(f64::from(i) * 10.0);
            c.slot_seconds = Some(f64::from(i) * 10.0 * 0.07);
            m.observe(&c, 3);
        }
        let l = m.learned(&CostPrior::default());
        assert!(close(l.service_s, 0.07), "{l:?}");
        assert_eq!(l.slots, Some(8.0));
    }

    #[test]
    fn evictions_are_what_does_not_fit() {
        let mut c = PodCosts::resolve(&LearnedCosts::default(), &CostPrior::default());
        assert_eq!(
            c.evicted_tokens(1000, 0.5),
            500.0,
            "capacity unknown: by usage"
        );
        c.cache_tokens = Some(32768.0);
        assert_eq!(c.evicted_tokens(4000, 0.75), 0.0, "8192 tokens free");
        assert_eq!(c.evicted_tokens(4000, 1.0), 4000.0);
        assert!((c.evicted_tokens(4000, 0.9) - (4000.0 - 0.1 * 32768.0)).abs() < 1e-6);
    }

    #[test]
    fn wait_counts_only_requests_beyond_the_slots() {
        let c = PodCosts {
            base_s: 0.0,
            per_token_s: 0.0,
            service_s: 0.08,
            slots: 4.0,
            cache_tokens: None,
        };
        assert_eq!(c.wait_s(0), 0.0);
        assert_eq!(c.wait_s(3), 0.0, "a fourth request still finds a slot");
        assert!((c.wait_s(4) - 0.02).abs() < 1e-12);
        assert!((c.wait_s(7) - 0.08).abs() < 1e-12);
    }

    #[test]
    fn counters_round_trip_and_old_pages_parse() {
        let c = WorkCounters {
            prefills: Some(3.0),
            max_num_seqs: Some(4),
            ..WorkCounters::default()
        };
        let v = serde_json::to_string(&c).unwrap_or_default();
        assert_eq!(v, r#"{"prefills":3.0,"max_num_seqs":4}"#);
        assert_eq!(serde_json::from_str::<WorkCounters>(&v).ok(), Some(c));
        assert_eq!(
            serde_json::from_str::<WorkCounters>("{}").ok(),
            Some(WorkCounters::default())
        );
    }
}
