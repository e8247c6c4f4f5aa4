//! The Kubernetes manifests in `deploy/kubernetes/`: the part that is generated (each
//! overlay's `envoy.yaml`, rendered from `config-tool/envoy.yaml.j2`; kustomize's
//! `configMapGenerator` makes it a ConfigMap, as it does the rules and the dashboard in
//! `base/`), and reading a kustomization back as the documents it applies, for the offline
//! checks in `tests/kubernetes.rs`.
//!
//! Generated files are checked in, so `kubectl apply -k` needs nothing from this project;
//! `render-kubernetes` rewrites them, and a test fails when one is stale.

use crate::envoy_config::{render, EnvoySettings, Membership};
use crate::paths;
use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The namespace every manifest uses.
pub const NAMESPACE: &str = "prefix-router";
/// Where the Envoy Deployment's init containers put the filter and the model's tokenizer
/// files (which Envoy serves to the filter on a loopback listener).
pub const WASM_IN_POD: &str = "/etc/prefix-router/prefix_router_filter.wasm";
pub const MODEL_IN_POD: &str = "/etc/prefix-router/model";
/// Ports of the Envoy pod: inference, admin (127.0.0.1 only), stats (`/stats/prometheus`,
/// `/ready`).
pub const ENVOY_PORTS: (u16, u16, u16) = (10000, 9901, 9902);

/// The fleets with an overlay: directory under `deploy/kubernetes`, headless Service, port.
pub const FLEETS: [(&str, &str, u16); 3] = [
    ("model-server", "model-server", 8000),
    ("llama-cpp", "llama-server", 8080),
    ("vllm", "vllm", 8000),
];

/// The port of the `kv-events` sidecar in the vLLM overlay's pods (plugin `events.port`).
pub const EVENTS_PORT: u16 = 8100;

pub fn manifests_dir() -> PathBuf {
    paths::repo_root().join("deploy/kubernetes")
}

/// The Envoy settings of a fleet's overlay: its headless Service by DNS, listeners on the
/// pod's address, the stats listener for Prometheus and the readiness probe.
pub fn envoy_settings(service: &str, port: u16) -> EnvoySettings {
    let (listen, admin, stats) = ENVOY_PORTS;
    let pod = format!("{service}.{NAMESPACE}.svc.cluster.local:{port}");
    let mut s = EnvoySettings::new(listen, admin, vec![pod], Some(WASM_IN_POD.into()));
    s.membership = Membership::Dns;
    s.listen_address = "0.0.0.0".into();
    s.stats_port = Some(stats);
    s.debug_headers = false;
    s.tokenizer_dir = Some(MODEL_IN_POD.into());
    s.tokenizer_dir_remote = true;
    // below the Envoy container's 1 GiB limit (base/envoy.yaml), with room for the filter's
    // V8 memory, which is not on Envoy's heap: overload actions come before the OOM kill
    s.limits.max_heap_bytes = ENVOY_MAX_HEAP_BYTES;
    s
}

/// Envoy's heap limit in the overlays (its overload manager acts at 90 % and 95 %).
pub const ENVOY_MAX_HEAP_BYTES: u64 = 640 << 20;

/// Every generated file: path relative to the repository root, and content.
pub fn generated() -> anyhow::Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    for (dir, service, port) in FLEETS {
        let mut settings = envoy_settings(service, port);
        if dir == "vllm" {
            settings
                .extra
                .insert("events".into(), json!({ "port": EVENTS_PORT }));
        }
        let yaml = render(&settings)?;
        out.push((
            PathBuf::from(format!("deploy/kubernetes/{dir}/envoy.yaml")),
            format!(
                "# Rendered from config-tool/envoy.yaml.j2 by render-kubernetes: do not edit by hand.\n{yaml}"
            ),
        ));
    }
    // the example of another model on the vLLM fleet: the same pods, another model's name
    let mut settings = envoy_settings("vllm", 8000);
    settings.model_name = ANOTHER_MODEL.into();
    settings
        .extra
        .insert("events".into(), json!({ "port": EVENTS_PORT }));
    out.push((
        PathBuf::from("deploy/kubernetes/examples/another-model/envoy.yaml"),
        format!(
            "# Rendered from config-tool/envoy.yaml.j2 by render-kubernetes: do not edit by hand.\n{}",
            render(&settings)?
        ),
    ));
    // the example of pods behind mutual TLS: their sidecars' port, the certificates where the
    // gateway's Envoy mounts them, the name the pods' certificate carries
    let mut settings = envoy_settings("model-server", POD_TLS_PORT);
    let certs = std::path::Path::new(POD_TLS_IN_ENVOY);
    settings.pod_tls = Some(crate::envoy_config::PodTls {
        ca: certs.join("ca.crt"),
        sni: Some(POD_TLS_NAME.into()),
        cert: Some((certs.join("tls.crt"), certs.join("tls.key"))),
    });
    out.push((
        PathBuf::from("deploy/kubernetes/examples/pod-tls/envoy.yaml"),
        format!(
            "# Rendered from config-tool/envoy.yaml.j2 by render-kubernetes: do not edit by hand.\n{}",
            render(&settings)?
        ),
    ));
    Ok(out)
}

/// `deploy/kubernetes/examples/pod-tls`: the pods' TLS sidecar port, where the gateway's Envoy
/// mounts its client certificate and the CA, and the name the pods' certificate carries.
pub const POD_TLS_PORT: u16 = 8443;
pub const POD_TLS_IN_ENVOY: &str = "/etc/prefix-router/pod-tls";
pub const POD_TLS_NAME: &str = "model-server.prefix-router.svc";

/// The model of `deploy/kubernetes/examples/another-model`.
pub const ANOTHER_MODEL: &str = "Qwen2.5-0.5B-Instruct";

/// The example overlays under `deploy/kubernetes/examples/` (patches over a fleet's overlay,
/// read by kustomize itself: this check's reader reads no patches).
pub const EXAMPLES: [&str; 2] = ["another-model", "pod-tls"];

fn read(p: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Kustomization {
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    config_map_generator: Vec<Generator>,
    #[serde(default)]
    generator_options: GeneratorOptions,
}

/// A `configMapGenerator` entry: a ConfigMap of files (`key=path`, or `path` keyed by its
/// file name).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Generator {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    files: Vec<String>,
    #[serde(default)]
    options: GeneratorOptions,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct GeneratorOptions {
    #[serde(default)]
    labels: serde_json::Map<String, Value>,
}

/// One Kubernetes object of a kustomization, with the file it came from.
pub struct Object {
    pub file: PathBuf,
    pub doc: Value,
}

impl Object {
    pub fn kind(&self) -> &str {
        self.doc["kind"].as_str().unwrap_or("")
    }
    pub fn name(&self) -> &str {
        self.doc["metadata"]["name"].as_str().unwrap_or("")
    }
}

/// Every object `kubectl apply -k dir` would apply, for the subset of kustomize these
/// manifests use (`resources`: files and directories with their own kustomization, and
/// `namespace`, which must agree with each object's own). Anything else is refused, so the
/// check cannot silently read a kustomization differently from kustomize.
pub fn objects(dir: &Path) -> anyhow::Result<Vec<Object>> {
    let path = dir.join("kustomization.yaml");
    let text = read(&path)?;
    let raw: Value = serde_norway::from_str(&text).with_context(|| path.display().to_string())?;
    let known = [
        "apiVersion",
        "kind",
        "namespace",
        "resources",
        "configMapGenerator",
        "generatorOptions",
    ];
    if let Some(extra) = raw
        .as_object()
        .and_then(|o| o.keys().find(|k| !known.contains(&k.as_str())))
    {
        bail!(
            "{}: field '{extra}' is not read by this check",
            path.display()
        );
    }
    let k: Kustomization = serde_json::from_value(raw)?;
    let mut out = Vec::new();
    for r in &k.resources {
        let p = dir.join(r);
        if p.is_dir() {
            out.extend(objects(&p)?);
        } else {
            let text = read(&p)?;
            for d in serde_norway::Deserializer::from_str(&text) {
                let doc = Value::deserialize(d).with_context(|| p.display().to_string())?;
                if !doc.is_null() {
                    out.push(Object {
                        file: p.clone(),
                        doc,
                    });
                }
            }
        }
    }
    for g in &k.config_map_generator {
        let mut data = serde_json::Map::new();
        for f in &g.files {
            let (key, file) = f.split_once('=').unwrap_or((f.as_str(), f.as_str()));
            let key = Path::new(key)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or(key);
            data.insert(key.to_owned(), Value::from(read(&dir.join(file))?));
        }
        let mut labels = k.generator_options.labels.clone();
        labels.extend(g.options.labels.clone());
        // kustomize suffixes the name with a hash of the content and rewrites every
        // reference to it: read here under its own name, references unchanged
        let mut meta = json!({"name": g.name, "labels": labels});
        if let Some(ns) = g.namespace.as_ref().or(k.namespace.as_ref()) {
            meta["namespace"] = json!(ns);
        }
        out.push(Object {
            file: path.clone(),
            doc: json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}),
        });
    }
    if let Some(ns) = &k.namespace {
        for o in &out {
            let own = o.doc["metadata"]["namespace"].as_str();
            if o.kind() != "Namespace" && own != Some(ns) {
                bail!(
                    "{} {} in {}: namespace {own:?}, the kustomization sets '{ns}'",
                    o.kind(),
                    o.name(),
                    o.file.display()
                );
            }
        }
    }
    Ok(out)
}
