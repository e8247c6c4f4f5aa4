//! The model bundle: everything needed to turn a request body into tokens and block hashes.
//!
//! It mirrors a Hugging Face model directory: `tokenizer.json` (vocabulary) plus
//! `tokenizer_config.json` (chat template, BOS/EOS). The filter and the server build the same
//! bundle from the same files, so [`ModelBundle::prepare`] gives both the same answer.

use crate::block::{root_hash, BlockHash, BlockSize};
use crate::error::ApiError;
use crate::prompt_blocks::PromptBlocks;
use crate::request::{InferenceRequest, PromptInput};
use crate::template::{ChatTemplate, TemplateError};
use crate::tokenizer::{Specials, Tokenizer, TokenizerError};
use std::borrow::Cow;

/// Chat prompts carry their special tokens in the rendered text.
static NO_SPECIALS: Specials = Specials {
    before: Vec::new(),
    after: Vec::new(),
};

/// The fields of an HF `tokenizer_config.json` that rendering needs.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenizerConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    #[serde(
        default,
        deserialize_with = "token_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub bos_token: Option<String>,
    #[serde(
        default,
        deserialize_with = "token_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub eos_token: Option<String>,
}

/// HF writes special tokens either as a string or as `{"content": "..."}`.
fn token_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    use serde::Deserialize;
    let v = Option::<serde_json::Value>::deserialize(d)?;
    Ok(match v {
        Some(serde_json::Value::String(s)) => Some(s),
        Some(serde_json::Value::Object(o)) => {
            o.get("content").and_then(|c| c.as_str()).map(str::to_owned)
        }
        _ => None,
    })
}

/// A bundle that could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("tokenizer_config.json: {0}")]
    Config(String),
}

/// Tokenizer, chat template and naming of one served model.
pub struct ModelBundle {
    name: String,
    /// LoRA adapter names served on top of this model: requests may name them as `model`;
    /// their blocks are keyed apart from the base model's and from each other's (as vLLM
    /// keys cached blocks by adapter), so they never share a cached prefix.
    adapters: Vec<String>,
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    block_size: BlockSize,
}

/// A request's prompt as tokens plus the hashes of its full blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedPrompt {
    pub tokens: Vec<u32>,
    pub hashes: Vec<BlockHash>,
}

impl ModelBundle {
    /// Builds a bundle from the bytes of `tokenizer.json` and, optionally,
    /// `tokenizer_config.json`. Without a chat template, chat requests are rejected with 400.
    pub fn new(
        name: &str,
        tokenizer_json: &[u8],
        tokenizer_config_json: Option<&[u8]>,
        block_size: BlockSize,
    ) -> Result<Self, BundleError> {
        Self::build(
            name,
            Tokenizer::from_json_bytes(tokenizer_json)?,
            tokenizer_config_json,
            block_size,
        )
    }

    /// A bundle for routing, which never decodes: see [`Tokenizer::for_encoding`].
    pub fn for_routing(
        name: &str,
        tokenizer_json: &[u8],
        tokenizer_config_json: Option<&[u8]>,
        block_size: BlockSize,
    ) -> Result<Self, BundleError> {
        Self::build(
            name,
            Tokenizer::for_encoding(tokenizer_json)?,
            tokenizer_config_json,
            block_size,
        )
    }

    fn build(
        name: &str,
        tokenizer: Tokenizer,
        tokenizer_config_json: Option<&[u8]>,
        block_size: BlockSize,
    ) -> Result<Self, BundleError> {
        let config: TokenizerConfig = match tokenizer_config_json {
            Some(b) => serde_json::from_slice(b).map_err(|e| BundleError::Config(e.to_string()))?,
            None => TokenizerConfig::default(),
        };
        let template = match &config.chat_template {
            Some(src) => Some(ChatTemplate::new(
                src,
                config.bos_token.as_deref().unwrap_or(""),
                config.eos_token.as_deref().unwrap_or(""),
            )?),
            None => None,
        };
        Ok(ModelBundle {
            name: name.to_owned(),
            adapters: Vec::new(),
            tokenizer,
            template,
            block_size,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The same bundle, also answering to these LoRA adapter names.
    pub fn with_adapters(mut self, adapters: Vec<String>) -> Self {
        self.adapters = adapters;
        self
    }

    pub fn adapters(&self) -> &[String] {
        &self.adapters
    }

    /// What seeds a request's block hashes: the base model, or base and adapter.
    fn hash_seed(&self, req: &InferenceRequest) -> String {
        match &req.model {
            Some(m) if self.adapters.contains(m) => format!("{}\u{0}lora:{m}", self.name),
            _ => self.name.clone(),
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn block_size(&self) -> BlockSize {
        self.block_size
    }

    /// 404 when the request names a model other than this one (an absent model is fine).
    pub fn check_model(&self, req: &InferenceRequest) -> Result<(), ApiError> {
        match &req.model {
            Some(m) if m != &self.name && !self.adapters.contains(m) => Err(ApiError::not_found(
                format!("The model '{m}' does not exist (served: '{}')", self.name),
                Some("model"),
            )),
            _ => Ok(()),
        }
    }

    /// Renders and tokenizes the prompt and hashes its full blocks.
    pub fn prepare(&self, req: &InferenceRequest) -> Result<PreparedPrompt, ApiError> {
        Ok(self.blocks(req)?.finish())
    }

    /// [`ModelBundle::prepare`] for a server whose context holds `max_tokens`: a prompt that
    /// is surely longer ([`PromptBlocks::min_tokens`], known before tokenizing) is refused
    /// at once, so a megabyte prompt costs its parse, not its tokenizing.
    pub fn prepare_within(
        &self,
        req: &InferenceRequest,
        max_tokens: usize,
    ) -> Result<PreparedPrompt, ApiError> {
        let blocks = self.blocks(req)?;
        let at_least = blocks.min_tokens();
        if at_least > max_tokens {
            return Err(ApiError::context_length(
                max_tokens,
                at_least,
                true,
                req.endpoint,
            ));
        }
        Ok(blocks.finish())
    }

    /// The prompt, rendered, to tokenize and hash only as deep as asked
    /// ([`PromptBlocks::extend_to`]); every client error is found here already.
    pub fn blocks<'a>(&'a self, req: &'a InferenceRequest) -> Result<PromptBlocks<'a>, ApiError> {
        self.blocks_within(req, usize::MAX)
    }

    /// [`ModelBundle::blocks`] for a router, which reads at most `read_limit` bytes of the
    /// prompt's text ([`PromptBlocks::read_at_most`]): exact up to a safe cut on the fast
    /// path; with another tokenizer the text is cut at the last whitespace before the limit,
    /// so the last block read may differ from the whole prompt's (a miss, never a wrong
    /// answer). Token-id prompts are not cut: the body limit bounds them, and they cost no
    /// tokenizing.
    pub fn blocks_within<'a>(
        &'a self,
        req: &'a InferenceRequest,
        read_limit: usize,
    ) -> Result<PromptBlocks<'a>, ApiError> {
        self.check_model(req)?;
        // non-text parts are not in the rendered text: they seed the hashes, so a prompt
        // with the same image hashes alike and one with another image does not
        let salt = match (req.cache_salt.as_deref(), req.media.is_empty()) {
            (salt, true) => salt.map(str::to_owned),
            (salt, false) => Some(format!(
                "{}\u{0}media:{}",
                salt.unwrap_or(""),
                req.media.join("\u{0}")
            )),
        };
        let root = root_hash(&self.hash_seed(req), salt.as_deref());
        let whole = |tokens| Ok(PromptBlocks::whole(tokens, root, self.block_size));
        let lazy = |fast, text, specials: &'a Specials| {
            let mut p = PromptBlocks::lazy(
                fast,
                text,
                &specials.before,
                &specials.after,
                root,
                self.block_size,
            );
            p.read_at_most(read_limit);
            Ok(p)
        };
        // a batch is routed on its first prompt
        let mut prompt = &req.prompt;
        while let PromptInput::Batch(prompts) = prompt {
            match prompts.first() {
                Some(first) => prompt = first,
                None => return whole(Vec::new()),
            }
        }
        match (prompt, self.tokenizer.fast()) {
            (PromptInput::Text(text), Some(fast)) => lazy(
                fast,
                Cow::Borrowed(text.as_str()),
                self.tokenizer.specials(),
            ),
            (PromptInput::Text(text), None) => {
                let (text, stopped) = cut_at_space(text, read_limit);
                let tokens = self.tokenizer.encode_with_specials(text).map_err(|e| {
                    ApiError::invalid(
                        format!("prompt could not be tokenized: {e}"),
                        Some("prompt"),
                    )
                })?;
                whole(tokens).map(|p| p.stopped_at(stopped))
            }
            (PromptInput::TokenIds(ids), _) => {
                let vocab = self.tokenizer.vocab_size();
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                    return Err(ApiError::invalid(
                        format!("token id {bad} is out of range (vocabulary size {vocab})"),
                        Some("prompt"),
                    ));
                }
                whole(ids.clone())
            }
            (PromptInput::Chat(messages), fast) => {
                let template = self.template.as_ref().ok_or_else(|| {
                    ApiError::unrenderable(
                        "this model has no chat template; use /v1/completions",
                        Some("messages"),
                    )
                })?;
                let text = template.render(messages, &req.chat)?;
                match fast {
                    Some(fast) => lazy(fast, Cow::Owned(text), &NO_SPECIALS),
                    None => {
                        let (read, stopped) = cut_at_space(&text, read_limit);
                        whole(self.encode(read)?).map(|p| p.stopped_at(stopped))
                    }
                }
            }
            (PromptInput::Batch(_), _) => whole(Vec::new()),
        }
    }

    /// The rendered text of a chat request (for debugging and for engines that want text).
    pub fn render_chat(&self, req: &InferenceRequest) -> Result<Option<String>, ApiError> {
        match (&req.prompt, &self.template) {
            (PromptInput::Chat(m), Some(t)) => t.render(m, &req.chat).map(Some),
            _ => Ok(None),
        }
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.tokenizer.encode(text).map_err(|e| {
            ApiError::unrenderable(
                format!("prompt could not be tokenized: {e}"),
                Some("prompt"),
            )
        })
    }
}

/// `text` up to its last whitespace within `limit` bytes, and `(read, total)` bytes when
/// that cut anything (the slow tokenizer path's read limit: [`ModelBundle::blocks_within`]).
fn cut_at_space(text: &str, limit: usize) -> (&str, Option<(usize, usize)>) {
    if text.len() <= limit {
        return (text, None);
    }
    let head = &text[..text.floor_char_boundary(limit)];
    let end = head
        .char_indices()
        .rev()
        .find(|(_, c)| c.is_whitespace())
        .map_or(0, |(i, _)| i);
    (&text[..end], Some((end, text.len())))
}

/// `tokenizer.json` of a test tokenizer in which every character is a token (ids 0–255 for
/// U+0000–U+00FF), for unit tests here and in the filter.
#[doc(hidden)]
pub fn tiny_tokenizer_json() -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = (0u8..=255)
        .map(|b| (String::from(b as char), serde_json::json!(b)))
        .collect();
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null,
        // WordLevel needs a splitter: one token per character
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": false},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "?"}
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{parse_request, Endpoint};

    fn bundle() -> ModelBundle {
        let tok = tiny_tokenizer_json();
        ModelBundle::new("base", tok.as_bytes(), None, BlockSize::new(4).unwrap())
            .unwrap()
            .with_adapters(vec!["sql-lora".into(), "chat-lora".into()])
    }

    fn hashes(b: &ModelBundle, model: &str) -> Result<Vec<BlockHash>, ApiError> {
        let body = serde_json::json!({"model": model, "prompt": "the same twelve"});
        let req = parse_request(Endpoint::Completions, body.to_string().as_bytes()).unwrap();
        b.prepare(&req).map(|p| p.hashes)
    }

    #[test]
    fn adapters_are_served_and_never_share_blocks() {
        let b = bundle();
        let base = hashes(&b, "base").unwrap();
        let sql = hashes(&b, "sql-lora").unwrap();
        let chat = hashes(&b, "chat-lora").unwrap();
        assert_eq!(base.len(), 3);
        assert!(base.iter().all(|h| !sql.contains(h) && !chat.contains(h)));
        assert!(sql.iter().all(|h| !chat.contains(h)));
        assert_eq!(hashes(&b, "sql-lora").unwrap(), sql, "stable");
        assert_eq!(hashes(&b, "other").unwrap_err().status, 404);
    }
}
