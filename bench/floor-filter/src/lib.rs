//! The floor of the filter-overhead benchmark: a proxy-wasm HTTP filter that does only what
//! any body-reading router in Envoy must do (pause the headers, let Envoy buffer the body,
//! copy the body into the VM once, set one request header) and nothing else: no parsing,
//! tokenizing, shared data or metrics.
//!
//! Why: `scripts/bench.sh filter` compares Envoy with the real filter against Envoy alone.
//! This row tells how much of that gap is the proxy-wasm boundary and body buffering, which no
//! filter logic can remove, and how much is the filter's own work.
//!
//! # Layout
//! - [`Floor`]: the root context (any configuration is accepted and ignored)
//! - [`FloorRequest`]: one per request

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Floor) });
}}

/// The root context: accepts any plugin configuration (the benchmark passes the real
/// filter's) and makes one [`FloorRequest`] per request.
pub struct Floor;

impl Context for Floor {}

impl RootContext for Floor {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(FloorRequest))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One request: waits for the whole body, reads it once, and names its length in a header
/// (Envoy's load balancer then picks the pod on its own, as with no filter).
pub struct FloorRequest;

/// The header set once per request (a router sets its destination the same way).
pub const HEADER: &str = "x-prefix-router-floor-bytes";

impl Context for FloorRequest {}

impl HttpContext for FloorRequest {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if end_of_stream {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            return Action::Pause;
        }
        let read = self
            .get_http_request_body(0, body_size)
            .map_or(0, |b| b.len());
        self.set_http_request_header(HEADER, Some(&read.to_string()));
        Action::Continue
    }
}
