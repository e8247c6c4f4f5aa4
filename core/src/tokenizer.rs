//! The model's tokenizer, loaded from a Hugging Face `tokenizer.json` held in memory.
//!
//! Uses the `tokenizers` crate with pure-Rust features only (fancy-regex instead of onig), so
//! the very same code runs in the server and inside Envoy's wasm VM, plus this crate's own
//! byte-level BPE encoder ([`crate::fast_bpe`]) where the vocabulary allows it. Without the
//! `hf-tokenizers` feature (the filter's build, whose .wasm is then much smaller) only
//! vocabularies the fast encoder covers load.

use std::fmt;

/// A loaded tokenizer: the `tokenizers` crate, plus the fast byte-level BPE encoder when the
/// vocabulary's shape allows it (same ids, several times faster, see [`crate::fast_bpe`]).
pub struct Tokenizer {
    /// `None` only when loaded for encoding alone and the fast path covers it.
    #[cfg(feature = "hf-tokenizers")]
    inner: Option<tokenizers::Tokenizer>,
    fast: Option<crate::fast_bpe::FastBpe>,
    /// What the post-processor puts around a single sequence ("adding special tokens"):
    /// Llama-3's `<|begin_of_text|>` before it, for example.
    specials: Specials,
}

/// Ids a `TemplateProcessing` post-processor puts before and after a single sequence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Specials {
    pub before: Vec<u32>,
    pub after: Vec<u32>,
}

impl Specials {
    /// From a parsed `tokenizer.json`'s `post_processor` (alone or inside a `Sequence`);
    /// none for other post-processors (GPT-2's `ByteLevel` adds nothing).
    pub fn of(doc: Option<&serde_json::Value>) -> Specials {
        let Some(pp) = doc.map(|d| &d["post_processor"]) else {
            return Specials::default();
        };
        let template = match pp["type"].as_str() {
            Some("TemplateProcessing") => pp,
            Some("Sequence") => pp["processors"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["type"] == "TemplateProcessing"))
                .unwrap_or(&serde_json::Value::Null),
            _ => &serde_json::Value::Null,
        };
        let mut out = Specials::default();
        let mut seen_sequence = false;
        for item in template["single"].as_array().into_iter().flatten() {
            if item.get("Sequence").is_some() {
                seen_sequence = true;
            } else if let Some(name) = item["SpecialToken"]["id"].as_str() {
                let ids = template["special_tokens"][name]["ids"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()));
                if seen_sequence {
                    out.after.extend(ids);
                } else {
                    out.before.extend(ids);
                }
            }
        }
        out
    }
}

/// The tokenizer could not be loaded or could not process input.
#[derive(Debug, thiserror::Error)]
#[error("tokenizer: {0}")]
pub struct TokenizerError(String);

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl Tokenizer {
    /// Parses the bytes of a `tokenizer.json`.
    #[cfg(feature = "hf-tokenizers")]
    pub fn from_json_bytes(bytes: &[u8]) -> Result<Self, TokenizerError> {
        // One prompt at a time: never spin up rayon threads (wasm has none, the server
        // already runs requests concurrently).
        tokenizers::utils::parallelism::set_parallelism(false);
        let inner =
            tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| TokenizerError(e.to_string()))?;
        let doc: Option<serde_json::Value> = serde_json::from_slice(bytes).ok();
        Ok(Tokenizer {
            inner: Some(inner),
            fast: doc.as_ref().and_then(crate::fast_bpe::FastBpe::from_value),
            specials: Specials::of(doc.as_ref()),
        })
    }

    /// For routers, which only encode: the fast encoder alone when the vocabulary allows it
    /// (a fraction of the start time and memory), else the full tokenizer.
    pub fn for_encoding(bytes: &[u8]) -> Result<Self, TokenizerError> {
        // parsed once for both (a large vocabulary takes a good part of a VM's start)
        let doc: Option<serde_json::Value> = serde_json::from_slice(bytes).ok();
        match doc.as_ref().and_then(crate::fast_bpe::FastBpe::from_value) {
            Some(fast) => Ok(Tokenizer {
                #[cfg(feature = "hf-tokenizers")]
                inner: None,
                fast: Some(fast),
                specials: Specials::of(doc.as_ref()),
            }),
            #[cfg(feature = "hf-tokenizers")]
            None => Self::from_json_bytes(bytes),
            #[cfg(not(feature = "hf-tokenizers"))]
            None => Err(TokenizerError(
                "this vocabulary is not a byte-level BPE of the GPT-2, Llama-3 or Qwen2 \
                 families, the only ones this build encodes (a filter built with \
                 `scripts/build-filter.sh --full` takes any tokenizer.json)"
                    .into(),
            )),
        }
    }

    #[cfg(feature = "hf-tokenizers")]
    fn inner(&self) -> Result<&tokenizers::Tokenizer, TokenizerError> {
        self.inner
            .as_ref()
            .ok_or_else(|| TokenizerError("loaded for encoding only".into()))
    }

    /// Whether encoding uses the fast byte-level BPE path.
    pub fn is_fast(&self) -> bool {
        self.fast.is_some()
    }

    /// The fast encoder, which can also encode a text's start alone
    /// ([`crate::fast_bpe::FastBpe::encode_from`]).
    pub fn fast(&self) -> Option<&crate::fast_bpe::FastBpe> {
        self.fast.as_ref()
    }

    /// Token ids from the `tokenizers` crate itself (the reference the fast path must match).
    #[cfg(feature = "hf-tokenizers")]
    pub fn encode_reference(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.inner()?
            .encode_fast(text, false)
            .map(|enc| enc.get_ids().to_vec())
            .map_err(|e| TokenizerError(e.to_string()))
    }

    /// Token ids of `text`. Special tokens written in the text (e.g. `<|im_start|>`) map to
    /// their ids; nothing is prepended or appended.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        if let Some(fast) = &self.fast {
            return Ok(fast.encode(text));
        }
        #[cfg(feature = "hf-tokenizers")]
        return self
            .inner()?
            .encode_fast(text, false)
            .map(|enc| enc.get_ids().to_vec())
            .map_err(|e| TokenizerError(e.to_string()));
        #[cfg(not(feature = "hf-tokenizers"))]
        Err(TokenizerError("no encoder loaded".into()))
    }

    /// Token ids of a completion prompt as vLLM computes them (`add_special_tokens`, its
    /// default for `/v1/completions`): [`Tokenizer::encode`] inside what the post-processor
    /// adds, e.g. Llama-3's BOS. Chat prompts carry their special tokens in the rendered text.
    pub fn encode_with_specials(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let body = self.encode(text)?;
        if self.specials == Specials::default() {
            return Ok(body);
        }
        let mut out = Vec::with_capacity(body.len() + 2);
        out.extend_from_slice(&self.specials.before);
        out.extend(body);
        out.extend_from_slice(&self.specials.after);
        Ok(out)
    }

    /// What [`Tokenizer::encode_with_specials`] adds.
    pub fn specials(&self) -> &Specials {
        &self.specials
    }

    /// Text of `ids`, special tokens included.
    #[cfg(feature = "hf-tokenizers")]
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner()?
            .decode(ids, false)
            .map_err(|e| TokenizerError(e.to_string()))
    }

    /// The id of a token, special or not.
    #[cfg(feature = "hf-tokenizers")]
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.as_ref()?.token_to_id(token)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        #[cfg(feature = "hf-tokenizers")]
        if let Some(t) = &self.inner {
            return t.get_vocab_size(true);
        }
        self.fast.as_ref().map_or(0, |f| f.vocab_size())
    }
}
