//! The OpenAI Responses API (`POST /v1/responses`) as vLLM renders it.
//!
//! vLLM turns a Responses request into chat messages and renders them with the model's chat
//! template (its `construct_input_messages`), so the filter does the same to route it by
//! prefix: `instructions` first as a system message; a string `input` as one user message;
//! an item list message by message, where `function_call` items become the preceding
//! assistant turn's `tool_calls`, `function_call_output` items become `tool` messages,
//! `reasoning` items an assistant's `reasoning`, output messages an assistant's text, and any
//! other item with a `role` is a chat message as sent (`input_text` parts are text).
//!
//! A request continuing a stored response (`previous_response_id`) carries only its new
//! turn: its history lives on the pod that stored it, so it is not rendered here
//! ([`super::InferenceRequest::previous_response`]).

use super::{flatten_messages, tools, ChatMessage, ChatOptions, PromptInput};
use crate::error::ApiError;
use serde_json::{Map, Value};
use std::mem::take;

pub(super) fn parse(
    obj: &mut Map<String, Value>,
    media: &mut Vec<String>,
) -> Result<(PromptInput, ChatOptions), ApiError> {
    let mut messages = Vec::new();
    match obj.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => messages.push(ChatMessage::text("system", s)),
        Some(_) => {
            return Err(ApiError::invalid(
                "'instructions' must be a string",
                Some("instructions"),
            ))
        }
    }
    let input = obj
        .get_mut("input")
        .ok_or_else(|| ApiError::invalid("missing required field 'input'", Some("input")))?;
    let mut continue_final = false;
    match input {
        Value::String(s) => messages.push(ChatMessage::text("user", &take(s))),
        Value::Array(items) => {
            continue_final = items.last().is_some_and(is_partial);
            for (i, item) in items.iter_mut().enumerate() {
                let Value::Object(item) = item else {
                    return Err(ApiError::invalid(
                        format!("'input[{i}]' must be an object"),
                        Some("input"),
                    ));
                };
                add_item(take(item), &mut messages)?;
            }
        }
        _ => {
            return Err(ApiError::invalid(
                "'input' must be a string or an array of input items",
                Some("input"),
            ))
        }
    }
    let messages = flatten_messages(messages, media, "input")?;
    let mut kwargs = super::parse_kwargs(obj)?;
    // what vLLM adds to the template's variables for a reasoning effort
    if let Some(effort) = obj.get("reasoning").and_then(|r| r.get("effort")) {
        if let Some(e) = effort.as_str() {
            kwargs
                .entry("enable_thinking")
                .or_insert(Value::Bool(e != "none"));
            kwargs.insert("reasoning_effort".into(), effort.clone());
        }
    }
    let tools = match obj.get("tools") {
        Some(Value::Array(list)) => {
            let functions: Vec<Value> = list.iter().filter_map(function_tool).collect();
            (!functions.is_empty()).then_some(Value::Array(functions))
        }
        None | Some(Value::Null) => None,
        Some(_) => return Err(ApiError::invalid("'tools' must be an array", Some("tools"))),
    };
    let chat = ChatOptions {
        tools,
        add_generation_prompt: !continue_final,
        continue_final_message: continue_final,
        kwargs,
        ..ChatOptions::default()
    };
    Ok((PromptInput::Chat(messages), chat))
}

/// A flat Responses function tool as a chat tool; other tools (web search, MCP, …) are not
/// the template's.
fn function_tool(tool: &Value) -> Option<Value> {
    let t = tool.as_object()?;
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return None;
    }
    let name = t.get("name").filter(|n| n.is_string())?;
    Some(tools::function(
        name,
        t.get("description"),
        t.get("parameters"),
        t,
    ))
}

/// The final item is an assistant message (or reasoning) still being written: the model
/// continues it instead of starting a new turn.
fn is_partial(item: &Value) -> bool {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    let status = item.get("status").and_then(Value::as_str);
    matches!(kind, "message" | "reasoning") && matches!(status, Some("in_progress" | "incomplete"))
}

fn str_field<'a>(item: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    item.get(key).and_then(Value::as_str)
}

/// The previous message when it is the assistant's, to which tool calls, reasoning and text
/// of the same turn are added.
fn assistant(messages: &mut [ChatMessage]) -> Option<&mut Map<String, Value>> {
    messages
        .last_mut()
        .filter(|m| m.role() == "assistant")
        .map(|m| &mut m.0)
}

fn add_item(item: Map<String, Value>, messages: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let kind = str_field(&item, "type");
    match kind {
        Some("function_call") | Some("custom_tool_call") => {
            let arguments = match kind {
                Some("function_call") => item.get("arguments").cloned().unwrap_or(Value::Null),
                _ => Value::from(str_field(&item, "input").unwrap_or_default()),
            };
            let mut function = Map::new();
            function.insert("name".into(), item.get("name").cloned().unwrap_or_default());
            function.insert("arguments".into(), arguments);
            let mut call = Map::new();
            call.insert(
                "id".into(),
                item.get("call_id").cloned().unwrap_or_default(),
            );
            call.insert("function".into(), Value::Object(function));
            call.insert("type".into(), Value::from("function"));
            let call = Value::Object(call);
            if let Some(prev) = assistant(messages) {
                match prev.get_mut("tool_calls") {
                    Some(Value::Array(calls)) => calls.push(call),
                    _ => {
                        prev.insert("tool_calls".into(), Value::Array(vec![call]));
                    }
                }
                return Ok(());
            }
            let mut m = Map::new();
            m.insert("role".into(), Value::from("assistant"));
            m.insert("tool_calls".into(), Value::Array(vec![call]));
            messages.push(ChatMessage(m));
        }
        Some("reasoning") => {
            if item.get("encrypted_content").is_some_and(|v| !v.is_null()) {
                return Err(ApiError::unrenderable(
                    "Encrypted content is not supported.",
                    Some("input"),
                ));
            }
            let first_text = |key: &str| {
                item.get(key)
                    .and_then(Value::as_array)
                    .and_then(|a| a.first())
                    .and_then(|p| p.get("text"))
                    .and_then(Value::as_str)
            };
            let text = first_text("content")
                .or_else(|| first_text("summary"))
                .unwrap_or_default();
            if let Some(prev) = assistant(messages) {
                if !prev.contains_key("reasoning") {
                    prev.insert("reasoning".into(), Value::from(text));
                    return Ok(());
                }
            }
            let mut m = Map::new();
            m.insert("role".into(), Value::from("assistant"));
            m.insert("reasoning".into(), Value::from(text));
            messages.push(ChatMessage(m));
        }
        Some("function_call_output") | Some("custom_tool_call_output") => {
            let mut m = Map::new();
            m.insert("role".into(), Value::from("tool"));
            m.insert(
                "content".into(),
                item.get("output").cloned().unwrap_or_default(),
            );
            m.insert(
                "tool_call_id".into(),
                item.get("call_id").cloned().unwrap_or_default(),
            );
            messages.push(ChatMessage(m));
        }
        _ if str_field(&item, "role") == Some("assistant") => {
            let text = match item.get("content") {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Array(parts)) => parts
                    .first()
                    .and_then(|p| p.get("text"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                _ => None,
            };
            let Some(text) = text else {
                // no text: the item goes to the template as sent
                messages.push(ChatMessage(item));
                return Ok(());
            };
            if let Some(prev) = assistant(messages) {
                if prev.get("content").is_none_or(Value::is_null) {
                    prev.insert("content".into(), Value::from(text));
                    return Ok(());
                }
            }
            messages.push(ChatMessage::text("assistant", &text));
        }
        _ if item.get("role").is_some_and(Value::is_string) => messages.push(ChatMessage(item)),
        _ => {
            return Err(ApiError::unrenderable(
                format!("Unsupported input item type: {}", kind.unwrap_or("(none)")),
                Some("input"),
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{chat_json, parse_request, Endpoint};
    use serde_json::{json, Value};

    fn messages(body: Value) -> Vec<Value> {
        chat_json(Endpoint::Responses, &body)
    }

    #[test]
    fn instructions_and_string_input() {
        assert_eq!(
            messages(json!({"model":"m","instructions":"be brief","input":"hi"})),
            vec![
                json!({"role":"system","content":"be brief"}),
                json!({"role":"user","content":"hi"})
            ]
        );
    }

    #[test]
    fn items_as_vllm_builds_them() {
        let got = messages(json!({"input":[
            {"role":"user","content":[{"type":"input_text","text":"weather?"}]},
            {"type":"function_call","call_id":"c1","name":"get","arguments":"{\"city\":\"Paris\"}"},
            {"type":"function_call","call_id":"c2","name":"get","arguments":"{}"},
            {"type":"function_call_output","call_id":"c1","output":"sunny"},
            {"type":"message","role":"assistant","id":"m1","status":"completed","content":[{"type":"output_text","text":"It is sunny."}]},
            {"role":"user","content":"thanks"}
        ]}));
        assert_eq!(
            got,
            vec![
                json!({"role":"user","content":"weather?"}),
                json!({"role":"assistant","tool_calls":[
                    {"id":"c1","function":{"name":"get","arguments":"{\"city\":\"Paris\"}"},"type":"function"},
                    {"id":"c2","function":{"name":"get","arguments":"{}"},"type":"function"}
                ]}),
                json!({"role":"tool","content":"sunny","tool_call_id":"c1"}),
                json!({"role":"assistant","content":"It is sunny."}),
                json!({"role":"user","content":"thanks"}),
            ]
        );
    }

    #[test]
    fn options_tools_and_refusals() {
        let r = parse_request(
            Endpoint::Responses,
            br#"{"input":"x","max_output_tokens":7,"stream":true,"tools":[{"type":"function","name":"f","parameters":{"z":1}},{"type":"web_search"}],"reasoning":{"effort":"low"}}"#,
        )
        .unwrap();
        assert_eq!(r.max_tokens, Some(7));
        assert!(r.stream && r.chat.add_generation_prompt);
        assert_eq!(
            r.chat.tools,
            Some(
                json!([{"type":"function","function":{"name":"f","description":null,"parameters":{"z":1}}}])
            )
        );
        assert_eq!(r.chat.kwargs.get("enable_thinking"), Some(&json!(true)));
        let partial = parse_request(
            Endpoint::Responses,
            br#"{"input":[{"role":"user","content":"a"},{"type":"message","role":"assistant","status":"in_progress","content":[{"type":"output_text","text":"Once"}]}]}"#,
        )
        .unwrap();
        assert!(partial.chat.continue_final_message && !partial.chat.add_generation_prompt);
        for (body, param) in [
            (&br#"{"model":"m"}"#[..], "input"),
            (br#"{"input":5}"#, "input"),
            (br#"{"input":[{"type":"frobnicate"}]}"#, "input"),
            (
                br#"{"input":[{"type":"reasoning","encrypted_content":"x","summary":[]}]}"#,
                "input",
            ),
            (br#"{"input":"x","instructions":3}"#, "instructions"),
        ] {
            let e = parse_request(Endpoint::Responses, body).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{e:?}");
        }
    }

    #[test]
    fn a_continued_response_keeps_its_id() {
        let r = parse_request(
            Endpoint::Responses,
            br#"{"input":"and then?","previous_response_id":"resp_1"}"#,
        )
        .unwrap();
        assert_eq!(r.previous_response.as_deref(), Some("resp_1"));
    }
}
