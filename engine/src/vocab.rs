//! A GGUF model's own tokenizer as a Hugging Face `tokenizer.json` (+ chat template and
//! special tokens for `tokenizer_config.json`).
//!
//! The default model ships only as GGUF, whose header carries the model's vocabulary (tokens,
//! token types, BPE merges, pre-tokenizer name, special-token ids) and chat template. Writing
//! that out gives the filter and the server the model's exact vocabulary without a second
//! download. The header is read with candle's GGUF reader (the one the real engine loads the
//! model with); this module only maps its metadata to the `tokenizers` JSON format.

use candle_core::quantized::gguf_file::{Content, Value};
use serde_json::{json, Map, Value as Json};
use std::collections::HashMap;

/// A vocabulary that cannot be converted.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum VocabError {
    #[error("GGUF metadata key '{0}' is missing or has the wrong type")]
    Missing(&'static str),
    #[error("unsupported GGUF tokenizer: {0}")]
    Unsupported(String),
}

/// What a model's GGUF says about its tokenizer, beyond the vocabulary itself.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizerInfo {
    pub model_name: Option<String>,
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

type Metadata = HashMap<String, Value>;

fn get_str<'a>(meta: &'a Metadata, key: &str) -> Option<&'a str> {
    meta.get(key)?.to_string().ok().map(String::as_str)
}

fn array<'a>(meta: &'a Metadata, key: &'static str) -> Result<&'a [Value], VocabError> {
    match meta.get(key) {
        Some(Value::Array(items)) => Ok(items),
        _ => Err(VocabError::Missing(key)),
    }
}

/// Any integer value, as an index.
fn index(v: &Value) -> Option<usize> {
    match *v {
        Value::U8(n) => Some(n.into()),
        Value::U16(n) => Some(n.into()),
        Value::U32(n) => usize::try_from(n).ok(),
        Value::U64(n) => usize::try_from(n).ok(),
        Value::I8(n) => usize::try_from(n).ok(),
        Value::I16(n) => usize::try_from(n).ok(),
        Value::I32(n) => usize::try_from(n).ok(),
        Value::I64(n) => usize::try_from(n).ok(),
        _ => None,
    }
}

fn token_at(tokens: &[Value], meta: &Metadata, key: &str) -> Option<String> {
    let id = index(meta.get(key)?)?;
    tokens.get(id)?.to_string().ok().cloned()
}

/// Reads a GGUF file's header (metadata and tensor index; no tensor data).
pub fn read_header(path: &std::path::Path) -> anyhow::Result<Content> {
    let mut file = std::io::BufReader::new(std::fs::File::open(path)?);
    Ok(Content::read(&mut file)?)
}

/// Builds the `tokenizer.json` (as a JSON value) for a GGUF byte-level BPE ("gpt2") vocabulary.
pub fn tokenizer_json(meta: &Metadata) -> Result<(Json, TokenizerInfo), VocabError> {
    let model =
        get_str(meta, "tokenizer.ggml.model").ok_or(VocabError::Missing("tokenizer.ggml.model"))?;
    if model != "gpt2" {
        return Err(VocabError::Unsupported(format!(
            "tokenizer.ggml.model = '{model}' (only byte-level BPE 'gpt2' vocabularies are converted; supply a tokenizer.json instead)"
        )));
    }
    let tokens = array(meta, "tokenizer.ggml.tokens")?;
    let types = array(meta, "tokenizer.ggml.token_type").unwrap_or(&[]);
    let merges = array(meta, "tokenizer.ggml.merges")?;

    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let pre = get_str(meta, "tokenizer.ggml.pre").unwrap_or("default");
    let pre_tokenizer = match pre {
        // SmolLM splits every digit on its own before the GPT-2 regex.
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            byte_level,
        ]}),
        "default" | "gpt2" | "gpt-2" => byte_level,
        other => {
            return Err(VocabError::Unsupported(format!(
                "tokenizer.ggml.pre = '{other}' (supported: smollm, gpt2, default)"
            )))
        }
    };

    let mut vocab = Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        let text = tok
            .to_string()
            .map_err(|_| VocabError::Missing("tokenizer.ggml.tokens"))?;
        vocab.insert(text.clone(), json!(id));
        // llama.cpp token types: 3 = control (special), 4 = user-defined (added, not special).
        let ty = types.get(id).and_then(index).unwrap_or(1);
        if ty == 3 || ty == 4 {
            added.push(json!({
                "id": id, "content": text, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty == 3,
            }));
        }
    }
    let merges: Vec<Json> = merges
        .iter()
        .map(|m| m.to_string().ok().map(|s| json!(s)))
        .collect::<Option<_>>()
        .ok_or(VocabError::Missing("tokenizer.ggml.merges"))?;

    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        },
    });
    let info = TokenizerInfo {
        model_name: get_str(meta, "general.name").map(str::to_owned),
        chat_template: get_str(meta, "tokenizer.chat_template").map(str::to_owned),
        bos_token: token_at(tokens, meta, "tokenizer.ggml.bos_token_id"),
        eos_token: token_at(tokens, meta, "tokenizer.ggml.eos_token_id"),
    };
    Ok((tokenizer, info))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file;

    fn strings(v: &[&str]) -> Value {
        Value::Array(v.iter().map(|s| Value::String(s.to_string())).collect())
    }

    /// A tiny but complete GGUF file with a 3-token byte-level vocabulary, written by candle.
    fn tiny(path: &std::path::Path, model: &str) {
        let entries = [
            ("tokenizer.ggml.model", Value::String(model.into())),
            ("tokenizer.ggml.tokens", strings(&["<|end|>", "a", "b"])),
            (
                "tokenizer.ggml.token_type",
                Value::Array(vec![Value::I32(3), Value::I32(1), Value::I32(1)]),
            ),
            ("tokenizer.ggml.merges", Value::Array(vec![])),
            ("tokenizer.ggml.eos_token_id", Value::U32(0)),
            ("general.name", Value::String("tiny".into())),
        ];
        let meta: Vec<(&str, &Value)> = entries.iter().map(|(k, v)| (*k, v)).collect();
        let mut f = std::fs::File::create(path).unwrap();
        gguf_file::write(&mut f, &meta, &[]).unwrap();
    }

    #[test]
    fn converts_a_byte_level_vocabulary() {
        let dir = std::env::temp_dir().join(format!("gguf-vocab-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny.gguf");
        tiny(&path, "gpt2");
        let header = read_header(&path).unwrap();
        let (tok, info) = tokenizer_json(&header.metadata).unwrap();
        assert_eq!(info.eos_token.as_deref(), Some("<|end|>"));
        assert_eq!(info.model_name.as_deref(), Some("tiny"));
        assert_eq!(tok["added_tokens"][0]["content"], "<|end|>");
        assert_eq!(tok["model"]["vocab"]["b"], 2);
        let t =
            prefix_core::tokenizer::Tokenizer::from_json_bytes(tok.to_string().as_bytes()).unwrap();
        assert_eq!(t.encode("<|end|>ab").unwrap(), vec![0, 1, 2]);

        tiny(&path, "llama");
        let header = read_header(&path).unwrap();
        assert!(matches!(
            tokenizer_json(&header.metadata),
            Err(VocabError::Unsupported(_))
        ));
        std::fs::write(&path, b"GGML\0\0\0\0").unwrap();
        assert!(read_header(&path).is_err(), "not a GGUF file");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
