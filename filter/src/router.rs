//! Per-request routing, independent of proxy-wasm: body in, decision (or client error) out.
//!
//! The filter's contexts only move bytes and headers; everything that decides lives here and
//! in `prefix-core`, and is unit-tested against a fake host.

use crate::host::Host;
use crate::ownership::{OwnershipTable, RecordStats};
use prefix_core::policy::{choose, Decision, Reason};
use prefix_core::request::{parse_request, Endpoint};
use prefix_core::router_config::RouterConfig;
use prefix_core::table::TableLayout;
use prefix_core::{ApiError, BlockHash, ModelBundle};
use std::cell::Cell;

/// Everything a worker's requests share: built once per VM in `on_configure`.
pub struct Router {
    pub config: RouterConfig,
    /// `None` when the embedded tokenizer failed to load: every request then fails open.
    pub bundle: Option<ModelBundle>,
    pub layout: TableLayout,
    balance: Cell<u64>,
}

/// The outcome for one inference request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    pub decision: Decision,
    pub table: RecordStats,
    /// Hash of the prompt's last full block (it names the whole hashed prefix); `None` for
    /// prompts shorter than a block or when the filter failed open.
    pub prefix_hash: Option<BlockHash>,
}

impl Router {
    pub fn new(config: RouterConfig, bundle: Option<ModelBundle>) -> Self {
        // The namespace names everything that changes slot meaning, so two differently
        // configured plugins in one Envoy never read each other's slots as their own.
        let namespace = format!(
            "prefix-router/v1/{}/{}",
            config.model_name, config.block_size
        );
        let layout = TableLayout::new(&namespace, config.table_capacity);
        Router {
            config,
            bundle,
            layout,
            balance: Cell::new(0),
        }
    }

    /// The address of pod `i`.
    pub fn pod(&self, i: usize) -> &str {
        self.config.pods.get(i).map(String::as_str).unwrap_or("")
    }

    /// Plain balancing (round-robin within this worker).
    pub fn balanced(&self, reason: Reason) -> Decision {
        let n = self.balance.get();
        self.balance.set(n.wrapping_add(1));
        Decision {
            pod: (n % self.config.pods.len().max(1) as u64) as usize,
            reason,
        }
    }

    /// Routes an inference request body. `Err` is a client error to answer with (4xx), exactly
    /// as the server would; the router's own failures never surface here, they fall back.
    pub fn route<H: Host>(
        &self,
        host: &H,
        endpoint: Endpoint,
        body: &[u8],
    ) -> Result<Routed, ApiError> {
        if body.len() > self.config.max_body_bytes {
            return Err(ApiError::too_large(self.config.max_body_bytes));
        }
        let req = parse_request(endpoint, body)?;
        let Some(bundle) = &self.bundle else {
            return Ok(Routed {
                decision: self.balanced(Reason::Fallback),
                table: RecordStats::default(),
                prefix_hash: None,
            });
        };
        let prompt = bundle.prepare(&req)?;
        let table = OwnershipTable::new(host, &self.layout);
        let pods = &self.config.pods;
        let balance = self.balance.get();
        let decision = choose(
            pods,
            &prompt.hashes,
            |h| {
                table
                    .owner(h)
                    .and_then(|addr| pods.iter().position(|p| *p == addr))
            },
            balance as usize,
        );
        let Some(decision) = decision else {
            return Ok(Routed {
                decision: self.balanced(Reason::Fallback),
                table: RecordStats::default(),
                prefix_hash: None,
            });
        };
        if decision.reason == Reason::ShortPrompt {
            self.balance.set(balance.wrapping_add(1));
        }
        let stats = table.record(&prompt.hashes, self.pod(decision.pod));
        Ok(Routed {
            decision,
            table: stats,
            prefix_hash: prompt.hashes.last().copied(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;
    use prefix_core::BlockSize;

    /// A byte-level tokenizer good enough for routing tests: each character is a token.
    fn tiny_bundle(block: u32) -> ModelBundle {
        let vocab: serde_json::Map<String, serde_json::Value> = (0u8..=255)
            .map(|b| (String::from(b as char), serde_json::json!(b)))
            .collect();
        let tok = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "?"}
        });
        // WordLevel needs a splitter; use per-character splitting
        let mut tok = tok;
        tok["pre_tokenizer"] = serde_json::json!({"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": false});
        ModelBundle::new(
            "m",
            tok.to_string().as_bytes(),
            None,
            BlockSize::new(block).unwrap(),
        )
        .unwrap()
    }

    fn router(bundle: Option<ModelBundle>) -> Router {
        let cfg = RouterConfig::parse(
            br#"{"pods":["127.0.0.1:8001","127.0.0.1:8002","127.0.0.1:8003"],"block_size":4,"model_name":"m","table_capacity":4096}"#,
        )
        .unwrap();
        Router::new(cfg, bundle)
    }

    fn body(prompt: &str) -> Vec<u8> {
        serde_json::json!({ "prompt": prompt })
            .to_string()
            .into_bytes()
    }

    #[test]
    fn cold_then_hits_on_same_pod() {
        let host = FakeHost::default();
        let r = router(Some(tiny_bundle(4)));
        let first = r
            .route(&host, Endpoint::Completions, &body("abcdefghij"))
            .unwrap();
        assert_eq!(first.decision.reason, Reason::Cold);
        assert_eq!(first.table.written, 2);
        assert!(first.prefix_hash.is_some());
        for _ in 0..5 {
            let again = r
                .route(&host, Endpoint::Completions, &body("abcdefghij"))
                .unwrap();
            assert_eq!(again.decision.pod, first.decision.pod);
            assert_eq!(again.decision.reason, Reason::PrefixHit { blocks: 2 });
        }
        // shares only the first block
        let partial = r
            .route(&host, Endpoint::Completions, &body("abcdXXXXzz"))
            .unwrap();
        assert_eq!(
            partial.decision,
            Decision {
                pod: first.decision.pod,
                reason: Reason::PrefixHit { blocks: 1 }
            }
        );
    }

    #[test]
    fn short_prompts_are_balanced() {
        let host = FakeHost::default();
        let r = router(Some(tiny_bundle(4)));
        let pods: Vec<usize> = (0..6)
            .map(|_| {
                r.route(&host, Endpoint::Completions, &body("abc"))
                    .unwrap()
                    .decision
            })
            .inspect(|d| assert_eq!(d.reason, Reason::ShortPrompt))
            .map(|d| d.pod)
            .collect();
        assert_eq!(pods, vec![0, 1, 2, 0, 1, 2]);
        assert!(
            host.data.borrow().is_empty(),
            "short prompts record nothing"
        );
    }

    #[test]
    fn client_errors_match_the_server() {
        let host = FakeHost::default();
        let r = router(Some(tiny_bundle(4)));
        assert_eq!(
            r.route(&host, Endpoint::Completions, b"{oops")
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            r.route(&host, Endpoint::ChatCompletions, br#"{"messages":[]}"#)
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            r.route(
                &host,
                Endpoint::Completions,
                br#"{"model":"other","prompt":"x"}"#
            )
            .unwrap_err()
            .status,
            404
        );
        let big = vec![b' '; r.config.max_body_bytes + 1];
        assert_eq!(
            r.route(&host, Endpoint::Completions, &big)
                .unwrap_err()
                .status,
            413
        );
    }

    #[test]
    fn broken_state_fails_open() {
        let host = FakeHost::default();
        let r = router(None);
        let d = r
            .route(&host, Endpoint::Completions, &body("abcdefgh"))
            .unwrap();
        assert_eq!(d.decision.reason, Reason::Fallback);
        // unreadable table: every lookup misses, the request is still routed (cold)
        let host = FakeHost::default();
        host.fail_reads.set(true);
        let r = router(Some(tiny_bundle(4)));
        let d = r
            .route(&host, Endpoint::Completions, &body("abcdefgh"))
            .unwrap();
        assert_eq!(d.decision.reason, Reason::Cold);
    }
}
