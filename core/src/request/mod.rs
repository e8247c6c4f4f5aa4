//! Parsing and validating inference request bodies: OpenAI completions and chat completions
//! here, the Responses API ([`responses`]) and Anthropic-style messages ([`messages`]) turned
//! into the chat messages vLLM renders for them.
//!
//! The filter and the server both call [`parse_request`], so a body that the server would
//! reject is rejected by the filter with the very same status and message, and a body both
//! accept yields the same prompt.

mod messages;
mod paths;
mod responses;
mod tools;

pub use paths::{PathKind, BALANCED_PATHS};

use crate::error::ApiError;
use serde_json::{Map, Value};
use std::mem::take;

/// Which OpenAI endpoint a body was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    ChatCompletions,
    /// OpenAI's Responses API (`input`, `instructions`), rendered as a chat.
    Responses,
    /// Anthropic-style messages (`system`, content blocks), rendered as a chat.
    Messages,
}

impl Endpoint {
    /// Every endpoint, in the order of [`Endpoint::path`].
    pub const ALL: [Endpoint; 4] = [
        Endpoint::Completions,
        Endpoint::ChatCompletions,
        Endpoint::Responses,
        Endpoint::Messages,
    ];

    /// The endpoint served at `path` (query string ignored), if it is one we route by prefix.
    pub fn from_path(path: &str) -> Option<Self> {
        let path = path.split('?').next().unwrap_or(path);
        Endpoint::ALL.into_iter().find(|e| e.path() == path)
    }

    /// Where the servers serve it.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Messages => "/v1/messages",
        }
    }

    /// The name a body kind has in configuration (`inference_paths`).
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::ChatCompletions => "chat",
            Endpoint::Responses => "responses",
            Endpoint::Messages => "messages",
        }
    }

    /// The endpoint configured as `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Endpoint::ALL.into_iter().find(|e| e.name() == name)
    }

    /// The body field holding the prompt, named in errors about it.
    pub fn prompt_field(self) -> &'static str {
        match self {
            Endpoint::Completions => "prompt",
            Endpoint::ChatCompletions | Endpoint::Messages => "messages",
            Endpoint::Responses => "input",
        }
    }
}

/// One chat message as the chat template sees it: the client's message object as sent
/// (`role`, `content`, `tool_calls`, `tool_call_id`, `name`, …), with a content-part array
/// flattened the way vLLM does for templates that take string content: the text parts joined
/// with "\n"; other parts (images, audio, video, files) are left out of the text and kept in
/// the request's [`InferenceRequest::media`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct ChatMessage(pub Map<String, Value>);

impl ChatMessage {
    /// A plain text message.
    pub fn text(role: &str, content: &str) -> ChatMessage {
        let mut m = Map::new();
        m.insert("role".into(), Value::from(role));
        m.insert("content".into(), Value::from(content));
        ChatMessage(m)
    }

    pub fn role(&self) -> &str {
        self.0.get("role").and_then(Value::as_str).unwrap_or("")
    }

    /// The text content; `None` when absent or `null` (an assistant turn of tool calls).
    pub fn content(&self) -> Option<&str> {
        self.0.get("content").and_then(Value::as_str)
    }
}

/// The prompt as the client gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptInput {
    /// Completions `prompt` as a string.
    Text(String),
    /// Completions `prompt` as an array of token ids (already tokenized by the client).
    TokenIds(Vec<u32>),
    /// Completions `prompt` as several prompts (strings or token-id arrays), which vLLM
    /// answers with one choice each; routed on the first.
    Batch(Vec<PromptInput>),
    /// Chat `messages`, rendered later with the model's chat template.
    Chat(Vec<ChatMessage>),
}

/// What a chat request gives the chat template besides its messages (vLLM's request
/// fields of the same names).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ChatOptions {
    /// `tools`, passed to the template as `tools`.
    pub tools: Option<Value>,
    /// Close the prompt with the assistant's turn header (default true).
    pub add_generation_prompt: bool,
    /// Leave the final (assistant) message open, for the model to continue it.
    pub continue_final_message: bool,
    /// `chat_template_kwargs`: extra template variables (e.g. `enable_thinking`).
    pub kwargs: Map<String, Value>,
    /// Anthropic-style messages: system messages after the first are merged into the leading
    /// one when the template allows a system message only first (as vLLM does);
    /// `Some(true)` when the first message is the request's top-level `system`.
    pub merge_inline_system: Option<bool>,
}

/// The fields of a request that routing and serving need.
#[derive(Clone, Debug, PartialEq)]
pub struct InferenceRequest {
    pub endpoint: Endpoint,
    pub model: Option<String>,
    pub prompt: PromptInput,
    /// Chat template options (defaults for completions).
    pub chat: ChatOptions,
    /// The non-text content parts of a chat (each part's JSON, in order): they are not in
    /// the rendered text, so they seed the block hashes, and the same image sent again
    /// lands where it was computed.
    pub media: Vec<String>,
    pub cache_salt: Option<String>,
    /// Responses API: the stored response this one continues. Its history is on the pod
    /// that stored it, not in this request.
    pub previous_response: Option<String>,
    pub stream: bool,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
}

/// Parses and validates a request body. Every rejection is a 400 naming the bad field.
pub fn parse_request(endpoint: Endpoint, body: &[u8]) -> Result<InferenceRequest, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::invalid(
            format!(
                "request body is not valid UTF-8 (at byte {})",
                e.valid_up_to()
            ),
            None,
        )
    })?;
    if text.trim().is_empty() {
        return Err(ApiError::invalid(
            "request body is empty; expected a JSON object",
            None,
        ));
    }
    let value: Value = serde_json::from_str(text)
        .map_err(|e| ApiError::invalid(format!("request body is not valid JSON: {e}"), None))?;
    let Value::Object(mut obj) = value else {
        return Err(ApiError::invalid(
            "request body must be a JSON object",
            None,
        ));
    };

    let mut media = Vec::new();
    let (prompt, chat) = match endpoint {
        Endpoint::Completions => (parse_prompt(&mut obj)?, ChatOptions::default()),
        Endpoint::ChatCompletions => (
            PromptInput::Chat(parse_messages(&mut obj, &mut media)?),
            parse_chat_options(&obj)?,
        ),
        Endpoint::Responses => responses::parse(&mut obj, &mut media)?,
        Endpoint::Messages => messages::parse(&mut obj, &mut media)?,
    };
    let (max_tokens_keys, stop_key): (&[&str], _) = match endpoint {
        Endpoint::Completions | Endpoint::ChatCompletions => {
            (&["max_completion_tokens", "max_tokens"], "stop")
        }
        Endpoint::Responses => (&["max_output_tokens"], "stop"),
        Endpoint::Messages => (&["max_tokens"], "stop_sequences"),
    };

    Ok(InferenceRequest {
        endpoint,
        model: opt_string(&obj, "model")?,
        prompt,
        chat,
        media,
        cache_salt: opt_string(&obj, "cache_salt")?,
        previous_response: match endpoint {
            Endpoint::Responses => opt_string(&obj, "previous_response_id")?,
            _ => None,
        },
        stream: opt_bool(&obj, "stream")?.unwrap_or(false),
        max_tokens: parse_max_tokens(&obj, max_tokens_keys)?,
        temperature: opt_number(&obj, "temperature", 0.0, 2.0)?,
        top_p: opt_number(&obj, "top_p", 0.0, 1.0)?,
        seed: opt_u64(&obj, "seed")?,
        stop: parse_stop(&obj, stop_key)?,
    })
}

/// The prompt, moved out of the parsed body (a long prompt is not copied again).
fn parse_prompt(obj: &mut Map<String, Value>) -> Result<PromptInput, ApiError> {
    let p = obj
        .get_mut("prompt")
        .ok_or_else(|| ApiError::invalid("missing required field 'prompt'", Some("prompt")))?;
    match p {
        Value::String(s) if s.is_empty() => Err(ApiError::invalid(
            "'prompt' must not be empty",
            Some("prompt"),
        )),
        Value::String(s) => Ok(PromptInput::Text(take(s))),
        Value::Array(items) if items.is_empty() => Err(ApiError::invalid(
            "'prompt' must not be empty",
            Some("prompt"),
        )),
        Value::Array(items) => {
            if let [Value::String(s)] = items.as_mut_slice() {
                if s.is_empty() {
                    return Err(ApiError::invalid(
                        "'prompt' must not be empty",
                        Some("prompt"),
                    ));
                }
                return Ok(PromptInput::Text(take(s)));
            }
            if let Some(ids) = token_ids(items) {
                return Ok(PromptInput::TokenIds(ids));
            }
            // several prompts: strings or arrays of token ids
            let batch = items
                .iter_mut()
                .map(|v| match v {
                    Value::String(s) if !s.is_empty() => Some(PromptInput::Text(take(s))),
                    Value::Array(ids) if !ids.is_empty() => token_ids(ids).map(PromptInput::TokenIds),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    ApiError::invalid(
                        "'prompt' must be a string, an array of token ids, or an array of non-empty strings or token-id arrays",
                        Some("prompt"),
                    )
                })?;
            Ok(PromptInput::Batch(batch))
        }
        _ => Err(ApiError::invalid(
            "'prompt' must be a string or an array of token ids",
            Some("prompt"),
        )),
    }
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

fn parse_chat_options(obj: &Map<String, Value>) -> Result<ChatOptions, ApiError> {
    let add_generation_prompt = opt_bool(obj, "add_generation_prompt")?.unwrap_or(true);
    let continue_final_message = opt_bool(obj, "continue_final_message")?.unwrap_or(false);
    if add_generation_prompt && continue_final_message {
        // as vLLM: the two contradict each other
        return Err(ApiError::invalid(
            "'continue_final_message' cannot be true while 'add_generation_prompt' is true",
            Some("continue_final_message"),
        ));
    }
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) => Some(Value::Array(list.iter().map(tools::chat_tool).collect())),
        Some(_) => {
            return Err(ApiError::invalid("'tools' must be an array", Some("tools")));
        }
    };
    let kwargs = parse_kwargs(obj)?;
    Ok(ChatOptions {
        tools,
        add_generation_prompt,
        continue_final_message,
        kwargs,
        merge_inline_system: None,
    })
}

/// `chat_template_kwargs`: extra template variables, an object (vLLM's field, on every chat
/// endpoint).
fn parse_kwargs(obj: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(_) => Err(ApiError::invalid(
            "'chat_template_kwargs' must be an object",
            Some("chat_template_kwargs"),
        )),
    }
}

/// The messages, moved out of the parsed body.
fn parse_messages(
    obj: &mut Map<String, Value>,
    media: &mut Vec<String>,
) -> Result<Vec<ChatMessage>, ApiError> {
    let m = obj
        .get_mut("messages")
        .ok_or_else(|| ApiError::invalid("missing required field 'messages'", Some("messages")))?;
    let Value::Array(items) = m else {
        return Err(ApiError::invalid(
            "'messages' must be an array",
            Some("messages"),
        ));
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            "'messages' must not be empty",
            Some("messages"),
        ));
    }
    let messages = items
        .iter_mut()
        .enumerate()
        .map(|(i, item)| {
            let Value::Object(msg) = item else {
                return Err(ApiError::invalid(
                    format!("'messages[{i}]' must be an object"),
                    Some(&format!("messages[{i}]")),
                ));
            };
            match msg.get("role") {
                Some(Value::String(r)) if !r.is_empty() => {}
                _ => {
                    return Err(ApiError::invalid(
                        format!("'messages[{i}].role' must be a non-empty string"),
                        Some(&format!("messages[{i}].role")),
                    ))
                }
            };
            Ok(ChatMessage(take(msg)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    flatten_messages(messages, media, "messages")
}

/// Every message's content as the template gets it ([`flatten_content`]); `field` names the
/// request's list in errors.
fn flatten_messages(
    mut messages: Vec<ChatMessage>,
    media: &mut Vec<String>,
    field: &str,
) -> Result<Vec<ChatMessage>, ApiError> {
    for (i, msg) in messages.iter_mut().enumerate() {
        if let Some(content) = msg.0.get_mut("content") {
            *content = flatten_content(take(content), media).ok_or_else(|| {
                ApiError::invalid(
                    format!("'{field}[{i}].content' must be a string, null, or an array of content parts (objects with a 'type')"),
                    Some(&format!("{field}[{i}].content")),
                )
            })?;
        }
    }
    Ok(messages)
}

/// Content part types that are text (the Responses API's too).
const TEXT_PARTS: [&str; 3] = ["text", "input_text", "output_text"];

/// A message's content as the template gets it: a string or null as sent; an array of
/// content parts becomes its text parts joined with "\n" (vLLM's string content format),
/// its other parts going to `media`. `None` for anything else.
fn flatten_content(v: Value, media: &mut Vec<String>) -> Option<Value> {
    match &v {
        Value::String(_) | Value::Null => Some(v),
        Value::Array(parts) => {
            let mut texts = Vec::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some(k), Some(Value::String(t))) if TEXT_PARTS.contains(&k) => {
                        texts.push(t.as_str())
                    }
                    (Some(k), _) if TEXT_PARTS.contains(&k) => return None,
                    (Some(_), _) => media.push(part.to_string()),
                    (None, _) => return None,
                }
            }
            Some(Value::from(texts.join("\n")))
        }
        _ => None,
    }
}

fn opt_string(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::invalid(
            format!("'{key}' must be a string"),
            Some(key),
        )),
    }
}

fn opt_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid(
            format!("'{key}' must be a boolean"),
            Some(key),
        )),
    }
}

fn opt_u64(obj: &Map<String, Value>, key: &str) -> Result<Option<u64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            ApiError::invalid(format!("'{key}' must be a non-negative integer"), Some(key))
        }),
    }
}

fn opt_number(
    obj: &Map<String, Value>,
    key: &str,
    min: f64,
    max: f64,
) -> Result<Option<f64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if (min..=max).contains(&x) => Ok(Some(x)),
            _ => Err(ApiError::invalid(
                format!("'{key}' must be a number between {min} and {max}"),
                Some(key),
            )),
        },
    }
}

/// The first of `keys` the body has (chat clients send `max_completion_tokens` nowadays,
/// older ones `max_tokens`; the Responses API `max_output_tokens`).
fn parse_max_tokens(obj: &Map<String, Value>, keys: &[&str]) -> Result<Option<u32>, ApiError> {
    let Some(key) = keys.iter().copied().find(|k| obj.contains_key(*k)) else {
        return Ok(None);
    };
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(ApiError::invalid(
                format!("'{key}' must be a positive integer"),
                Some(key),
            )),
        },
    }
}

fn parse_stop(obj: &Map<String, Value>, key: &str) -> Result<Vec<String>, ApiError> {
    let message = format!("'{key}' must be a string or an array of strings");
    match obj.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::invalid(message, Some(key))),
        Some(_) => Err(ApiError::invalid(message, Some(key))),
    }
}

/// The chat messages a body of `endpoint` renders, as JSON (for the tests of each shape).
#[cfg(test)]
fn chat_json(endpoint: Endpoint, body: &Value) -> Vec<Value> {
    match parse_request(endpoint, body.to_string().as_bytes()).map(|r| r.prompt) {
        Ok(PromptInput::Chat(m)) => m.into_iter().map(|m| Value::Object(m.0)).collect(),
        other => panic!("not a chat: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(ep: Endpoint, body: &[u8]) -> ApiError {
        parse_request(ep, body).unwrap_err()
    }

    #[test]
    fn completions_text_and_ids() {
        let r = parse_request(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"hi","stream":true,"cache_salt":"t1","max_tokens":5}"#,
        )
        .unwrap();
        assert_eq!(r.prompt, PromptInput::Text("hi".into()));
        assert!(r.stream);
        assert_eq!(r.cache_salt.as_deref(), Some("t1"));
        assert_eq!(r.max_tokens, Some(5));
        let r = parse_request(Endpoint::Completions, br#"{"prompt":[1,2,3]}"#).unwrap();
        assert_eq!(r.prompt, PromptInput::TokenIds(vec![1, 2, 3]));
        let r = parse_request(Endpoint::Completions, br#"{"prompt":["one"]}"#).unwrap();
        assert_eq!(r.prompt, PromptInput::Text("one".into()));
    }

    #[test]
    fn chat_messages_and_parts() {
        let r = parse_request(
            Endpoint::ChatCompletions,
            br#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            r.prompt,
            PromptInput::Chat(vec![
                ChatMessage::text("system", "s"),
                ChatMessage::text("user", "a\nb"),
            ])
        );
        assert!(r.chat.add_generation_prompt && r.media.is_empty());
    }

    #[test]
    fn chat_shapes_vllm_accepts() {
        let r = parse_request(
            Endpoint::ChatCompletions,
            br#"{"messages":[
                {"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"https://x/cat.png"}}]},
                {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"look","arguments":"{}"}}]},
                {"role":"tool","tool_call_id":"c1","content":"a cat"},
                {"role":"user"}
            ],
            "tools":[{"type":"function","function":{"name":"look","parameters":{}}}],
            "chat_template_kwargs":{"enable_thinking":false},
            "add_generation_prompt":false,"continue_final_message":true}"#,
        )
        .unwrap();
        let PromptInput::Chat(m) = &r.prompt else {
            panic!("{:?}", r.prompt)
        };
        assert_eq!(m[0].content(), Some("what is this?"));
        assert_eq!(
            r.media,
            [r#"{"type":"image_url","image_url":{"url":"https://x/cat.png"}}"#]
        );
        assert_eq!(
            (m[1].content(), m[1].0["tool_calls"][0]["id"].as_str()),
            (None, Some("c1"))
        );
        assert_eq!(
            (m[2].role(), m[2].0["tool_call_id"].as_str()),
            ("tool", Some("c1"))
        );
        assert_eq!(m[3].content(), None);
        assert!(r.chat.tools.is_some() && r.chat.continue_final_message);
        assert_eq!(r.chat.kwargs["enable_thinking"], false);
    }

    #[test]
    fn batched_prompts() {
        let r = parse_request(Endpoint::Completions, br#"{"prompt":["a","b"]}"#).unwrap();
        assert_eq!(
            r.prompt,
            PromptInput::Batch(vec![
                PromptInput::Text("a".into()),
                PromptInput::Text("b".into())
            ])
        );
        let r = parse_request(Endpoint::Completions, br#"{"prompt":[[1,2],[3]]}"#).unwrap();
        assert_eq!(
            r.prompt,
            PromptInput::Batch(vec![
                PromptInput::TokenIds(vec![1, 2]),
                PromptInput::TokenIds(vec![3])
            ])
        );
    }

    #[test]
    fn bad_inputs_are_400_with_param() {
        let cases: &[(Endpoint, &[u8], Option<&str>)] = &[
            (Endpoint::Completions, b"{not json", None),
            (Endpoint::Completions, b"\xff\xfe{}", None),
            (Endpoint::Completions, b"", None),
            (Endpoint::Completions, b"[1,2]", None),
            (Endpoint::Completions, br#"{"model":"m"}"#, Some("prompt")),
            (Endpoint::Completions, br#"{"prompt":""}"#, Some("prompt")),
            (Endpoint::Completions, br#"{"prompt":[]}"#, Some("prompt")),
            (Endpoint::Completions, br#"{"prompt":42}"#, Some("prompt")),
            (
                Endpoint::Completions,
                br#"{"prompt":["a",""]}"#,
                Some("prompt"),
            ),
            (
                Endpoint::Completions,
                br#"{"prompt":["a",3]}"#,
                Some("prompt"),
            ),
            (
                Endpoint::Completions,
                br#"{"prompt":"x","stream":"yes"}"#,
                Some("stream"),
            ),
            (
                Endpoint::Completions,
                br#"{"prompt":"x","max_tokens":0}"#,
                Some("max_tokens"),
            ),
            (
                Endpoint::Completions,
                br#"{"prompt":"x","cache_salt":5}"#,
                Some("cache_salt"),
            ),
            (
                Endpoint::Completions,
                br#"{"prompt":"x","temperature":9}"#,
                Some("temperature"),
            ),
            (
                Endpoint::ChatCompletions,
                br#"{"prompt":"x"}"#,
                Some("messages"),
            ),
            (
                Endpoint::ChatCompletions,
                br#"{"messages":[]}"#,
                Some("messages"),
            ),
            (
                Endpoint::ChatCompletions,
                br#"{"messages":"hi"}"#,
                Some("messages"),
            ),
            (
                Endpoint::ChatCompletions,
                br#"{"messages":[{"role":"user","content":[{"text":"no type"}]}]}"#,
                Some("messages[0].content"),
            ),
            (
                Endpoint::ChatCompletions,
                br#"{"messages":[{"role":"user","content":"x"}],"continue_final_message":true}"#,
                Some("continue_final_message"),
            ),
            (
                Endpoint::ChatCompletions,
                br#"{"messages":[{"role":"user","content":"x"}],"tools":{}}"#,
                Some("tools"),
            ),
            (
                Endpoint::ChatCompletions,
                br#"{"messages":[{"content":"x"}]}"#,
                Some("messages[0].role"),
            ),
            (
                Endpoint::ChatCompletions,
                br#"{"messages":[{"role":"user","content":1}]}"#,
                Some("messages[0].content"),
            ),
        ];
        for (ep, body, param) in cases {
            let e = err(*ep, body);
            assert_eq!(e.status, 400, "{:?}", String::from_utf8_lossy(body));
            assert_eq!(
                e.param.as_deref(),
                *param,
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn endpoint_from_path() {
        assert_eq!(
            Endpoint::from_path("/v1/completions"),
            Some(Endpoint::Completions)
        );
        assert_eq!(
            Endpoint::from_path("/v1/chat/completions?x=1"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(Endpoint::from_path("/v1/models"), None);
    }
}
