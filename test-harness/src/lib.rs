//! Real-process test support for prefix-router: model-server pods, Envoy with the wasm filter
//! and Prometheus, all on 127.0.0.1 with free ports, readiness polled, everything killed on
//! drop. The real-process tests are in `tests/`; the benchmark (`bench/`) builds on this.
//!
//! # Layout
//!
//! In the order a test sets things up and reads them back:
//!
//! - [`paths`]: where the binaries, the filter and the templates are (environment overrides).
//! - [`process`]: child processes that are always cleaned up, free ports, readiness polling.
//! - [`envoy_config`]: the Envoy configuration (the `prefix-router-config` crate's, which
//!   is also the `render-envoy-config` binary).
//! - [`cluster`]: starting pods (this project's server, [`llama`]: llama.cpp's, or [`vllm`]:
//!   vLLM with its `kv-events` sidecar) and Envoys.
//! - [`fleet`]: a running fleet (pods + Envoy) and the answers sent through it.
//! - [`load`]: open-loop load at a fixed rate, every outcome recorded.
//! - [`hostile`]: the requests of hostile clients (huge words, batches, deep JSON, …) that
//!   the gateway and the pods must answer without stalling.
//! - [`pki`]: certificates made for a test (a CA, a server's, a client's).
//! - [`prometheus`]: a real Prometheus scraping the fleet.
//! - [`wire`]: reading answers back (Prometheus text, server-sent events).
//! - [`kubernetes`]: the generated parts of `deploy/kubernetes` and reading them back.
//! - [`readme`]: the README's command blocks, for the tests that run them as written.

pub mod cluster;
pub use prefix_router_config::envoy as envoy_config;
pub mod fleet;
pub mod hostile;
pub mod kubernetes;
pub mod llama;
pub mod load;
pub mod paths;
pub mod pki;
pub mod process;
pub mod prometheus;
pub mod readme;
pub mod vllm;
pub mod wire;
