//! The filter's per-request reasons, summed up to explain a run's tail: how many requests
//! each reason took and their TTFTs (with `BENCH_DEBUG_HEADERS=1`, which makes the filter name
//! its reason and matched blocks on every answer). A p90 dominated by `cold` and `imbalanced`
//! requests is spills and re-placements; one from `prefix-hit` requests is queueing at owners
//! (or stale ownership: the pod evicted what the table still says it holds).

use crate::replay::{quantile, Outcome};
use std::fmt::Write as _;

/// One line per reason, most requests first: `cold 130 (TTFT p50 450 ms, p90 610 ms)`; empty
/// when the answers named no reason (debug headers off).
pub fn summary(outcomes: &[Outcome]) -> String {
    let mut by: Vec<(&str, Vec<f64>, usize)> = Vec::new();
    for o in outcomes.iter().filter(|o| o.ok() && !o.reason.is_empty()) {
        let ttft = o.ttft_ms.unwrap_or(f64::NAN);
        match by.iter_mut().find(|(r, _, _)| *r == o.reason) {
            Some((_, ttfts, blocks)) => {
                ttfts.push(ttft);
                *blocks += o.matched_blocks;
            }
            None => by.push((&o.reason, vec![ttft], o.matched_blocks)),
        }
    }
    by.sort_by_key(|(r, v, _)| (std::cmp::Reverse(v.len()), *r));
    let mut s = String::new();
    for (reason, ttfts, blocks) in by {
        let n = ttfts.len();
        let _ = write!(
            s,
            "{reason} {n} (TTFT p50 {:.0} ms, p90 {:.0} ms, {:.1} blocks matched on average); ",
            quantile(&ttfts, 0.5),
            quantile(&ttfts, 0.9),
            blocks as f64 / n as f64
        );
    }
    s.trim_end_matches("; ").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(reason: &str, ttft: f64, blocks: usize) -> Outcome {
        Outcome {
            at_ms: 0.0,
            status: 200,
            ttft_ms: Some(ttft),
            e2e_ms: ttft,
            output_tokens: 1,
            pod: String::new(),
            reason: reason.to_owned(),
            matched_blocks: blocks,
            error: None,
        }
    }

    #[test]
    fn reasons_by_count_with_their_ttfts() {
        let o = [
            outcome("cold", 400.0, 0),
            outcome("prefix-hit", 40.0, 8),
            outcome("prefix-hit", 60.0, 4),
            outcome("", 1.0, 0),
        ];
        let s = summary(&o);
        assert!(s.starts_with("prefix-hit 2 (TTFT p50"), "{s}");
        assert!(s.contains("6.0 blocks matched"), "{s}");
        assert!(
            s.ends_with("cold 1 (TTFT p50 400 ms, p90 400 ms, 0.0 blocks matched on average)"),
            "{s}"
        );
        assert_eq!(summary(&o[3..]), "");
    }
}
