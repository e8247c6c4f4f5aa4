//! The HTTP context: one per request stream. It scrubs any client-sent destination, holds an
//! inference request until its body is complete, asks the [`Router`] for a decision and writes
//! it to the destination header; on the response it notes a pod that refused the connection,
//! adds the debug headers, and at the end releases the request's in-flight slot.

use crate::host::{EnvoyHost, Headers, Host, Level};
use crate::metrics::Metrics;
use crate::poller::mark_down;
use crate::router::Router;
use prefix_core::liveness::is_connect_failure;
use prefix_core::policy::{Decision, Reason};
use prefix_core::protocol::headers::{self, debug};
use prefix_core::request::Endpoint;
use prefix_core::ApiError;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

pub struct RouterHttp<H: Host> {
    host: Rc<H>,
    router: Option<Rc<Router>>,
    metrics: Option<Rc<Metrics<H>>>,
    /// Set for an inference request (POST to a completions path) until it is decided.
    endpoint: Option<Endpoint>,
    pub decision: Option<Decision>,
    prefix_hash: Option<String>,
    /// this request holds an in-flight slot on the chosen pod
    counted: bool,
    done: bool,
}

impl<H: Host> RouterHttp<H> {
    pub fn new(host: Rc<H>, router: Option<Rc<Router>>, metrics: Option<Rc<Metrics<H>>>) -> Self {
        RouterHttp {
            host,
            router,
            metrics,
            endpoint: None,
            decision: None,
            prefix_hash: None,
            counted: false,
            done: false,
        }
    }

    fn set_destination(&mut self, router: &Router, decision: Decision) {
        let pod = router.pod(decision.pod);
        self.host
            .set_header(Headers::Request, headers::DESTINATION, Some(pod));
        if let Some(m) = &self.metrics {
            m.decision(decision.reason);
        }
        self.decision = Some(decision);
    }

    fn reject(&mut self, e: &ApiError) -> Action {
        self.done = true;
        if let Some(m) = &self.metrics {
            m.rejected();
        }
        let json = e.to_json();
        self.host.send_response(
            e.status,
            &[("content-type", "application/json")],
            json.as_bytes(),
        );
        Action::Pause
    }

    /// The body must fit `max_body_bytes`: checked on the declared length before buffering
    /// and on what was buffered (a body may come without a length).
    fn too_large(router: &Router, len: usize) -> Option<ApiError> {
        let limit = router.config.max_body_bytes;
        (len > limit).then(|| ApiError::too_large(limit))
    }

    /// The whole body is here: decide and let the request go.
    fn finish(&mut self, body_size: usize) -> Action {
        self.done = true;
        let (Some(router), Some(endpoint)) = (self.router.clone(), self.endpoint) else {
            return Action::Continue;
        };
        let body = self.host.request_body(body_size).unwrap_or_default();
        let started = self.host.now_nanos();
        match router.route(&*self.host, endpoint, &body) {
            Ok(routed) => {
                if let Some(m) = &self.metrics {
                    let t = &routed.table;
                    m.table(t.filled, t.replaced, t.conflicts);
                    let took_us = self.host.now_nanos().saturating_sub(started) / 1_000;
                    m.route_time(took_us, routed.prepare_us);
                }
                self.prefix_hash = routed.prefix_hash.map(|h| h.to_hex());
                self.counted = routed.counted;
                self.set_destination(&router, routed.decision);
                Action::Continue
            }
            Err(e) => self.reject(&e),
        }
    }

    pub fn request_headers(&mut self, end_of_stream: bool) -> Action {
        // Never honour a client-supplied destination.
        self.host
            .set_header(Headers::Request, headers::DESTINATION, None);
        let Some(router) = self.router.clone() else {
            // Not configured: Envoy would not have loaded us; let the route decide.
            return Action::Continue;
        };
        let header = |name| self.host.header(Headers::Request, name).unwrap_or_default();
        let (path, method) = (header(":path"), header(":method"));
        self.endpoint = Endpoint::from_path(&path).filter(|_| method == "POST");
        if self.endpoint.is_none() {
            let d = router.plain(&*self.host, Reason::Passthrough);
            self.set_destination(&router, d);
            return Action::Continue;
        }
        let declared = self
            .host
            .header(Headers::Request, "content-length")
            .and_then(|v| v.parse::<usize>().ok());
        if let Some(e) = declared.and_then(|n| Self::too_large(&router, n)) {
            return self.reject(&e);
        }
        if end_of_stream {
            return self.finish(0);
        }
        // Hold the headers until the body is complete (needs allow_on_headers_stop_iteration).
        Action::Pause
    }

    pub fn request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.done || self.endpoint.is_none() {
            return Action::Continue;
        }
        if let Some(e) = self
            .router
            .as_deref()
            .and_then(|r| Self::too_large(r, body_size))
        {
            return self.reject(&e);
        }
        if !end_of_stream {
            return Action::Pause; // keep buffering
        }
        self.finish(body_size)
    }

    pub fn request_trailers(&mut self) -> Action {
        if self.done || self.endpoint.is_none() {
            return Action::Continue;
        }
        // A body followed by trailers: the body ended without end_of_stream.
        let size = self.host.request_body(usize::MAX).map_or(0, |b| b.len());
        self.finish(size)
    }

    pub fn response_headers(&mut self) -> Action {
        let (Some(router), Some(d)) = (self.router.clone(), self.decision) else {
            return Action::Continue;
        };
        let host = &*self.host;
        let status = host
            .header(Headers::Response, ":status")
            .unwrap_or_default();
        let from_pod = host.header(Headers::Response, headers::POD).is_some();
        if is_connect_failure(&status, from_pod) {
            let addr = router.pod(d.pod);
            let down_after = router.config.down_after_failures;
            if mark_down(host, &router.keys, addr, down_after).is_some() {
                host.log(
                    Level::Warn,
                    &format!("prefix-router: pod {addr} failed a request ({status}); marked down"),
                );
            }
        }
        if router.config.debug_headers {
            let set = |name, value: &str| host.set_header(Headers::Response, name, Some(value));
            set(debug::POD, router.pod(d.pod));
            set(debug::REASON, d.reason.as_str());
            set(
                debug::MATCHED_BLOCKS,
                &d.reason.matched_blocks().to_string(),
            );
            if let Some(h) = &self.prefix_hash {
                set(debug::PREFIX_HASH, h);
            }
        }
        Action::Continue
    }

    /// The stream is over, however it ended: release the in-flight slot.
    pub fn log(&mut self) {
        if let (true, Some(router), Some(d)) = (self.counted, &self.router, self.decision) {
            self.counted = false;
            router.release(&*self.host, d.pod);
        }
    }
}

impl Context for RouterHttp<EnvoyHost> {}

impl HttpContext for RouterHttp<EnvoyHost> {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        self.request_headers(end_of_stream)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.request_body(body_size, end_of_stream)
    }

    fn on_http_request_trailers(&mut self, _trailers: usize) -> Action {
        self.request_trailers()
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.response_headers()
    }

    fn on_log(&mut self) {
        self.log();
    }
}
