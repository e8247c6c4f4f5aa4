//! `prefix-core`: the pure logic that the proxy-wasm routing filter and the model server share.
//!
//! Both sides must agree, token for token and hash for hash, on what a request's prefix is,
//! and speak the same wire messages. Everything that decides that lives here, with no I/O, no
//! async runtime and no proxy-wasm dependency, so it is unit-testable on the host and compiles
//! unchanged to `wasm32`.
//!
//! # Layout
//!
//! In request order:
//!
//! - [`request`] and [`error`]: parse and validate an inference body (completions, chat,
//!   Responses, Anthropic-style messages; which paths are read as what); the OpenAI-style
//!   errors both sides answer with.
//! - [`model`], [`template`], [`tokenizer`] ([`fast_bpe`], its words from [`split`]): render
//!   the prompt with the model's chat template and tokenize it with its vocabulary;
//!   [`prompt_blocks`]: only as deep as a router needs.
//! - [`block`]: chained XXH3 hashes of the full token blocks (golden vectors in
//!   `tests/data`).
//! - [`pod_costs`]: what a request costs on each pod (prefill per token, slot time, slots),
//!   learned online from the pods' counters (when a pod's prefill ends; the `cost` policy).
//! - [`policy`]: **the routing decision** — a pod and a [`policy::Reason`], from the block
//!   owners and the pods' loads, in steps; one file per policy.
//! - [`table`]: the ownership table's layout in Envoy shared data (bounded, 4-way buckets).
//! - [`membership`]: which pods are in the fleet right now, each at a stable slot.
//! - [`liveness`]: what a router believes about a pod (health, load, cache generation) and
//!   the rules that change it.
//! - [`protocol`]: **the wire types** — the cache-events page the pods serve and the filter
//!   polls, header names, shared defaults.
//! - [`router_config`], [`plugin_config`]: the filter's plugin configuration (one model's
//!   settings; the models one filter serves), typed and validated once.

pub mod block;
pub mod error;
pub mod fast_bpe;
pub mod liveness;
pub mod membership;
pub mod model;
pub mod plugin_config;
pub mod pod_costs;
pub mod policy;
pub mod prompt_blocks;
pub mod protocol;
pub mod request;
pub mod router_config;
pub mod split;
pub mod table;
pub mod template;
pub mod tokenizer;

pub use block::{BlockHash, BlockSize, TokenCount};
pub use error::ApiError;
pub use model::{ModelBundle, PreparedPrompt};
