//! Anthropic-style messages (`POST /v1/messages`) as vLLM renders them.
//!
//! vLLM converts such a request into a chat completion (its `AnthropicServingMessages`) and
//! renders that with the model's chat template; the filter converts the same way so it routes
//! by the same tokens: the top-level `system` (a string or text blocks, joined with nothing
//! between, Claude Code's `x-anthropic-billing-header` blocks left out) first; each message's
//! text blocks as its content (one block: a string; several: text parts), `tool_use` blocks
//! as `tool_calls` with the input as Python's `json.dumps` writes it, a user's `tool_result`
//! blocks as `tool` messages before it, `thinking` as the assistant's `reasoning`; tools with
//! their `input_schema` as parameters.
//!
//! Templates that allow a system message only first (vLLM probes by rendering one): inline
//! system messages are merged into the leading one at render time
//! ([`super::ChatOptions::merge_inline_system`]), as vLLM merges them.

use super::{flatten_messages, tools, ChatMessage, ChatOptions, PromptInput};
use crate::error::ApiError;
use serde_json::{Map, Value};

/// System text blocks beginning with this carry a per-request hash; vLLM drops them so the
/// prompt's prefix stays cacheable.
const BILLING_HEADER: &str = "x-anthropic-billing-header";

pub(super) fn parse(
    obj: &mut Map<String, Value>,
    media: &mut Vec<String>,
) -> Result<(PromptInput, ChatOptions), ApiError> {
    match obj.get("model") {
        Some(Value::String(_)) => {}
        _ => {
            return Err(ApiError::invalid(
                "missing required field 'model'",
                Some("model"),
            ))
        }
    }
    if !obj.get("max_tokens").is_some_and(Value::is_u64) {
        return Err(ApiError::invalid(
            "missing required field 'max_tokens' (a positive integer)",
            Some("max_tokens"),
        ));
    }
    let mut messages = Vec::new();
    let leading = match obj.get("system") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => (!s.is_empty()).then(|| s.clone()),
        Some(Value::Array(blocks)) => system_text(blocks, "system")?,
        Some(_) => {
            return Err(ApiError::invalid(
                "'system' must be a string or an array of text blocks",
                Some("system"),
            ))
        }
    };
    if let Some(text) = &leading {
        messages.push(ChatMessage::text("system", text));
    }
    let Some(Value::Array(list)) = obj.get("messages") else {
        return Err(ApiError::invalid(
            "missing required field 'messages' (an array)",
            Some("messages"),
        ));
    };
    for (i, msg) in list.iter().enumerate() {
        add_message(i, msg, &mut messages)?;
    }
    let messages = flatten_messages(messages, media, "messages")?;
    let kwargs = super::parse_kwargs(obj)?;
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) => Some(Value::Array(
            list.iter()
                .map(|t| {
                    let t = t
                        .as_object()
                        .filter(|t| t.get("name").is_some_and(Value::is_string));
                    let t = t.ok_or_else(|| {
                        ApiError::invalid("each tool must have a 'name'", Some("tools"))
                    })?;
                    Ok(tools::function(
                        &t["name"],
                        t.get("description"),
                        t.get("input_schema"),
                        t,
                    ))
                })
                .collect::<Result<_, ApiError>>()?,
        )),
        Some(_) => return Err(ApiError::invalid("'tools' must be an array", Some("tools"))),
    };
    let chat = ChatOptions {
        tools,
        add_generation_prompt: true,
        continue_final_message: false,
        kwargs,
        merge_inline_system: Some(leading.is_some()),
    };
    Ok((PromptInput::Chat(messages), chat))
}

/// The text of system blocks, joined with nothing between; `None` when there is none.
fn system_text(blocks: &[Value], field: &str) -> Result<Option<String>, ApiError> {
    let mut text = String::new();
    for b in blocks {
        let kind = b.get("type").and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid(format!("'{field}' blocks must have a 'type'"), Some(field))
        })?;
        if let (Some("text"), Some(t)) = (Some(kind), b.get("text").and_then(Value::as_str)) {
            if !t.is_empty() && !t.starts_with(BILLING_HEADER) {
                text.push_str(t);
            }
        }
    }
    Ok((!text.is_empty()).then_some(text))
}

const BLOCK_TYPES: [&str; 9] = [
    "text",
    "image",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
    "tool_addition",
    "tool_removal",
];

fn add_message(i: usize, msg: &Value, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let field = format!("messages[{i}]");
    let role = match msg.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant" | "system")) => r,
        _ => {
            return Err(ApiError::invalid(
                format!("'{field}.role' must be \"user\", \"assistant\" or \"system\""),
                Some(&field),
            ))
        }
    };
    let blocks = match msg.get("content") {
        Some(Value::String(s)) if role == "system" => {
            if !s.is_empty() && !s.starts_with(BILLING_HEADER) {
                out.push(ChatMessage::text("system", s));
            }
            return Ok(());
        }
        Some(Value::String(s)) => {
            out.push(ChatMessage::text(role, s));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(ApiError::invalid(
                format!("'{field}.content' must be a string or an array of content blocks"),
                Some(&field),
            ))
        }
    };
    for b in blocks {
        let kind = b.get("type").and_then(Value::as_str);
        if !kind.is_some_and(|k| BLOCK_TYPES.contains(&k)) {
            return Err(ApiError::invalid(
                format!("'{field}.content' has a block of unknown type"),
                Some(&field),
            ));
        }
    }
    if role == "system" {
        if let Some(text) = system_text(blocks, &field)? {
            out.push(ChatMessage::text("system", &text));
        }
        return Ok(());
    }
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut reasoning = String::new();
    let mut has_reasoning = false;
    for b in blocks {
        let s = |k: &str| b.get(k).and_then(Value::as_str);
        match s("type") {
            Some("text") => {
                if let Some(t) = s("text").filter(|t| !t.is_empty()) {
                    parts.push(text_part(t));
                }
            }
            Some("image") => {
                if let Some(url) = b.get("source").and_then(image_url) {
                    let mut p = Map::new();
                    p.insert("type".into(), Value::from("image_url"));
                    let mut u = Map::new();
                    u.insert("url".into(), Value::from(url));
                    p.insert("image_url".into(), Value::Object(u));
                    parts.push(Value::Object(p));
                }
            }
            Some("thinking") => {
                if let Some(t) = s("thinking") {
                    reasoning.push_str(t);
                    has_reasoning = true;
                }
            }
            Some("tool_use") => {
                let input = b.get("input").filter(|v| !v.is_null());
                let empty = Value::Object(Map::new());
                let mut function = Map::new();
                function.insert("name".into(), Value::from(s("name").unwrap_or_default()));
                function.insert(
                    "arguments".into(),
                    Value::from(py_dumps(input.unwrap_or(&empty))),
                );
                let mut call = Map::new();
                call.insert("id".into(), Value::from(s("id").unwrap_or_default()));
                call.insert("type".into(), Value::from("function"));
                call.insert("function".into(), Value::Object(function));
                calls.push(Value::Object(call));
            }
            Some("tool_result") if role == "user" => {
                let text = match b.get("content") {
                    Some(Value::String(t)) => t.clone(),
                    Some(Value::Array(items)) => items
                        .iter()
                        .filter(|it| it.get("type").and_then(Value::as_str) == Some("text"))
                        .map(|it| it.get("text").and_then(Value::as_str).unwrap_or_default())
                        .collect::<Vec<_>>()
                        .join("\n"),
                    _ => String::new(),
                };
                let mut m = Map::new();
                m.insert("role".into(), Value::from("tool"));
                m.insert(
                    "tool_call_id".into(),
                    Value::from(s("tool_use_id").unwrap_or_default()),
                );
                m.insert("content".into(), Value::from(text));
                out.push(ChatMessage(m));
            }
            Some("tool_result") => {
                let text = match b.get("content") {
                    Some(Value::String(t)) => t.clone(),
                    _ => String::new(),
                };
                parts.push(text_part(&format!("Tool result: {text}")));
            }
            _ => {} // redacted thinking, tool references and tool changes add no text
        }
    }
    let mut m = Map::new();
    m.insert("role".into(), Value::from(role));
    if has_reasoning {
        m.insert("reasoning".into(), Value::from(reasoning));
    }
    if !calls.is_empty() {
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    match parts.as_slice() {
        [] => {}
        [one] if one.get("type").and_then(Value::as_str) == Some("text") => {
            m.insert("content".into(), one["text"].clone());
        }
        _ => {
            m.insert("content".into(), Value::Array(parts));
        }
    }
    // a user turn of tool results only adds no message of its own
    if role != "user" || m.contains_key("content") {
        out.push(ChatMessage(m));
    }
    Ok(())
}

fn text_part(text: &str) -> Value {
    let mut p = Map::new();
    p.insert("type".into(), Value::from("text"));
    p.insert("text".into(), Value::from(text));
    Value::Object(p)
}

/// An image source as the URL vLLM passes on: a URL as is, base64 data as a data URL.
fn image_url(source: &Value) -> Option<String> {
    match source.get("type").and_then(Value::as_str) {
        Some("url") => source.get("url").and_then(Value::as_str).map(str::to_owned),
        Some("base64") => {
            let media = source
                .get("media_type")
                .and_then(Value::as_str)
                .unwrap_or("image/jpeg");
            let data = source
                .get("data")
                .and_then(Value::as_str)
                .unwrap_or_default();
            Some(format!("data:{media};base64,{data}"))
        }
        _ => None,
    }
}

/// `json.dumps(v)` as Python writes it: `", "` and `": "` between items, anything not ASCII
/// as `\uXXXX` escapes.
fn py_dumps(v: &Value) -> String {
    crate::template::py_json(v, None, true).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::super::{chat_json, parse_request, Endpoint};
    use serde_json::{json, Value};

    fn messages(body: Value) -> Vec<Value> {
        chat_json(Endpoint::Messages, &body)
    }

    #[test]
    fn system_blocks_and_turns() {
        let got = messages(json!({"model":"m","max_tokens":8,
        "system":[{"type":"text","text":"x-anthropic-billing-header: abc"},{"type":"text","text":"You are "},{"type":"text","text":"brief."}],
        "messages":[
            {"role":"user","content":"hi"},
            {"role":"assistant","content":[{"type":"text","text":"hello"}]},
            {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}
        ]}));
        assert_eq!(
            got,
            vec![
                json!({"role":"system","content":"You are brief."}),
                json!({"role":"user","content":"hi"}),
                json!({"role":"assistant","content":"hello"}),
                json!({"role":"user","content":"a\nb"}),
            ]
        );
    }

    #[test]
    fn tool_use_and_results_as_vllm_converts_them() {
        let got = messages(json!({"model":"m","max_tokens":8,"messages":[
            {"role":"user","content":"weather in Zürich?"},
            {"role":"assistant","content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"t1","name":"get","input":{"city":"Zürich","days":2}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"sunny"}]}]}
        ],"tools":[{"name":"get","description":"weather","input_schema":{"type":"object"}}]}));
        assert_eq!(
            got,
            vec![
                json!({"role":"user","content":"weather in Zürich?"}),
                json!({"role":"assistant","tool_calls":[{"id":"t1","type":"function","function":{"name":"get","arguments":"{\"city\": \"Z\\u00fcrich\", \"days\": 2}"}}],"content":"Checking."}),
                json!({"role":"tool","tool_call_id":"t1","content":"sunny"}),
            ]
        );
        let r = parse_request(
            Endpoint::Messages,
            br#"{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"get","input_schema":{"type":"object"}}],"stop_sequences":["END"]}"#,
        )
        .unwrap();
        assert_eq!(
            r.chat.tools,
            Some(
                json!([{"type":"function","function":{"name":"get","description":null,"parameters":{"type":"object"}}}])
            )
        );
        assert_eq!(r.stop, vec!["END".to_owned()]);
        assert_eq!(r.max_tokens, Some(8));
    }

    #[test]
    fn refuses_what_vllm_refuses() {
        for (body, param) in [
            (&br#"{"max_tokens":8,"messages":[]}"#[..], "model"),
            (br#"{"model":"m","messages":[]}"#, "max_tokens"),
            (br#"{"model":"m","max_tokens":8}"#, "messages"),
            (br#"{"model":"m","max_tokens":8,"messages":[{"role":"tool","content":"x"}]}"#, "messages[0]"),
            (br#"{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"video"}]}]}"#, "messages[0]"),
        ] {
            let e = parse_request(Endpoint::Messages, body).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{e:?}");
        }
    }
}
