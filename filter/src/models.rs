//! The models one filter routes for: a [`Router`] (own pods, tokenizer, block size, table)
//! and [`Metrics`] per model, and which of them a request is for.
//!
//! Every model is kept apart: its table and pod states live under its own namespace in
//! shared data, its poller holds its own lease, its tokenizer is fetched on its own. With
//! several models the filter also names the request's Envoy cluster
//! ([`headers::ROUTE_CLUSTER`]): each model's pods are their own cluster, so Envoy's
//! override-host choice, and its retries onto fallbacks, stay inside the model's pool.

use crate::host::{Host, Level};
use crate::metrics::Metrics;
use crate::router::Router;
use prefix_core::plugin_config::{ModelChoice, PluginConfig};
use prefix_core::protocol::headers;
use prefix_core::router_config::{PodCredentials, RouterConfig};
use prefix_core::ApiError;
use std::rc::Rc;

/// One model's router and metrics.
pub struct Model<H: Host> {
    pub router: Rc<Router>,
    pub metrics: Rc<Metrics<H>>,
}

/// Every model of the plugin configuration, in its order (the first is the default).
pub struct Models<H: Host> {
    pub config: PluginConfig,
    pub list: Vec<Model<H>>,
}

impl<H: Host> Model<H> {
    /// Builds a model's router, its tokenizer to be fetched (the .wasm carries none), its
    /// metrics defined. Logs what it set up; a model with no `tokenizer` source is logged as
    /// an error and balanced by load (the filter fails open).
    pub fn new(host: &Rc<H>, config: RouterConfig, vm_id: u64) -> Self {
        let tokenizer = match &config.tokenizer {
            Some(src) => format!(
                "tokenizer to be fetched from cluster '{}' ({}), balancing by load until then",
                src.cluster, src.path
            ),
            None => {
                host.log(
                    Level::Error,
                    &format!(
                        "prefix-router: model '{}': no `tokenizer` configured (the filter carries no vocabulary: name the cluster serving the model's tokenizer.json, as render-envoy-config --tokenizer-dir writes); balancing by load",
                        config.model_name
                    ),
                );
                "NO tokenizer (failing open)".to_owned()
            }
        };
        host.log(
            Level::Info,
            &format!(
                "prefix-router: model '{}' on cluster '{}': {} pods{}, policy {:?}, block size {}, table {} entries, poll every {} ms; {tokenizer}",
                config.model_name,
                config.route_cluster,
                config.pods.len(),
                config.discovery.as_ref().map_or(String::new(), |d| format!(
                    " (then the members of cluster '{}', from Envoy's admin through '{}')",
                    d.cluster, d.admin_cluster
                )),
                config.policy,
                config.block_size.get(),
                config.table_capacity,
                config.poll_interval_ms,
            ),
        );
        let metrics = Metrics::define(Rc::clone(host), &config.model_name, &config.adapters);
        metrics.define_pods(&config.pods);
        metrics.tokenizer_loaded(false);
        let mut router = Router::new(config, None, vm_id);
        router.pod_auth = pod_auth(&**host, router.config.pod_credentials.as_ref());
        crate::pods::Inflight::create(&**host, &router.inflight_key, router.config.pods.len());
        Model {
            router: Rc::new(router),
            metrics: Rc::new(metrics),
        }
    }
}

/// The credentials header for the pods, its value read from Envoy's environment. A missing
/// variable is logged by name (polls then go without it, and pods that require it are
/// marked down, which shows); the value never is.
fn pod_auth<H: Host>(host: &H, creds: Option<&PodCredentials>) -> Option<(String, String)> {
    let c = creds?;
    match host.env_var(&c.value_from_env) {
        Some(v) if !v.is_empty() => Some((c.header.clone(), format!("{}{}", c.prefix, v.trim()))),
        _ => {
            host.log(
                Level::Error,
                &format!(
                    "prefix-router: pod_credentials: environment variable '{}' is not set or empty (Envoy passes only those listed in vm_config.environment_variables.host_env_keys); polling pods without credentials",
                    c.value_from_env
                ),
            );
            None
        }
    }
}

/// What a request's `model` leads to.
pub enum Lookup<'a, H: Host> {
    /// A model served here (or no model named: the first).
    Served(&'a Model<H>),
    /// A model not served here, sent to this model's pool by load (`unknown_model`).
    Unknown(&'a Model<H>),
    /// A model not served here: the client error to answer with.
    NotFound(ApiError),
}

impl<H: Host> Models<H> {
    pub fn new(host: &Rc<H>, config: PluginConfig, vm_id: u64) -> Self {
        let list = config
            .models
            .iter()
            .map(|c| Model::new(host, c.clone(), vm_id))
            .collect();
        Models { config, list }
    }

    /// The model requests naming none go to, and that other paths are balanced over.
    pub fn default_model(&self) -> Option<&Model<H>> {
        self.list.first()
    }

    /// The model the request's `model` names.
    pub fn lookup(&self, model: Option<&str>) -> Lookup<'_, H> {
        match self.config.choose(model) {
            ModelChoice::Served(i) => self
                .list
                .get(i)
                .map_or_else(|| self.not_found(model), Lookup::Served),
            ModelChoice::Unknown(i) => self
                .list
                .get(i)
                .map_or_else(|| self.not_found(model), Lookup::Unknown),
            ModelChoice::Rejected => self.not_found(model),
        }
    }

    fn not_found(&self, model: Option<&str>) -> Lookup<'_, H> {
        let served: Vec<&str> = self
            .config
            .models
            .iter()
            .flat_map(|m| std::iter::once(&m.model_name).chain(&m.adapters))
            .map(String::as_str)
            .collect();
        Lookup::NotFound(ApiError::not_found(
            format!(
                "The model '{}' does not exist (served: '{}')",
                model.unwrap_or_default(),
                served.join("', '")
            ),
            Some("model"),
        ))
    }

    /// Names the model's Envoy cluster for the route, when there are several models (with
    /// one, the route has one cluster and no header is needed).
    pub fn set_route_cluster(&self, host: &H, model: &Model<H>) {
        if self.config.several {
            host.set_header(
                crate::host::Headers::Request,
                headers::ROUTE_CLUSTER,
                Some(&model.router.config.route_cluster),
            );
        }
    }

    /// The OpenAI `/v1/models` list of every model and adapter served (with several models
    /// no one pod can answer it): adapters name their base model as `parent`, as vLLM does.
    pub fn list_json(&self, created: u64) -> String {
        let mut data = Vec::new();
        for m in &self.config.models {
            let base = &m.model_name;
            let entry = |id: &str, parent: Option<&str>| {
                serde_json::json!({"id": id, "object": "model", "created": created,
                    "owned_by": "prefix-router", "root": base, "parent": parent})
            };
            data.push(entry(base, None));
            data.extend(m.aliases.iter().map(|a| entry(a, None)));
            data.extend(m.adapters.iter().map(|a| entry(a, Some(base))));
        }
        serde_json::json!({"object": "list", "data": data}).to_string()
    }
}
