//! The routers users compare this one with, run in front of the same pods: vllm-router and
//! SGLang's router (both from PyPI, Rust binaries behind a Python launcher, each in its own
//! venv that `scripts/install-peers.sh` makes under `~/.cache/prefix-router/peers/`).
//!
//! A benchmark "front" is what the load generator talks to: Envoy with the filter under one of
//! its policies, or a peer router under one of its own. Their round-robin rows check that the
//! proxies themselves are comparable before their policies are.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use test_harness::cluster::client;
use test_harness::process::{free_port, wait_until, Proc};

/// A peer router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// `vllm-router` (PyPI `vllm-router`)
    Vllm,
    /// `sglang-router launch` (PyPI `sglang-router`)
    Sglang,
}

impl Peer {
    fn package(self) -> &'static str {
        match self {
            Peer::Vllm => "vllm-router",
            Peer::Sglang => "sglang-router",
        }
    }

    /// Its launcher: `$VLLM_ROUTER_BIN` / `$SGLANG_ROUTER_BIN`, else the venv setup made.
    pub fn bin(self) -> PathBuf {
        let var = match self {
            Peer::Vllm => "VLLM_ROUTER_BIN",
            Peer::Sglang => "SGLANG_ROUTER_BIN",
        };
        if let Some(p) = std::env::var_os(var) {
            return PathBuf::from(p);
        }
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        home.join(".cache/prefix-router/peers")
            .join(self.package())
            .join("bin")
            .join(self.package())
    }

    pub fn installed(self) -> bool {
        self.bin().is_file()
    }
}

/// What a benchmark run puts in front of the pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// Envoy with the filter under this policy (`prefix`, `round_robin`, …).
    Envoy(&'static str),
    /// A peer router under one of its policies (`cache_aware`, `round_robin`).
    Peer(Peer, &'static str),
}

impl Front {
    /// The row's name in tables, CSV and plots: the filter's policy name as it always was, or
    /// `vllm-router cache_aware`.
    pub fn name(self) -> &'static str {
        match self {
            Front::Envoy(p) => p,
            Front::Peer(Peer::Vllm, "cache_aware") => "vllm-router cache_aware",
            Front::Peer(Peer::Vllm, _) => "vllm-router round_robin",
            Front::Peer(Peer::Sglang, "cache_aware") => "sglang-router cache_aware",
            Front::Peer(Peer::Sglang, _) => "sglang-router round_robin",
        }
    }

    pub fn is_peer(self) -> bool {
        matches!(self, Front::Peer(..))
    }
}

/// Every front of a full comparison: the filter's policies (`prefix` and the three baselines), both peers' cache-aware
/// policy, and SGLang's round robin as the proxies' check.
pub const FRONTS: [Front; 7] = [
    Front::Envoy("prefix"),
    Front::Envoy("round_robin"),
    Front::Envoy("random"),
    Front::Envoy("least_loaded"),
    Front::Peer(Peer::Vllm, "cache_aware"),
    Front::Peer(Peer::Sglang, "cache_aware"),
    Front::Peer(Peer::Sglang, "round_robin"),
];

/// A running peer router.
pub struct PeerRouter {
    pub port: u16,
    pub proc: Proc,
}

impl PeerRouter {
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

/// Starts `peer` with `policy` in front of `pods` (`ip:port`) on a free loopback port and
/// waits until it answers `/health`. Both routers are left at their defaults otherwise (their
/// logs name the thresholds they run with), as a user would first run them; their request
/// retries stay on, as Envoy's do.
pub fn start(
    peer: Peer,
    policy: &str,
    pods: &[String],
    dir: &std::path::Path,
) -> anyhow::Result<PeerRouter> {
    let bin = peer.bin();
    if !bin.is_file() {
        anyhow::bail!(
            "{} not installed at {} (scripts/install-peers.sh)",
            peer.package(),
            bin.display()
        );
    }
    let port = free_port()?;
    let mut cmd = Command::new(&bin);
    if peer == Peer::Sglang {
        cmd.arg("launch");
    }
    cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .arg("--worker-urls")
        .args(pods.iter().map(|p| format!("http://{p}")))
        .args(["--policy", policy])
        // their metrics listener defaults to a fixed port (sglang-router: on every address):
        // a free loopback one instead, so a leftover router cannot make the start fail
        .args(["--prometheus-host", "127.0.0.1", "--prometheus-port"])
        .arg(free_port()?.to_string());
    match peer {
        Peer::Vllm => cmd.args(["--log-level", "warning"]),
        Peer::Sglang => cmd.args(["--log-level", "warn"]),
    };
    let mut proc = Proc::spawn(peer.package(), cmd, dir)?;
    let http = client();
    let health = format!("http://127.0.0.1:{port}/health");
    wait_until(peer.package(), &mut proc, Duration::from_secs(60), || {
        http.get(&health)
            .timeout(Duration::from_secs(2))
            .send()
            .is_ok_and(|r| r.status().is_success())
    })?;
    Ok(PeerRouter { port, proc })
}
