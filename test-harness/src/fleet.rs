//! A fleet for tests: pods plus one or more Envoys, and helpers to send requests through them.

use crate::cluster::{
    client, metric_value, pod_metric, run_dir, start_envoy, start_pods_of, Envoy, Pod, PodKind,
};
use crate::envoy_config::EnvoySettings;
use reqwest::blocking::{Client, Response};
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Flags that make the sim engine answer at once.
pub use prefix_core::protocol::defaults::SIM_ZERO_COST as ZERO_COST;

pub struct Fleet {
    pub pods: Vec<Pod>,
    pub envoy: Envoy,
    pub http: Client,
    pub dir: PathBuf,
}

/// A response, read whole.
pub struct Answer {
    pub status: u16,
    /// `x-inference-pod` (empty when no pod answered)
    pub pod: String,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    pub fn read(r: Response) -> Answer {
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let pod = headers
            .get(prefix_core::protocol::headers::POD)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let body = r.json::<Value>().unwrap_or(Value::Null);
        Answer {
            status,
            pod,
            headers,
            body,
        }
    }

    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// `usage.prompt_tokens_details.cached_tokens`; fails the calling test without one.
    #[allow(clippy::panic)] // a test helper: the test that asked fails, naming the answer
    pub fn cached(&self) -> u64 {
        self.body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("no usage in {} (status {})", self.body, self.status))
    }

    pub fn reason(&self) -> &str {
        self.header(prefix_core::protocol::headers::debug::REASON)
    }
}

impl Fleet {
    /// A fleet of pods and an Envoy started by hand (e.g. with EDS membership).
    pub fn of(pods: Vec<Pod>, envoy: Envoy, dir: PathBuf) -> Fleet {
        Fleet {
            pods,
            envoy,
            http: client(),
            dir,
        }
    }

    /// `n` pods with `pod_args`, one Envoy with the filter, tweaked by `tweak`.
    pub fn start(
        name: &str,
        n: usize,
        pod_args: &[&str],
        tweak: impl FnOnce(&mut EnvoySettings),
    ) -> anyhow::Result<Fleet> {
        Self::start_of(PodKind::ModelServer, name, n, pod_args, tweak)
    }

    /// [`Fleet::start`] with pods of any kind.
    pub fn start_of(
        kind: PodKind,
        name: &str,
        n: usize,
        pod_args: &[&str],
        tweak: impl FnOnce(&mut EnvoySettings),
    ) -> anyhow::Result<Fleet> {
        let dir = run_dir(name);
        let pods = start_pods_of(kind, n, pod_args, &dir)?;
        let envoy = start_envoy(
            "envoy",
            &Self::addrs_of(&pods),
            true,
            |s| {
                pod_defaults(&pods, s);
                tweak(s)
            },
            &dir,
        )?;
        let fleet = Fleet {
            pods,
            envoy,
            http: client(),
            dir,
        };
        fleet.wait_polled(&fleet.envoy)?;
        Ok(fleet)
    }

    /// Waits until `envoy`'s filter has heard from every pod (when it polls at all). First
    /// contact with an events pod starts its generation and re-reads its whole event log, so
    /// a test that starts before it could see those effects land in the middle of its own
    /// steps; after it, generation changes and stored events come only from what the test
    /// does. A pod without events has been read through its `/metrics` once.
    pub fn wait_polled(&self, envoy: &Envoy) -> anyhow::Result<()> {
        if !envoy.polls {
            return Ok(());
        }
        let events_pods = self.pods.iter().filter(|p| p.kind.has_events()).count() as f64;
        let done = || {
            self.stat(envoy, "prefix_router_pod_generation_changes") >= events_pods
                && self.pods.iter().all(|p| {
                    let signals = if p.kind.has_events() { 1.0 } else { 2.0 };
                    self.pod_stat(envoy, "healthy", &p.addr) == 1.0
                        && self.pod_stat(envoy, "signals", &p.addr) == signals
                })
        };
        if self.wait(Duration::from_secs(20), done) {
            Ok(())
        } else {
            anyhow::bail!(
                "the filter in {} never polled every pod",
                envoy.config_path.display()
            )
        }
    }

    fn addrs_of(pods: &[Pod]) -> Vec<String> {
        pods.iter().map(|p| p.addr.clone()).collect()
    }

    pub fn addrs(&self) -> Vec<String> {
        Self::addrs_of(&self.pods)
    }

    /// POST JSON through `envoy` with extra headers.
    pub fn send_via(
        &self,
        envoy: &Envoy,
        path: &str,
        body: &Value,
        extra: &[(&str, &str)],
    ) -> Answer {
        #![allow(clippy::expect_used)] // a test helper: no answer at all fails the test
        let mut req = self.http.post(envoy.url(path)).json(body);
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        Answer::read(req.send().expect("request through envoy"))
    }

    pub fn send(&self, path: &str, body: &Value, extra: &[(&str, &str)]) -> Answer {
        self.send_via(&self.envoy, path, body, extra)
    }

    /// Every pod's `vllm:prefix_cache_hits_total`.
    pub fn hits(&self) -> Vec<f64> {
        self.pods
            .iter()
            .map(|p| {
                pod_metric(&self.http, &p.addr, "vllm:prefix_cache_hits_total").unwrap_or(f64::NAN)
            })
            .collect()
    }

    #[allow(clippy::panic)] // a test helper: a wrong name fails the test
    pub fn pod_index(&self, name: &str) -> usize {
        self.pods
            .iter()
            .position(|p| p.name == name)
            .unwrap_or_else(|| panic!("unknown pod {name}"))
    }

    /// One of `envoy`'s stats from `/stats/prometheus` (0 when not yet defined).
    pub fn stat(&self, envoy: &Envoy, name: &str) -> f64 {
        let text = self
            .http
            .get(envoy.admin_url("/stats/prometheus"))
            .send()
            .and_then(|r| r.text())
            .unwrap_or_default();
        metric_value(&text, name).unwrap_or(0.0)
    }

    /// What the first pod's `/tokenize` says of a request body (tokens, block hashes).
    pub fn tokenize(&self, body: &Value) -> Value {
        self.http
            .post(format!("http://{}/tokenize", self.pods[0].addr))
            .json(body)
            .send()
            .and_then(|r| r.json())
            .unwrap_or_default()
    }

    /// The hash of the last full block of a request body, as the first pod computes it.
    pub fn pod_prefix_hash(&self, body: &Value) -> Value {
        self.tokenize(body)["block_hashes"]
            .as_array()
            .and_then(|h| h.last())
            .cloned()
            .unwrap_or_default()
    }

    /// One of the filter's per-pod gauges (`healthy`, `inflight`, `event_lag_ms`, `signals`)
    /// for the pod at `addr`: `prefix_router_pod_<name>{pod="<addr>"}` (Envoy's stats tag).
    pub fn pod_stat(&self, envoy: &Envoy, name: &str, addr: &str) -> f64 {
        self.stat(
            envoy,
            &format!("prefix_router_pod_{name}{{pod=\"{addr}\"}}"),
        )
    }

    /// Polls `cond` every 50 ms until true or `timeout`; returns whether it became true.
    pub fn wait(&self, timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        cond()
    }
}

/// What an Envoy in front of these pods needs besides the defaults: for vLLM pods, the
/// tokenizer and template vLLM serves, and where their sidecars serve their events (plugin
/// `events.addresses`). Applied by [`Fleet::start_of`]; for another Envoy of the same fleet,
/// apply it in its settings too.
pub fn pod_defaults(pods: &[Pod], s: &mut EnvoySettings) {
    if pods.iter().any(|p| p.kind == PodKind::Vllm) {
        s.tokenizer_dir = Some(crate::paths::vllm_model_dir());
    }
    let addresses: serde_json::Map<String, Value> = pods
        .iter()
        .filter_map(|p| Some((p.addr.clone(), Value::from(p.events_addr()?))))
        .collect();
    if !addresses.is_empty() {
        s.extra.insert(
            "events".into(),
            serde_json::json!({ "addresses": addresses }),
        );
    }
}
