//! The filter's per-request reasons, summed up to explain a run's tail: how many requests
//! each reason took and their TTFTs (with `BENCH_DEBUG_HEADERS=1`, which makes the filter name
//! its reason and matched blocks on every answer). A p90 dominated by `cold` and `imbalanced`
//! requests is spills and re-placements; one from `prefix-hit` requests is queueing at owners
//! (or stale ownership: the pod evicted what the table still says it holds).

use crate::replay::{quantile, Outcome};
use std::fmt::Write as _;

/// One line per reason, most requests first: `cold 130 (TTFT p50 450 ms, p90 610 ms, 0.0
/// blocks matched on average, 2% of prompt tokens cached)`; empty when the answers named no
/// reason (debug headers off). The cached share is what the pods reported in the answers'
/// usage: a `prefix-hit` with many blocks matched but few tokens cached was routed on
/// ownership the pod no longer had. Left out when the pods report no usage.
pub fn summary(outcomes: &[Outcome]) -> String {
    #[derive(Default)]
    struct Sum<'a> {
        reason: &'a str,
        ttfts: Vec<f64>,
        blocks: usize,
        prompt: u64,
        cached: u64,
    }
    let mut by: Vec<Sum<'_>> = Vec::new();
    for o in outcomes.iter().filter(|o| o.ok() && !o.reason.is_empty()) {
        let i = match by.iter().position(|s| s.reason == o.reason) {
            Some(i) => i,
            None => {
                by.push(Sum {
                    reason: &o.reason,
                    ..Sum::default()
                });
                by.len() - 1
            }
        };
        let s = &mut by[i];
        s.ttfts.push(o.ttft_ms.unwrap_or(f64::NAN));
        s.blocks += o.matched_blocks;
        s.prompt += o.prompt_tokens;
        s.cached += o.cached_tokens;
    }
    by.sort_by_key(|s| (std::cmp::Reverse(s.ttfts.len()), s.reason));
    let mut out = String::new();
    for s in by {
        let n = s.ttfts.len();
        let _ = write!(
            out,
            "{} {n} (TTFT p50 {:.0} ms, p90 {:.0} ms, {:.1} blocks matched on average",
            s.reason,
            quantile(&s.ttfts, 0.5),
            quantile(&s.ttfts, 0.9),
            s.blocks as f64 / n as f64
        );
        if s.prompt > 0 {
            let _ = write!(
                out,
                ", {:.0}% of prompt tokens cached",
                100.0 * s.cached as f64 / s.prompt as f64
            );
        }
        out.push_str("); ");
    }
    out.trim_end_matches("; ").to_owned()
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
            prompt_tokens: 1000,
            cached_tokens: (blocks * 100) as u64,
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
        assert!(s.contains("60% of prompt tokens cached"), "{s}");
        assert!(
            s.ends_with(
                "cold 1 (TTFT p50 400 ms, p90 400 ms, 0.0 blocks matched on average, \
                 0% of prompt tokens cached)"
            ),
            "{s}"
        );
        assert_eq!(summary(&o[3..]), "");
    }
}
