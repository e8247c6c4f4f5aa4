//! Real-process test support for prefix-router: model-server pods, Envoy with the wasm filter
//! and Prometheus, all on 127.0.0.1 with free ports, readiness polled, everything killed on drop.

pub mod cluster;
pub mod envoy_config;
pub mod fleet;
pub mod paths;
pub mod process;
pub mod prometheus;
pub mod wire;
