//! The root context: one per worker VM. It parses the plugin configuration once, builds the
//! [`Models`] (a [`Router`] per model) every request of the worker shares, and drives each
//! model's tokenizer fetch and [`Poller`] on each tick and call answer.

use crate::host::{EnvoyHost, Host, Level};
use crate::http::RouterHttp;
use crate::model_fetch::ModelFetch;
use crate::models::{Model, Models};
use crate::poller::Poller;
use crate::router::Router;
use prefix_core::plugin_config::PluginConfig;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::rc::Rc;
use std::time::Duration;

/// Tick period while a tokenizer is to be fetched and polling is off.
const TOKENIZER_TICK_MS: u64 = 1_000;

pub struct RouterRoot<H: Host> {
    pub host: Rc<H>,
    pub models: Option<Rc<Models<H>>>,
    /// Each model's poller and tokenizer fetch, in the order of `models`.
    work: Vec<(Poller, ModelFetch)>,
    vm_id: u64,
}

impl<H: Host> RouterRoot<H> {
    pub fn new(host: Rc<H>, vm_id: u64) -> Self {
        RouterRoot {
            host,
            models: None,
            work: Vec::new(),
            vm_id,
        }
    }

    /// The first (default) model's router.
    pub fn router(&self) -> Option<&Rc<Router>> {
        self.models
            .as_ref()
            .and_then(|m| m.default_model())
            .map(|m| &m.router)
    }

    /// `on_configure`: false (Envoy rejects the configuration) when it is invalid; the log
    /// line names the field.
    pub fn configure(&mut self) -> bool {
        let host = &self.host;
        let bytes = host.plugin_configuration().unwrap_or_default();
        let config = match PluginConfig::parse(&bytes) {
            Ok(c) => c,
            Err(e) => {
                host.log(Level::Error, &e.to_string());
                return false;
            }
        };
        // ticks drive the polls, and the tokenizer fetches even when polling is off
        let fetching = config.models.iter().any(|m| m.tokenizer.is_some());
        let tick_ms = match (config.poll_interval_ms(), fetching) {
            (0, true) => TOKENIZER_TICK_MS,
            (ms, _) => ms,
        };
        if tick_ms > 0 {
            host.set_tick_period(Duration::from_millis(tick_ms));
        }
        let models = Models::new(host, config, self.vm_id);
        self.work = models
            .list
            .iter()
            .map(|_| (Poller::default(), ModelFetch::default()))
            .collect();
        self.models = Some(Rc::new(models));
        true
    }

    fn each(&self) -> impl Iterator<Item = (&Model<H>, &(Poller, ModelFetch))> {
        self.models
            .iter()
            .flat_map(|m| m.list.iter())
            .zip(self.work.iter())
    }

    pub fn tick(&self) {
        let host = &*self.host;
        for (m, (poller, fetch)) in self.each() {
            fetch.tick(host, &m.router, &m.metrics);
            if m.router.config.poll_interval_ms > 0 {
                poller.tick(host, &m.router, &m.metrics, self.vm_id);
            }
        }
    }

    /// An HTTP call came back: to whichever model's fetch or poller made it.
    pub fn call_answered(&self, token: u32, body_size: usize) {
        let host = &*self.host;
        for (m, (poller, fetch)) in self.each() {
            if fetch.on_response(host, &m.router, &m.metrics, token, body_size)
                || poller.on_response(host, &m.router, &m.metrics, token, body_size)
            {
                return;
            }
        }
    }

    /// A stream's context, sharing this worker's models.
    pub fn http_context(&self) -> RouterHttp<H> {
        RouterHttp::new(Rc::clone(&self.host), self.models.clone())
    }
}

impl Context for RouterRoot<EnvoyHost> {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        self.call_answered(token, body_size);
    }
}

impl RootContext for RouterRoot<EnvoyHost> {
    fn on_configure(&mut self, _size: usize) -> bool {
        self.configure()
    }

    fn on_tick(&mut self) {
        self.tick();
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(self.http_context()))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::{Call, FakeHost};
    use crate::host::Store;
    use crate::pods::read_state;
    use crate::poller::CATCH_UP_PAGES;
    use prefix_core::protocol::headers;
    use serde_json::json;

    const PODS: &str = r#""pods":["127.0.0.1:8001","127.0.0.1:8002"]"#;

    fn configured(extra: &str) -> RouterRoot<FakeHost> {
        let host = Rc::new(FakeHost::default());
        *host.config.borrow_mut() = format!("{{{PODS}{extra}}}").into_bytes();
        let mut root = RouterRoot::new(host, 7);
        assert!(root.configure());
        tokenizers_loaded(&root);
        root
    }

    /// What a fetch would leave behind, for the models configured without a `tokenizer`
    /// (tests of everything but the fetch): the installed model's bundle in each router.
    fn tokenizers_loaded(root: &RouterRoot<FakeHost>) {
        for m in root.models.iter().flat_map(|m| &m.list) {
            let c = &m.router.config;
            if c.tokenizer.is_none() {
                let bundle = crate::testing::installed_bundle(c)
                    .with_adapters(c.adapters.clone())
                    .with_aliases(c.aliases.clone());
                let _ = m.router.bundle.set(bundle);
            }
        }
    }

    fn answer(root: &RouterRoot<FakeHost>, call: &Call, status: &str, body: &serde_json::Value) {
        let bytes = body.to_string().into_bytes();
        let len = bytes.len();
        *root.host.call_answer.borrow_mut() = Some((status.to_owned(), bytes));
        root.call_answered(call.token, len);
    }

    fn page(seq: u64, more: bool) -> serde_json::Value {
        json!({"epoch": "e1", "seq": seq, "more": more, "events": [
            {"seq": seq, "type": "BlockStored", "hashes": [format!("{seq:016x}")]}
        ], "load": {"running": 2, "waiting": 3, "kv_cache_usage": 0.5}})
    }

    fn state(root: &RouterRoot<FakeHost>, pod: &str) -> prefix_core::liveness::PodState {
        let router = root.router().unwrap();
        read_state(&*root.host, &router.keys, pod).0
    }

    #[test]
    fn a_bad_configuration_is_refused_naming_the_field() {
        let host = Rc::new(FakeHost::default());
        *host.config.borrow_mut() = br#"{"pods":["127.0.0.1:1"],"block_size":0}"#.to_vec();
        let mut root = RouterRoot::new(Rc::clone(&host), 1);
        assert!(!root.configure());
        assert_eq!(host.logged("field 'block_size'"), 1);
        assert!(root.router().is_none());
        root.tick(); // nothing configured: nothing happens
        assert!(host.take_calls().is_empty());
    }

    #[test]
    fn configure_sets_up_polling_metrics_and_counts() {
        let root = configured(r#","poll_interval_ms":250"#);
        let host = &root.host;
        assert_eq!(host.tick.get(), Some(Duration::from_millis(250)));
        assert_eq!(
            host.logged("no `tokenizer` configured"),
            1,
            "the .wasm carries none: {:?}",
            host.logs.borrow()
        );
        for name in [
            "prefix_router_decisions.prefix_hit.SmolLM2-135M-Instruct",
            "prefix_router_decisions.least_loaded.SmolLM2-135M-Instruct",
            "prefix_router_pod.127.0.0.1:8002.healthy",
            "prefix_router_route_us",
        ] {
            assert!(
                host.metrics.borrow().iter().any(|(n, _, _)| n == name),
                "{name} defined"
            );
        }
        let router = root.router().unwrap();
        assert!(host.shared_get(&router.inflight_key).is_some());
        // polling off: no timer
        let off = configured(r#","poll_interval_ms":0"#);
        assert_eq!(off.host.tick.get(), None);
    }

    #[test]
    fn polls_carry_the_pod_credentials_from_the_environment_never_logged() {
        let creds = r#","pod_credentials":{"value_from_env":"POD_KEY"}"#;
        let host = Rc::new(FakeHost::default());
        host.env
            .borrow_mut()
            .insert("POD_KEY".into(), "s3cret\n".into());
        *host.config.borrow_mut() = format!("{{{PODS}{creds}}}").into_bytes();
        let mut root = RouterRoot::new(Rc::clone(&host), 7);
        assert!(root.configure());
        tokenizers_loaded(&root);
        root.tick();
        let calls = host.take_calls();
        assert_eq!(calls.len(), 2);
        for call in &calls {
            assert_eq!(call.header("authorization"), Some("Bearer s3cret"));
        }
        assert_eq!(host.logged("s3cret"), 0);
        // the variable missing: configured all the same, polls without it, the name logged
        let root = configured(creds);
        root.tick();
        assert!(root
            .host
            .take_calls()
            .iter()
            .all(|c| c.header("authorization").is_none()));
        assert_eq!(root.host.logged("'POD_KEY' is not set"), 1);
        // a header name that is not one
        let host = Rc::new(FakeHost::default());
        *host.config.borrow_mut() = format!(
            "{{{PODS},\"pod_credentials\":{{\"value_from_env\":\"K\",\"header\":\"X Auth\"}}}}"
        )
        .into_bytes();
        let mut root = RouterRoot::new(Rc::clone(&host), 7);
        assert!(!root.configure());
        assert_eq!(host.logged("pod_credentials.header"), 1);
    }

    #[test]
    fn each_tick_polls_every_pod_once_and_applies_the_answers() {
        let root = configured("");
        root.tick();
        let calls = root.host.take_calls();
        assert_eq!(calls.len(), 2);
        for (call, pod) in calls.iter().zip(["127.0.0.1:8001", "127.0.0.1:8002"]) {
            assert_eq!(call.cluster, "pod_polls");
            assert_eq!(call.header(headers::DESTINATION), Some(pod));
            assert_eq!(call.header(":path"), Some("/v1/cache/events?since=0"));
            assert_eq!(call.timeout, Duration::from_millis(500));
        }
        // pod 0 answers; pod 1's poll is still out, so the next tick skips it
        answer(&root, &calls[0], "200", &page(4, false));
        let st = state(&root, "127.0.0.1:8001");
        assert_eq!((st.seq, st.running, st.waiting), (4, 2, 3));
        assert_eq!(root.host.metric("prefix_router_events_blocks_stored"), 1);
        assert_eq!(
            root.host
                .metric("prefix_router_table_entries.SmolLM2-135M-Instruct"),
            1
        );
        root.tick();
        let calls = root.host.take_calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].header(":path"), Some("/v1/cache/events?since=4"));
        assert_eq!(
            root.host.metric("prefix_router_pod.127.0.0.1:8001.healthy"),
            1
        );
        // an answer to a call that is not one of ours is ignored
        root.call_answered(999_999, 0);
    }

    #[test]
    fn events_are_asked_of_the_sidecar_the_config_names_and_applied_to_its_pod() {
        let root = configured(
            r#","events":{"port":9100,"addresses":{"127.0.0.1:8002":"127.0.0.1:9002"}}"#,
        );
        root.tick();
        let calls = root.host.take_calls();
        let asked: Vec<_> = calls
            .iter()
            .map(|c| (c.header(headers::DESTINATION), c.header(":path")))
            .collect();
        assert_eq!(
            asked,
            [
                (Some("127.0.0.1:9100"), Some("/v1/cache/events?since=0")),
                (Some("127.0.0.1:9002"), Some("/v1/cache/events?since=0")),
            ]
        );
        // the sidecar's page is its pod's: state and ownership go to the pod
        answer(&root, &calls[1], "200", &page(4, false));
        assert_eq!(state(&root, "127.0.0.1:8002").seq, 4);
        assert_eq!(root.host.metric("prefix_router_events_blocks_stored"), 1);
    }

    #[test]
    fn a_pod_with_more_events_is_asked_again_within_a_bound() {
        let root = configured("");
        root.tick();
        let calls = root.host.take_calls();
        answer(&root, &calls[1], "200", &page(0, false));
        answer(&root, &calls[0], "200", &page(1, true));
        let mut pages = 0;
        loop {
            let calls = root.host.take_calls();
            let Some(call) = calls.first() else { break };
            pages += 1;
            let seq = pages + 1;
            assert_eq!(
                call.header(":path"),
                Some(format!("/v1/cache/events?since={}", seq - 1).as_str())
            );
            answer(&root, call, "200", &page(seq, true));
        }
        assert_eq!(
            pages, CATCH_UP_PAGES as u64,
            "then it waits for the next tick"
        );
        root.tick();
        assert_eq!(
            root.host.take_calls().len(),
            2,
            "next tick: both pods again"
        );
    }

    #[test]
    fn failed_polls_take_a_pod_down_and_a_good_one_brings_it_back() {
        let root = configured(r#","down_after_failures":2"#);
        let pod = "127.0.0.1:8002";
        for (status, body) in [("503", json!({})), ("200", json!({"not": "a page"}))] {
            root.tick();
            let calls = root.host.take_calls();
            answer(&root, &calls[0], "200", &page(0, false));
            answer(&root, &calls[1], status, &body);
        }
        assert!(!state(&root, pod).healthy);
        assert_eq!(root.host.metric("prefix_router_polls_failed"), 2);
        assert_eq!(root.host.logged("marked down"), 1);
        root.tick();
        assert_eq!(
            root.host.metric("prefix_router_pod.127.0.0.1:8002.healthy"),
            0
        );
        let calls = root.host.take_calls();
        answer(&root, &calls[1], "200", &page(1, false));
        assert!(state(&root, pod).healthy);
        assert_eq!(root.host.logged("is back"), 1);
        // a poll that cannot even be dispatched counts as failed
        root.host.fail_calls.set(true);
        root.tick();
        root.tick();
        assert!(!state(&root, pod).healthy);
    }

    /// Answers with a plain-text body.
    fn answer_text(root: &RouterRoot<FakeHost>, call: &Call, status: &str, body: &str) {
        *root.host.call_answer.borrow_mut() = Some((status.to_owned(), body.as_bytes().to_vec()));
        root.call_answered(call.token, body.len());
    }

    fn vllm_metrics(running: u32, start: f64) -> String {
        format!(
            "vllm:num_requests_running{{model_name=\"m\"}} {running}\nvllm:num_requests_waiting{{model_name=\"m\"}} 4\nvllm:kv_cache_usage_perc{{model_name=\"m\"}} 0.5\nprocess_start_time_seconds {start}\n"
        )
    }

    /// One tick: the other pod's events poll is answered with an empty page; the call made
    /// to `pod` is returned unanswered.
    fn tick_for(root: &RouterRoot<FakeHost>, pod: &str) -> Call {
        root.tick();
        let (mine, others): (Vec<Call>, Vec<Call>) = root
            .host
            .take_calls()
            .into_iter()
            .partition(|c| c.header(headers::DESTINATION) == Some(pod));
        for other in &others {
            answer(root, other, "200", &page(0, false));
        }
        mine.into_iter().next().unwrap()
    }

    /// Answers a health check with 200 and the `/metrics` call that follows with `body`.
    fn healthy_with(root: &RouterRoot<FakeHost>, health: &Call, body: &str) {
        assert_eq!(health.header(":path"), Some("/health"));
        answer_text(root, health, "200", "");
        let m = root.host.take_calls().remove(0);
        assert_eq!(m.header(":path"), Some("/metrics"));
        answer_text(root, &m, "200", body);
    }

    #[test]
    fn pods_without_events_are_followed_by_health_and_metrics() {
        use prefix_core::liveness::PodKind;
        let root = configured(r#","down_after_failures":2"#);
        let pod = "127.0.0.1:8001";
        // a vLLM-like pod: no events endpoint
        let events = tick_for(&root, pod);
        answer_text(&root, &events, "404", "Not Found");
        assert_eq!(state(&root, pod).kind, PodKind::Metrics);
        assert!(
            state(&root, pod).healthy,
            "a 404 is an answer, not a failure"
        );
        assert_eq!(root.host.logged("following its /health and /metrics"), 1);
        let health = root.host.take_calls().remove(0);
        healthy_with(&root, &health, &vllm_metrics(3, 100.0));
        let st = state(&root, pod);
        assert_eq!((st.running, st.waiting), (3, 4));
        // the next tick goes straight to /health; a new process start time is a restart
        healthy_with(&root, &tick_for(&root, pod), &vllm_metrics(1, 200.0));
        assert_ne!(
            state(&root, pod).generation,
            st.generation,
            "restarted: its blocks are gone"
        );
        assert_eq!(
            root.host.metric("prefix_router_pod_generation_changes"),
            2,
            "first contact of pod 1, restart of pod 0"
        );
        // a failing health check, twice: down
        for _ in 0..2 {
            answer_text(&root, &tick_for(&root, pod), "503", "");
        }
        assert!(!state(&root, pod).healthy);
        // healthy, with metrics that are not a model server's: back, followed by health only
        healthy_with(&root, &tick_for(&root, pod), "# not a model server\nup 1\n");
        assert!(state(&root, pod).healthy, "its health says it is up");
        assert_eq!(state(&root, pod).kind, PodKind::Health);
        assert_eq!(root.host.logged("is back"), 1);
        assert_eq!(root.host.logged("serves no model-server load metrics"), 1);
        // /metrics not served at all (llama-server without --metrics answers 501): the same
        let health = tick_for(&root, pod);
        answer_text(&root, &health, "200", "");
        let m = root.host.take_calls().remove(0);
        answer_text(
            &root,
            &m,
            "501",
            r#"{"error":{"message":"This server does not support metrics endpoint."}}"#,
        );
        assert!(state(&root, pod).healthy);
        assert_eq!(
            root.host.metric("prefix_router_polls_failed"),
            2,
            "only the two 503s"
        );
        // metrics again: followed by them
        healthy_with(&root, &tick_for(&root, pod), &vllm_metrics(2, 200.0));
        assert_eq!(
            (state(&root, pod).kind, state(&root, pod).running),
            (PodKind::Metrics, 2)
        );
    }

    /// Envoy's `/clusters?format=json` with these members of `pods` (and another cluster).
    fn clusters(members: &[&str]) -> serde_json::Value {
        let host = |a: &&str| {
            let (ip, port) = a.rsplit_once(':').unwrap();
            json!({"address": {"socket_address": {"address": ip, "port_value": port.parse::<u16>().unwrap()}},
                   "health_status": {"eds_health_status": "HEALTHY"}})
        };
        json!({"cluster_statuses": [
            {"name": "pod_polls", "host_statuses": [host(&"10.9.9.9:1")]},
            {"name": "pods", "host_statuses": members.iter().map(host).collect::<Vec<_>>()},
        ]})
    }

    /// Routes a completion through a new stream; the destination header written.
    fn route_one(root: &RouterRoot<FakeHost>, prompt: &str) -> Option<String> {
        root.host
            .new_stream(&[(":method", "POST"), (":path", "/v1/completions")]);
        let mut ctx = root.http_context();
        ctx.request_headers(false);
        let body = json!({ "prompt": prompt }).to_string();
        *root.host.body.borrow_mut() = body.clone().into_bytes();
        ctx.request_body(body.len(), true);
        ctx.log();
        root.host
            .header(crate::host::Headers::Request, headers::DESTINATION)
    }

    #[test]
    fn a_tokenizer_from_the_configuration_is_fetched_then_routes() {
        let root = configured(
            r#","block_size":4,"model_name":"m","poll_interval_ms":0,"debug_headers":true,"tokenizer":{"cluster":"assets","config_path":null}"#,
        );
        let host = &root.host;
        let router = root.router().unwrap();
        assert!(router.bundle.get().is_none(), "not fetched yet");
        assert_eq!(
            host.tick.get(),
            Some(Duration::from_millis(1000)),
            "ticks to fetch"
        );
        assert_eq!(host.metric("prefix_router_tokenizer_loaded.m"), 0);
        let prompt = "a prompt long enough for several four-token blocks";
        let fallback = || host.metric("prefix_router_decisions.fallback.m");
        assert!(route_one(&root, prompt).is_some(), "balanced by load");
        assert_eq!(fallback(), 1);
        // the first tick asks for tokenizer.json; a 404 is logged, counted, retried later
        root.tick();
        let calls = host.take_calls();
        assert_eq!(
            calls.len(),
            1,
            "no chat template asked for (config_path null)"
        );
        assert_eq!(
            (calls[0].cluster.as_str(), calls[0].header(":path")),
            ("assets", Some("/tokenizer.json"))
        );
        answer(&root, &calls[0], "404", &json!({}));
        assert_eq!(host.metric("prefix_router_tokenizer_load_failures"), 1);
        assert_eq!(host.logged("answered 404"), 1, "{:?}", host.logs.borrow());
        root.tick();
        assert!(host.take_calls().is_empty(), "the retry waits");
        host.clock.set(host.clock.get() + 2_000_000_000);
        root.tick();
        let calls = host.take_calls();
        assert_eq!(calls.len(), 1, "retried");
        let json = crate::testing::tiny_tokenizer_json().into_bytes();
        let len = json.len();
        *host.call_answer.borrow_mut() = Some(("200".to_owned(), json));
        root.call_answered(calls[0].token, len);
        assert!(router.bundle.get().is_some());
        assert_eq!(host.metric("prefix_router_tokenizer_loaded.m"), 1);
        assert_eq!(host.logged("loaded from cluster 'assets'"), 1);
        // routed by prefix from now on; no more fetches
        route_one(&root, prompt);
        assert_eq!(fallback(), 1);
        assert_eq!(host.metric("prefix_router_decisions.cold.m"), 1);
        root.tick();
        assert!(host.take_calls().is_empty());
    }

    #[test]
    fn the_chat_template_is_fetched_too_and_a_bad_file_is_retried() {
        let root = configured(
            r#","block_size":4,"model_name":"m","poll_interval_ms":100,"tokenizer":{"cluster":"assets"}"#,
        );
        let host = &root.host;
        let router = root.router().unwrap();
        let fetch_calls = || -> Vec<Call> {
            host.take_calls()
                .into_iter()
                .filter(|c| c.cluster == "assets")
                .collect()
        };
        let reply = |call: &Call, status: &str, body: &[u8]| {
            *host.call_answer.borrow_mut() = Some((status.to_owned(), body.to_vec()));
            root.call_answered(call.token, body.len());
        };
        root.tick();
        let calls = fetch_calls();
        let paths: Vec<_> = calls.iter().filter_map(|c| c.header(":path")).collect();
        assert_eq!(paths, ["/tokenizer.json", "/tokenizer_config.json"]);
        // a tokenizer.json that is not one: nothing is built, the next try comes later
        reply(&calls[0], "200", b"{ not a tokenizer");
        reply(
            &calls[1],
            "200",
            br#"{"chat_template":"{{ messages[0].content }}"}"#,
        );
        assert!(router.bundle.get().is_none());
        assert_eq!(host.metric("prefix_router_tokenizer_load_failures"), 1);
        assert_eq!(host.logged("unusable"), 1, "{:?}", host.logs.borrow());
        host.clock.set(host.clock.get() + 2_000_000_000);
        root.tick();
        let calls = fetch_calls();
        assert_eq!(calls.len(), 2);
        // both good: built only once the second file is there, with its chat template
        let json = crate::testing::tiny_tokenizer_json().into_bytes();
        reply(&calls[0], "200", &json);
        assert!(router.bundle.get().is_none(), "waits for the chat template");
        reply(
            &calls[1],
            "200",
            br#"{"chat_template":"{{ messages[0].content }}"}"#,
        );
        let bundle = router.bundle.get().unwrap();
        let req = prefix_core::request::parse_request(
            prefix_core::request::Endpoint::ChatCompletions,
            br#"{"messages":[{"role":"user","content":"abcdefgh"}]}"#,
        )
        .unwrap();
        assert_eq!(
            bundle.render_chat(&req).unwrap().as_deref(),
            Some("abcdefgh")
        );
    }

    #[test]
    fn members_follow_the_envoy_cluster() {
        let host = Rc::new(FakeHost::default());
        *host.config.borrow_mut() = br#"{"discovery":{},"poll_interval_ms":100}"#.to_vec();
        let mut root = RouterRoot::new(Rc::clone(&host), 7);
        assert!(root.configure());
        tokenizers_loaded(&root);
        // no members yet: requests pass with no destination (Envoy balances them)
        assert_eq!(route_one(&root, "hello there, pods"), None);
        // the tick asks Envoy's admin; the answer makes two pods members
        root.tick();
        let calls = host.take_calls();
        assert_eq!(calls.len(), 1, "no pods to poll yet");
        let admin = &calls[0];
        assert_eq!(
            (admin.cluster.as_str(), admin.header(":path")),
            ("envoy_admin", Some("/clusters?format=json"))
        );
        answer(
            &root,
            admin,
            "200",
            &clusters(&["127.0.0.1:8002", "127.0.0.1:8001"]),
        );
        assert_eq!(host.metric("prefix_router_membership_changes"), 1);
        assert_eq!(
            host.logged("joined [\"127.0.0.1:8001\", \"127.0.0.1:8002\"]"),
            1,
            "{:?}",
            host.logs.borrow()
        );
        let dest = route_one(&root, "hello there, pods").unwrap();
        assert!(
            dest.split(',')
                .all(|a| a == "127.0.0.1:8001" || a == "127.0.0.1:8002"),
            "{dest}"
        );
        // the next tick polls both pods and asks again; 8001 leaves, 8003 joins
        root.tick();
        let calls = host.take_calls();
        assert_eq!(calls.len(), 3);
        let gen_before = state(&root, "127.0.0.1:8001").generation;
        let admin = calls.iter().find(|c| c.cluster == "envoy_admin").unwrap();
        answer(
            &root,
            admin,
            "200",
            &clusters(&["127.0.0.1:8002", "127.0.0.1:8003"]),
        );
        let left = state(&root, "127.0.0.1:8001");
        assert_ne!(left.generation, gen_before, "its ownership is dropped");
        // the polls of that tick come back; the one of the pod that left is ignored
        for c in calls.iter().filter(|c| c.cluster != "envoy_admin") {
            answer(&root, c, "200", &page(1, false));
        }
        assert_eq!(state(&root, "127.0.0.1:8001"), left);
        assert_eq!(state(&root, "127.0.0.1:8002").seq, 1);
        for _ in 0..6 {
            let dest = route_one(&root, "another prompt that is long enough").unwrap();
            assert!(!dest.contains("127.0.0.1:8001"), "{dest}");
        }
        // 8003 took the free slot 0; slot 1 is still 8002
        root.tick();
        let calls = host.take_calls();
        let polled: Vec<&str> = calls
            .iter()
            .filter_map(|c| c.header(headers::DESTINATION))
            .collect();
        assert_eq!(polled, ["127.0.0.1:8003", "127.0.0.1:8002"]);
        assert_eq!(
            host.metric("prefix_router_members.SmolLM2-135M-Instruct"),
            2
        );
        // per-pod gauges are named by address (Envoy's stats tag makes it a `pod` label)
        assert_eq!(host.metric("prefix_router_pod.127.0.0.1:8002.healthy"), 1);
        assert_eq!(host.metric("prefix_router_pod.127.0.0.1:8001.healthy"), 0);
        assert_eq!(host.metric("prefix_router_pod.127.0.0.1:8003.signals"), 0);
        let admin = calls.iter().find(|c| c.cluster == "envoy_admin").unwrap();
        answer(
            &root,
            admin,
            "200",
            &clusters(&["127.0.0.1:8003", "127.0.0.1:8002"]),
        );
        assert_eq!(
            host.metric("prefix_router_membership_changes"),
            2,
            "unchanged"
        );
        // Envoy's admin failing, or naming no such cluster: the last members stay
        let admin_fails = |root: &RouterRoot<FakeHost>, status: &str, body: serde_json::Value| {
            root.tick();
            let calls = root.host.take_calls();
            let admin = calls.iter().find(|c| c.cluster == "envoy_admin");
            // the previous ask was answered above, so a new one goes out
            answer(root, admin.unwrap(), status, &body);
        };
        admin_fails(&root, "503", json!({}));
        admin_fails(
            &root,
            "200",
            json!({"cluster_statuses": [{"name": "other"}]}),
        );
        assert_eq!(host.logged("keeping the last ones"), 2);
        assert!(route_one(&root, "still routed").is_some());
        assert_eq!(
            host.metric("prefix_router_members.SmolLM2-135M-Instruct"),
            2
        );
    }

    #[test]
    fn only_the_lease_holder_polls() {
        let a = configured("");
        let host = Rc::clone(&a.host);
        let mut b = RouterRoot::new(Rc::clone(&host), 8); // a second VM, same shared data
        assert!(b.configure());
        tokenizers_loaded(&b);
        a.tick();
        assert_eq!(host.take_calls().len(), 2);
        b.tick();
        assert!(host.take_calls().is_empty(), "a holds the lease");
    }

    #[test]
    fn streams_share_the_workers_router() {
        let root = configured("");
        root.host
            .new_stream(&[(":method", "GET"), (":path", "/v1/models")]);
        let mut ctx = root.http_context();
        assert_eq!(
            ctx.request_headers(true),
            proxy_wasm::types::Action::Continue
        );
        assert!(ctx.placed().is_some());
        assert_eq!(
            root.host.metric(&format!(
                "prefix_router_decisions.passthrough.{}",
                prefix_core::protocol::defaults::MODEL_NAME
            )),
            1
        );
    }

    /// Two models, each its own pool and cluster; `unknown` is the `unknown_model` value.
    fn two_models(unknown: &str) -> RouterRoot<FakeHost> {
        let host = Rc::new(FakeHost::default());
        *host.config.borrow_mut() = format!(
            r#"{{"poll_interval_ms":100,"block_size":4,"debug_headers":true,"unknown_model":"{unknown}","models":[
                {{"model_name":"a","pods":["127.0.0.1:8001","127.0.0.1:8002"],"route_cluster":"pods_a",{instant}}},
                {{"model_name":"b","pods":["127.0.0.1:9001"],"route_cluster":"pods_b","block_size":8,
                  "adapters":["b-sql"]}}]}}"#,
            instant = crate::testing::INSTANT_PREFILL
        )
        .into_bytes();
        let mut root = RouterRoot::new(host, 7);
        assert!(root.configure());
        tokenizers_loaded(&root);
        root
    }

    /// Sends a request through a new stream: the destination and cluster written, and what
    /// the filter answered itself (status, body), if it did.
    fn send(
        root: &RouterRoot<FakeHost>,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (Option<String>, Option<String>, Option<(u16, String)>) {
        use crate::host::Headers::Request;
        root.host.new_stream(&[
            (":method", method),
            (":path", path),
            (headers::ROUTE_CLUSTER, "envoy_admin"),
        ]);
        *root.host.sent.borrow_mut() = None;
        let mut ctx = root.http_context();
        match body {
            None => {
                ctx.request_headers(true);
            }
            Some(b) => {
                ctx.request_headers(false);
                let b = b.to_string();
                *root.host.body.borrow_mut() = b.clone().into_bytes();
                ctx.request_body(b.len(), true);
            }
        }
        ctx.log();
        let sent = root.host.sent.borrow_mut().take();
        (
            root.host.header(Request, headers::DESTINATION),
            root.host.header(Request, headers::ROUTE_CLUSTER),
            sent.map(|s| (s.status, String::from_utf8_lossy(&s.body).into_owned())),
        )
    }

    #[test]
    fn each_model_is_routed_in_its_own_pool() {
        let root = two_models("reject");
        let host = &root.host;
        let complete = |model: Option<&str>| {
            let mut body = json!({"prompt": "a prompt that is long enough for a block or two"});
            if let Some(m) = model {
                body["model"] = json!(m);
            }
            send(&root, "POST", "/v1/completions", Some(body))
        };
        let in_pool = |dest: &Option<String>, prefix: &str| {
            dest.as_deref()
                .is_some_and(|d| d.split(',').all(|a| a.starts_with(prefix)))
        };
        for (model, cluster, port) in [
            (Some("a"), "pods_a", "127.0.0.1:800"),
            (None, "pods_a", "127.0.0.1:800"),
            (Some("b"), "pods_b", "127.0.0.1:900"),
            (Some("b-sql"), "pods_b", "127.0.0.1:900"),
        ] {
            let (dest, routed_to, sent) = complete(model);
            assert!(in_pool(&dest, port), "{model:?}: {dest:?}");
            assert_eq!(routed_to.as_deref(), Some(cluster), "{model:?}");
            assert_eq!(sent, None);
        }
        assert_eq!(host.metric("prefix_router_decisions.cold.a"), 1);
        assert_eq!(host.metric("prefix_router_decisions.prefix_hit.a"), 1);
        assert_eq!(host.metric("prefix_router_decisions.cold.b"), 1);
        assert_eq!(host.metric("prefix_router_decisions.cold.b-sql"), 1);
        // a model nobody serves: 404 as a server would, naming what is served
        let (dest, routed_to, sent) = complete(Some("c"));
        let (status, body) = sent.unwrap();
        assert_eq!((dest, routed_to, status), (None, None, 404));
        assert!(
            body.contains("model_not_found") && body.contains("'a', 'b', 'b-sql'"),
            "{body}"
        );
        // other paths go to the first model's pool; the client's cluster header never survives
        let (dest, routed_to, _) = send(&root, "GET", "/health", None);
        assert!(in_pool(&dest, "127.0.0.1:800"));
        assert_eq!(routed_to.as_deref(), Some("pods_a"));
        // the model list is every pool's, answered by the filter
        let (_, _, sent) = send(&root, "GET", "/v1/models?x=1", None);
        let (status, body) = sent.unwrap();
        let list: serde_json::Value = serde_json::from_str(&body).unwrap();
        let ids: Vec<&str> = list["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!((status, ids), (200, vec!["a", "b", "b-sql"]));
        assert_eq!(list["data"][2]["parent"], "b");
        // each model keeps its own gauges and polls its own pods
        assert_eq!(
            host.metric("prefix_router_members.a"),
            0,
            "set by the poller"
        );
        root.tick();
        let polled: Vec<String> = host
            .take_calls()
            .iter()
            .filter_map(|c| c.header(headers::DESTINATION).map(str::to_owned))
            .collect();
        assert_eq!(
            polled,
            ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:9001"]
        );
    }

    #[test]
    fn unknown_models_can_go_to_a_default_pool_by_load() {
        let root = two_models("b");
        let body =
            json!({"model": "c", "prompt": "a prompt that is long enough for a block or two"});
        let (dest, routed_to, sent) = send(&root, "POST", "/v1/completions", Some(body));
        assert_eq!(sent, None, "the pod answers");
        assert_eq!(dest.as_deref(), Some("127.0.0.1:9001"));
        assert_eq!(routed_to.as_deref(), Some("pods_b"));
        assert_eq!(root.host.metric("prefix_router_decisions.fallback.b"), 1);
        // a bad body is still the filter's 400
        let (_, _, sent) = send(
            &root,
            "POST",
            "/v1/completions",
            Some(json!({"model": "c"})),
        );
        assert_eq!(sent.map(|s| s.0), Some(400));
    }

    #[test]
    fn every_inference_path_is_routed_in_its_models_pool() {
        let root = two_models("reject");
        let host = &root.host;
        // nothing to reuse by prefix: the named model's pool, least loaded
        let (dest, routed_to, sent) = send(
            &root,
            "POST",
            "/v1/embeddings",
            Some(json!({"model": "b", "input": "some text"})),
        );
        assert_eq!(
            (dest.as_deref(), routed_to.as_deref(), sent),
            (Some("127.0.0.1:9001"), Some("pods_b"), None)
        );
        assert_eq!(host.metric("prefix_router_decisions.passthrough.b"), 1);
        let (_, _, sent) = send(
            &root,
            "POST",
            "/v1/embeddings",
            Some(json!({"model": "c", "input": "x"})),
        );
        assert_eq!(
            sent.map(|s| s.0),
            Some(404),
            "an unknown model, as the servers answer"
        );
        // the Responses API and Anthropic-style messages are rendered and routed by prefix
        let system = "You are a careful assistant who answers in one short sentence, always.";
        let responses =
            json!({"model": "a", "instructions": system, "input": "What is two plus two?"});
        let messages = json!({"model": "a", "max_tokens": 8, "system": system,
            "messages": [{"role": "user", "content": "What is two plus two?"}]});
        for (path, body) in [("/v1/responses", &responses), ("/v1/messages", &messages)] {
            let (first, _, sent) = send(&root, "POST", path, Some(body.clone()));
            assert_eq!(sent, None, "{path}");
            let (again, _, _) = send(&root, "POST", path, Some(body.clone()));
            assert_eq!(
                first.unwrap().split(',').next(),
                again.unwrap().split(',').next(),
                "{path}"
            );
        }
        // both render to the same chat, so the second endpoint found the first one's blocks
        assert_eq!(host.metric("prefix_router_decisions.cold.a"), 1);
        assert_eq!(host.metric("prefix_router_decisions.prefix_hit.a"), 3);
        // their own mistakes get the servers' 400s
        let (_, _, sent) = send(
            &root,
            "POST",
            "/v1/messages",
            Some(json!({"model": "a", "messages": []})),
        );
        let (status, body) = sent.unwrap();
        assert!(status == 400 && body.contains("max_tokens"), "{body}");
        // a continued response goes by load: its history is on a pod, not in the body
        let (dest, _, sent) = send(
            &root,
            "POST",
            "/v1/responses",
            Some(json!({"model": "a", "input": "and then?", "previous_response_id": "resp_1"})),
        );
        assert!(dest.is_some() && sent.is_none());
        assert_eq!(host.metric("prefix_router_decisions.passthrough.a"), 1);
        assert_eq!(host.metric("prefix_router_decisions.fallback.a"), 0);
    }

    #[test]
    fn a_pool_may_declare_more_inference_paths() {
        let root = configured(&format!(
            r#","block_size":4,{},"inference_paths":{{"/generate":"completions","/embed":"balanced"}}"#,
            crate::testing::INSTANT_PREFILL
        ));
        let prompt = json!({"prompt": "a prompt that is long enough for a block or two"});
        let model = prefix_core::protocol::defaults::MODEL_NAME;
        for _ in 0..2 {
            let (dest, _, sent) = send(&root, "POST", "/generate", Some(prompt.clone()));
            assert!(dest.is_some() && sent.is_none());
        }
        assert_eq!(
            root.host
                .metric(&format!("prefix_router_decisions.prefix_hit.{model}")),
            1
        );
        send(&root, "POST", "/embed", Some(json!({"input": "x"})));
        assert_eq!(
            root.host
                .metric(&format!("prefix_router_decisions.passthrough.{model}")),
            1
        );
        let bad = RouterRoot::new(
            {
                let host = Rc::new(FakeHost::default());
                *host.config.borrow_mut() =
                    format!(r#"{{{PODS},"inference_paths":{{"/x":"nope"}}}}"#).into_bytes();
                host
            },
            7,
        );
        let mut bad = bad;
        assert!(
            !bad.configure(),
            "an unknown body kind is a configuration error"
        );
    }
}
