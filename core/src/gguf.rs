//! Reading a GGUF file's metadata, and turning its vocabulary into a Hugging Face
//! `tokenizer.json`.
//!
//! The default model ships only as GGUF, whose header carries the model's own tokenizer
//! (tokens, token types, BPE merges, pre-tokenizer name, special-token ids) and chat template.
//! Writing that out as `tokenizer.json` gives the filter and the server the model's exact
//! vocabulary without any second download. Only the metadata is parsed; tensors are skipped.

use serde_json::{json, Map, Value as Json};

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer type that fits in an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::I8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }
}

/// A GGUF file that could not be read or converted.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GgufError {
    #[error("not a GGUF file (bad magic)")]
    BadMagic,
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    Version(u32),
    #[error("GGUF metadata is truncated")]
    Truncated,
    #[error("GGUF metadata has unknown value type {0}")]
    ValueType(u32),
    #[error("GGUF metadata string is not UTF-8")]
    Utf8,
    #[error("GGUF metadata key '{0}' is missing or has the wrong type")]
    Missing(&'static str),
    #[error("unsupported GGUF tokenizer: {0}")]
    Unsupported(String),
}

/// The key/value metadata of a GGUF file.
#[derive(Debug, Default)]
pub struct Metadata {
    pub version: u32,
    pub tensor_count: u64,
    entries: Vec<(String, Value)>,
}

impl Metadata {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    fn array(&self, key: &'static str) -> Result<&[Value], GgufError> {
        match self.get(key) {
            Some(Value::Array(items)) => Ok(items),
            _ => Err(GgufError::Missing(key)),
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], GgufError> {
        let end = self.pos.checked_add(n).ok_or(GgufError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(GgufError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A length that must fit in what is left of the buffer (each element ≥ `min_size` bytes).
    fn len(&mut self, min_size: usize) -> Result<usize, GgufError> {
        let n = usize::try_from(self.u64()?).map_err(|_| GgufError::Truncated)?;
        let left = self.buf.len() - self.pos;
        if n.saturating_mul(min_size.max(1)) > left {
            return Err(GgufError::Truncated);
        }
        Ok(n)
    }

    fn string(&mut self) -> Result<String, GgufError> {
        let n = self.len(1)?;
        let bytes = self.take(n)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::Utf8)
    }

    fn value(&mut self, ty: u32, depth: u8) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.array()?)),
            1 => Value::I8(i8::from_le_bytes(self.array()?)),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => Value::Bool(self.array::<1>()?[0] != 0),
            8 => Value::String(self.string()?),
            9 if depth < 4 => {
                let inner = self.u32()?;
                let n = self.len(1)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(inner, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(GgufError::ValueType(other)),
        })
    }
}

/// Parses the metadata at the start of a GGUF file. `bytes` may be just a prefix of the
/// file, as long as it covers the whole metadata section.
pub fn parse_metadata(bytes: &[u8]) -> Result<Metadata, GgufError> {
    let mut r = Reader { buf: bytes, pos: 0 };
    if r.take(4)? != b"GGUF" {
        return Err(GgufError::BadMagic);
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::Version(version));
    }
    let tensor_count = r.u64()?;
    let kv_count = r.len(12)?;
    let mut entries = Vec::with_capacity(kv_count);
    for _ in 0..kv_count {
        let key = r.string()?;
        let ty = r.u32()?;
        let value = r.value(ty, 0)?;
        entries.push((key, value));
    }
    Ok(Metadata {
        version,
        tensor_count,
        entries,
    })
}

/// What a model's GGUF says about its tokenizer, beyond the vocabulary itself.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizerInfo {
    pub model_name: Option<String>,
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

fn token_at(tokens: &[Value], meta: &Metadata, key: &str) -> Option<String> {
    let id = usize::try_from(meta.get(key)?.as_i64()?).ok()?;
    tokens.get(id)?.as_str().map(str::to_owned)
}

/// Builds the `tokenizer.json` (as a JSON value) for a GGUF byte-level BPE ("gpt2") vocabulary.
pub fn tokenizer_json(meta: &Metadata) -> Result<(Json, TokenizerInfo), GgufError> {
    let model = meta
        .get_str("tokenizer.ggml.model")
        .ok_or(GgufError::Missing("tokenizer.ggml.model"))?;
    if model != "gpt2" {
        return Err(GgufError::Unsupported(format!(
            "tokenizer.ggml.model = '{model}' (only byte-level BPE 'gpt2' vocabularies are converted; supply a tokenizer.json instead)"
        )));
    }
    let tokens = meta.array("tokenizer.ggml.tokens")?;
    let types = meta.array("tokenizer.ggml.token_type").unwrap_or(&[]);
    let merges = meta.array("tokenizer.ggml.merges")?;

    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let pre = meta.get_str("tokenizer.ggml.pre").unwrap_or("default");
    let pre_tokenizer = match pre {
        // SmolLM splits every digit on its own before the GPT-2 regex.
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            byte_level,
        ]}),
        "default" | "gpt2" | "gpt-2" => byte_level,
        other => {
            return Err(GgufError::Unsupported(format!(
                "tokenizer.ggml.pre = '{other}' (supported: smollm, gpt2, default)"
            )))
        }
    };

    let mut vocab = Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        let text = tok
            .as_str()
            .ok_or(GgufError::Missing("tokenizer.ggml.tokens"))?;
        vocab.insert(text.to_owned(), json!(id));
        // llama.cpp token types: 3 = control (special), 4 = user-defined (added, not special).
        let ty = types.get(id).and_then(Value::as_i64).unwrap_or(1);
        if ty == 3 || ty == 4 {
            added.push(json!({
                "id": id, "content": text, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty == 3,
            }));
        }
    }
    let merges: Vec<Json> = merges
        .iter()
        .map(|m| m.as_str().map(|s| json!(s)))
        .collect::<Option<_>>()
        .ok_or(GgufError::Missing("tokenizer.ggml.merges"))?;

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
        model_name: meta.get_str("general.name").map(str::to_owned),
        chat_template: meta.get_str("tokenizer.chat_template").map(str::to_owned),
        bos_token: token_at(tokens, meta, "tokenizer.ggml.bos_token_id"),
        eos_token: token_at(tokens, meta, "tokenizer.ggml.eos_token_id"),
    };
    Ok((tokenizer, info))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    /// A tiny but complete GGUF header with a 3-token byte-level vocabulary.
    fn tiny() -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&5u64.to_le_bytes());
        put_str(&mut b, "tokenizer.ggml.model");
        b.extend_from_slice(&8u32.to_le_bytes());
        put_str(&mut b, "gpt2");
        put_str(&mut b, "tokenizer.ggml.tokens");
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(&3u64.to_le_bytes());
        for t in ["<|end|>", "a", "b"] {
            put_str(&mut b, t);
        }
        put_str(&mut b, "tokenizer.ggml.token_type");
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&5u32.to_le_bytes());
        b.extend_from_slice(&3u64.to_le_bytes());
        for t in [3i32, 1, 1] {
            b.extend_from_slice(&t.to_le_bytes());
        }
        put_str(&mut b, "tokenizer.ggml.merges");
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        put_str(&mut b, "tokenizer.ggml.eos_token_id");
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b
    }

    #[test]
    fn parses_and_converts() {
        let meta = parse_metadata(&tiny()).unwrap();
        assert_eq!(meta.get_str("tokenizer.ggml.model"), Some("gpt2"));
        let (tok, info) = tokenizer_json(&meta).unwrap();
        assert_eq!(info.eos_token.as_deref(), Some("<|end|>"));
        assert_eq!(tok["added_tokens"][0]["content"], "<|end|>");
        assert_eq!(tok["model"]["vocab"]["b"], 2);
        let t = crate::tokenizer::Tokenizer::from_json_bytes(tok.to_string().as_bytes()).unwrap();
        assert_eq!(t.encode("<|end|>ab").unwrap(), vec![0, 1, 2]);
    }

    #[test]
    fn truncation_and_garbage_are_errors_not_panics() {
        let full = tiny();
        for cut in 0..full.len() {
            assert!(parse_metadata(&full[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(
            parse_metadata(b"GGML\0\0\0\0").unwrap_err(),
            GgufError::BadMagic
        );
        let mut huge = b"GGUF".to_vec();
        huge.extend_from_slice(&3u32.to_le_bytes());
        huge.extend_from_slice(&0u64.to_le_bytes());
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(parse_metadata(&huge).unwrap_err(), GgufError::Truncated);
    }
}
