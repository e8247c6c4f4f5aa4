//! A real Prometheus (Debian package) on 127.0.0.1, scraping the pods (and Envoy) every second.

use crate::cluster::client;
use crate::paths;
use crate::process::{free_port, on_fresh_ports, wait_until, Proc};
use anyhow::{bail, Context};
use reqwest::blocking::Client;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

pub struct Prometheus {
    pub port: u16,
    pub proc: Proc,
    http: Client,
}

/// One series of an instant-query result: its labels and value.
pub type Sample = (BTreeMap<String, String>, f64);

/// The scrape configuration: every pod target is labelled `pod` with its address, as the
/// Kubernetes one labels it with its pod's name, and a server that sets its own `pod` keeps
/// it (`honor_labels`); Envoy's admin stats (the filter's metrics) are a second job. Written
/// as JSON, which is YAML.
pub fn config_yaml(pods: &[String], envoy_admin: Option<u16>, rules: Option<&Path>) -> String {
    let targets: Vec<_> = pods
        .iter()
        .map(|p| json!({"targets": [p], "labels": {"pod": p}}))
        .collect();
    let mut jobs = vec![json!({
        "job_name": "pods",
        "honor_labels": true,
        "static_configs": targets,
    })];
    if let Some(port) = envoy_admin {
        jobs.push(json!({
            "job_name": "envoy",
            "metrics_path": "/stats/prometheus",
            "static_configs": [{"targets": [format!("127.0.0.1:{port}")]}],
        }));
    }
    let rule_files: Vec<String> = rules.iter().map(|p| p.display().to_string()).collect();
    json!({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": rule_files,
        "scrape_configs": jobs,
    })
    .to_string()
}

impl Prometheus {
    pub fn start(
        pods: &[String],
        envoy_admin: Option<u16>,
        dir: &Path,
    ) -> anyhow::Result<Prometheus> {
        Self::start_with_rules(pods, envoy_admin, None, dir)
    }

    /// [`Prometheus::start`], also evaluating the rules file `rules` (every second).
    /// `envoy_admin` is any port that serves Envoy's `/stats/prometheus`.
    pub fn start_with_rules(
        pods: &[String],
        envoy_admin: Option<u16>,
        rules: Option<&Path>,
        dir: &Path,
    ) -> anyhow::Result<Prometheus> {
        let bin = paths::prometheus_bin();
        if !bin.is_file() {
            bail!(
                "{} missing (scripts/setup.sh installs the Debian package)",
                bin.display()
            );
        }
        std::fs::create_dir_all(dir)?;
        let cfg = dir.join("prometheus.yml");
        std::fs::write(&cfg, config_yaml(pods, envoy_admin, rules))?;
        on_fresh_ports("prometheus", || {
            let port = free_port()?;
            let mut cmd = Command::new(&bin);
            cmd.arg(format!("--config.file={}", cfg.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("prometheus-data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .arg("--log.level=warn");
            let mut proc = Proc::spawn("prometheus", cmd, dir)?;
            let http = client();
            let ready = format!("http://127.0.0.1:{port}/-/ready");
            wait_until("prometheus", &mut proc, Duration::from_secs(60), || {
                http.get(&ready)
                    .send()
                    .is_ok_and(|r| r.status().is_success())
            })?;
            Ok(Prometheus { port, proc, http })
        })
    }

    /// An instant query through the HTTP API.
    pub fn query(&self, promql: &str) -> anyhow::Result<Vec<Sample>> {
        let v: Value = self
            .http
            .get(format!("http://127.0.0.1:{}/api/v1/query", self.port))
            .query(&[("query", promql)])
            .send()?
            .json()?;
        if v["status"] != "success" {
            bail!("query {promql} failed: {v}");
        }
        let result = v["data"]["result"].as_array().context("no result array")?;
        result
            .iter()
            .map(|s| {
                let labels = s["metric"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                            .collect()
                    })
                    .unwrap_or_default();
                let value = s["value"][1]
                    .as_str()
                    .and_then(|x| x.parse().ok())
                    .context("bad sample value")?;
                Ok((labels, value))
            })
            .collect()
    }

    /// `promql` grouped by `label` → value.
    pub fn by_label(&self, promql: &str, label: &str) -> anyhow::Result<BTreeMap<String, f64>> {
        Ok(self
            .query(promql)?
            .into_iter()
            .map(|(l, v)| (l.get(label).cloned().unwrap_or_default(), v))
            .collect())
    }

    /// Polls `promql` until `done` accepts the samples (new scrapes arrive every second).
    pub fn wait_for(
        &self,
        promql: &str,
        timeout: Duration,
        mut done: impl FnMut(&[Sample]) -> bool,
    ) -> anyhow::Result<Vec<Sample>> {
        let deadline = Instant::now() + timeout;
        loop {
            let samples = self.query(promql)?;
            if done(&samples) {
                return Ok(samples);
            }
            if Instant::now() > deadline {
                bail!("Prometheus: {promql} did not reach the expected state in {timeout:?}: {samples:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
