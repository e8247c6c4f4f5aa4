//! Every call the filter makes into Envoy, behind traits, so that the contexts' behaviour is
//! unit-tested against a fake host (`fake::FakeHost`, in tests) and only [`EnvoyHost`] touches proxy-wasm.
//!
//! - [`Store`]: shared data and the clock — all that the ownership table, pod states and
//!   routing need.
//! - [`Host`]: everything else a context does: plugin configuration, timers, HTTP calls to
//!   pods and their answers, the current stream's headers and body, local responses,
//!   metrics and logs.

use std::time::Duration;

/// Result of a shared-data write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetOutcome {
    Written,
    /// Someone else wrote the key since we read it (compare-and-swap failed).
    CasMismatch,
    Failed,
}

/// Envoy's shared data (one store for every worker VM of a plugin) and the clock.
pub trait Store {
    /// The value and its CAS token; `None` when the key does not exist (or on host error).
    fn shared_get(&self, key: &str) -> Option<(Vec<u8>, Option<u32>)>;
    /// Writes `value`; with `cas`, only if the key is unchanged since that read.
    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> SetOutcome;
    /// Wall-clock nanoseconds (monotonic enough for ordering table entries).
    fn now_nanos(&self) -> u64;
}

/// Kinds of metric (Envoy stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

/// Log levels the filter uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// Which header map of the current stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headers {
    Request,
    Response,
}

pub trait Host: Store {
    /// The plugin's `configuration` bytes.
    fn plugin_configuration(&self) -> Option<Vec<u8>>;
    fn set_tick_period(&self, period: Duration);
    fn log(&self, level: Level, message: &str);

    /// Defines a metric; `None` if the host refuses.
    fn define_metric(&self, kind: MetricKind, name: &str) -> Option<u32>;
    fn increment_metric(&self, id: u32, by: i64);
    fn record_metric(&self, id: u32, value: u64);

    /// Starts an HTTP call through `cluster`; the token names its answer.
    fn dispatch_http_call(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<u32, String>;
    /// The `:status` of the HTTP call being answered (inside its callback).
    fn http_call_status(&self) -> Option<String>;
    /// The body of the HTTP call being answered.
    fn http_call_body(&self, size: usize) -> Option<Vec<u8>>;

    /// The body of the HTTP call being answered, if it answered 200 with at most `max`
    /// bytes; else why not (`answered 404`, `no answer …`, `… bytes is over …`).
    fn http_call_ok_body(&self, size: usize, max: usize) -> Result<Vec<u8>, String> {
        match self.http_call_status().as_deref() {
            Some("200") => {}
            Some(other) => return Err(format!("answered {other}")),
            None => return Err("no answer (timed out, or no such cluster)".to_owned()),
        }
        if size > max {
            return Err(format!("{size} bytes is over the limit of {max}"));
        }
        self.http_call_body(size)
            .ok_or_else(|| "answered without a body".to_owned())
    }

    /// A header of the current stream.
    fn header(&self, map: Headers, name: &str) -> Option<String>;
    /// Sets (or with `None` removes) a header of the current stream.
    fn set_header(&self, map: Headers, name: &str, value: Option<&str>);
    /// The request body buffered so far (`size` bytes from the start).
    fn request_body(&self, size: usize) -> Option<Vec<u8>>;
    /// Answers the current stream locally (the request goes no further).
    fn send_response(&self, status: u16, headers: &[(&str, &str)], body: &[u8]);
    /// The `ip:port` of the upstream that served the current stream (its last try), if any.
    fn upstream_address(&self) -> Option<String>;

    /// An environment variable Envoy passes to the VM (`vm_config.environment_variables`).
    fn env_var(&self, name: &str) -> Option<String>;

    /// Ends this VM at once, as a fault inside it would (a wasm trap): only for the
    /// test-only crash trigger (`test_only_crash_header`), which proves Envoy brings the
    /// filter back.
    fn crash_vm(&self);
}

/// The real host: proxy-wasm host calls into Envoy.
pub struct EnvoyHost;

mod envoy {
    use super::*;
    use proxy_wasm::hostcalls as hc;
    use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType, Status};

    impl Store for EnvoyHost {
        fn shared_get(&self, key: &str) -> Option<(Vec<u8>, Option<u32>)> {
            match hc::get_shared_data(key) {
                Ok((Some(v), cas)) => Some((v, cas)),
                _ => None,
            }
        }

        fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> SetOutcome {
            match hc::set_shared_data(key, Some(value), cas) {
                Ok(()) => SetOutcome::Written,
                Err(Status::CasMismatch) => SetOutcome::CasMismatch,
                Err(_) => SetOutcome::Failed,
            }
        }

        fn now_nanos(&self) -> u64 {
            hc::get_current_time()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        }
    }

    fn map(m: Headers) -> MapType {
        match m {
            Headers::Request => MapType::HttpRequestHeaders,
            Headers::Response => MapType::HttpResponseHeaders,
        }
    }

    impl Host for EnvoyHost {
        fn plugin_configuration(&self) -> Option<Vec<u8>> {
            hc::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
                .ok()
                .flatten()
        }

        fn set_tick_period(&self, period: Duration) {
            let _ = hc::set_tick_period(period);
        }

        fn log(&self, level: Level, message: &str) {
            let level = match level {
                Level::Info => LogLevel::Info,
                Level::Warn => LogLevel::Warn,
                Level::Error => LogLevel::Error,
            };
            let _ = hc::log(level, message);
        }

        fn define_metric(&self, kind: MetricKind, name: &str) -> Option<u32> {
            let kind = match kind {
                MetricKind::Counter => MetricType::Counter,
                MetricKind::Gauge => MetricType::Gauge,
                MetricKind::Histogram => MetricType::Histogram,
            };
            hc::define_metric(kind, name).ok()
        }

        fn increment_metric(&self, id: u32, by: i64) {
            let _ = hc::increment_metric(id, by);
        }

        fn record_metric(&self, id: u32, value: u64) {
            let _ = hc::record_metric(id, value);
        }

        fn dispatch_http_call(
            &self,
            cluster: &str,
            headers: &[(&str, &str)],
            timeout: Duration,
        ) -> Result<u32, String> {
            hc::dispatch_http_call(cluster, headers.to_vec(), None, vec![], timeout)
                .map_err(|e| format!("{e:?}"))
        }

        fn http_call_status(&self) -> Option<String> {
            hc::get_map_value(MapType::HttpCallResponseHeaders, ":status")
                .ok()
                .flatten()
        }

        fn http_call_body(&self, size: usize) -> Option<Vec<u8>> {
            hc::get_buffer(BufferType::HttpCallResponseBody, 0, size)
                .ok()
                .flatten()
        }

        fn header(&self, m: Headers, name: &str) -> Option<String> {
            hc::get_map_value(map(m), name).ok().flatten()
        }

        fn set_header(&self, m: Headers, name: &str, value: Option<&str>) {
            let _ = hc::set_map_value(map(m), name, value);
        }

        fn request_body(&self, size: usize) -> Option<Vec<u8>> {
            hc::get_buffer(BufferType::HttpRequestBody, 0, size)
                .ok()
                .flatten()
        }

        fn send_response(&self, status: u16, headers: &[(&str, &str)], body: &[u8]) {
            let _ = hc::send_http_response(u32::from(status), headers.to_vec(), Some(body));
        }

        fn upstream_address(&self) -> Option<String> {
            hc::get_property(vec!["upstream", "address"])
                .ok()
                .flatten()
                .and_then(|v| String::from_utf8(v).ok())
        }

        fn env_var(&self, name: &str) -> Option<String> {
            std::env::var(name).ok()
        }

        fn crash_vm(&self) {
            #[cfg(target_arch = "wasm32")]
            core::arch::wasm32::unreachable();
        }
    }
}

#[cfg(test)]
pub mod fake {
    //! An in-memory host: Envoy's shared-data semantics (CAS checked for existing keys), one
    //! current stream, recorded HTTP calls, metrics by name and log lines.
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;

    /// A local response the filter sent.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Sent {
        pub status: u16,
        pub headers: Vec<(String, String)>,
        pub body: Vec<u8>,
    }

    /// An HTTP call the filter dispatched.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Call {
        pub token: u32,
        pub cluster: String,
        pub headers: Vec<(String, String)>,
        pub timeout: Duration,
    }

    impl Call {
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        }
    }

    #[derive(Default)]
    pub struct FakeHost {
        pub data: RefCell<HashMap<String, (Vec<u8>, u32)>>,
        pub clock: Cell<u64>,
        pub fail_reads: Cell<bool>,
        pub config: RefCell<Vec<u8>>,
        pub tick: Cell<Option<Duration>>,
        pub logs: RefCell<Vec<(Level, String)>>,
        /// Metric names by id (index) with their kind and value.
        pub metrics: RefCell<Vec<(String, MetricKind, i64)>>,
        pub calls: RefCell<Vec<Call>>,
        pub fail_calls: Cell<bool>,
        /// The answer being delivered to `on_http_call_response`.
        pub call_answer: RefCell<Option<(String, Vec<u8>)>>,
        pub request_headers: RefCell<Vec<(String, String)>>,
        pub response_headers: RefCell<Vec<(String, String)>>,
        pub body: RefCell<Vec<u8>>,
        pub sent: RefCell<Option<Sent>>,
        /// What `upstream_address` answers for the current stream.
        pub upstream: RefCell<Option<String>>,
        /// `crash_vm` was called.
        pub crashed: Cell<bool>,
        /// What `env_var` answers.
        pub env: RefCell<HashMap<String, String>>,
        /// Host calls made, by kind (what a request costs in crossings into Envoy).
        pub tally: RefCell<std::collections::BTreeMap<&'static str, u32>>,
    }

    impl FakeHost {
        /// The value of metric `name` (0 if undefined).
        pub fn metric(&self, name: &str) -> i64 {
            self.metrics
                .borrow()
                .iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, _, v)| *v)
                .unwrap_or(0)
        }

        /// Log lines containing `needle`.
        pub fn logged(&self, needle: &str) -> usize {
            self.logs
                .borrow()
                .iter()
                .filter(|(_, l)| l.contains(needle))
                .count()
        }

        /// Starts a new stream with these request headers (and no body yet).
        pub fn new_stream(&self, headers: &[(&str, &str)]) {
            *self.request_headers.borrow_mut() = headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            self.response_headers.borrow_mut().clear();
            self.body.borrow_mut().clear();
            self.sent.borrow_mut().take();
            self.upstream.borrow_mut().take();
        }

        /// Counts one host call of `kind`.
        fn count(&self, kind: &'static str) {
            *self.tally.borrow_mut().entry(kind).or_default() += 1;
        }

        /// The host calls made since the last `take_tally`, by kind.
        pub fn take_tally(&self) -> std::collections::BTreeMap<&'static str, u32> {
            std::mem::take(&mut *self.tally.borrow_mut())
        }

        /// Shared-data reads and writes since the last `take_tally`.
        pub fn shared_calls(&self) -> (u32, u32) {
            let t = self.tally.borrow();
            let n = |kind| t.get(kind).copied().unwrap_or(0);
            (n("shared_get"), n("shared_set"))
        }

        pub fn take_calls(&self) -> Vec<Call> {
            std::mem::take(&mut *self.calls.borrow_mut())
        }
    }

    fn get(h: &[(String, String)], name: &str) -> Option<String> {
        h.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    impl Store for FakeHost {
        fn shared_get(&self, key: &str) -> Option<(Vec<u8>, Option<u32>)> {
            self.count("shared_get");
            if self.fail_reads.get() {
                return None;
            }
            self.data
                .borrow()
                .get(key)
                .map(|(v, c)| (v.clone(), Some(*c)))
        }

        fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> SetOutcome {
            self.count("shared_set");
            let mut d = self.data.borrow_mut();
            match (d.get_mut(key), cas) {
                (Some((_, c)), Some(want)) if *c != want => SetOutcome::CasMismatch,
                (Some((v, c)), _) => {
                    *v = value.to_vec();
                    *c += 1;
                    SetOutcome::Written
                }
                (None, _) => {
                    d.insert(key.to_owned(), (value.to_vec(), 1));
                    SetOutcome::Written
                }
            }
        }

        fn now_nanos(&self) -> u64 {
            self.count("now");
            self.clock.set(self.clock.get() + 1);
            self.clock.get()
        }
    }

    impl Host for FakeHost {
        fn plugin_configuration(&self) -> Option<Vec<u8>> {
            Some(self.config.borrow().clone())
        }
        fn set_tick_period(&self, period: Duration) {
            self.tick.set(Some(period));
        }
        fn log(&self, level: Level, message: &str) {
            self.count("log");
            self.logs.borrow_mut().push((level, message.to_owned()));
        }
        fn define_metric(&self, kind: MetricKind, name: &str) -> Option<u32> {
            let mut m = self.metrics.borrow_mut();
            if let Some(i) = m.iter().position(|(n, _, _)| n == name) {
                return Some(i as u32);
            }
            m.push((name.to_owned(), kind, 0));
            Some(m.len() as u32 - 1)
        }
        fn increment_metric(&self, id: u32, by: i64) {
            self.count("metric");
            if let Some(m) = self.metrics.borrow_mut().get_mut(id as usize) {
                m.2 += by;
            }
        }
        fn record_metric(&self, id: u32, value: u64) {
            self.count("metric");
            if let Some(m) = self.metrics.borrow_mut().get_mut(id as usize) {
                m.2 = value as i64;
            }
        }
        fn dispatch_http_call(
            &self,
            cluster: &str,
            headers: &[(&str, &str)],
            timeout: Duration,
        ) -> Result<u32, String> {
            if self.fail_calls.get() {
                return Err("BadArgument".into());
            }
            let mut calls = self.calls.borrow_mut();
            let token = 1000 + self.clock.get() as u32 + calls.len() as u32;
            self.clock.set(self.clock.get() + 1);
            calls.push(Call {
                token,
                cluster: cluster.to_owned(),
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                timeout,
            });
            Ok(token)
        }
        fn http_call_status(&self) -> Option<String> {
            self.call_answer.borrow().as_ref().map(|(s, _)| s.clone())
        }
        fn http_call_body(&self, size: usize) -> Option<Vec<u8>> {
            self.call_answer
                .borrow()
                .as_ref()
                .map(|(_, b)| b[..size.min(b.len())].to_vec())
        }
        fn header(&self, map: Headers, name: &str) -> Option<String> {
            self.count("header");
            match map {
                Headers::Request => get(&self.request_headers.borrow(), name),
                Headers::Response => get(&self.response_headers.borrow(), name),
            }
        }
        fn set_header(&self, map: Headers, name: &str, value: Option<&str>) {
            self.count("set_header");
            let mut h = match map {
                Headers::Request => self.request_headers.borrow_mut(),
                Headers::Response => self.response_headers.borrow_mut(),
            };
            h.retain(|(k, _)| k != name);
            if let Some(v) = value {
                h.push((name.to_owned(), v.to_owned()));
            }
        }
        fn request_body(&self, size: usize) -> Option<Vec<u8>> {
            self.count("body");
            let b = self.body.borrow();
            Some(b[..size.min(b.len())].to_vec())
        }
        fn send_response(&self, status: u16, headers: &[(&str, &str)], body: &[u8]) {
            self.count("send_response");
            *self.sent.borrow_mut() = Some(Sent {
                status,
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                body: body.to_vec(),
            });
        }
        fn upstream_address(&self) -> Option<String> {
            self.count("upstream_address");
            self.upstream.borrow().clone()
        }

        fn env_var(&self, name: &str) -> Option<String> {
            self.env.borrow().get(name).cloned()
        }

        fn crash_vm(&self) {
            self.crashed.set(true);
        }
    }
}
