//! In-process micro benchmarks: the block prefix cache and the tokenizer/hashing path.

use model_server::cache::BlockPrefixCache;
use prefix_core::request::{parse_request, Endpoint};
use prefix_core::{BlockHash, BlockSize, ModelBundle};
use serde::Serialize;
use std::time::Instant;

#[derive(Debug, Serialize)]
pub struct CacheResult {
    pub blocks_cached: usize,
    pub requests: usize,
    pub blocks_per_request: usize,
    /// acquire (lookup + pin) + store (insert/evict) + release, per block
    pub ns_per_block: f64,
}

fn mix(i: u64) -> BlockHash {
    BlockHash(xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes()))
}

/// Fills a cache with `blocks` blocks, then times requests of 32 blocks each: half a
/// previously stored chain (hits), half new blocks (inserts evicting the LRU).
pub fn cache(blocks: usize, requests: usize) -> CacheResult {
    const PER: usize = 32;
    let cache = BlockPrefixCache::<()>::new(blocks, 128);
    let mut next = 0u64;
    let mut chain = |n: usize| -> Vec<BlockHash> {
        (0..n)
            .map(|_| {
                next += 1;
                mix(next)
            })
            .collect()
    };
    let mut stored = Vec::new();
    while cache.len() < blocks {
        let hs = chain(PER);
        cache.acquire(&hs, usize::MAX).store(&hs);
        stored.push(hs);
    }
    let t = Instant::now();
    for r in 0..requests {
        let old = &stored[(r * 7919) % stored.len()];
        let mut hs: Vec<BlockHash> = old[..PER / 2].to_vec();
        hs.extend(chain(PER / 2));
        let mut lease = cache.acquire(&hs, usize::MAX);
        lease.store(&hs);
    }
    let ns = t.elapsed().as_nanos() as f64;
    CacheResult {
        blocks_cached: cache.len(),
        requests,
        blocks_per_request: PER,
        ns_per_block: ns / (requests * PER) as f64,
    }
}

#[derive(Debug, Serialize)]
pub struct TokenizerResult {
    pub prompt_tokens: usize,
    pub iterations: usize,
    pub tokens_per_sec: f64,
    /// parse body + tokenize + hash, per request (native; the filter runs the same in V8)
    pub prepare_us: f64,
}

pub fn tokenizer(
    bundle: &ModelBundle,
    text: &str,
    iterations: usize,
) -> anyhow::Result<TokenizerResult> {
    let tokens = bundle.tokenizer().encode(text)?.len();
    // each iteration's text is new (a leading counter), so the whole-segment cache never
    // answers: this is the cost of a prompt not seen before (its words mostly are)
    let texts: Vec<String> = (0..iterations).map(|i| format!("{i} {text}")).collect();
    let t = Instant::now();
    for text in &texts {
        std::hint::black_box(bundle.tokenizer().encode(text)?);
    }
    let encode_s = t.elapsed().as_secs_f64();
    let bodies: Vec<String> = texts
        .iter()
        .map(|text| serde_json::json!({ "prompt": text }).to_string())
        .collect();
    let t = Instant::now();
    for body in &bodies {
        let req = parse_request(Endpoint::Completions, body.as_bytes())?;
        std::hint::black_box(bundle.prepare(&req)?);
    }
    let prepare_s = t.elapsed().as_secs_f64();
    Ok(TokenizerResult {
        prompt_tokens: tokens,
        iterations,
        tokens_per_sec: (tokens * iterations) as f64 / encode_s,
        prepare_us: prepare_s * 1e6 / iterations as f64,
    })
}

/// The default model's bundle, from the data directory setup fills.
pub fn default_bundle() -> anyhow::Result<ModelBundle> {
    let dir = model_server::config::default_model_dir();
    let json = std::fs::read(dir.join("tokenizer.json"))?;
    let cfg = std::fs::read(dir.join("tokenizer_config.json")).ok();
    Ok(ModelBundle::new(
        model_server::config::DEFAULT_MODEL_NAME,
        &json,
        cfg.as_deref(),
        BlockSize::default(),
    )?)
}

/// Prompt text (letters, spaces and periods only, so it embeds in JSON and Lua verbatim) of
/// at least `tokens` tokens.
pub fn text_of(bundle: &ModelBundle, tokens: usize) -> anyhow::Result<String> {
    const WORDS: &[&str] = &[
        "check",
        "the",
        "service",
        "logs",
        "before",
        "restarting",
        "any",
        "node",
        "and",
        "compare",
        "latency",
        "with",
        "last",
        "week",
        "then",
        "escalate",
        "to",
        "the",
        "database",
        "team",
        "when",
        "replication",
        "lag",
        "grows",
        "beyond",
        "thirty",
        "seconds.",
    ];
    let mut text = String::new();
    let mut i = 0usize;
    loop {
        // grow in chunks, then check
        for _ in 0..64 {
            text.push_str(WORDS[i % WORDS.len()]);
            text.push(' ');
            i += 1;
        }
        if bundle.tokenizer().encode(&text)?.len() >= tokens {
            return Ok(text);
        }
    }
}

/// One input shape of [`tokenize_scaling`] at one size.
#[derive(Debug, Serialize)]
pub struct ScalingRow {
    pub input: &'static str,
    pub bytes: usize,
    pub ms: f64,
    pub ms_per_mib: f64,
}

/// How tokenizing time grows with the input, 1 KiB to 4 MiB (the body limit): one word of one
/// letter (`aaaa…`, the hostile case), one word of random letters, and ordinary text (words
/// never seen before). Near-linear means ms per MiB stays flat; [`slope`] fits the exponent.
pub fn tokenize_scaling(bundle: &ModelBundle) -> anyhow::Result<Vec<ScalingRow>> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut letter = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        char::from(b'a' + (x % 26) as u8)
    };
    let max = 4usize << 20;
    let random: String = (0..max).map(|_| letter()).collect();
    // ordinary text: words of random letters, so neither the word cache nor a segment's helps
    let mut words = String::with_capacity(max);
    let mut i = 0;
    while words.len() < max {
        let len = 2 + (i * 7919) % 9;
        words.push_str(&random[i % (max - 16)..][..len]);
        words.push(' ');
        i += len;
    }
    let mut rows = Vec::new();
    for (input, source) in [
        ("one word aaaa…", "a".repeat(max)),
        ("one word of random letters", random),
        ("words of random letters", words),
    ] {
        let mut bytes = 1024;
        while bytes <= max {
            let text = source.get(..bytes).unwrap_or(&source);
            let t = Instant::now();
            std::hint::black_box(bundle.tokenizer().encode(text)?);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            rows.push(ScalingRow {
                input,
                bytes,
                ms,
                ms_per_mib: ms * (1 << 20) as f64 / bytes as f64,
            });
            bytes *= 4;
        }
    }
    Ok(rows)
}

/// The exponent `k` of time ∝ size^k, fitted (least squares on logs) over one input's rows
/// from 64 KiB up (smaller ones are dominated by fixed costs): 1 is linear, 2 quadratic.
pub fn slope(rows: &[ScalingRow], input: &str) -> f64 {
    let pts: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r.input == input && r.bytes >= 64 << 10 && r.ms > 0.0)
        .map(|r| ((r.bytes as f64).ln(), r.ms.ln()))
        .collect();
    let n = pts.len() as f64;
    let (sx, sy) = pts.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = pts.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    num / den
}
