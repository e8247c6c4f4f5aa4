//! `gguf-tokenizer`: writes a GGUF model's own vocabulary and chat template out as a Hugging
//! Face `tokenizer.json` + `tokenizer_config.json`, the form every other component loads.

use anyhow::Context;
use clap::Parser;
use gguf_engine::vocab::{read_header, tokenizer_json};
use prefix_core::model::TokenizerConfig;
use std::path::PathBuf;

/// Writes a GGUF model's vocabulary and chat template as tokenizer.json + tokenizer_config.json.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// The GGUF model file.
    #[arg(long)]
    gguf: PathBuf,
    /// Directory to write tokenizer.json and tokenizer_config.json into.
    #[arg(long)]
    out_dir: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let header =
        read_header(&args.gguf).with_context(|| format!("reading {}", args.gguf.display()))?;
    let (tokenizer, info) = tokenizer_json(&header.metadata)?;
    std::fs::create_dir_all(&args.out_dir)?;
    let tok_path = args.out_dir.join("tokenizer.json");
    std::fs::write(&tok_path, serde_json::to_vec(&tokenizer)?)?;
    let config = TokenizerConfig {
        chat_template: info
            .chat_template
            .map(prefix_core::model::ChatTemplateField::One),
        bos_token: info.bos_token,
        eos_token: info.eos_token,
    };
    let cfg_path = args.out_dir.join("tokenizer_config.json");
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&config)?)?;
    println!(
        "wrote {} and {} (model: {})",
        tok_path.display(),
        cfg_path.display(),
        info.model_name.as_deref().unwrap_or("unnamed")
    );
    Ok(())
}
