//! The oracle hit rate of a trace: with one unbounded cache shared by every pod, how many
//! prompt tokens could have been reused? Counted exactly as the servers count hits (leading
//! chain of full blocks seen before; a fully cached prompt still recomputes its last block).

use super::trace::TraceRequest;
use prefix_core::request::{parse_request, Endpoint};
use prefix_core::{BlockHash, ModelBundle};
use std::collections::HashSet;

#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Oracle {
    pub prompt_tokens: u64,
    pub reusable_tokens: u64,
    pub hit_rate: f64,
}

pub fn oracle(bundle: &ModelBundle, trace: &[TraceRequest]) -> anyhow::Result<Oracle> {
    let bs = bundle.block_size().get() as usize;
    let mut seen: HashSet<BlockHash> = HashSet::new();
    let mut o = Oracle::default();
    for r in trace {
        let endpoint = Endpoint::from_path(&r.path).unwrap_or(Endpoint::Completions);
        let req = parse_request(endpoint, r.body.to_string().as_bytes())?;
        let p = bundle.prepare(&req)?;
        let mut hits = p.hashes.iter().take_while(|h| seen.contains(h)).count();
        if hits > 0 && hits * bs >= p.tokens.len() {
            hits -= 1;
        }
        o.prompt_tokens += p.tokens.len() as u64;
        o.reusable_tokens += (hits * bs) as u64;
        seen.extend(p.hashes.iter().copied());
    }
    o.hit_rate = o.reusable_tokens as f64 / o.prompt_tokens.max(1) as f64;
    Ok(o)
}
