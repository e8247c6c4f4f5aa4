//! Tool definitions as vLLM hands them to the chat template.
//!
//! vLLM validates every tool into its `ChatCompletionToolsParam` and gives the template that
//! model's dump, not the client's JSON: `{"type": "function", "function": {"name",
//! "description", "parameters"}}` with `description` and `parameters` always present (null
//! when not sent), `strict` and `defer_loading` only when sent, anything else dropped. A
//! template that prints tools with `tojson` sees exactly these keys, so the filter and the
//! server build the same dump for chat completions, Responses (flat `{"type": "function",
//! "name", …}` tools) and Anthropic-style tools (`input_schema` as `parameters`).

use serde_json::{Map, Value};

/// One function, as vLLM's `FunctionDefinition` dumps it.
pub(super) fn function(
    name: &Value,
    description: Option<&Value>,
    parameters: Option<&Value>,
    extra: &Map<String, Value>,
) -> Value {
    let mut f = Map::new();
    f.insert("name".into(), name.clone());
    f.insert(
        "description".into(),
        description.cloned().unwrap_or(Value::Null),
    );
    f.insert(
        "parameters".into(),
        parameters.cloned().unwrap_or(Value::Null),
    );
    for key in ["strict", "defer_loading"] {
        if let Some(v) = extra.get(key).filter(|v| !v.is_null()) {
            f.insert(key.into(), v.clone());
        }
    }
    let mut tool = Map::new();
    tool.insert("type".into(), Value::from("function"));
    tool.insert("function".into(), Value::Object(f));
    Value::Object(tool)
}

/// A chat-completions tool (`{"type": "function", "function": {...}}`) as vLLM dumps it; a
/// tool of another shape is kept as sent (vLLM refuses it; the pod answers that).
pub(super) fn chat_tool(tool: &Value) -> Value {
    let Some(f) = tool.get("function").and_then(Value::as_object) else {
        return tool.clone();
    };
    let Some(name) = f.get("name").filter(|n| n.is_string()) else {
        return tool.clone();
    };
    let mut out = function(name, f.get("description"), f.get("parameters"), f);
    if let Some(d) = tool.get("defer_loading").filter(|v| !v.is_null()) {
        if let Some(o) = out.as_object_mut() {
            o.insert("defer_loading".into(), d.clone());
            if let Some(Value::Object(f)) = o.get_mut("function") {
                f.entry("defer_loading").or_insert_with(|| d.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dumps_as_vllm() {
        // the dumps printed by vLLM 0.32's ChatCompletionToolsParam.model_dump()
        assert_eq!(
            chat_tool(
                &json!({"type":"function","function":{"name":"f","parameters":{"b":1,"a":2},"x":1}})
            ),
            json!({"type":"function","function":{"name":"f","description":null,"parameters":{"b":1,"a":2}}})
        );
        assert_eq!(
            chat_tool(
                &json!({"type":"function","function":{"name":"f","description":"d","strict":true}})
            ),
            json!({"type":"function","function":{"name":"f","description":"d","parameters":null,"strict":true}})
        );
        assert_eq!(chat_tool(&json!({"x":1})), json!({"x":1}));
    }
}
