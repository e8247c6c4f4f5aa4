//! `gguf-tokenizer`: writes a GGUF model's own vocabulary and chat template out as a Hugging
//! Face `tokenizer.json` + `tokenizer_config.json`, the form every other component loads.

use anyhow::Context;
use clap::Parser;
use prefix_core::gguf::{parse_metadata, tokenizer_json, GgufError};
use prefix_core::model::TokenizerConfig;
use std::io::Read;
use std::path::PathBuf;

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

/// Reads just enough of the file to cover its metadata (the tensors are not needed).
fn read_metadata(path: &PathBuf) -> anyhow::Result<prefix_core::gguf::Metadata> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = Vec::new();
    let mut want = 4 << 20;
    loop {
        let have = buf.len();
        (&mut file)
            .take((want - have) as u64)
            .read_to_end(&mut buf)?;
        match parse_metadata(&buf) {
            Err(GgufError::Truncated) if buf.len() == want => want *= 2,
            other => return other.with_context(|| format!("reading {}", path.display())),
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let meta = read_metadata(&args.gguf)?;
    let (tokenizer, info) = tokenizer_json(&meta)?;
    std::fs::create_dir_all(&args.out_dir)?;
    let tok_path = args.out_dir.join("tokenizer.json");
    std::fs::write(&tok_path, serde_json::to_vec(&tokenizer)?)?;
    let config = TokenizerConfig {
        chat_template: info.chat_template,
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
