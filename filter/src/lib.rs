//! prefix-router's Envoy filter (proxy-wasm, wasm32-wasip1).
//!
//! For `POST /v1/completions` and `/v1/chat/completions` it holds the request until the body
//! is complete, renders and tokenizes the prompt exactly as the model servers do, hashes its
//! full blocks, and picks a pod by cache affinity and load ([`router`], `prefix_core::policy`),
//! by setting `x-gateway-destination-endpoint` for Envoy's ORIGINAL_DST cluster. A value sent
//! by the client is always removed first. Other paths are balanced by load.
//!
//! One VM (elected through a lease in shared data) polls every pod each `poll_interval_ms`
//! for health, load and cache events ([`poller`]); all workers share what it learns.
//!
//! The glue here only moves bytes and headers. The filter never panics and never answers 5xx:
//! if its own state is broken it falls back to plain balancing.

pub mod host;
pub mod metrics;
pub mod ownership;
pub mod pods;
pub mod poller;
pub mod router;

use host::{EnvoyHost, Host};
use metrics::Metrics;
use prefix_core::policy::{Decision, Reason};
use prefix_core::request::Endpoint;
use prefix_core::router_config::{RouterConfig, DESTINATION_HEADER};
use prefix_core::{ApiError, BlockSize, ModelBundle};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use router::Router;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

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
    match ModelBundle::for_routing(&config.model_name, TOKENIZER_JSON, cfg, block) {
        Ok(b) => Some(b),
        Err(e) => {
            log::error!("prefix-router: embedded tokenizer unusable, failing open: {e}");
            None
        }
    }
}

/// A random 64-bit id (std's hash seeds come from the host's randomness via WASI).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5eed);
    h.finish()
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(RouterRoot::default()) });
}}

#[derive(Default)]
struct RouterRoot {
    router: Option<Rc<Router>>,
    metrics: Rc<Metrics>,
    vm_id: u64,
    /// poll call token → pod index
    polls: RefCell<HashMap<u32, usize>>,
    /// Per pod: pages fetched at once since the last tick (catching up is bounded per tick).
    catch_up: RefCell<Vec<u32>>,
}

/// Pages of cache events a pod may be polled for right away, per tick, beyond the tick's own
/// poll: enough to drain the server's whole bounded history (8 × 512 events) in one period.
const CATCH_UP_PAGES: u32 = 8;

impl RouterRoot {
    /// Asks pod `i` for its cache events after `since` (answered in `on_http_call_response`).
    fn poll(&self, router: &Router, i: usize, since: u64) {
        let addr = router.pod(i);
        let timeout = Duration::from_millis(router.config.poll_interval_ms.max(100));
        let path = format!("/v1/cache/events?since={since}");
        let headers = vec![
            (":method", "GET"),
            (":path", path.as_str()),
            (":authority", addr),
            (DESTINATION_HEADER, addr),
        ];
        match self.dispatch_http_call(&router.config.cluster, headers, None, vec![], timeout) {
            Ok(token) => {
                self.polls.borrow_mut().insert(token, i);
            }
            Err(e) => {
                self.metrics.poll_failed();
                log::warn!(
                    "prefix-router: cannot poll {addr} through cluster '{}': {e:?}",
                    router.config.cluster
                );
                poller::apply_failure(
                    &EnvoyHost,
                    &router.keys,
                    addr,
                    router.config.down_after_failures,
                );
            }
        }
    }
}

impl Context for RouterRoot {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(pod) = self.polls.borrow_mut().remove(&token) else {
            return;
        };
        let Some(router) = self.router.clone() else {
            return;
        };
        let addr = router.pod(pod).to_owned();
        let status = self.get_http_call_response_header(":status");
        let now = EnvoyHost.now_nanos();
        let result = match status.as_deref() {
            Some("200") => {
                let body = self
                    .get_http_call_response_body(0, body_size)
                    .unwrap_or_default();
                poller::apply_success(&EnvoyHost, &router.keys, &router.layout, &addr, &body, now)
            }
            other => Err(format!("poll of {addr} failed (status {other:?})")),
        };
        match result {
            Ok(a) => {
                if a.recovered {
                    log::info!("prefix-router: pod {addr} is back");
                }
                if a.new_generation {
                    log::info!(
                        "prefix-router: pod {addr} has a new cache generation (restart or resync)"
                    );
                }
                self.metrics.events(a.stored, a.removed, a.new_generation);
                if let Some(since) = a.again_since {
                    let mut catch_up = self.catch_up.borrow_mut();
                    if let Some(n) = catch_up.get_mut(pod).filter(|n| **n < CATCH_UP_PAGES) {
                        *n += 1;
                        drop(catch_up);
                        self.poll(&router, pod, since);
                    }
                }
            }
            Err(e) => {
                self.metrics.poll_failed();
                let st = poller::apply_failure(
                    &EnvoyHost,
                    &router.keys,
                    &addr,
                    router.config.down_after_failures,
                );
                if st.is_some_and(|s| !s.healthy && s.fails == router.config.down_after_failures) {
                    log::warn!("prefix-router: pod {addr} marked down: {e}");
                }
            }
        }
    }
}

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
            "prefix-router: configured {} pods, policy {:?}, block size {}, model '{}', table {} entries, poll every {} ms; tokenizer {} in {took} ms",
            config.pods.len(),
            config.policy,
            config.block_size,
            config.model_name,
            config.table_capacity,
            config.poll_interval_ms,
            if bundle.is_some() { "loaded" } else { "MISSING (failing open)" },
        );
        self.vm_id = random_u64();
        self.metrics = Rc::new(Metrics::define(config.pods.len()));
        if config.poll_interval_ms > 0 {
            self.set_tick_period(Duration::from_millis(config.poll_interval_ms));
        }
        let router = Router::new(config, bundle, self.vm_id);
        pods::Inflight::create(&EnvoyHost, &router.inflight_key, router.config.pods.len());
        self.router = Some(Rc::new(router));
        true
    }

    fn on_tick(&mut self) {
        let Some(router) = self.router.clone() else {
            return;
        };
        let now = EnvoyHost.now_nanos();
        let period_ns = router.config.poll_interval_ms.saturating_mul(1_000_000);
        if !pods::try_lease(
            &EnvoyHost,
            &router.keys,
            self.vm_id,
            now,
            period_ns.saturating_mul(3),
        ) {
            return; // another VM is the poller
        }
        *self.catch_up.borrow_mut() = vec![0; router.config.pods.len()];
        let inflight =
            pods::Inflight::read(&EnvoyHost, &router.inflight_key, router.config.pods.len());
        for (i, addr) in router.config.pods.iter().enumerate() {
            let (st, _) = pods::read_state(&EnvoyHost, &router.keys, addr);
            let lag_ms = if st.last_ok_ns == 0 {
                0
            } else {
                now.saturating_sub(st.last_ok_ns) / 1_000_000
            };
            self.metrics.pod(i, st.healthy, inflight.of(i), lag_ms);
            if self.polls.borrow().values().any(|&p| p == i) {
                continue; // the previous poll of this pod is still out
            }
            self.poll(&router, i, st.seq);
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(RouterHttp {
            router: self.router.clone(),
            metrics: Rc::clone(&self.metrics),
            endpoint: None,
            decision: None,
            prefix_hash: None,
            counted: false,
            done: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct RouterHttp {
    router: Option<Rc<Router>>,
    metrics: Rc<Metrics>,
    endpoint: Option<Endpoint>,
    decision: Option<Decision>,
    prefix_hash: Option<String>,
    /// this request holds an in-flight slot on the chosen pod
    counted: bool,
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
                    self.metrics
                        .route_time(d.as_micros() as u64, routed.prepare_us);
                }
                self.prefix_hash = routed.prefix_hash.map(|h| h.to_hex());
                self.counted = routed.counted;
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
            let d = router.plain(&EnvoyHost, Reason::Passthrough);
            self.set_destination(&router, d);
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
        // Envoy itself answered 502/503 (no pod header): the pod refused or reset the
        // connection. Mark it down now; the poller brings it back when it answers.
        let status = self.get_http_response_header(":status").unwrap_or_default();
        if (status == "503" || status == "502")
            && self.get_http_response_header("x-inference-pod").is_none()
        {
            let addr = router.pod(d.pod).to_owned();
            if poller::mark_down(
                &EnvoyHost,
                &router.keys,
                &addr,
                router.config.down_after_failures,
            )
            .is_some()
            {
                log::warn!("prefix-router: pod {addr} failed a request ({status}); marked down");
            }
        }
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

    fn on_log(&mut self) {
        // The stream is over, however it ended: release the in-flight slot.
        if let (true, Some(router), Some(d)) = (self.counted, self.router.clone(), self.decision) {
            self.counted = false;
            let n = router.config.pods.len();
            pods::Inflight::read(&EnvoyHost, &router.inflight_key, n).add(
                &EnvoyHost,
                &router.inflight_key,
                d.pod,
                -1,
            );
        }
    }
}
