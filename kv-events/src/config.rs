//! The command line, parsed and checked once; errors name the flag.

use anyhow::{bail, Result};
use clap::Parser;
use prefix_core::BlockSize;
use std::net::SocketAddr;

/// Follows a vLLM (or SGLang) pod's KV-cache events and serves them as prefix-router's
/// cache-events page.
#[derive(Parser, Debug, Clone)]
#[command(name = "kv-events", version)]
pub struct Args {
    /// The pod's event publisher (vLLM's `--kv-events-config` `endpoint`): connected to, as
    /// vLLM binds `tcp://*:PORT` and `ipc://` endpoints. With --bind-events, bound instead
    /// (for pods configured to connect, `tcp://HOST:PORT`).
    #[arg(long)]
    pub events: String,
    #[arg(long)]
    pub bind_events: bool,
    /// The pod's replay socket (`replay_endpoint`), asked for lost messages. Without it, a loss
    /// forgets the pod's blocks.
    #[arg(long)]
    pub replay: Option<String>,
    /// Only messages of this topic (vLLM's `topic`; empty: all).
    #[arg(long, default_value = "")]
    pub topic: String,
    /// The pod's HTTP address, for its `/metrics` (load, restarts), e.g. http://127.0.0.1:8000.
    #[arg(long)]
    pub pod: String,
    /// The model name the router hashes with: the pool's `model_name` in the plugin config.
    #[arg(long)]
    pub model: String,
    /// The router's block size in tokens (the plugin config's `block_size`); a whole multiple
    /// of the pod's.
    #[arg(long, default_value_t = prefix_core::block::DEFAULT_BLOCK_SIZE)]
    pub block_size: u32,
    /// Where the page is served.
    #[arg(long, default_value = "127.0.0.1:8100")]
    pub listen: SocketAddr,
    /// The name the page gives the pod (logs).
    #[arg(long, default_value = "")]
    pub pod_name: String,
    /// Pod blocks followed at most (past it, everything is forgotten once).
    #[arg(long, default_value_t = 1_000_000)]
    pub max_blocks: usize,
    /// Page events kept for routers that fall behind (older ones get a snapshot).
    #[arg(long, default_value_t = 4096)]
    pub history: usize,
    /// How often the pod's `/metrics` is read.
    #[arg(long, default_value_t = 250)]
    pub metrics_interval_ms: u64,
    /// How long a replay may take.
    #[arg(long, default_value_t = 2000)]
    pub replay_timeout_ms: u64,
}

/// Checked settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub events: String,
    pub bind_events: bool,
    pub replay: Option<String>,
    pub topic: String,
    pub pod: String,
    pub model: String,
    pub block_size: BlockSize,
    pub listen: SocketAddr,
    pub pod_name: String,
    pub max_blocks: usize,
    pub history: usize,
    pub metrics_interval_ms: u64,
    pub replay_timeout_ms: u64,
}

fn zmq_endpoint(flag: &str, e: &str) -> Result<()> {
    if !(e.starts_with("tcp://") || e.starts_with("ipc://")) {
        bail!("--{flag}: a ZeroMQ endpoint is tcp://HOST:PORT or ipc://PATH, not '{e}'");
    }
    Ok(())
}

impl Args {
    pub fn validate(self) -> Result<Config> {
        zmq_endpoint("events", &self.events)?;
        if let Some(r) = &self.replay {
            zmq_endpoint("replay", r)?;
        }
        if !(self.pod.starts_with("http://") || self.pod.starts_with("https://")) {
            bail!(
                "--pod: the pod's HTTP address, like http://127.0.0.1:8000, not '{}'",
                self.pod
            );
        }
        if self.model.is_empty() {
            bail!("--model: the model name the router hashes with must not be empty");
        }
        let Some(block_size) = BlockSize::new(self.block_size) else {
            bail!("--block-size: must be at least 1 token");
        };
        if self.max_blocks == 0 || self.history == 0 {
            bail!("--max-blocks and --history must be at least 1");
        }
        if !(50..=60_000).contains(&self.metrics_interval_ms) {
            bail!(
                "--metrics-interval-ms: 50 to 60000, not {}",
                self.metrics_interval_ms
            );
        }
        if !(100..=60_000).contains(&self.replay_timeout_ms) {
            bail!(
                "--replay-timeout-ms: 100 to 60000, not {}",
                self.replay_timeout_ms
            );
        }
        Ok(Config {
            events: self.events,
            bind_events: self.bind_events,
            replay: self.replay,
            topic: self.topic,
            pod: self.pod.trim_end_matches('/').to_owned(),
            model: self.model,
            block_size,
            listen: self.listen,
            pod_name: self.pod_name,
            max_blocks: self.max_blocks,
            history: self.history,
            metrics_interval_ms: self.metrics_interval_ms,
            replay_timeout_ms: self.replay_timeout_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Result<Config> {
        let base = [
            "kv-events",
            "--events",
            "ipc:///tmp/x",
            "--pod",
            "http://127.0.0.1:8000",
            "--model",
            "m",
        ];
        Args::try_parse_from(base.iter().chain(extra))?.validate()
    }

    #[test]
    fn errors_name_the_flag() {
        assert!(args(&[]).is_ok());
        for (extra, flag) in [
            (&["--events", "localhost:5557"][..], "--events"),
            (&["--replay", "5558"], "--replay"),
            (&["--pod", "127.0.0.1:8000"], "--pod"),
            (&["--model", ""], "--model"),
            (&["--block-size", "0"], "--block-size"),
            (&["--metrics-interval-ms", "1"], "--metrics-interval-ms"),
        ] {
            let e = args(extra).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(flag), "{extra:?}: {e}");
        }
    }
}
