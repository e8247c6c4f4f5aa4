//! prefix-router's configuration tool: the Envoy configuration for the filter in front of a
//! fleet, from command-line flags or one YAML file, validated as the filter will validate it.
//! Its template is built in, so the installed binary runs anywhere.
//!
//! # Layout
//!
//! In the order a configuration is made:
//!
//! - [`cli`]: the `render-envoy-config` command line (flags for the simple case, `--config`
//!   for the rest).
//! - [`file`]: the YAML file describing the gateway (pools, weights, liveness, timeouts, TLS).
//! - [`install`]: where the filter's .wasm is when not named.
//! - [`envoy`]: the settings, the template (`envoy.yaml.j2`) and its rendering.
//! - [`configmap`]: the rendered file as a Kubernetes ConfigMap.

pub mod cli;
pub mod configmap;
pub mod envoy;
pub mod file;
pub mod install;
