//! Seeded workload generators. A trace is a list of timed OpenAI requests, saved as JSONL so
//! a run can be reproduced and shared.

use prefix_core::protocol::defaults;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// One request of a trace: when to send it (ms from the start), where, and what.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TraceRequest {
    pub at_ms: f64,
    pub path: String,
    pub body: Value,
    /// tenant or conversation the request belongs to (for reporting)
    pub group: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// T tenants with long shared contexts + unique questions
    SharedPrefix,
    /// conversations whose history grows turn by turn (chat endpoint)
    MultiTurn,
    /// no shared prefixes at all
    AllUnique,
    /// one tenant sends half the traffic
    HotTenant,
}

impl Workload {
    pub const ALL: [Workload; 4] = [
        Workload::SharedPrefix,
        Workload::MultiTurn,
        Workload::AllUnique,
        Workload::HotTenant,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::SharedPrefix => "shared-prefix",
            Workload::MultiTurn => "multi-turn",
            Workload::AllUnique => "all-unique",
            Workload::HotTenant => "hot-tenant",
        }
    }
}

/// Shape of a generated trace.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TraceParams {
    pub seed: u64,
    pub requests: usize,
    /// mean arrival rate (Poisson), requests per second
    pub rate: f64,
    pub tenants: u32,
    /// shared context length range in words (≈ 1.2 tokens each)
    pub context_words: (usize, usize),
    /// each request's own question length range in words
    pub question_words: (usize, usize),
    pub max_tokens: u32,
}

/// splitmix64: small, seeded, good enough for workload shapes.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// uniform in [0, 1)
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi.saturating_sub(lo).max(1) as u64)) as usize
    }
    /// exponential inter-arrival gap for `rate` per second, in ms
    pub fn exp_ms(&mut self, rate: f64) -> f64 {
        -(1.0 - self.unit()).ln() / rate.max(1e-9) * 1000.0
    }
}

const WORDS: &[&str] = &[
    "service",
    "latency",
    "deploy",
    "rollback",
    "cluster",
    "node",
    "pod",
    "queue",
    "replica",
    "shard",
    "index",
    "cache",
    "token",
    "prompt",
    "schema",
    "billing",
    "invoice",
    "payment",
    "region",
    "alert",
    "metric",
    "budget",
    "quota",
    "tenant",
    "policy",
    "request",
    "response",
    "timeout",
    "retry",
    "error",
    "storage",
    "volume",
    "snapshot",
    "backup",
    "restore",
    "network",
    "gateway",
    "router",
    "kernel",
    "memory",
    "customer",
    "contract",
    "report",
    "review",
    "approve",
    "escalate",
    "investigate",
    "summarize",
    "compare",
    "verify",
];

/// `n` pseudo-random words (letters and spaces only: safe in JSON and templates).
pub fn words(rng: &mut Rng, n: usize) -> String {
    let mut s = String::with_capacity(n * 8);
    for i in 0..n {
        if i > 0 {
            s.push(if i % 17 == 0 { '.' } else { ' ' });
            if i % 17 == 0 {
                s.push(' ');
            }
        }
        s.push_str(WORDS[(rng.next_u64() % WORDS.len() as u64) as usize]);
    }
    s
}

/// Generates the trace for `w`.
pub fn generate(w: Workload, p: &TraceParams) -> Vec<TraceRequest> {
    let mut rng = Rng::new(p.seed ^ (w as u64 + 1).wrapping_mul(0x1234_5678));
    let contexts: Vec<String> = (0..p.tenants.max(1))
        .map(|t| {
            let n = rng.range(p.context_words.0, p.context_words.1);
            format!("Tenant {t} knowledge base. {}", words(&mut rng, n))
        })
        .collect();
    let mut t = 0.0;
    let mut out = Vec::with_capacity(p.requests);
    // multi-turn state: each conversation's messages so far
    let mut convs: Vec<Vec<Value>> = (0..p.tenants.max(1))
        .map(|c| vec![json!({"role": "system", "content": contexts[c as usize].clone()})])
        .collect();
    for i in 0..p.requests {
        t += rng.exp_ms(p.rate);
        let qlen = rng.range(p.question_words.0, p.question_words.1);
        let question = format!("Question {i}: {}?", words(&mut rng, qlen));
        let (path, body, group) = match w {
            Workload::SharedPrefix | Workload::HotTenant => {
                let tenant = if w == Workload::HotTenant && rng.unit() < 0.5 {
                    0
                } else {
                    (rng.next_u64() % u64::from(p.tenants.max(1))) as u32
                };
                let prompt = format!("{}\n\n{question}", contexts[tenant as usize]);
                (
                    "/v1/completions",
                    json!({"prompt": prompt, "max_tokens": p.max_tokens, "stream": true}),
                    tenant,
                )
            }
            Workload::AllUnique => {
                let n = rng.range(p.context_words.0, p.context_words.1);
                let prompt = format!(
                    "Request {i} {}: {}\n\n{question}",
                    rng.next_u64(),
                    words(&mut rng, n)
                );
                (
                    "/v1/completions",
                    json!({"prompt": prompt, "max_tokens": p.max_tokens, "stream": true}),
                    i as u32,
                )
            }
            Workload::MultiTurn => {
                let c = (rng.next_u64() % u64::from(p.tenants.max(1))) as usize;
                convs[c].push(json!({"role": "user", "content": question}));
                let body =
                    json!({"messages": convs[c], "max_tokens": p.max_tokens, "stream": true});
                // the (simulated) answer becomes part of the history for the next turn
                convs[c].push(json!({"role": "assistant", "content": words(&mut rng, 20)}));
                ("/v1/chat/completions", body, c as u32)
            }
        };
        // named as OpenAI clients do (the peer routers' request types require it)
        let mut body = body;
        body["model"] = json!(defaults::MODEL_NAME);
        out.push(TraceRequest {
            at_ms: t,
            path: path.to_owned(),
            body,
            group,
        });
    }
    out
}

pub fn write_jsonl(path: &std::path::Path, trace: &[TraceRequest]) -> anyhow::Result<()> {
    let mut s = String::new();
    for r in trace {
        s.push_str(&serde_json::to_string(r)?);
        s.push('\n');
    }
    std::fs::write(path, s)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_and_shaped() {
        let p = TraceParams {
            seed: 7,
            requests: 50,
            rate: 10.0,
            tenants: 4,
            context_words: (100, 200),
            question_words: (8, 24),
            max_tokens: 8,
        };
        for w in Workload::ALL {
            let a = generate(w, &p);
            let b = generate(w, &p);
            assert_eq!(a.len(), 50);
            assert_eq!(
                serde_json::to_string(&a[10].body).unwrap(),
                serde_json::to_string(&b[10].body).unwrap()
            );
            assert!(a.windows(2).all(|x| x[0].at_ms <= x[1].at_ms));
        }
        let hot = generate(Workload::HotTenant, &p);
        let zero = hot.iter().filter(|r| r.group == 0).count();
        assert!(zero > 20, "tenant 0 is hot: {zero}/50");
        let chat = generate(Workload::MultiTurn, &p);
        let last = chat
            .iter()
            .rev()
            .find(|r| r.group == chat[0].group)
            .unwrap();
        assert!(
            last.body["messages"].as_array().unwrap().len()
                > chat[0].body["messages"].as_array().unwrap().len()
        );
    }
}
