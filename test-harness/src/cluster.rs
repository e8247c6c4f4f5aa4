//! A fleet on 127.0.0.1: N model-server pods and, optionally, Envoy with the filter in front.

use crate::envoy_config::{render, EnvoySettings};
use crate::paths;
use crate::process::{free_port, on_fresh_ports, wait_until, Proc};
use anyhow::{bail, Context};
use reqwest::blocking::Client;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Which server a pod runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodKind {
    /// This project's `model-server` (cache events, `x-inference-pod`, `vllm:*` metrics).
    ModelServer,
    /// llama.cpp's `llama-server` (health and `llamacpp:*` metrics only).
    LlamaCpp,
    /// vLLM (CPU build), its KV-cache events served by a `kv-events` sidecar.
    Vllm,
}

impl PodKind {
    /// The filter follows it by cache events (its own, or its sidecar's).
    pub fn has_events(self) -> bool {
        matches!(self, PodKind::ModelServer | PodKind::Vllm)
    }
}

/// One pod process.
pub struct Pod {
    pub name: String,
    pub kind: PodKind,
    /// `127.0.0.1:port`
    pub addr: String,
    pub proc: Proc,
    /// A vLLM pod's `kv-events` sidecar.
    pub sidecar: Option<Sidecar>,
}

/// The process that serves a pod's cache-events page beside it.
pub struct Sidecar {
    /// where the page is served (`127.0.0.1:port`)
    pub addr: String,
    pub proc: Proc,
}

impl Sidecar {
    /// Waits until its page is served (its pod answers and its events are subscribed to).
    fn serving(&mut self, http: &Client) -> anyhow::Result<()> {
        let page = format!("http://{}/health", self.addr);
        let name = self.proc.name.clone();
        wait_until(&name, &mut self.proc, Duration::from_secs(30), || {
            healthy(http, &page)
        })
    }
}

/// One Envoy process.
pub struct Envoy {
    pub listen_port: u16,
    pub admin_port: u16,
    pub config_path: PathBuf,
    pub proc: Proc,
    /// The filter is loaded and polls the pods' cache events.
    pub polls: bool,
}

impl Envoy {
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.listen_port, path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.admin_port, path)
    }
}

/// A fresh run directory for logs and rendered configs.
pub fn run_dir(name: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "prefix-router-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// An HTTP client with bounded timeouts.
pub fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(60))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_default()
}

fn healthy(http: &Client, url: &str) -> bool {
    http.get(url)
        .timeout(Duration::from_secs(2))
        .send()
        .is_ok_and(|r| r.status().is_success())
}

/// Polls `url` until it answers 2xx; false when `timeout` passes first (for a process the
/// caller started itself).
pub fn wait_healthy(url: &str, timeout: Duration) -> bool {
    let http = client();
    let deadline = std::time::Instant::now() + timeout;
    while !healthy(&http, url) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Starts `n` model-server pods named `pod-0..` with extra flags, and waits for health (all
/// start at once, then each is waited for).
pub fn start_pods(n: usize, extra_args: &[&str], dir: &Path) -> anyhow::Result<Vec<Pod>> {
    start_pods_of(PodKind::ModelServer, n, extra_args, dir)
}

/// [`start_pods`] for any kind of server.
pub fn start_pods_of(
    kind: PodKind,
    n: usize,
    extra_args: &[&str],
    dir: &Path,
) -> anyhow::Result<Vec<Pod>> {
    if kind == PodKind::ModelServer {
        let bin = paths::model_server_bin();
        if !bin.is_file() {
            bail!("{} not built (cargo build -p model-server)", bin.display());
        }
    }
    let http = client();
    on_fresh_ports("pods", || {
        // distinct ports: none is bound until the pods start, so the OS could hand one out
        // twice
        let mut ports: Vec<u16> = Vec::with_capacity(n);
        for _ in 0..n * 10 {
            if ports.len() == n {
                break;
            }
            let p = free_port()?;
            if !ports.contains(&p) {
                ports.push(p);
            }
        }
        if ports.len() < n {
            bail!("could not find {n} distinct free ports");
        }
        let mut starting = Vec::with_capacity(n);
        for (i, port) in ports.into_iter().enumerate() {
            starting.push(spawn_pod(kind, &format!("pod-{i}"), port, extra_args, dir)?);
        }
        starting.into_iter().map(|pod| pod.ready(&http)).collect()
    })
}

/// Starts one pod on `port` (used again to restart a pod on the same address).
pub fn start_pod(
    kind: PodKind,
    name: &str,
    port: u16,
    extra_args: &[&str],
    dir: &Path,
    http: &Client,
) -> anyhow::Result<Pod> {
    spawn_pod(kind, name, port, extra_args, dir)?.ready(http)
}

fn spawn_pod(
    kind: PodKind,
    name: &str,
    port: u16,
    extra_args: &[&str],
    dir: &Path,
) -> anyhow::Result<Pod> {
    let addr = format!("127.0.0.1:{port}");
    let cmd = match kind {
        PodKind::ModelServer => {
            let mut cmd = Command::new(paths::model_server_bin());
            cmd.args(["--listen", &addr, "--pod-name", name])
                .args(extra_args);
            cmd
        }
        PodKind::LlamaCpp => crate::llama::command(port, extra_args)?,
        PodKind::Vllm => {
            let sockets = crate::vllm::Sockets::in_dir(&dir.join(format!("{name}-kv")));
            std::fs::create_dir_all(dir.join(format!("{name}-kv")))?;
            let pod =
                Proc::spawn_group(name, crate::vllm::command(port, &sockets, extra_args)?, dir)?;
            let sidecar = Proc::spawn(
                &format!("{name}-kv-events"),
                crate::vllm::sidecar_command(port, &sockets, "127.0.0.1:0")?,
                dir,
            )?;
            return Ok(Pod {
                name: name.to_owned(),
                kind,
                addr,
                proc: pod,
                sidecar: Some(Sidecar {
                    addr: String::new(), // known once it has bound
                    proc: sidecar,
                }),
            });
        }
    };
    let proc = Proc::spawn(name, cmd, dir)?;
    Ok(Pod {
        name: name.to_owned(),
        kind,
        addr,
        proc,
        sidecar: None,
    })
}

impl Pod {
    /// Waits until the pod answers `/health`.
    fn ready(mut self, http: &Client) -> anyhow::Result<Pod> {
        let health = format!("http://{}/health", self.addr);
        let patience = match self.kind {
            PodKind::Vllm => Duration::from_secs(crate::vllm::READY_SECS),
            PodKind::ModelServer | PodKind::LlamaCpp => Duration::from_secs(30),
        };
        wait_until(&self.name, &mut self.proc, patience, || {
            healthy(http, &health)
        })?;
        if let Some(sidecar) = &mut self.sidecar {
            // its page is served once it has read the pod's /metrics
            let log = sidecar.proc.log.clone();
            let mut addr = String::new();
            wait_until(
                &sidecar.proc.name.clone(),
                &mut sidecar.proc,
                Duration::from_secs(30),
                || {
                    if addr.is_empty() {
                        addr = crate::vllm::sidecar_addr(&log).unwrap_or_default();
                    }
                    !addr.is_empty() && healthy(http, &format!("http://{addr}/health"))
                },
            )?;
            sidecar.addr = addr;
        }
        Ok(self)
    }

    /// The pod's port.
    pub fn port(&self) -> u16 {
        self.addr
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }

    /// Starts the server again on its address after it was killed (`proc.kill()`); a vLLM
    /// pod's sidecar, which kept running as a pod's other container would, is not touched.
    pub fn restart_server(
        &mut self,
        extra_args: &[&str],
        dir: &Path,
        http: &Client,
    ) -> anyhow::Result<()> {
        self.proc.kill();
        if self.kind != PodKind::Vllm {
            *self = start_pod(
                self.kind,
                &self.name.clone(),
                self.port(),
                extra_args,
                dir,
                http,
            )?;
            return Ok(());
        }
        let sockets = crate::vllm::Sockets::in_dir(&dir.join(format!("{}-kv", self.name)));
        self.proc = Proc::spawn_group(
            &self.name,
            crate::vllm::command(self.port(), &sockets, extra_args)?,
            dir,
        )?;
        let health = format!("http://{}/health", self.addr);
        let patience = Duration::from_secs(crate::vllm::READY_SECS);
        wait_until(&self.name.clone(), &mut self.proc, patience, || {
            healthy(http, &health)
        })?;
        match &mut self.sidecar {
            Some(s) => s.serving(http),
            None => Ok(()),
        }
    }

    /// Stops a vLLM pod's sidecar and starts a new one on the same address: a subscriber
    /// that missed every message in between.
    pub fn restart_sidecar(&mut self, dir: &Path, http: &Client) -> anyhow::Result<()> {
        let port = self.port();
        let Some(s) = &mut self.sidecar else {
            bail!("{} has no sidecar", self.name);
        };
        s.proc.kill();
        let sockets = crate::vllm::Sockets::in_dir(&dir.join(format!("{}-kv", self.name)));
        s.proc = Proc::spawn(
            &format!("{}-kv-events", self.name),
            crate::vllm::sidecar_command(port, &sockets, &s.addr)?,
            dir,
        )?;
        s.serving(http)
    }

    /// Stops a vLLM pod's sidecar alone.
    pub fn stop_sidecar(&mut self) {
        if let Some(s) = &mut self.sidecar {
            s.proc.kill();
        }
    }

    /// Where the filter reads this pod's cache events, when not from the pod itself.
    pub fn events_addr(&self) -> Option<&str> {
        self.sidecar.as_ref().map(|s| s.addr.as_str())
    }
}

/// `envoy --mode validate` on a rendered config.
pub fn validate_config(path: &Path) -> anyhow::Result<()> {
    let out = Command::new(paths::envoy_bin())
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(path)
        .output()
        .with_context(|| format!("running {}", paths::envoy_bin().display()))?;
    if !out.status.success() {
        bail!(
            "envoy --mode validate failed for {}:\n{}{}",
            path.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Renders a config for `pods`, validates it, starts Envoy (`--concurrency 2`), waits until
/// the admin endpoint says LIVE and the listener answers.
pub fn start_envoy(
    name: &str,
    pods: &[String],
    wasm: bool,
    tweak: impl FnOnce(&mut EnvoySettings),
    dir: &Path,
) -> anyhow::Result<Envoy> {
    launch_envoy(name, pods, wasm, tweak, dir, true)
}

/// [`start_envoy`] without `envoy --mode validate`, for the benchmarks: they start Envoy with
/// the same template the tests validate, and validating compiles the wasm module and loads
/// its tokenizer once more (about 3 s of a 2-core machine per start, a third of a short run).
pub fn start_envoy_unvalidated(
    name: &str,
    pods: &[String],
    wasm: bool,
    tweak: impl FnOnce(&mut EnvoySettings),
    dir: &Path,
) -> anyhow::Result<Envoy> {
    launch_envoy(name, pods, wasm, tweak, dir, false)
}

fn launch_envoy(
    name: &str,
    pods: &[String],
    wasm: bool,
    tweak: impl FnOnce(&mut EnvoySettings),
    dir: &Path,
    validate: bool,
) -> anyhow::Result<Envoy> {
    let wasm_path = paths::wasm_path();
    let mut settings = EnvoySettings::new(
        free_port()?,
        free_port()?,
        pods.to_vec(),
        wasm.then_some(wasm_path),
    );
    // the .wasm carries no vocabulary: Envoy serves it the installed model's files
    if wasm {
        settings.tokenizer_dir = Some(paths::default_model_dir());
    }
    settings.assets_port = free_port()?;
    tweak(&mut settings);
    if let Some(w) = settings.wasm.as_ref().filter(|w| !w.is_file()) {
        bail!(
            "{} not built (scripts/build-filter.sh [--full])",
            w.display()
        );
    }
    std::fs::create_dir_all(dir)?;
    let config_path = dir.join(format!("{name}.yaml"));
    let mut first = true;
    on_fresh_ports(name, || {
        let again = !std::mem::take(&mut first);
        if again {
            settings.listen_port = free_port()?;
            settings.admin_port = free_port()?;
            settings.assets_port = free_port()?;
        }
        std::fs::write(&config_path, render(&settings)?)?;
        // validated once: a retry differs only in its ports
        if validate && !again {
            validate_config(&config_path)?;
        }
        let mut cmd = Command::new(paths::envoy_bin());
        cmd.envs(settings.env.iter().map(|(k, v)| (k, v)));
        cmd.arg("-c").arg(&config_path).args([
            "--concurrency",
            "2",
            "--disable-hot-restart",
            "--log-level",
            "warn",
            "--component-log-level",
            "wasm:info",
        ]);
        let mut proc = Proc::spawn(name, cmd, dir)?;
        let http = client();
        let ready = format!("http://127.0.0.1:{}/ready", settings.admin_port);
        wait_until(name, &mut proc, Duration::from_secs(60), || {
            healthy(&http, &ready)
        })?;
        // this project's filter (not another .wasm a benchmark compares it with)
        let ours = [paths::wasm_path(), paths::full_wasm_path()];
        if settings.wasm.as_ref().is_some_and(|w| ours.contains(w)) {
            let models = settings.more_models.len() + 1;
            wait_until(name, &mut proc, Duration::from_secs(60), || {
                tokenizers_tried(&http, settings.admin_port, models)
            })?;
        }
        Ok(Envoy {
            listen_port: settings.listen_port,
            admin_port: settings.admin_port,
            config_path: config_path.clone(),
            proc,
            polls: wasm && settings.poll_interval_ms > 0,
        })
    })
}

/// Envoy's threads that run the filter, each in a VM of its own: the `--concurrency`
/// workers and the main thread.
const FILTER_VMS: usize = 3;

/// Whether every VM has loaded each model's tokenizer (fetched from the assets listener just
/// after start; requests are balanced by load until then) or has tried and failed, which
/// leaves the failure for the test to see. `models` tokenizers per VM.
pub fn tokenizers_tried(http: &Client, admin_port: u16, models: usize) -> bool {
    let Ok(text) = http
        .get(format!("http://127.0.0.1:{admin_port}/stats/prometheus"))
        .send()
        .and_then(|r| r.text())
    else {
        return false;
    };
    let stat = |name: &str| metric_value(&text, name).unwrap_or(0.0);
    let expected = (FILTER_VMS * models) as f64;
    stat("prefix_router_tokenizer_loads") >= expected
        || stat("prefix_router_tokenizer_load_failures") >= FILTER_VMS as f64
}

pub use crate::wire::metric_value;

/// A pod's metric, read from its `/metrics` (summed over label sets).
pub fn pod_metric(http: &Client, addr: &str, name: &str) -> anyhow::Result<f64> {
    let text = http.get(format!("http://{addr}/metrics")).send()?.text()?;
    metric_value(&text, name).with_context(|| format!("{name} not exposed by {addr}"))
}
