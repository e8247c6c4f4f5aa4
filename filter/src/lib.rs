//! prefix-router's Envoy filter (proxy-wasm, wasm32-wasip1).
//!
//! For `POST /v1/completions` and `/v1/chat/completions` it holds the request until the body
//! is complete, renders and tokenizes the prompt exactly as the model servers do, hashes its
//! full blocks, and picks a pod by cache affinity and load, by setting
//! `x-gateway-destination-endpoint` (a value sent by the client is always removed first).
//! Other paths are balanced by load. One VM (elected through a lease in shared data) polls
//! every pod for health, load and cache events; all workers share what it learns.
//!
//! The filter never panics and never answers 5xx: if its own state is broken it falls back
//! to plain balancing.
//!
//! # Layout
//!
//! In request order:
//!
//! - [`root`]: the root context (one per worker VM): configuration, tokenizer, ticks.
//! - [`model_fetch`]: the model's tokenizer and chat template, fetched at run time through an
//!   Envoy cluster (`tokenizer` config): the .wasm carries no vocabulary.
//! - [`http`]: the HTTP context (one per stream): scrub, buffer, route, debug headers,
//!   settle the pending blocks when the answer starts, release.
//! - [`models`]: the models one filter serves (a router each), and which one a request is
//!   for.
//! - [`router`]: body → prompt → block hashes → fleet view → decision → table record
//!   (prepare → decide → record), giving a [`ticket::Ticket`].
//! - [`ticket`]: one routed request from its decision to its stream's end: held slot,
//!   pending ownership, debug headers, a failed pod marked down.
//! - [`members`]: the fleet's current members (configured, or followed from Envoy's
//!   cluster), and a decision placed on them.
//! - [`ownership`]: the ownership table's reads and writes in shared data.
//! - [`pods`]: pod states, in-flight counts and the poller lease in shared data;
//! - [`poller`]: polling Envoy for the pods cluster's members and each pod for health, load
//!   and cache events, and applying the answers.
//! - [`metrics`]: the filter's Envoy stats.
//! - [`host`]: every host call, behind traits, with a fake for tests.
//!
//! The decisions themselves (policy, liveness rules, table layout, wire types) are pure code
//! in `prefix_core`.

pub mod host;
pub mod http;
pub mod members;
pub mod metrics;
pub mod model_fetch;
pub mod models;
pub mod ownership;
pub mod pods;
pub mod poller;
pub mod root;
pub mod router;
pub mod ticket;

#[cfg(test)]
mod testing;

use host::EnvoyHost;
use proxy_wasm::traits::RootContext;
use proxy_wasm::types::LogLevel;
use std::rc::Rc;

/// A random 64-bit id (std's hash seeds come from the host's randomness via WASI).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5eed);
    h.finish()
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(root::RouterRoot::new(Rc::new(EnvoyHost), random_u64()))
    });
}}
