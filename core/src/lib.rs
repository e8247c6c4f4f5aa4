//! `prefix-core`: the pure logic that the proxy-wasm routing filter and the model server share.
//!
//! Both sides must agree, token for token and hash for hash, on what a request's prefix is.
//! Everything that decides that lives here, with no I/O, no async runtime and no proxy-wasm
//! dependency, so it is unit-testable on the host and compiles unchanged to `wasm32`:
//!
//! - [`request`]: parse and validate an OpenAI completions / chat request body, with the
//!   same OpenAI-style errors on both sides.
//! - [`template`] and [`tokenizer`]: render the prompt with the model's own chat template and
//!   tokenize it with the model's own vocabulary.
//! - [`block`]: chained XXH3 block hashes over full token blocks.
//! - [`gguf`]: read a GGUF file's metadata and turn its vocabulary into a `tokenizer.json`.
//! - [`model`]: the one bundle (tokenizer + template + names) that turns a body into hashes.
//! - [`policy`], [`table`], [`router_config`]: the routing decision, the bounded ownership
//!   table's layout, and the filter's validated configuration.

pub mod block;
pub mod error;
pub mod fast_bpe;
pub mod gguf;
pub mod liveness;
pub mod model;
pub mod policy;
pub mod protocol;
pub mod request;
pub mod router_config;
pub mod table;
pub mod template;
pub mod tokenizer;

pub use block::{BlockHash, BlockSize, TokenCount};
pub use error::ApiError;
pub use model::{ModelBundle, PreparedPrompt};
