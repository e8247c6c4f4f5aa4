//! The baselines, kept for side-by-side comparison in the benchmark: `round_robin`,
//! `random` and `least_loaded` choose among the candidates without looking at the prompt.

use super::{Candidates, Inputs, Policy, Reason};

/// The baseline's choice, or `None` for the policies that weigh the prompt.
pub(super) fn choose<S: AsRef<str>>(
    input: &Inputs<'_, S>,
    cands: &Candidates<'_, S>,
) -> Option<(usize, Reason)> {
    let k = cands.pods.len() as u64;
    match input.policy {
        Policy::RoundRobin => Some((cands.pods[(input.counter % k) as usize], Reason::RoundRobin)),
        Policy::Random => Some((cands.pods[(input.random % k) as usize], Reason::Random)),
        Policy::LeastLoaded => Some((cands.least_loaded(), Reason::LeastLoaded)),
        Policy::Prefix => None,
    }
}
