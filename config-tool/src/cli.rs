//! `render-envoy-config`: writes an Envoy config for a list of pods (nobody edits ports by
//! hand), from flags or a YAML file (`--config`, [`crate::file`]).
//!
//! `render-envoy-config --pods 127.0.0.1:8001,127.0.0.1:8002 --listen-port 10000 > envoy.yaml`
//! `render-envoy-config --pods model-server.default.svc.cluster.local:8000` (a DNS name: a
//! STRICT_DNS cluster, members followed by the filter through Envoy's admin)
//! `render-envoy-config --eds-file /etc/envoy/eds/pods.yaml` (an EDS cluster fed from a file)
//! `render-envoy-config --pods 127.0.0.1:8001 --add-model 'name=Qwen2.5-0.5B-Instruct
//! pods=127.0.0.1:9001 tokenizer-dir=models/qwen'` (two models, each its own pool)
//! `render-envoy-config --config gateway.yaml -o envoy.yaml` (everything in one file)

use crate::envoy::{
    all_addresses, configmap, render, EnvoySettings, ExtraModel, Limits, Membership, PodTls,
};
use crate::file::GatewayFile;
use clap::Parser;
use prefix_core::protocol::defaults;
use prefix_core::router_config::{DEFAULT_POLL_INTERVAL_MS, DEFAULT_TABLE_CAPACITY};
use std::path::PathBuf;

#[derive(Parser, Clone)]
#[command(
    version,
    about = "Writes the Envoy configuration for prefix-router in front of a list of pods: the \
             listener, the header scrubbing, the wasm filter with its plugin configuration \
             (validated exactly as the filter will), and the pod clusters."
)]
pub struct Args {
    /// The whole gateway in a YAML file (pools, weights, liveness, timeouts, TLS; see the
    /// README's configuration section). Only --wasm, --out and --configmap apply with it.
    #[arg(long, conflicts_with_all = ["pods", "eds_file", "add_model"])]
    config: Option<PathBuf>,
    /// Pods as ip:port (a fixed list), or name:port (resolved by Envoy: STRICT_DNS, e.g. a
    /// Kubernetes headless Service), comma-separated.
    #[arg(long, value_delimiter = ',', required_unless_present_any = ["eds_file", "config"])]
    pods: Vec<String>,
    /// Take the pods cluster's members from this EDS file instead (Envoy watches its
    /// directory; replace the file by renaming a new one over it).
    #[arg(long, conflicts_with = "pods")]
    eds_file: Option<PathBuf>,
    /// STRICT_DNS re-resolution period (Envoy duration, e.g. 5s).
    #[arg(long, default_value = "5s")]
    dns_refresh: String,
    /// Port of the inference listener.
    #[arg(long, default_value_t = 10000)]
    listen_port: u16,
    /// Address of the inference and stats listeners (0.0.0.0 in a Kubernetes pod). The admin
    /// always stays on 127.0.0.1.
    #[arg(long, default_value = "127.0.0.1")]
    listen_address: std::net::IpAddr,
    /// Also listen here for `/stats/prometheus` and `/ready` only (read from the admin), for
    /// Prometheus and readiness probes from outside the pod.
    #[arg(long)]
    stats_port: Option<u16>,
    /// Port of Envoy's admin interface (on 127.0.0.1; /stats/prometheus has the filter's metrics).
    #[arg(long, default_value_t = 9901)]
    admin_port: u16,
    /// The filter's .wasm (default: $PREFIX_ROUTER_WASM, else the install location
    /// ~/.local/share/prefix-router/prefix_router_filter.wasm, else this checkout's build).
    #[arg(long)]
    wasm: Option<PathBuf>,
    /// The model's directory (`tokenizer.json`, optional `tokenizer_config.json` and
    /// `chat_template.jinja`, as on the Hugging Face hub): Envoy serves the files on
    /// 127.0.0.1:--assets-port and the filter fetches them at start (the .wasm carries no
    /// vocabulary). Required for any model but the default, whose installed directory is
    /// found as --wasm is.
    #[arg(long)]
    tokenizer_dir: Option<PathBuf>,
    /// `--tokenizer-dir` exists only where Envoy runs (e.g. a Kubernetes pod's volume): not
    /// checked here, taken to hold both files.
    #[arg(long, requires = "tokenizer_dir")]
    tokenizer_dir_in_envoy: bool,
    /// Loopback port on which Envoy serves the tokenizer files.
    #[arg(long, default_value_t = 9903)]
    assets_port: u16,
    /// Render Envoy without the filter (plain round-robin).
    #[arg(long)]
    no_filter: bool,
    /// Tokens per block the router hashes: this project's servers' --block-size; a whole
    /// multiple of the pods' block size with a kv-events sidecar; otherwise the router's own.
    #[arg(long, default_value_t = defaults::BLOCK_SIZE)]
    block_size: u32,
    /// Served model name (seeds the block hashes, as the pods' --served-model-name).
    #[arg(long, default_value = defaults::MODEL_NAME)]
    model_name: String,
    /// LoRA adapter names the pods serve on top of the model (comma-separated): routed in
    /// the same pool, their prompts cached apart.
    #[arg(long, value_delimiter = ',')]
    adapters: Vec<String>,
    /// Other names the pods serve the model under (comma-separated; vLLM's several
    /// `--served-model-name`s after the first, which is --model-name): requests naming one
    /// are routed as the model's own.
    #[arg(long, value_delimiter = ',')]
    model_aliases: Vec<String>,
    /// Another model on the same listener, with its own pods (a cluster of their own),
    /// tokenizer and block size; repeatable. Space-separated key=value pairs:
    /// `name=Qwen2.5-0.5B-Instruct pods=10.0.0.7:8000,10.0.0.8:8000 tokenizer-dir=DIR
    /// block-size=16 adapters=a,b` (name and pods required; block size defaults to
    /// --block-size). The first model (--model-name, --pods) takes requests naming none.
    #[arg(long)]
    add_model: Vec<ExtraModel>,
    /// What requests naming a model that is not served get: `reject` (404, as a server
    /// would) or a served model's name (its pool answers them, balanced by load).
    #[arg(long)]
    unknown_model: Option<String>,
    /// Largest request body the filter buffers (413 beyond).
    #[arg(long, default_value_t = defaults::MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Add x-prefix-router-* debug response headers.
    #[arg(long)]
    debug_headers: bool,
    /// Entries of the filter's ownership table.
    #[arg(long, default_value_t = DEFAULT_TABLE_CAPACITY)]
    table_capacity: u64,
    /// Routing policy: prefix, round_robin, random, least_loaded.
    #[arg(long, default_value = "prefix")]
    policy: String,
    /// Pods whose cache events a `kv-events` sidecar serves (vLLM, SGLang): the sidecar's
    /// port on each pod's own address (Kubernetes: a container of the pod).
    #[arg(long)]
    events_port: Option<u16>,
    /// …or each pod's sidecar address, as `POD=SIDECAR` pairs (`127.0.0.1:8001=127.0.0.1:9001`).
    #[arg(long, value_delimiter = ',', value_parser = parse_pair)]
    events_addresses: Vec<(String, String)>,
    /// How often the filter polls pods for health, load and cache events (0 = never).
    #[arg(long, default_value_t = DEFAULT_POLL_INTERVAL_MS)]
    poll_interval_ms: u64,
    /// The pods require an API key (vLLM's `--api-key`): the filter's own polls carry
    /// `Authorization: Bearer <the value of this environment variable of Envoy's>`, passed to
    /// the filter and never written in the config. Clients send their own key as always.
    #[arg(long)]
    pod_api_key_env: Option<String>,
    /// TLS to the pods (requests and the filter's polls): the CA file (PEM) their certificates
    /// are checked against.
    #[arg(long)]
    pod_tls_ca: Option<PathBuf>,
    /// The name the pods' certificates must carry (a DNS SAN), also sent as SNI.
    #[arg(long, requires = "pod_tls_ca")]
    pod_tls_sni: Option<String>,
    /// A client certificate chain (PEM) for mutual TLS with the pods (with --pod-tls-key).
    #[arg(long, requires_all = ["pod_tls_ca", "pod_tls_key"])]
    pod_tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, requires = "pod_tls_cert")]
    pod_tls_key: Option<PathBuf>,
    /// Another path routed to the pods besides the built-in ones (completions, chat,
    /// responses, messages, models, embeddings, pooling, scoring), as PATH or PATH=KIND where
    /// KIND is the body the filter reads it as: completions, chat, responses, messages
    /// (routed by prefix) or balanced (only its model read); repeatable. Every other path is
    /// 404 at Envoy: the pods' metrics, cache events and tokenize endpoints are not public.
    #[arg(long = "inference-path")]
    inference_paths: Vec<String>,
    /// Longest answer, streamed ones included (Envoy duration; 0s, the default: no limit, so
    /// a long generation streams for as long as its tokens keep coming).
    #[arg(long, default_value = "0s")]
    route_timeout: String,
    /// An answer (or request) that sends nothing for this long is ended: a stalled pod, or a
    /// non-streamed answer that takes longer than this.
    #[arg(long, default_value = "300s")]
    stream_idle_timeout: String,
    /// A request (headers and body) must arrive within this (a body trickled in holds a
    /// connection no longer).
    #[arg(long, default_value = "60s")]
    request_timeout: String,
    /// Downstream connections open at once; more are refused.
    #[arg(long, default_value_t = 10_000)]
    max_connections: u64,
    /// Envoy's heap limit: at 90 % it returns memory, at 95 % it stops accepting requests.
    #[arg(long, default_value_t = 2 << 30)]
    max_heap_bytes: u64,
    /// Write a Kubernetes ConfigMap of this name holding the config as `envoy.yaml`.
    #[arg(long)]
    configmap: Option<String>,
    /// Write here instead of stdout.
    #[arg(long, short)]
    out: Option<PathBuf>,
}

/// Renders what the command line (or its `--config` file) describes, to `--out` or stdout.
pub fn run(a: Args) -> anyhow::Result<()> {
    // the filter to load: none without it, else the one named, else the installed one
    let wasm = |no_filter: bool, named: Option<PathBuf>| -> anyhow::Result<Option<PathBuf>> {
        match (no_filter, named) {
            (true, _) => Ok(None),
            (false, Some(w)) => Ok(Some(w)),
            (false, None) => crate::install::default_wasm(|k| std::env::var(k).ok()).map(Some),
        }
    };
    let s = match &a.config {
        Some(path) => {
            let file = GatewayFile::read(path)?;
            let w = wasm(file.no_filter(), a.wasm.clone().or(file.wasm()))?;
            file.settings(w)?
        }
        None => settings(a.clone(), wasm(a.no_filter, a.wasm.clone())?)?,
    };
    let mut yaml = render(&s)?;
    if let Some(name) = &a.configmap {
        yaml = configmap(name, &yaml)?;
    }
    match &a.out {
        Some(p) => std::fs::write(p, yaml)?,
        None => print!("{yaml}"),
    }
    Ok(())
}

/// The settings the flags describe.
fn settings(a: Args, wasm: Option<PathBuf>) -> anyhow::Result<EnvoySettings> {
    let membership = match (&a.eds_file, all_addresses(&a.pods)) {
        (Some(path), _) => Membership::EdsFile(std::path::absolute(path)?),
        (None, true) => Membership::Static,
        (None, false) => Membership::Dns,
    };
    let mut s = EnvoySettings::new(a.listen_port, a.admin_port, a.pods, wasm);
    s.membership = membership;
    s.dns_refresh = a.dns_refresh;
    s.block_size = a.block_size;
    s.model_name = a.model_name;
    s.max_body_bytes = a.max_body_bytes;
    s.debug_headers = a.debug_headers;
    s.table_capacity = a.table_capacity;
    s.policy = a.policy;
    s.poll_interval_ms = a.poll_interval_ms;
    s.listen_address = a.listen_address.to_string();
    s.stats_port = a.stats_port;
    s.tokenizer_dir = match a.tokenizer_dir {
        Some(d) => Some(d),
        None => {
            crate::install::tokenizer_dir_for(s.wasm.is_some(), &s.model_name, "--tokenizer-dir")?
        }
    };
    s.tokenizer_dir_remote = a.tokenizer_dir_in_envoy;
    s.adapters = a.adapters;
    s.aliases = a.model_aliases;
    s.more_models = a.add_model;
    if let Some(u) = a.unknown_model {
        s.extra.insert("unknown_model".into(), serde_json::json!(u));
    }
    if a.events_port.is_some() || !a.events_addresses.is_empty() {
        let addresses: serde_json::Map<String, serde_json::Value> = a
            .events_addresses
            .into_iter()
            .map(|(pod, sidecar)| (pod, sidecar.into()))
            .collect();
        s.extra.insert(
            "events".into(),
            serde_json::json!({"port": a.events_port, "addresses": addresses}),
        );
    }
    s.assets_port = a.assets_port;
    s.extra_api_paths = a
        .inference_paths
        .into_iter()
        .map(|p| match p.split_once('=') {
            Some((path, kind)) => (path.to_owned(), Some(kind.to_owned())),
            None => (p, None),
        })
        .collect();
    s.pod_api_key_env = a.pod_api_key_env;
    s.pod_tls = a.pod_tls_ca.map(|ca| PodTls {
        ca,
        sni: a.pod_tls_sni,
        cert: a.pod_tls_cert.zip(a.pod_tls_key),
    });
    s.limits = Limits {
        route_timeout: a.route_timeout,
        stream_idle_timeout: a.stream_idle_timeout,
        request_timeout: a.request_timeout,
        max_connections: a.max_connections,
        max_heap_bytes: a.max_heap_bytes,
    };
    Ok(s)
}

/// `POD=SIDECAR`.
fn parse_pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .ok_or_else(|| format!("'{s}' is not POD=SIDECAR"))
}
