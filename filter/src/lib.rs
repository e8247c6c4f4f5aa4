//! prefix-router's Envoy filter (proxy-wasm, wasm32-wasip1).
//!
//! For `POST /v1/completions` and `/v1/chat/completions` it holds the request until the body
//! is complete, renders and tokenizes the prompt exactly as the model servers do, hashes its
//! full blocks, and sends the request to the pod owning the longest leading chain of them by
//! setting `x-gateway-destination-endpoint` for Envoy's ORIGINAL_DST cluster. A value sent by
//! the client is always removed first. Other paths are balanced across the pods.
//!
//! The glue here only moves bytes and headers; decisions are in [`router`] and `prefix-core`.
//! The filter never panics and never answers 5xx: if its own state is broken it falls back to
//! plain balancing.

pub mod host;
pub mod metrics;
pub mod ownership;
pub mod router;

use host::EnvoyHost;
use metrics::Metrics;
use prefix_core::policy::{Decision, Reason};
use prefix_core::request::Endpoint;
use prefix_core::router_config::{RouterConfig, DESTINATION_HEADER};
use prefix_core::{ApiError, BlockSize, ModelBundle};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use router::Router;
use std::rc::Rc;

/// The model's tokenizer, embedded at build time (see build.rs).
static TOKENIZER_JSON: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tokenizer.json"));
static TOKENIZER_CONFIG_JSON: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tokenizer_config.json"));

/// Debug response headers (when `debug_headers` is on).
pub const POD_DEBUG_HEADER: &str = "x-prefix-router-pod";
pub const REASON_DEBUG_HEADER: &str = "x-prefix-router-reason";
pub const BLOCKS_DEBUG_HEADER: &str = "x-prefix-router-matched-blocks";
/// Hash of the prompt's last full block as the filter computed it: compare with the server's
/// `/tokenize` to prove both tokenize and hash identically.
pub const PREFIX_HASH_DEBUG_HEADER: &str = "x-prefix-router-prefix-hash";

/// Builds the embedded model bundle; `None` (logged) if it cannot be loaded.
pub fn embedded_bundle(config: &RouterConfig) -> Option<ModelBundle> {
    let block = BlockSize::new(config.block_size)?;
    let cfg = (!TOKENIZER_CONFIG_JSON.is_empty()).then_some(TOKENIZER_CONFIG_JSON);
    match ModelBundle::new(&config.model_name, TOKENIZER_JSON, cfg, block) {
        Ok(b) => Some(b),
        Err(e) => {
            log::error!("prefix-router: embedded tokenizer unusable, failing open: {e}");
            None
        }
    }
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(RouterRoot::default()) });
}}

#[derive(Default)]
struct RouterRoot {
    router: Option<Rc<Router>>,
    metrics: Metrics,
}

impl Context for RouterRoot {}

impl RootContext for RouterRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let config = match RouterConfig::parse(&bytes) {
            Ok(c) => c,
            Err(e) => {
                // Returning false makes Envoy reject the configuration, naming the field.
                log::error!("{e}");
                return false;
            }
        };
        let started = self.get_current_time();
        let bundle = embedded_bundle(&config);
        let took = self
            .get_current_time()
            .duration_since(started)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        log::info!(
            "prefix-router: configured {} pods, block size {}, model '{}', table {} slots; tokenizer {} in {took} ms",
            config.pods.len(),
            config.block_size,
            config.model_name,
            config.table_capacity,
            if bundle.is_some() { "loaded" } else { "MISSING (failing open)" },
        );
        self.metrics = Metrics::define();
        self.router = Some(Rc::new(Router::new(config, bundle)));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(RouterHttp {
            router: self.router.clone(),
            metrics: self.metrics,
            endpoint: None,
            decision: None,
            prefix_hash: None,
            done: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct RouterHttp {
    router: Option<Rc<Router>>,
    metrics: Metrics,
    endpoint: Option<Endpoint>,
    decision: Option<Decision>,
    prefix_hash: Option<String>,
    done: bool,
}

impl Context for RouterHttp {}

impl RouterHttp {
    fn set_destination(&mut self, router: &Router, decision: Decision) {
        self.set_http_request_header(DESTINATION_HEADER, Some(router.pod(decision.pod)));
        self.metrics.decision(decision.reason);
        self.decision = Some(decision);
    }

    fn reject(&mut self, e: &ApiError) -> Action {
        self.metrics.rejected();
        self.send_http_response(
            u32::from(e.status),
            vec![("content-type", "application/json")],
            Some(e.to_json().as_bytes()),
        );
        Action::Pause
    }

    /// The whole body is here: decide and let the request go.
    fn finish(&mut self, body_size: usize) -> Action {
        self.done = true;
        let (Some(router), Some(endpoint)) = (self.router.clone(), self.endpoint) else {
            return Action::Continue;
        };
        let body = self.get_http_request_body(0, body_size).unwrap_or_default();
        let started = self.get_current_time();
        match router.route(&EnvoyHost, endpoint, &body) {
            Ok(routed) => {
                let t = &routed.table;
                self.metrics.table(t.filled, t.replaced, t.conflicts);
                if let Ok(d) = self.get_current_time().duration_since(started) {
                    self.metrics.route_time(d.as_micros() as u64);
                }
                self.prefix_hash = routed.prefix_hash.map(|h| h.to_hex());
                self.set_destination(&router, routed.decision);
                Action::Continue
            }
            Err(e) => self.reject(&e),
        }
    }
}

impl HttpContext for RouterHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        // Never honour a client-supplied destination.
        self.set_http_request_header(DESTINATION_HEADER, None);
        let Some(router) = self.router.clone() else {
            // Not configured: Envoy would not have loaded us; let the route decide.
            return Action::Continue;
        };
        let path = self.get_http_request_header(":path").unwrap_or_default();
        let method = self.get_http_request_header(":method").unwrap_or_default();
        self.endpoint = if method == "POST" {
            Endpoint::from_path(&path)
        } else {
            None
        };
        if self.endpoint.is_none() {
            self.set_destination(&router, router.balanced(Reason::Passthrough));
            return Action::Continue;
        }
        let declared = self
            .get_http_request_header("content-length")
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > router.config.max_body_bytes) {
            return self.reject(&ApiError::too_large(router.config.max_body_bytes));
        }
        if end_of_stream {
            return self.finish(0);
        }
        // Hold the headers until the body is complete (needs allow_on_headers_stop_iteration).
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.done || self.endpoint.is_none() {
            return Action::Continue;
        }
        if let Some(router) = self.router.clone() {
            if body_size > router.config.max_body_bytes {
                self.done = true;
                return self.reject(&ApiError::too_large(router.config.max_body_bytes));
            }
        }
        if !end_of_stream {
            return Action::Pause; // keep buffering
        }
        self.finish(body_size)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        if self.done || self.endpoint.is_none() {
            return Action::Continue;
        }
        // A body followed by trailers: the body ended without end_of_stream.
        let size = self
            .get_http_request_body(0, usize::MAX)
            .map(|b| b.len())
            .unwrap_or(0);
        self.finish(size)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let (Some(router), Some(d)) = (self.router.clone(), self.decision) else {
            return Action::Continue;
        };
        if router.config.debug_headers {
            self.set_http_response_header(POD_DEBUG_HEADER, Some(router.pod(d.pod)));
            self.set_http_response_header(REASON_DEBUG_HEADER, Some(d.reason.as_str()));
            let blocks = d.reason.matched_blocks().to_string();
            self.set_http_response_header(BLOCKS_DEBUG_HEADER, Some(&blocks));
            if let Some(h) = self.prefix_hash.clone() {
                self.set_http_response_header(PREFIX_HASH_DEBUG_HEADER, Some(&h));
            }
        }
        Action::Continue
    }
}
