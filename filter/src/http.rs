//! The HTTP context: one per request stream. It scrubs any client-sent destination, holds an
//! inference request until its body is complete, finds its model's [`Router`], asks it for a
//! decision and writes it to the destination header (and, with several models, the model's
//! cluster to the route-cluster header). The decision is a [`Ticket`], which the answer's
//! events are handed to: it notes a pod that refused the connection, adds the debug headers,
//! marks the prompt's blocks as the pod's once its answer starts, and at the end releases the
//! request's in-flight slot.

use crate::host::{EnvoyHost, Headers, Host, Level};
use crate::metrics::Metrics;
use crate::models::{Lookup, Model, Models};
use crate::router::Router;
use crate::ticket::Ticket;
use prefix_core::policy::Reason;
use prefix_core::protocol::headers;
use prefix_core::request::{parse_request, PathKind};
use prefix_core::ApiError;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

/// The path of the OpenAI model list, answered by the filter itself when it serves several
/// models (each pool knows only its own).
const MODELS_PATH: &str = "/v1/models";

pub struct RouterHttp<H: Host> {
    host: Rc<H>,
    models: Option<Rc<Models<H>>>,
    /// The request's model's router and metrics, once known (the default model's for
    /// requests that are not inference requests).
    router: Option<Rc<Router>>,
    metrics: Option<Rc<Metrics<H>>>,
    /// Set for an inference request (a POST to an inference path: read by prefix, or only
    /// for its model) until it is decided.
    reading: Option<PathKind>,
    /// The decision and what it holds until the stream ends.
    ticket: Option<Ticket>,
    done: bool,
}

impl<H: Host> RouterHttp<H> {
    pub fn new(host: Rc<H>, models: Option<Rc<Models<H>>>) -> Self {
        RouterHttp {
            host,
            models,
            router: None,
            metrics: None,
            reading: None,
            ticket: None,
            done: false,
        }
    }

    /// Where the request was placed, once decided.
    pub fn placed(&self) -> Option<&crate::members::Placement> {
        self.ticket.as_ref().map(|t| &t.placed)
    }

    /// This request is for `model`: its router decides, its metrics count, and with several
    /// models Envoy is told its cluster.
    fn use_model(&mut self, models: &Models<H>, model: &Model<H>) {
        self.router = Some(Rc::clone(&model.router));
        self.metrics = Some(Rc::clone(&model.metrics));
        models.set_route_cluster(&*self.host, model);
    }

    /// Writes the chosen pod, then its fallbacks: `ip:port,ip:port,…`. Envoy's override-host
    /// balancer takes them in order, one per try, and only ever connects to members of the
    /// pods cluster.
    fn set_destination(&mut self, ticket: Ticket) {
        let placed = &ticket.placed;
        self.host.set_header(
            Headers::Request,
            headers::DESTINATION,
            Some(&placed.destination()),
        );
        if let Some(m) = &self.metrics {
            m.decision(placed.decision.reason, placed.model);
        }
        self.ticket = Some(ticket);
    }

    fn reject(&mut self, e: &ApiError) -> Action {
        self.done = true;
        let metrics = self.metrics.clone().or_else(|| {
            let models = self.models.as_ref()?;
            Some(Rc::clone(&models.default_model()?.metrics))
        });
        if let Some(m) = metrics {
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
    fn too_large(models: &Models<H>, len: usize) -> Option<ApiError> {
        let limit = models.config.max_body_bytes();
        (len > limit).then(|| ApiError::too_large(limit))
    }

    /// The whole body is here: decide and let the request go.
    fn finish(&mut self, body_size: usize) -> Action {
        self.done = true;
        let (Some(models), Some(reading)) = (self.models.clone(), self.reading) else {
            return Action::Continue;
        };
        let body = self.host.request_body(body_size).unwrap_or_default();
        let started = self.host.now_nanos();
        let endpoint = match reading {
            PathKind::Prefix(e) => e,
            PathKind::Balanced => return self.balance(&models, &body),
        };
        let req = match parse_request(endpoint, &body) {
            Ok(r) => r,
            Err(e) => return self.reject(&e),
        };
        let (model, known) = match models.lookup(req.model.as_deref()) {
            Lookup::Served(m) => (m, true),
            Lookup::Unknown(m) => (m, false),
            Lookup::NotFound(e) => return self.reject(&e),
        };
        self.use_model(&models, model);
        let host = &*self.host;
        let routed = if !known {
            Ok(model.router.by_load(host, 0, Reason::Fallback))
        } else if req.previous_response.is_some() {
            // a continued response's history is on the pod that stored it, not in this body
            Ok(model.router.by_load(host, 0, Reason::Passthrough))
        } else {
            model.router.route_request(host, &req)
        };
        match routed {
            // no members at all: nothing to choose from; Envoy balances it (or answers 503)
            Ok(None) => Action::Continue,
            Ok(Some(ticket)) => {
                let c = &ticket.cost;
                model
                    .metrics
                    .table(c.table.filled, c.table.replaced, c.table.conflicts);
                let took_us = host.now_nanos().saturating_sub(started) / 1_000;
                model.metrics.route_time(took_us, c.prepare_us);
                model.metrics.hashed(c.hashed_blocks);
                if ticket.read_short.is_some() {
                    model.metrics.read_short();
                }
                self.set_destination(ticket);
                Action::Continue
            }
            Err(e) => self.reject(&e),
        }
    }

    /// A request with nothing to reuse by prefix (embeddings, pooling): only its `model` is
    /// read, to send it to that model's pool, least loaded there. A body that is not JSON
    /// goes to the default model's pool for its server to answer.
    fn balance(&mut self, models: &Models<H>, body: &[u8]) -> Action {
        #[derive(serde::Deserialize)]
        struct Named {
            model: Option<String>,
        }
        let named = serde_json::from_slice::<Named>(body)
            .ok()
            .and_then(|n| n.model);
        let model = match models.lookup(named.as_deref()) {
            Lookup::Served(m) | Lookup::Unknown(m) => m,
            Lookup::NotFound(e) => return self.reject(&e),
        };
        self.use_model(models, model);
        if let Some(placed) = model.router.plain(&*self.host, Reason::Passthrough) {
            self.set_destination(Ticket::by_load(placed));
        }
        Action::Continue
    }

    pub fn request_headers(&mut self, end_of_stream: bool) -> Action {
        // Never honour a client-supplied destination (or cluster).
        let host = Rc::clone(&self.host);
        host.set_header(Headers::Request, headers::DESTINATION, None);
        let Some(models) = self.models.clone() else {
            // Not configured: Envoy would not have loaded us; let the route decide.
            return Action::Continue;
        };
        if models.config.several {
            host.set_header(Headers::Request, headers::ROUTE_CLUSTER, None);
        }
        if let Some(name) = models
            .default_model()
            .and_then(|m| m.router.config.test_only_crash_header.as_deref())
        {
            if host.header(Headers::Request, name).is_some() {
                host.log(
                    Level::Warn,
                    "prefix-router: test-only crash header seen; ending the VM",
                );
                host.crash_vm();
            }
        }
        let header = |name| host.header(Headers::Request, name).unwrap_or_default();
        let (path, method) = (header(":path"), header(":method"));
        self.reading = models.config.path_kind(&path).filter(|_| method == "POST");
        if self.reading.is_none() {
            let bare = path.split('?').next().unwrap_or_default();
            if models.config.several && method == "GET" && bare == MODELS_PATH {
                self.done = true;
                let created = host.now_nanos() / 1_000_000_000;
                host.send_response(
                    200,
                    &[("content-type", "application/json")],
                    models.list_json(created).as_bytes(),
                );
                return Action::Pause;
            }
            let Some(model) = models.default_model() else {
                return Action::Continue;
            };
            self.use_model(&models, model);
            if let Some(placed) = model.router.plain(&*host, Reason::Passthrough) {
                self.set_destination(Ticket::by_load(placed));
            }
            return Action::Continue;
        }
        let declared = host
            .header(Headers::Request, "content-length")
            .and_then(|v| v.parse::<usize>().ok());
        if let Some(e) = declared.and_then(|n| Self::too_large(&models, n)) {
            return self.reject(&e);
        }
        if end_of_stream {
            return self.finish(0);
        }
        // Hold the headers until the body is complete (needs allow_on_headers_stop_iteration).
        Action::Pause
    }

    pub fn request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.done || self.reading.is_none() {
            return Action::Continue;
        }
        if let Some(e) = self
            .models
            .as_deref()
            .and_then(|m| Self::too_large(m, body_size))
        {
            return self.reject(&e);
        }
        if !end_of_stream {
            return Action::Pause; // keep buffering
        }
        self.finish(body_size)
    }

    pub fn request_trailers(&mut self) -> Action {
        if self.done || self.reading.is_none() {
            return Action::Continue;
        }
        // A body followed by trailers: the body ended without end_of_stream.
        let size = self.host.request_body(usize::MAX).map_or(0, |b| b.len());
        self.finish(size)
    }

    pub fn response_headers(&mut self) -> Action {
        if let (Some(router), Some(ticket)) = (&self.router, &mut self.ticket) {
            ticket.answer_headers(&*self.host, router);
        }
        Action::Continue
    }

    /// A chunk of the answer: the first one (a streamed answer's first token, or a whole
    /// answer) means the chosen pod has computed the prompt.
    pub fn response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if body_size > 0 || end_of_stream {
            if let (Some(router), Some(ticket)) = (&self.router, &mut self.ticket) {
                ticket.answer_started(&*self.host, router);
            }
        }
        Action::Continue
    }

    /// The stream is over, however it ended: the ticket releases what it holds.
    pub fn log(&mut self) {
        if let (Some(router), Some(ticket)) = (&self.router, &mut self.ticket) {
            let read_body = self.reading.is_some();
            ticket.end(&*self.host, router, self.metrics.as_deref(), read_body);
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

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.response_body(body_size, end_of_stream)
    }

    fn on_log(&mut self) {
        self.log();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;
    use crate::pods::{read_state, Inflight};
    use crate::testing;
    use prefix_core::protocol::headers::debug;
    use prefix_core::request::Endpoint;
    use prefix_core::router_config::RouterConfig;

    struct Stream {
        host: Rc<FakeHost>,
        router: Rc<Router>,
        ctx: RouterHttp<FakeHost>,
    }

    type Setup = (Rc<FakeHost>, Rc<Router>, Rc<Models<FakeHost>>);

    fn setup(extra: &str) -> Setup {
        let host = Rc::new(FakeHost::default());
        let models = testing::models(&host, extra);
        let router = Rc::clone(&models.list[0].router);
        (host, router, Rc::new(models))
    }

    fn stream((host, router, models): &Setup, headers: &[(&str, &str)]) -> Stream {
        host.new_stream(headers);
        Stream {
            host: Rc::clone(host),
            router: Rc::clone(router),
            ctx: RouterHttp::new(Rc::clone(host), Some(Rc::clone(models))),
        }
    }

    const POST: [(&str, &str); 2] = [(":method", "POST"), (":path", "/v1/completions")];

    /// A short completion through the filter, answered 200 by a pod.
    fn short_answered(f: &Setup) {
        let mut s = stream(f, &POST);
        s.ctx.request_headers(false);
        s.body(r#"{"prompt":"abcdefgh"}"#);
        s.respond("200", true);
    }

    impl Stream {
        fn destination(&self) -> Option<String> {
            self.host.header(Headers::Request, headers::DESTINATION)
        }
        /// Sends `body` in two chunks, as Envoy would deliver a streamed body.
        fn body(&mut self, body: &str) -> (Action, Action) {
            let half = body.len() / 2;
            *self.host.body.borrow_mut() = body.as_bytes()[..half].to_vec();
            let first = self.ctx.request_body(half, false);
            *self.host.body.borrow_mut() = body.as_bytes().to_vec();
            (first, self.ctx.request_body(body.len(), true))
        }
        fn respond(&mut self, status: &str, from_pod: bool) {
            let mut h = vec![(":status".to_owned(), status.to_owned())];
            if from_pod {
                h.push((headers::POD.to_owned(), "pod-x".to_owned()));
            }
            *self.host.response_headers.borrow_mut() = h;
            assert_eq!(self.ctx.response_headers(), Action::Continue);
        }
        fn inflight(&self) -> Vec<u32> {
            Inflight::read(&*self.host, &self.router.inflight_key, 3).counts
        }
    }

    #[test]
    fn an_inference_request_waits_for_its_body_then_is_routed_and_released() {
        let f = setup("");
        let mut s = stream(
            &f,
            &[POST[0], POST[1], (headers::DESTINATION, "10.0.0.1:1")],
        );
        assert_eq!(s.ctx.request_headers(false), Action::Pause);
        assert_eq!(
            s.destination(),
            None,
            "the client's destination is scrubbed at once"
        );
        let (first, last) = s.body(r#"{"prompt":"abcdefghijklmnop"}"#);
        assert_eq!((first, last), (Action::Pause, Action::Continue));
        let placed = s.ctx.placed().cloned().unwrap();
        let d = placed.decision;
        assert_eq!(d.reason, Reason::Cold);
        // the chosen pod, then the other two as ranked fallbacks
        let dest = s.destination().unwrap();
        let named: Vec<&str> = dest.split(',').collect();
        let mut expect = vec![placed.pod()];
        expect.extend(placed.fallbacks());
        assert_eq!(named, expect);
        assert_eq!(named.len(), 3, "{dest}");
        assert_eq!(f.0.metric("prefix_router_decisions.cold.m"), 1);
        assert_eq!(
            f.0.metric("prefix_router_table_entries.m"),
            3,
            "4 blocks of 4 chars: the probed ones (0, 1, 3) recorded"
        );
        assert_eq!(s.inflight().iter().sum::<u32>(), 1);
        s.respond("200", true);
        s.ctx.log();
        s.ctx.log(); // at most once
        assert_eq!(s.inflight(), [0, 0, 0], "released when the stream ends");

        // the same prompt again: a prefix hit on the same pod
        let mut again = stream(&f, &POST);
        again.ctx.request_headers(false);
        again.body(r#"{"prompt":"abcdefghijklmnop"}"#);
        assert_eq!(
            again
                .ctx
                .placed()
                .as_ref()
                .map(|p| (p.decision.pod, p.decision.reason)),
            Some((d.pod, Reason::PrefixHit { blocks: 4 }))
        );
        assert_eq!(f.0.metric("prefix_router_matched_blocks"), 4);
    }

    #[test]
    fn a_pods_first_answer_bytes_make_its_blocks_ready_before_the_predicted_time() {
        // 10 ms per token: the blocks of a 16-token prompt are the pod's only after 160 ms
        let f = setup(r#""cost":{"base_ms":0,"prefill_us_per_token":10000}"#);
        let send = |status: &str, answer: bool| {
            let mut s = stream(&f, &POST);
            s.ctx.request_headers(false);
            s.body(r#"{"prompt":"abcdefghijklmnop"}"#);
            let d = s.ctx.placed().map(|p| p.decision);
            s.respond(status, true);
            if answer {
                assert_eq!(s.ctx.response_body(12, false), Action::Continue);
            }
            s.ctx.log();
            d
        };
        let first = send("503", true).unwrap();
        assert_eq!(first.reason, Reason::Cold);
        let second = send("200", false).unwrap();
        assert_eq!(
            (second.pod, second.reason),
            (first.pod, Reason::Computing),
            "a failed answer settles nothing, and no answer bytes yet"
        );
        let third = send("200", true).unwrap();
        assert_eq!(
            third.reason,
            Reason::Computing,
            "still pending when it was routed"
        );
        let fourth = send("200", true).unwrap();
        assert_eq!(
            (fourth.pod, fourth.reason),
            (first.pod, Reason::PrefixHit { blocks: 4 }),
            "the third's answer made the blocks ready"
        );
    }

    /// What a request costs in crossings into Envoy: a repeated prompt's request writes no
    /// table bucket (its blocks are already the pod's), only its in-flight count (taken and
    /// released), and every repeat costs the same; a successful answer's upstream address is
    /// read once, and its pod header not at all.
    #[test]
    fn a_repeated_prompt_writes_only_its_inflight_count() {
        let f = setup("");
        let prompt: String = (0..64).map(|i| format!("w{i} ")).collect();
        let body = format!(r#"{{"prompt":"{prompt}"}}"#);
        let mut tallies = Vec::new();
        for _ in 0..3 {
            f.0.take_tally();
            let mut s = stream(&f, &POST);
            s.ctx.request_headers(false);
            s.body(&body);
            s.respond("200", true);
            s.ctx.response_body(10, false);
            s.ctx.response_body(0, true);
            s.ctx.log();
            tallies.push(f.0.take_tally());
        }
        assert!(tallies[0]["shared_set"] > 2, "{:?}", tallies[0]);
        for t in &tallies[1..] {
            assert_eq!(t.get("shared_set"), Some(&2), "{t:?}");
            assert_eq!(t.get("upstream_address"), Some(&1), "{t:?}");
            assert_eq!(
                t.get("header"),
                Some(&4),
                ":path, :method, content-length, :status"
            );
            assert_eq!(t, &tallies[1]);
        }
    }

    /// The filter's whole per-request path natively (a profiling aid, not a test of speed):
    /// `cargo test --release -p prefix-router-filter native_request_path -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn native_request_path() {
        let host = Rc::new(FakeHost::default());
        let config = RouterConfig::parse(
            br#"{"pods":["127.0.0.1:8001"],"model_name":"SmolLM2-135M-Instruct","block_size":128}"#,
        )
        .unwrap();
        let bundle = Some(testing::installed_bundle(&config));
        let models = Rc::new(testing::models_of(&host, Router::new(config, bundle, 0)));
        let text = "check the service logs before restarting any node ".repeat(225);
        let n = std::env::var("ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        let same = std::env::var("SAME").is_ok();
        // RANDOM_TOKENS=groups: prompts decoded from random token ids, a shared prefix per
        // group and a question per request, as inference-perf's `shared_prefix` data makes them
        let random_groups: Option<usize> = std::env::var("RANDOM_TOKENS")
            .ok()
            .and_then(|v| v.parse().ok());
        // made one by one outside the timed part (made all up front, a few thousand of them
        // aborted node's WASI run)
        let mut random_body: Box<dyn FnMut(usize) -> Option<String>> = match random_groups {
            Some(groups) => {
                use prefix_core::protocol::defaults::{data_dir, model_dir};
                let repo = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
                let json = std::fs::read(model_dir(&data_dir(repo)).join("tokenizer.json"));
                let tok =
                    prefix_core::tokenizer::Tokenizer::from_json_bytes(&json.unwrap()).unwrap();
                let vocab = tok.vocab_size() as u64;
                let mut x: u64 = 42;
                let mut ids = move |len: usize| -> Vec<u32> {
                    (0..len)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            (x % vocab) as u32
                        })
                        .collect()
                };
                let prefixes: Vec<Vec<u32>> = (0..groups).map(|_| ids(2048)).collect();
                Box::new(move |i| {
                    let mut all = prefixes[i % groups].clone();
                    all.extend(ids(64));
                    let prompt = tok.decode(&all).unwrap();
                    Some(
                        serde_json::json!({"model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": 1})
                            .to_string(),
                    )
                })
            }
            None => Box::new(|_| None),
        };
        let mut body = |i: usize| {
            if let Some(b) = random_body(i) {
                return b;
            }
            let lead = if same { String::new() } else { format!("{i} ") };
            format!(r#"{{"model":"SmolLM2-135M-Instruct","prompt":"{lead}{text}","max_tokens":1}}"#)
        };
        // per request, for the median: on a shared machine a neighbour's burst moves the mean
        let mut spent = Vec::with_capacity(n);
        for i in 0..n {
            let body = body(i);
            let t = std::time::Instant::now();
            host.new_stream(&POST);
            let mut ctx = RouterHttp::new(Rc::clone(&host), Some(Rc::clone(&models)));
            ctx.request_headers(false);
            *host.body.borrow_mut() = body.as_bytes().to_vec();
            ctx.request_body(body.len(), true);
            *host.response_headers.borrow_mut() = vec![(":status".into(), "200".into())];
            ctx.response_headers();
            ctx.response_body(100, true);
            ctx.log();
            spent.push(t.elapsed());
            if i + 1 == n {
                eprintln!("host calls of the last request: {:?}", host.take_tally());
            } else {
                host.take_tally();
            }
        }
        let mean = spent.iter().sum::<std::time::Duration>() / n.max(1) as u32;
        spent.sort();
        let p50 = spent.get(n / 2).copied().unwrap_or_default();
        eprintln!(
            "{:.1} µs per request, p50 {:.1} µs ({n} requests, same prompt: {same})",
            mean.as_secs_f64() * 1e6,
            p50.as_secs_f64() * 1e6
        );
    }

    #[test]
    fn other_requests_pass_through_balanced() {
        let f = setup("");
        for (method, path) in [
            ("GET", "/v1/models"),
            ("GET", "/v1/completions"),
            ("POST", "/v1/files"),
        ] {
            let mut s = stream(
                &f,
                &[
                    (":method", method),
                    (":path", path),
                    (headers::DESTINATION, "10.0.0.1:1"),
                ],
            );
            assert_eq!(s.ctx.request_headers(false), Action::Continue, "{path}");
            assert_eq!(s.ctx.placed().unwrap().decision.reason, Reason::Passthrough);
            let dest = s.destination().unwrap();
            assert!(dest.starts_with("127.0.0.1:800"), "{dest}");
            assert_eq!(
                s.ctx.request_body(3, true),
                Action::Continue,
                "not buffered"
            );
        }
        assert_eq!(f.0.metric("prefix_router_decisions.passthrough.m"), 3);
    }

    #[test]
    fn bad_requests_get_the_servers_json_errors() {
        let f = setup("");
        // declared too large: refused before buffering
        let mut s = stream(&f, &[POST[0], POST[1], ("content-length", "4194305")]);
        assert_eq!(s.ctx.request_headers(false), Action::Pause);
        let sent = f.0.sent.borrow_mut().take().unwrap();
        assert_eq!(sent.status, 413);
        assert_eq!(
            sent.headers,
            [("content-type".to_owned(), "application/json".to_owned())]
        );
        let v: serde_json::Value = serde_json::from_slice(&sent.body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(
            s.ctx.request_body(10, true),
            Action::Continue,
            "already answered"
        );
        assert!(f.0.sent.borrow().is_none());
        // no length declared, buffered past the limit
        let mut s = stream(&f, &POST);
        s.ctx.request_headers(false);
        assert_eq!(
            s.ctx.request_body(4 * 1024 * 1024 + 1, false),
            Action::Pause
        );
        assert_eq!(f.0.sent.borrow_mut().take().unwrap().status, 413);
        // malformed JSON and an unknown model: 400 and 404, nothing routed or counted
        for (body, status) in [("{oops", 400), (r#"{"model":"other","prompt":"x"}"#, 404)] {
            let mut s = stream(&f, &POST);
            s.ctx.request_headers(false);
            assert_eq!(s.body(body).1, Action::Pause, "{body}");
            let sent = f.0.sent.borrow_mut().take().unwrap();
            assert_eq!(sent.status, status, "{body}");
            let v: serde_json::Value = serde_json::from_slice(&sent.body).unwrap();
            assert!(v["error"]["message"].is_string(), "{v}");
            assert!(s.ctx.placed().is_none());
            assert_eq!(s.inflight(), [0, 0, 0]);
        }
        assert_eq!(f.0.metric("prefix_router_rejected"), 4);
    }

    #[test]
    fn a_refused_connection_marks_the_pod_down() {
        let f = setup("");
        let mut s = stream(&f, &POST);
        s.ctx.request_headers(false);
        s.body(r#"{"prompt":"abcdefgh"}"#);
        let pod = s.ctx.placed().unwrap().pod().to_owned();
        s.respond("503", true); // the pod itself answered 503: it is alive
        assert!(read_state(&*f.0, &s.router.keys, &pod).0.healthy);
        s.respond("503", false); // Envoy answered: the pod refused or reset
        assert!(!read_state(&*f.0, &s.router.keys, &pod).0.healthy);
        assert_eq!(f.0.logged("marked down"), 1);
        // the next request avoids it
        let mut next = stream(&f, &POST);
        next.ctx.request_headers(false);
        next.body(r#"{"prompt":"abcdefgh"}"#);
        assert_ne!(next.ctx.placed().unwrap().pod(), pod);
    }

    #[test]
    fn an_answer_from_a_fallback_counts_and_marks_the_chosen_pod() {
        let f = setup("");
        let mut s = stream(&f, &POST);
        s.ctx.request_headers(false);
        s.body(r#"{"prompt":"abcdefgh"}"#);
        let placed = s.ctx.placed().cloned().unwrap();
        let chosen = placed.pod().to_owned();
        let fallback = placed.fallbacks().next().unwrap().to_owned();
        // the chosen pod answered: nothing to note
        *f.0.upstream.borrow_mut() = Some(chosen.clone());
        s.respond("200", true);
        s.ctx.log();
        assert_eq!(f.0.metric("prefix_router_served_by_fallback"), 0);
        // Envoy retried on the first fallback, which answered
        let mut s = stream(&f, &POST);
        s.ctx.request_headers(false);
        s.body(r#"{"prompt":"abcdefgh"}"#);
        assert_eq!(s.ctx.placed().unwrap().pod(), chosen, "still the owner");
        *f.0.upstream.borrow_mut() = Some(fallback);
        s.respond("200", true);
        s.ctx.log();
        assert_eq!(f.0.metric("prefix_router_served_by_fallback"), 1);
        assert!(!read_state(&*f.0, &s.router.keys, &chosen).0.healthy);
        assert_eq!(s.inflight(), [0, 0, 0], "the chosen pod's slot is released");
    }

    #[test]
    fn a_prompt_past_the_read_limit_is_routed_on_what_was_read_and_says_so() {
        let f = setup(r#""debug_headers":true,"max_prompt_tokens":64"#);
        let prompt = format!("{} {}", "abcd ".repeat(60), "x".repeat(100_000));
        let body = serde_json::json!({ "prompt": prompt }).to_string();
        let mut s = stream(&f, &POST);
        s.ctx.request_headers(false);
        s.body(&body);
        s.respond("200", true);
        let h = |n| f.0.header(Headers::Response, n);
        assert_eq!(h(debug::REASON).as_deref(), Some("cold"));
        let read = h(debug::PROMPT_READ).unwrap();
        let (done, total) = read.split_once('/').unwrap();
        assert!(done.parse::<usize>().unwrap() <= 64 * 8, "{read}");
        assert_eq!(total.parse::<usize>().unwrap(), prompt.len());
        assert!(s.destination().is_some());
        // a prompt within the limit says nothing
        short_answered(&f);
        assert_eq!(f.0.header(Headers::Response, debug::PROMPT_READ), None);
    }

    #[test]
    fn the_test_only_crash_header_ends_the_vm_only_when_configured() {
        let f = setup(r#""test_only_crash_header":"x-crash""#);
        let mut s = stream(&f, &[(":method", "GET"), (":path", "/v1/models")]);
        s.ctx.request_headers(true);
        assert!(!f.0.crashed.get());
        const CRASH: [(&str, &str); 3] = [
            (":method", "GET"),
            (":path", "/v1/models"),
            ("x-crash", "1"),
        ];
        let mut s = stream(&f, &CRASH);
        s.ctx.request_headers(true);
        assert!(f.0.crashed.get());
        // not configured: the header means nothing
        let f = setup("");
        let mut s = stream(&f, &CRASH);
        s.ctx.request_headers(true);
        assert!(!f.0.crashed.get());
    }

    #[test]
    fn debug_headers_tell_the_decision() {
        let f = setup(r#""debug_headers":true"#);
        let mut s = stream(&f, &POST);
        s.ctx.request_headers(false);
        s.body(r#"{"prompt":"abcdefgh"}"#);
        s.respond("200", true);
        let h = |n| f.0.header(Headers::Response, n);
        assert_eq!(h(debug::REASON).as_deref(), Some("cold"));
        assert_eq!(h(debug::MATCHED_BLOCKS).as_deref(), Some("0"));
        // the debug header names the chosen pod, the destination header lists fallbacks after it
        let chosen = h(debug::POD).unwrap();
        assert!(s.destination().unwrap().starts_with(&format!("{chosen},")));
        let hashes = f.1.bundle.get().unwrap();
        let req =
            prefix_core::request::parse_request(Endpoint::Completions, br#"{"prompt":"abcdefgh"}"#)
                .unwrap();
        let last = hashes
            .prepare(&req)
            .unwrap()
            .hashes
            .last()
            .unwrap()
            .to_hex();
        assert_eq!(h(debug::PREFIX_HASH), Some(last));
        // off by default
        let f = setup("");
        short_answered(&f);
        assert_eq!(f.0.header(Headers::Response, debug::REASON), None);
    }

    #[test]
    fn bodies_ending_in_trailers_or_with_the_headers() {
        let f = setup("");
        let mut s = stream(&f, &POST);
        s.ctx.request_headers(false);
        *f.0.body.borrow_mut() = br#"{"prompt":"abcdefgh"}"#.to_vec();
        assert_eq!(s.ctx.request_body(21, false), Action::Pause);
        assert_eq!(s.ctx.request_trailers(), Action::Continue);
        assert_eq!(s.ctx.placed().unwrap().decision.reason, Reason::Cold);
        // headers-only POST: decided on the (empty) body, the server's own 400
        let mut s = stream(&f, &POST);
        assert_eq!(s.ctx.request_headers(true), Action::Pause);
        assert_eq!(f.0.sent.borrow().as_ref().map(|s| s.status), Some(400));
    }

    #[test]
    fn an_unconfigured_filter_only_scrubs() {
        let host = Rc::new(FakeHost::default());
        host.new_stream(&[POST[0], POST[1], (headers::DESTINATION, "10.0.0.1:1")]);
        let mut ctx = RouterHttp::new(Rc::clone(&host), None);
        assert_eq!(ctx.request_headers(false), Action::Continue);
        assert_eq!(host.header(Headers::Request, headers::DESTINATION), None);
        ctx.log();
    }
}
