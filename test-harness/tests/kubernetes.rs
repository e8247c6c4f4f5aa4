//! The Kubernetes manifests (`deploy/kubernetes`), checked with no cluster and no network:
//! every object against the Kubernetes OpenAPI schemas (strict: unknown fields fail), the
//! objects against each other (selectors, ConfigMaps, ports, probes, mount paths), every
//! Envoy configuration inside through `envoy --mode validate` with the real filter, and the
//! Prometheus configuration and rules through `promtool`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use test_harness::cluster::validate_config;
use test_harness::kubernetes::{
    generated, manifests_dir, objects, Object, ANOTHER_MODEL, ENVOY_PORTS, EXAMPLES, FLEETS,
    MODEL_IN_POD, POD_TLS_IN_ENVOY, POD_TLS_NAME, POD_TLS_PORT, WASM_IN_POD,
};
use test_harness::paths;

/// The Kubernetes version the manifests are checked against.
const KUBERNETES: &str = "1.33.0";

fn fleet_objects(dir: &str) -> Vec<Object> {
    objects(&manifests_dir().join(dir)).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = test_harness::cluster::run_dir(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs kubernetes-validate on these objects; Err with its report when one fails.
fn schema_check(objs: &[&Value], dir: &Path) -> Result<(), String> {
    let file = dir.join("objects.yaml");
    let text: Vec<String> = objs
        .iter()
        .map(|o| serde_json::to_string_pretty(o).unwrap())
        .collect();
    std::fs::write(&file, text.join("\n---\n")).unwrap();
    let out = Command::new(paths::kubernetes_validate_bin())
        .args(["--strict", "--quiet", "-k", KUBERNETES])
        .arg(&file)
        .output()
        .expect("kubernetes-validate (scripts/setup.sh installs it into .venv)");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// What `kubectl kustomize dir` builds, as documents.
fn kustomize(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_norway::Deserializer::from_slice(&out.stdout)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
        .collect()
}

fn configmap_file<'a>(objs: &'a [Object], name: &str, key: &str) -> &'a str {
    objs.iter()
        .find(|o| o.kind() == "ConfigMap" && o.name() == name)
        .unwrap_or_else(|| panic!("no ConfigMap {name}"))
        .doc["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("ConfigMap {name} has no {key}"))
}

#[test]
fn generated_files_are_current() {
    for (rel, content) in generated().unwrap() {
        let on_disk = std::fs::read_to_string(paths::repo_root().join(&rel)).unwrap_or_default();
        assert!(
            on_disk == content,
            "{} is stale: run target/debug/render-kubernetes",
            rel.display()
        );
    }
}

#[test]
fn every_object_passes_the_kubernetes_schemas() {
    let dir = tmp("k8s-schemas");
    for (fleet, _, _) in FLEETS {
        let objs = fleet_objects(fleet);
        assert!(objs.len() >= 10, "{fleet}: {} objects", objs.len());
        let docs: Vec<&Value> = objs.iter().map(|o| &o.doc).collect();
        if let Err(report) = schema_check(&docs, &dir) {
            panic!("{fleet}: {report}");
        }
    }
    // the check can fail: a misspelt probe and a port given as a word are refused
    let mut bad = fleet_objects("model-server")
        .into_iter()
        .find(|o| o.kind() == "Deployment" && o.name() == "model-server")
        .unwrap()
        .doc;
    let c = &mut bad["spec"]["template"]["spec"]["containers"][0];
    c["readinesProbe"] = c["readinessProbe"].take();
    assert!(schema_check(&[&bad], &dir)
        .unwrap_err()
        .contains("readinesProbe"));
}

/// Labels of a pod template, as `k=v` strings.
fn labels(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_objects_fit_together() {
    for (fleet, service, port) in FLEETS {
        let objs = fleet_objects(fleet);
        let of = |kind: &'static str| objs.iter().filter(move |o| o.kind() == kind);
        let configmaps: BTreeSet<&str> = of("ConfigMap").map(|o| o.name()).collect();
        for d in of("Deployment") {
            let spec = &d.doc["spec"];
            let pod = &spec["template"]["spec"];
            let tpl = labels(&spec["template"]["metadata"]["labels"]);
            assert!(
                labels(&spec["selector"]["matchLabels"]).is_subset(&tpl),
                "{fleet}: {} selector does not select its pods",
                d.name()
            );
            // hardened: the runtime's default seccomp profile, no floating image tags
            assert_eq!(
                pod["securityContext"]["seccompProfile"]["type"],
                "RuntimeDefault",
                "{fleet}: {}",
                d.name()
            );
            for c in pod["containers"]
                .as_array()
                .into_iter()
                .chain(pod["initContainers"].as_array())
                .flatten()
            {
                let image = c["image"].as_str().unwrap();
                let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
                assert!(
                    tag.chars().any(|ch| ch.is_ascii_digit()) && tag != "latest",
                    "{fleet}: {} image {image} is not pinned to a version",
                    d.name()
                );
            }
            // every ConfigMap volume exists; every mount names a volume
            let volumes: Vec<&Value> = pod["volumes"].as_array().into_iter().flatten().collect();
            for v in &volumes {
                if let Some(cm) = v["configMap"]["name"].as_str() {
                    assert!(configmaps.contains(cm), "{fleet}: no ConfigMap {cm}");
                }
            }
            let containers = pod["containers"]
                .as_array()
                .into_iter()
                .chain(pod["initContainers"].as_array())
                .flatten();
            for c in containers {
                let ports: BTreeSet<String> = c["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|p| [p["name"].to_string(), p["containerPort"].to_string()])
                    .collect();
                for m in c["volumeMounts"].as_array().into_iter().flatten() {
                    assert!(
                        volumes.iter().any(|v| v["name"] == m["name"]),
                        "{fleet}: mount {} has no volume",
                        m["name"]
                    );
                }
                for probe in ["readinessProbe", "livenessProbe"] {
                    let p = &c[probe];
                    let port = p["httpGet"]["port"]
                        .as_str()
                        .map(|s| format!("\"{s}\""))
                        .or_else(|| p["httpGet"]["port"].as_u64().map(|n| n.to_string()))
                        .or_else(|| p["tcpSocket"]["port"].as_str().map(|s| format!("\"{s}\"")));
                    if let Some(port) = port {
                        assert!(
                            ports.contains(&port),
                            "{fleet}: {} {probe} port {port}",
                            d.name()
                        );
                    }
                }
            }
            // a scraped pod's annotated port is one of its container ports
            let ann = &spec["template"]["metadata"]["annotations"];
            if ann["prometheus.io/scrape"] == "true" {
                let port: u64 = ann["prometheus.io/port"].as_str().unwrap().parse().unwrap();
                assert!(
                    pod["containers"][0]["ports"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p["containerPort"] == port),
                    "{fleet}: {} scrape port {port}",
                    d.name()
                );
            }
        }
        // every Service selects some Deployment's pods
        for s in of("Service") {
            let sel = labels(&s.doc["spec"]["selector"]);
            assert!(
                of("Deployment")
                    .any(|d| sel
                        .is_subset(&labels(&d.doc["spec"]["template"]["metadata"]["labels"]))),
                "{fleet}: Service {} selects nothing",
                s.name()
            );
        }
        // the fleet: a headless Service on its port, pods ready only once /health answers
        let headless = of("Service").find(|s| s.name() == service).unwrap();
        assert_eq!(headless.doc["spec"]["clusterIP"], "None", "{fleet}");
        assert_eq!(headless.doc["spec"]["ports"][0]["port"], port, "{fleet}");
        let pods = of("Deployment").find(|d| d.name() == service).unwrap();
        let c = &pods.doc["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/health", "{fleet}");
        // a slow model load is not killed: liveness starts after the startup probe
        assert_eq!(c["startupProbe"]["httpGet"]["path"], "/health", "{fleet}");
        // only Envoy and Prometheus reach the pods' port (metrics, events, tokenize)
        let pod_labels = labels(&pods.doc["spec"]["template"]["metadata"]["labels"]);
        let policy = of("NetworkPolicy")
            .find(|n| labels(&n.doc["spec"]["podSelector"]["matchLabels"]).is_subset(&pod_labels))
            .unwrap_or_else(|| panic!("{fleet}: no NetworkPolicy selects the pods"));
        let from: BTreeSet<String> = policy.doc["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|rule| rule["from"].as_array().unwrap().iter())
            .map(|peer| {
                labels(&peer["podSelector"]["matchLabels"])
                    .into_iter()
                    .collect()
            })
            .collect();
        let allowed: BTreeSet<String> = ["envoy", "prometheus"]
            .iter()
            .map(|n| format!("app.kubernetes.io/name={n}"))
            .collect();
        assert_eq!(from, allowed, "{fleet}: who reaches the pods");
        // Envoy: config and filter where its arguments and the config expect them
        let envoy = of("Deployment").find(|d| d.name() == "envoy").unwrap();
        let pod = &envoy.doc["spec"]["template"]["spec"];
        let mounts = &pod["containers"][0]["volumeMounts"];
        let mount_of = |vol: &str| {
            mounts
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == vol)
                .and_then(|m| m["mountPath"].as_str())
                .unwrap()
                .to_owned()
        };
        let args: Vec<&str> = pod["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(args
            .windows(2)
            .any(|w| w == ["-c", &format!("{}/envoy.yaml", mount_of("config"))]));
        assert_eq!(
            Path::new(WASM_IN_POD).parent().unwrap(),
            Path::new(&mount_of("wasm"))
        );
        // an init container writes the model's files under that mount
        let inits = pod["initContainers"].to_string();
        let in_init = MODEL_IN_POD.replace(&mount_of("wasm"), "/wasm");
        assert!(inits.contains(&format!("{in_init}/")), "{inits}");
        let config = configmap_file(&objs, "envoy-config", "envoy.yaml");
        // the overload manager acts before the container's memory limit is reached
        let limit = pod["containers"][0]["resources"]["limits"]["memory"]
            .as_str()
            .unwrap();
        let limit_bytes: u64 = match limit.strip_suffix("Gi") {
            Some(g) => g.parse::<u64>().unwrap() << 30,
            None => limit.strip_suffix("Mi").unwrap().parse::<u64>().unwrap() << 20,
        };
        let heap = test_harness::kubernetes::ENVOY_MAX_HEAP_BYTES;
        assert!(
            config.contains(&format!("max_heap_size_bytes: {heap}")),
            "{fleet}"
        );
        assert!(
            heap * 4 <= limit_bytes * 3,
            "{fleet}: heap {heap} vs limit {limit}"
        );
        let (listen, _, stats) = ENVOY_PORTS;
        assert!(config.contains(&format!(
            "address: \"{service}.prefix-router.svc.cluster.local\", port_value: {port}"
        )));
        for p in [listen, stats] {
            assert!(config.contains(&format!("port_value: {p}")));
        }
        // Prometheus reads the rules where they are mounted
        let prom = of("Deployment").find(|d| d.name() == "prometheus").unwrap();
        let rules_at = prom.doc["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "rules")
            .unwrap()["mountPath"]
            .as_str()
            .unwrap()
            .to_owned();
        let prom_cfg = configmap_file(&objs, "prometheus-config", "prometheus.yml");
        assert!(
            prom_cfg.contains(&format!("- {rules_at}/*.yml")),
            "{prom_cfg}"
        );
    }
}

#[test]
fn the_envoy_configurations_pass_envoy_validate() {
    let wasm = paths::wasm_path();
    assert!(wasm.is_file(), "scripts/build-filter.sh");
    let dir = tmp("k8s-envoy");
    for (fleet, _, _) in FLEETS {
        let objs = fleet_objects(fleet);
        let config = configmap_file(&objs, "envoy-config", "envoy.yaml");
        assert!(config.contains(WASM_IN_POD));
        // the filter and the model's files are where the init containers put them in the pod;
        // here, the built filter and the installed model
        assert!(config.contains(&format!("{MODEL_IN_POD}/tokenizer.json")));
        let model = test_harness::paths::default_model_dir();
        let local = config
            .replace(WASM_IN_POD, &wasm.display().to_string())
            .replace(MODEL_IN_POD, &model.display().to_string());
        let path = dir.join(format!("{fleet}-envoy.yaml"));
        std::fs::write(&path, local).unwrap();
        validate_config(&path).unwrap();
    }
}

#[test]
fn the_prometheus_configuration_and_rules_pass_promtool() {
    let dir = tmp("k8s-promtool");
    let objs = fleet_objects("model-server");
    let cfg = dir.join("prometheus.yml");
    // Debian's Prometheus is built without Kubernetes service discovery: swap it for a static
    // target, and let promtool check everything else (relabelling, rule files, globals)
    let text = configmap_file(&objs, "prometheus-config", "prometheus.yml");
    let mut doc: Value = serde_norway::from_str(text).unwrap();
    for job in doc["scrape_configs"].as_array_mut().unwrap() {
        let job = job.as_object_mut().unwrap();
        let sd = job.remove("kubernetes_sd_configs").unwrap();
        assert_eq!(sd[0]["role"], "pod");
        job.insert(
            "static_configs".into(),
            serde_json::json!([{"targets": ["127.0.0.1:1"]}]),
        );
    }
    std::fs::write(&cfg, serde_norway::to_string(&doc).unwrap()).unwrap();
    let rules = dir.join("prefix-router.yml");
    std::fs::write(
        &rules,
        configmap_file(&objs, "prometheus-rules", "prefix-router.yml"),
    )
    .unwrap();
    for args in [["check", "config"], ["check", "rules"]] {
        let file = if args[1] == "config" { &cfg } else { &rules };
        let out = Command::new(paths::promtool_bin())
            .args(args)
            .arg(file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Where kubectl is installed, its kustomize must read the overlays as this check does.
#[test]
fn kubectl_kustomize_agrees_where_installed() {
    let Ok(out) = Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
    else {
        eprintln!("kubectl not installed: the overlays are read by this check's own reader only");
        return;
    };
    assert!(out.status.success());
    let generated_maps = [
        "envoy-config",
        "prometheus-rules",
        "grafana-dashboard-prefix-router",
    ];
    for (fleet, _, _) in FLEETS {
        let theirs: BTreeSet<(String, String)> = kustomize(&manifests_dir().join(fleet))
            .into_iter()
            .map(|v| {
                let name = v["metadata"]["name"].as_str().unwrap().to_owned();
                // a generated ConfigMap's name carries a hash of its content, which
                // kustomize also writes into every reference to it
                let name = match (v["kind"].as_str(), name.rsplit_once('-')) {
                    (Some("ConfigMap"), Some((base, hash)))
                        if hash.len() == 10 && generated_maps.contains(&base) =>
                    {
                        base.to_owned()
                    }
                    _ => name,
                };
                (v["kind"].to_string(), Value::from(name).to_string())
            })
            .collect();
        let ours: BTreeSet<(String, String)> = fleet_objects(fleet)
            .iter()
            .map(|o| {
                (
                    o.doc["kind"].to_string(),
                    o.doc["metadata"]["name"].to_string(),
                )
            })
            .collect();
        assert_eq!(theirs, ours, "{fleet}");
    }
}

/// The vLLM overlay: each pod's sidecar serves its events on the port the filter asks, reads
/// them from sockets in a volume it shares with vLLM, and hashes with the router's model and
/// block size.
#[test]
fn the_vllm_sidecar_serves_what_the_filter_asks_for() {
    let objs = fleet_objects("vllm");
    let pods = objs
        .iter()
        .find(|o| o.kind() == "Deployment" && o.name() == "vllm")
        .unwrap();
    let containers = pods.doc["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    let by_name = |n: &str| containers.iter().find(|c| c["name"] == n).unwrap();
    let (vllm, sidecar) = (by_name("vllm"), by_name("kv-events"));
    let args = |c: &Value| -> Vec<String> {
        c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect()
    };
    let flag = |c: &Value, f: &str| {
        let a = args(c);
        let i = a
            .iter()
            .position(|x| x == f)
            .unwrap_or_else(|| panic!("no {f}"));
        a[i + 1].clone()
    };
    // the filter asks each pod's address on the events port, which the sidecar listens on
    let port = test_harness::kubernetes::EVENTS_PORT;
    let config = configmap_file(&objs, "envoy-config", "envoy.yaml");
    assert!(
        config.contains(&format!("\\\"events\\\":{{\\\"port\\\":{port}}}")),
        "{config}"
    );
    assert_eq!(flag(sidecar, "--listen"), format!("0.0.0.0:{port}"));
    assert_eq!(sidecar["ports"][0]["containerPort"], port);
    // vLLM publishes where the sidecar subscribes, in a volume both mount at the same path
    let events: Value = serde_json::from_str(&flag(vllm, "--kv-events-config")).unwrap();
    assert_eq!(
        events["endpoint"].as_str().unwrap(),
        flag(sidecar, "--events")
    );
    assert_eq!(
        events["replay_endpoint"].as_str().unwrap(),
        flag(sidecar, "--replay")
    );
    let dir = Path::new(flag(sidecar, "--events").trim_start_matches("ipc://"))
        .parent()
        .unwrap()
        .to_owned();
    for c in [vllm, sidecar] {
        assert!(
            c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["name"] == "kv-events"
                    && Path::new(m["mountPath"].as_str().unwrap()) == dir),
            "{} does not mount {}",
            c["name"],
            dir.display()
        );
    }
    // the sidecar names the model as the router does, and asks vLLM on its own port
    assert_eq!(flag(vllm, "--served-model-name"), flag(sidecar, "--model"));
    assert!(config.contains(&format!(
        "\\\"model_name\\\":\\\"{}\\\"",
        flag(sidecar, "--model")
    )));
    assert_eq!(
        flag(sidecar, "--pod"),
        format!("http://127.0.0.1:{}", flag(vllm, "--port"))
    );
}

/// The images the manifests run are built by `scripts/build-images.sh` from a Containerfile
/// each, whose every `COPY` source is let into the build context by `.containerignore` (which
/// lets in nothing else: no `target/` whole, no `.venv/`).
#[test]
fn every_image_is_built_from_what_its_context_sends() {
    let root = paths::repo_root();
    let ignore = std::fs::read_to_string(root.join(".containerignore")).unwrap();
    let rules: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        rules.first(),
        Some(&"*"),
        "everything out, then each file let in"
    );
    let sent = |path: &str| rules.iter().any(|r| r.strip_prefix('!') == Some(path));
    for path in ["target/debug/model-server", ".venv/bin/envoy", "target"] {
        assert!(!sent(path), "{path} is kept out of the context");
    }
    let script = std::fs::read_to_string(root.join("scripts/build-images.sh")).unwrap();
    let mut images = BTreeSet::new();
    for fleet in ["base", "model-server", "llama-cpp", "vllm"] {
        for e in std::fs::read_dir(manifests_dir().join(fleet)).unwrap() {
            let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
            for line in text.lines() {
                if let Some(img) = line.trim().strip_prefix("image: prefix-router/") {
                    images.insert(img.split(':').next().unwrap().to_owned());
                }
            }
        }
    }
    assert_eq!(images.len(), 3, "{images:?}");
    for image in &images {
        let file = root.join(format!("deploy/images/{image}.Containerfile"));
        let text = std::fs::read_to_string(&file).unwrap_or_else(|_| panic!("{file:?}"));
        assert!(script.contains("for image in filter model-server kv-events"));
        assert!(
            script.contains(image.as_str()),
            "build-images.sh builds {image}"
        );
        // COPY lines, continuation lines joined; the last word is the destination
        let joined = text.replace("\\\n", " ");
        for line in joined.lines().filter(|l| l.starts_with("COPY ")) {
            let words: Vec<&str> = line.split_whitespace().skip(1).collect();
            assert!(
                !words.iter().any(|w| w.starts_with("--from")),
                "{image}: built on the host"
            );
            for src in &words[..words.len() - 1] {
                assert!(sent(src), "{image}: COPY {src} is not let into the context");
            }
        }
    }
}

/// The example overlays (patches over a fleet, read by kustomize itself) build and pass the
/// schemas; each agrees with itself where it must (below); every Envoy configuration in them
/// passes Envoy's validation like the fleets' own.
#[test]
fn the_example_overlays_hold_together_where_kubectl_is_installed() {
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        eprintln!("kubectl not installed: the examples need kustomize's patches to be read");
        return;
    }
    let dir = tmp("k8s-examples");
    for example in EXAMPLES {
        let docs = kustomize(&manifests_dir().join("examples").join(example));
        schema_check(&docs.iter().collect::<Vec<_>>(), &dir).unwrap();
        let built = Built { example, docs };
        match example {
            "another-model" => another_model(&built, &dir),
            "pod-tls" => pod_tls(&built, &dir),
            other => panic!("no check for the example {other}"),
        }
    }
}

/// One example as kustomize builds it.
struct Built {
    example: &'static str,
    docs: Vec<Value>,
}

impl Built {
    fn object(&self, kind: &str, name: &str) -> &Value {
        self.docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{}: no {kind} {name}", self.example))
    }

    fn pod_spec(&self, deployment: &str) -> &Value {
        &self.object("Deployment", deployment)["spec"]["template"]["spec"]
    }

    fn container(&self, deployment: &str, name: &str) -> &Value {
        self.pod_spec(deployment)["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{}: no container {name}", self.example))
    }

    /// A generated ConfigMap's file (its name carries a hash).
    fn generated_file(&self, name: &str, key: &str) -> &str {
        let prefix = format!("{name}-");
        self.docs
            .iter()
            .find(|d| {
                d["kind"] == "ConfigMap"
                    && d["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with(&prefix) && n.len() == prefix.len() + 10)
            })
            .unwrap_or_else(|| panic!("{}: no ConfigMap {name}", self.example))["data"][key]
            .as_str()
            .unwrap()
    }
}

/// Envoy validates `config` once the pod's paths are this machine's (`from` → `to`).
fn validate_with(config: &str, subst: &[(&str, String)], path: &Path) {
    let mut local = config.to_owned();
    for (from, to) in subst {
        local = local.replace(from, to);
    }
    std::fs::write(path, local).unwrap();
    validate_config(path).unwrap();
}

/// Three places agree on the model: the name the pods serve, the name their sidecar hashes
/// under, and the filter's `model_name`; the init container fetches that model's files.
fn another_model(b: &Built, dir: &Path) {
    let arg_after = |container: &str, flag: &str| -> String {
        let args = b.container("vllm", container)["args"].as_array().unwrap();
        let at = args.iter().position(|a| a == flag).unwrap();
        args[at + 1].as_str().unwrap().to_owned()
    };
    let served = arg_after("vllm", "--served-model-name");
    assert_eq!(served, ANOTHER_MODEL);
    assert_eq!(
        arg_after("kv-events", "--model"),
        served,
        "the sidecar's hashes"
    );
    let config = b.generated_file("envoy-config", "envoy.yaml");
    assert!(
        config.contains(&format!(r#"\"model_name\":\"{served}\""#)),
        "the filter's model_name"
    );
    let init = &b.pod_spec("envoy")["initContainers"];
    assert!(init.to_string().contains("Qwen/Qwen2.5-0.5B-Instruct"));
    let subst = [
        (WASM_IN_POD, paths::wasm_path().display().to_string()),
        (
            MODEL_IN_POD,
            paths::repo_root()
                .join("data/tokenizers/qwen2.5")
                .display()
                .to_string(),
        ),
    ];
    validate_with(config, &subst, &dir.join("another-model-envoy.yaml"));
}

/// The gateway reaches the pods' TLS sidecar port and nothing else of theirs; its
/// certificates are where its configuration names them; the sidecar's are where its own
/// configuration names them; both configurations validate with real certificates.
fn pod_tls(b: &Built, dir: &Path) {
    let sidecar = b.container("model-server", "tls");
    assert_eq!(sidecar["ports"][0]["containerPort"], POD_TLS_PORT);
    let service_ports = &b.object("Service", "model-server")["spec"]["ports"];
    assert!(service_ports
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["port"] == POD_TLS_PORT));
    let policy = &b.object("NetworkPolicy", "model-server")["spec"]["ingress"];
    for rule in policy.as_array().unwrap() {
        let from = rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"].clone();
        let port = rule["ports"][0]["port"].clone();
        match from.as_str() {
            Some("envoy") => assert_eq!(port, POD_TLS_PORT, "Envoy reaches only the TLS port"),
            Some("prometheus") => assert_eq!(port, 8000),
            other => panic!("unexpected ingress from {other:?}"),
        }
    }
    let mount = |deployment: &str, container: &str, volume: &str| -> String {
        let c = b.container(deployment, container);
        let m = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == volume);
        m.unwrap_or_else(|| panic!("{container} mounts no {volume}"))["mountPath"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(mount("envoy", "envoy", "pod-tls"), POD_TLS_IN_ENVOY);
    let gateway = b.generated_file("envoy-config", "envoy.yaml");
    assert!(gateway.contains(&format!("{POD_TLS_IN_ENVOY}/tls.crt")));
    assert!(gateway.contains(&format!("port_value: {POD_TLS_PORT}")));
    assert!(gateway.contains(POD_TLS_NAME));
    let own = b.generated_file("pod-tls-sidecar", "envoy.yaml");
    let certs = mount("model-server", "tls", "tls-certificates");
    assert!(own.contains(&format!("{certs}/tls.crt")));
    assert_eq!(mount("model-server", "tls", "tls-config"), "/etc/envoy");
    // real certificates where the pods would have them (the names each side mounts)
    let pki = dir.join("pki");
    test_harness::pki::certificates(&pki, POD_TLS_NAME).unwrap();
    for ext in ["crt", "key"] {
        std::fs::copy(
            pki.join(format!("client.{ext}")),
            pki.join(format!("tls.{ext}")),
        )
        .unwrap();
    }
    let pki_path = pki.display().to_string();
    let subst = [
        (WASM_IN_POD, paths::wasm_path().display().to_string()),
        (
            MODEL_IN_POD,
            test_harness::paths::default_model_dir()
                .display()
                .to_string(),
        ),
        (POD_TLS_IN_ENVOY, pki_path.clone()),
    ];
    validate_with(gateway, &subst, &dir.join("pod-tls-envoy.yaml"));
    validate_with(
        own,
        &[(certs.as_str(), pki_path)],
        &dir.join("pod-tls-sidecar.yaml"),
    );
}
