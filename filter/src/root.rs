//! The root context: one per worker VM. It parses the plugin configuration once, loads the
//! tokenizer, builds the [`Router`] every request of the worker shares, and drives the
//! [`Poller`] on each tick and poll answer.

use crate::host::{EnvoyHost, Host, Level};
use crate::http::RouterHttp;
use crate::metrics::Metrics;
use crate::pods::Inflight;
use crate::poller::Poller;
use crate::router::Router;
use crate::tokenizer::embedded_bundle;
use prefix_core::router_config::RouterConfig;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::rc::Rc;
use std::time::Duration;

pub struct RouterRoot<H: Host> {
    pub host: Rc<H>,
    pub router: Option<Rc<Router>>,
    pub metrics: Option<Rc<Metrics<H>>>,
    poller: Poller,
    vm_id: u64,
}

impl<H: Host> RouterRoot<H> {
    pub fn new(host: Rc<H>, vm_id: u64) -> Self {
        RouterRoot {
            host,
            router: None,
            metrics: None,
            poller: Poller::default(),
            vm_id,
        }
    }

    /// `on_configure`: false (Envoy rejects the configuration) when it is invalid; the log
    /// line names the field.
    pub fn configure(&mut self) -> bool {
        let host = &self.host;
        let bytes = host.plugin_configuration().unwrap_or_default();
        let config = match RouterConfig::parse(&bytes) {
            Ok(c) => c,
            Err(e) => {
                host.log(Level::Error, &e.to_string());
                return false;
            }
        };
        let started = host.now_nanos();
        let bundle = embedded_bundle(&config).map_err(|e| {
            host.log(
                Level::Error,
                &format!("prefix-router: tokenizer unusable, failing open: {e}"),
            )
        });
        let took_ms = host.now_nanos().saturating_sub(started) / 1_000_000;
        host.log(
            Level::Info,
            &format!(
                "prefix-router: configured {} pods, policy {:?}, block size {}, model '{}', table {} entries, poll every {} ms; tokenizer {} in {took_ms} ms",
                config.pods.len(),
                config.policy,
                config.block_size.get(),
                config.model_name,
                config.table_capacity,
                config.poll_interval_ms,
                if bundle.is_ok() { "loaded" } else { "MISSING (failing open)" },
            ),
        );
        if config.poll_interval_ms > 0 {
            host.set_tick_period(Duration::from_millis(config.poll_interval_ms));
        }
        self.metrics = Some(Rc::new(Metrics::define(Rc::clone(host), config.pods.len())));
        let router = Router::new(config, bundle.ok(), self.vm_id);
        Inflight::create(&**host, &router.inflight_key, router.pods());
        self.router = Some(Rc::new(router));
        true
    }

    pub fn tick(&self) {
        if let (Some(router), Some(metrics)) = (&self.router, &self.metrics) {
            self.poller.tick(&*self.host, router, metrics, self.vm_id);
        }
    }

    pub fn call_answered(&self, token: u32, body_size: usize) {
        if let (Some(router), Some(metrics)) = (&self.router, &self.metrics) {
            self.poller
                .on_response(&*self.host, router, metrics, token, body_size);
        }
    }

    /// A stream's context, sharing this worker's router and metrics.
    pub fn http_context(&self) -> RouterHttp<H> {
        RouterHttp::new(
            Rc::clone(&self.host),
            self.router.clone(),
            self.metrics.clone(),
        )
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
