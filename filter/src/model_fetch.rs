//! Fetching the model's tokenizer (and chat template) at run time, so that one published
//! .wasm routes for any model: `tokenizer.json` and `tokenizer_config.json` come over HTTP
//! through an Envoy cluster named in the plugin configuration (`tokenizer`), not from the
//! build. Wasm in Envoy cannot read files, but Envoy can serve them (a direct response from
//! a file, which is what `render-envoy-config --tokenizer-dir` writes), and a cluster can as
//! well point at a model registry or any HTTP server with a Hugging Face model directory.
//!
//! Each worker VM fetches its own copy on its first tick (VMs share no memory; the files are
//! read once per VM either way). Until the bundle is built, requests are balanced by load
//! with reason `fallback`; a failed fetch is logged, counted, and retried after a delay that
//! doubles up to 30 s. Loading never blocks a request: the bundle is built inside the call's
//! answer, on the root context.

use crate::host::{Host, Level};
use crate::metrics::Metrics;
use crate::router::Router;
use prefix_core::model::ModelFiles;
use prefix_core::router_config::{TokenizerSource, MAX_TOKENIZER_BYTES};
use prefix_core::ModelBundle;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

/// The files of a model directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Part {
    Tokenizer,
    Config,
    Template,
}

/// First retry delay; doubles per failure up to [`MAX_RETRY_NS`].
const FIRST_RETRY_NS: u64 = 1_000_000_000;
const MAX_RETRY_NS: u64 = 30_000_000_000;

/// One VM's fetch: the calls out, the files received, when to try again.
#[derive(Default)]
pub struct ModelFetch {
    out: RefCell<HashMap<u32, Part>>,
    got: RefCell<HashMap<Part, Vec<u8>>>,
    failures: Cell<u32>,
    retry_at_ns: Cell<u64>,
    started_ns: Cell<u64>,
}

impl ModelFetch {
    /// On each tick: starts the fetch unless the bundle is there, calls are out, or a retry
    /// is not due yet.
    pub fn tick<H: Host>(&self, host: &H, router: &Router, metrics: &Metrics<H>) {
        let Some(src) = &router.config.tokenizer else {
            return;
        };
        let now = host.now_nanos();
        if router.bundle.get().is_some() || !self.out.borrow().is_empty() {
            return;
        }
        if now < self.retry_at_ns.get() {
            return;
        }
        self.got.borrow_mut().clear();
        self.started_ns.set(now);
        let mut parts = vec![(Part::Tokenizer, src.path.as_str())];
        if let Some(p) = &src.config_path {
            parts.push((Part::Config, p.as_str()));
        }
        if let Some(p) = &src.template_path {
            parts.push((Part::Template, p.as_str()));
        }
        for (part, path) in parts {
            let request = [
                (":method", "GET"),
                (":path", path),
                (":authority", src.authority.as_str()),
            ];
            let timeout = Duration::from_millis(src.timeout_ms);
            match host.dispatch_http_call(&src.cluster, &request, timeout) {
                Ok(token) => {
                    self.out.borrow_mut().insert(token, part);
                }
                Err(e) => {
                    // nothing to wait for: the answers of the calls already out are dropped
                    self.out.borrow_mut().clear();
                    self.failed(
                        host,
                        router,
                        src,
                        &format!("cannot call cluster '{}': {e}", src.cluster),
                    );
                    metrics.tokenizer_failed();
                    return;
                }
            }
        }
    }

    /// An HTTP call was answered: `true` if it was one of ours (then handled here).
    pub fn on_response<H: Host>(
        &self,
        host: &H,
        router: &Router,
        metrics: &Metrics<H>,
        token: u32,
        body_size: usize,
    ) -> bool {
        let Some(part) = self.out.borrow_mut().remove(&token) else {
            return false;
        };
        let Some(src) = &router.config.tokenizer else {
            return true;
        };
        let path = match part {
            Part::Tokenizer => src.path.as_str(),
            Part::Config => src.config_path.as_deref().unwrap_or(""),
            Part::Template => src.template_path.as_deref().unwrap_or(""),
        };
        let body = host
            .http_call_ok_body(body_size, MAX_TOKENIZER_BYTES)
            .map_err(|why| format!("GET {path} {why}"));
        let body = match body {
            Ok(b) => b,
            Err(why) => {
                self.out.borrow_mut().clear();
                self.failed(host, router, src, &why);
                metrics.tokenizer_failed();
                return true;
            }
        };
        self.got.borrow_mut().insert(part, body);
        if !self.out.borrow().is_empty() {
            return true; // the other file is still coming
        }
        let got = std::mem::take(&mut *self.got.borrow_mut());
        let json = got
            .get(&Part::Tokenizer)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let files = ModelFiles {
            tokenizer_json: json,
            tokenizer_config_json: got.get(&Part::Config).map(Vec::as_slice),
            chat_template_jinja: got.get(&Part::Template).map(Vec::as_slice),
        };
        let started = host.now_nanos();
        match ModelBundle::routing_from_files(
            &router.config.model_name,
            files,
            router.config.block_size,
        ) {
            Ok(bundle) => {
                let now = host.now_nanos();
                let _ = router.bundle.set(
                    bundle
                        .with_adapters(router.config.adapters.clone())
                        .with_aliases(router.config.aliases.clone()),
                );
                metrics.tokenizer_loaded(true);
                self.failures.set(0);
                host.log(
                    Level::Info,
                    &format!(
                        "prefix-router: tokenizer for '{}' loaded from cluster '{}' ({} bytes{}): fetched in {} ms, built in {} ms; routing by prefix from now on",
                        router.config.model_name,
                        src.cluster,
                        json.len(),
                        [
                            (files.tokenizer_config_json, "tokenizer_config.json"),
                            (files.chat_template_jinja, "chat_template.jinja"),
                        ]
                        .iter()
                        .filter_map(|(f, name)| f.map(|b| format!(" + {} bytes of {name}", b.len())))
                        .collect::<String>(),
                        started.saturating_sub(self.started_ns.get()) / 1_000_000,
                        now.saturating_sub(started) / 1_000_000,
                    ),
                );
            }
            Err(e) => {
                self.failed(host, router, src, &format!("unusable: {e}"));
                metrics.tokenizer_failed();
            }
        }
        true
    }

    fn failed<H: Host>(&self, host: &H, router: &Router, src: &TokenizerSource, why: &str) {
        let n = self.failures.get().saturating_add(1);
        self.failures.set(n);
        let delay = FIRST_RETRY_NS
            .saturating_mul(1u64 << (n - 1).min(5))
            .min(MAX_RETRY_NS);
        self.retry_at_ns.set(host.now_nanos().saturating_add(delay));
        host.log(
            Level::Warn,
            &format!(
                "prefix-router: tokenizer for '{}' from cluster '{}' not loaded ({why}); balancing by load (reason fallback) until it is; retry in {} s",
                router.config.model_name,
                src.cluster,
                delay / 1_000_000_000
            ),
        );
    }
}
