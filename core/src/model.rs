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
    pub chat_template: Option<ChatTemplateField>,
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

/// `chat_template` as models ship it: one template, or a list of named ones (`default`, and
/// `tool_use` for requests that pass tools), as Hugging Face's `apply_chat_template` picks.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum ChatTemplateField {
    One(String),
    Named(Vec<NamedTemplate>),
}

/// One entry of a list-form `chat_template`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NamedTemplate {
    pub name: String,
    pub template: String,
}

impl ChatTemplateField {
    /// The template named `name` (a single template is `default`).
    fn named(&self, name: &str) -> Option<&str> {
        match self {
            ChatTemplateField::One(t) => (name == "default").then_some(t.as_str()),
            ChatTemplateField::Named(list) => list
                .iter()
                .find(|t| t.name == name)
                .map(|t| t.template.as_str()),
        }
    }
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
    /// Other names the model is served under (vLLM takes several `--served-model-name`s):
    /// requests naming one are this model's own, with the same blocks.
    aliases: Vec<String>,
    tokenizer: Tokenizer,
    /// The chat template (`default`), and the one for requests that pass tools when the
    /// model ships one (`tool_use`).
    template: Option<ChatTemplate>,
    tool_template: Option<ChatTemplate>,
    block_size: BlockSize,
}

/// A model directory's files, as bytes.
#[derive(Debug, Clone, Copy)]
pub struct ModelFiles<'a> {
    /// `tokenizer.json`
    pub tokenizer_json: &'a [u8],
    /// `tokenizer_config.json` (special tokens; the chat template, one or a named list)
    pub tokenizer_config_json: Option<&'a [u8]>,
    /// `chat_template.jinja`, where the model keeps its template in a file of its own
    pub chat_template_jinja: Option<&'a [u8]>,
}

impl<'a> ModelFiles<'a> {
    /// `tokenizer.json` and, optionally, `tokenizer_config.json`; no `chat_template.jinja`.
    pub fn new(tokenizer_json: &'a [u8], tokenizer_config_json: Option<&'a [u8]>) -> Self {
        ModelFiles {
            tokenizer_json,
            tokenizer_config_json,
            chat_template_jinja: None,
        }
    }
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
    #[cfg(feature = "hf-tokenizers")]
    pub fn new(
        name: &str,
        tokenizer_json: &[u8],
        tokenizer_config_json: Option<&[u8]>,
        block_size: BlockSize,
    ) -> Result<Self, BundleError> {
        Self::from_files(
            name,
            ModelFiles::new(tokenizer_json, tokenizer_config_json),
            block_size,
        )
    }

    /// A bundle from a model directory's files, `chat_template.jinja` included (Hugging
    /// Face's newer layout keeps the template there; it wins over `tokenizer_config.json`'s).
    #[cfg(feature = "hf-tokenizers")]
    pub fn from_files(
        name: &str,
        files: ModelFiles<'_>,
        block_size: BlockSize,
    ) -> Result<Self, BundleError> {
        Self::build(
            name,
            Tokenizer::from_json_bytes(files.tokenizer_json)?,
            files,
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
        Self::routing_from_files(
            name,
            ModelFiles::new(tokenizer_json, tokenizer_config_json),
            block_size,
        )
    }

    /// [`ModelBundle::from_files`] for routing ([`ModelBundle::for_routing`]).
    pub fn routing_from_files(
        name: &str,
        files: ModelFiles<'_>,
        block_size: BlockSize,
    ) -> Result<Self, BundleError> {
        Self::build(
            name,
            Tokenizer::for_encoding(files.tokenizer_json)?,
            files,
            block_size,
        )
    }

    fn build(
        name: &str,
        tokenizer: Tokenizer,
        files: ModelFiles<'_>,
        block_size: BlockSize,
    ) -> Result<Self, BundleError> {
        let config: TokenizerConfig = match files.tokenizer_config_json {
            Some(b) => serde_json::from_slice(b).map_err(|e| BundleError::Config(e.to_string()))?,
            None => TokenizerConfig::default(),
        };
        let jinja = match files.chat_template_jinja {
            Some(b) => Some(
                std::str::from_utf8(b)
                    .map_err(|e| BundleError::Config(format!("chat_template.jinja: {e}")))?,
            ),
            None => None,
        };
        let compile = |src: Option<&str>| -> Result<Option<ChatTemplate>, BundleError> {
            src.map(|src| {
                ChatTemplate::new(
                    src,
                    config.bos_token.as_deref().unwrap_or(""),
                    config.eos_token.as_deref().unwrap_or(""),
                )
            })
            .transpose()
            .map_err(BundleError::from)
        };
        let field = config.chat_template.as_ref();
        let template = compile(jinja.or_else(|| field.and_then(|f| f.named("default"))))?;
        let tool_template = compile(field.and_then(|f| match f {
            ChatTemplateField::Named(_) => f.named("tool_use"),
            ChatTemplateField::One(_) => None,
        }))?;
        Ok(ModelBundle {
            name: name.to_owned(),
            adapters: Vec::new(),
            aliases: Vec::new(),
            tokenizer,
            template,
            tool_template,
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

    /// The same bundle, also answering to these other names of the model.
    pub fn with_aliases(mut self, aliases: Vec<String>) -> Self {
        self.aliases = aliases;
        self
    }

    pub fn aliases(&self) -> &[String] {
        &self.aliases
    }

    pub fn adapters(&self) -> &[String] {
        &self.adapters
    }

    /// What seeds a request's block hashes: the base model, or base and adapter.
    fn hash_seed(&self, req: &InferenceRequest) -> String {
        let adapter = req
            .model
            .as_deref()
            .filter(|m| self.adapters.iter().any(|a| a == m));
        crate::block::model_seed(&self.name, adapter)
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
            Some(m)
                if m != &self.name && !self.aliases.contains(m) && !self.adapters.contains(m) =>
            {
                Err(ApiError::not_found(
                    format!("The model '{m}' does not exist (served: '{}')", self.name),
                    Some("model"),
                ))
            }
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
                let template = self.chat_template_for(req).ok_or_else(|| {
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
        match (&req.prompt, self.chat_template_for(req)) {
            (PromptInput::Chat(m), Some(t)) => t.render(m, &req.chat).map(Some),
            _ => Ok(None),
        }
    }

    /// The template a chat request renders with: `tool_use` when it passes tools and the
    /// model ships one, else the default (Hugging Face's choice, which vLLM follows).
    fn chat_template_for(&self, req: &InferenceRequest) -> Option<&ChatTemplate> {
        let tools = req
            .chat
            .tools
            .as_ref()
            .is_some_and(|t| t.as_array().is_none_or(|a| !a.is_empty()));
        match (&self.tool_template, tools) {
            (Some(t), true) => Some(t),
            _ => self.template.as_ref(),
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

    #[test]
    fn aliases_are_the_model_itself() {
        let b = bundle().with_aliases(vec!["smol".into()]);
        assert_eq!(hashes(&b, "smol").unwrap(), hashes(&b, "base").unwrap());
        assert_ne!(hashes(&b, "smol").unwrap(), hashes(&b, "sql-lora").unwrap());
        assert_eq!(hashes(&bundle(), "smol").unwrap_err().status, 404);
    }

    fn chat(b: &ModelBundle, tools: bool) -> String {
        let mut body = serde_json::json!({"messages": [{"role": "user", "content": "hi"}]});
        if tools {
            body["tools"] = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
        }
        let req = parse_request(Endpoint::ChatCompletions, body.to_string().as_bytes()).unwrap();
        b.render_chat(&req).unwrap().unwrap()
    }

    fn files<'a>(tok: &'a str, cfg: Option<&'a str>, jinja: Option<&'a str>) -> ModelFiles<'a> {
        ModelFiles {
            tokenizer_json: tok.as_bytes(),
            tokenizer_config_json: cfg.map(str::as_bytes),
            chat_template_jinja: jinja.map(str::as_bytes),
        }
    }

    #[test]
    fn chat_templates_as_models_ship_them() {
        let tok = tiny_tokenizer_json();
        let bs = BlockSize::new(4).unwrap();
        // the list form: `default`, and `tool_use` for requests that pass tools
        let named = r#"{"chat_template": [
            {"name": "default", "template": "D:{{ messages[0].content }}"},
            {"name": "tool_use", "template": "T:{{ tools[0].function.name }}:{{ messages[0].content }}"}
        ]}"#;
        let b = ModelBundle::from_files("m", files(&tok, Some(named), None), bs).unwrap();
        assert_eq!(chat(&b, false), "D:hi");
        assert_eq!(chat(&b, true), "T:f:hi");
        // one template serves both
        let one = r#"{"chat_template": "O:{{ messages[0].content }}"}"#;
        let b = ModelBundle::from_files("m", files(&tok, Some(one), None), bs).unwrap();
        assert_eq!(
            (chat(&b, false), chat(&b, true)),
            ("O:hi".into(), "O:hi".into())
        );
        // chat_template.jinja wins over the config's (and needs no config at all)
        let jinja = "J:{{ messages[0].content }}";
        let b = ModelBundle::from_files("m", files(&tok, Some(one), Some(jinja)), bs).unwrap();
        assert_eq!(chat(&b, false), "J:hi");
        let b = ModelBundle::from_files("m", files(&tok, None, Some(jinja)), bs).unwrap();
        assert_eq!(chat(&b, false), "J:hi");
        // a list without `default`: chat is refused as unrenderable (the pod decides)
        let no_default = r#"{"chat_template": [{"name": "rag", "template": "R"}]}"#;
        let b = ModelBundle::from_files("m", files(&tok, Some(no_default), None), bs).unwrap();
        let req = parse_request(
            Endpoint::ChatCompletions,
            br#"{"messages": [{"role": "user", "content": "hi"}]}"#,
        )
        .unwrap();
        assert!(b.prepare(&req).unwrap_err().is_unrenderable());
    }
}
