//! Embeds the model's tokenizer into the filter at build time.
//!
//! Wasm in Envoy cannot read files, and the vocabulary must be byte-for-byte the servers', so
//! the filter carries it: `PREFIX_ROUTER_TOKENIZER_DIR` (a directory with `tokenizer.json` and
//! optionally `tokenizer_config.json`) defaults to the model `scripts/setup.sh` installs.

use std::path::{Path, PathBuf};

/// The defaults the filter, the server and the harness share (the same file `prefix-core`
/// compiles as `protocol::defaults`).
#[allow(dead_code)]
#[path = "../core/src/protocol/defaults.rs"]
mod defaults;

fn main() {
    println!("cargo:rerun-if-env-changed=PREFIX_ROUTER_TOKENIZER_DIR");
    println!("cargo:rerun-if-env-changed={}", defaults::DATA_DIR_ENV);
    let dir = std::env::var_os("PREFIX_ROUTER_TOKENIZER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            defaults::model_dir(&defaults::data_dir(&repo))
        });
    let json = dir.join("tokenizer.json");
    if !json.is_file() {
        println!(
            "cargo:warning=no tokenizer at {} — run scripts/setup.sh (or set PREFIX_ROUTER_TOKENIZER_DIR); the filter will fail open",
            json.display()
        );
    }
    let cfg = dir.join("tokenizer_config.json");
    println!("cargo:rerun-if-changed={}", json.display());
    println!("cargo:rerun-if-changed={}", cfg.display());
    // Missing files embed as empty: the filter then reports it and fails open.
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    for (src, name) in [(json, "tokenizer.json"), (cfg, "tokenizer_config.json")] {
        let bytes = std::fs::read(&src).unwrap_or_default();
        let _ = std::fs::write(out.join(name), bytes);
    }
}
