//! Chat rendering equal to vLLM's, byte for byte: the project's renderer (minijinja with
//! Hugging Face's additions) against Jinja2 itself, set up as Hugging Face's
//! `apply_chat_template` sets it up (which is what vLLM calls), on the real templates of
//! SmolLM2 and Qwen2.5, for the chat shapes vLLM accepts: system prompts, content-part
//! arrays, tools, assistant tool calls with `content: null`, tool results,
//! `chat_template_kwargs`, `add_generation_prompt: false`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use prefix_core::model::ModelBundle;
use prefix_core::request::{parse_request, Endpoint};
use prefix_core::BlockSize;
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use test_harness::paths;

/// Hugging Face's Jinja environment (transformers' `_compile_jinja_template`), rendering one
/// request read from stdin.
const REFERENCE: &str = r#"
import json, sys
from datetime import datetime, timezone
import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def strftime_now(fmt):
    return datetime.now(timezone.utc).strftime(fmt)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now
r = json.load(sys.stdin)
out = env.from_string(r["template"]).render(
    messages=r["messages"], tools=r["tools"], add_generation_prompt=r["add_generation_prompt"],
    bos_token=r["bos_token"], eos_token=r["eos_token"], **r["kwargs"])
sys.stdout.write(out)
"#;

/// The model directories with a chat template: (name, directory).
fn models() -> Vec<(&'static str, PathBuf)> {
    let data = prefix_core::protocol::defaults::data_dir(&paths::repo_root());
    vec![
        (
            "SmolLM2-135M-Instruct",
            test_harness::paths::default_model_dir(),
        ),
        ("Qwen2.5", data.join("tokenizers/qwen2.5")),
    ]
}

/// Jinja2's rendering, or its error.
fn reference(template: &str, cfg: &Value, body: &Value) -> Result<String, String> {
    // the request as vLLM hands it to the template: content parts joined with "\n"
    let messages: Vec<Value> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(parts) = m["content"].as_array() {
                let texts: Vec<&str> = parts
                    .iter()
                    .filter(|p| p["type"] == "text")
                    .filter_map(|p| p["text"].as_str())
                    .collect();
                m["content"] = json!(texts.join("\n"));
            }
            m
        })
        .collect();
    let token = |k: &str| match &cfg[k] {
        Value::String(s) => s.clone(),
        Value::Object(o) => o["content"].as_str().unwrap_or("").to_owned(),
        _ => String::new(),
    };
    let req = json!({
        "template": template,
        "messages": messages,
        "tools": body.get("tools").cloned().unwrap_or(Value::Null),
        "add_generation_prompt": body.get("add_generation_prompt").cloned().unwrap_or(json!(true)),
        "bos_token": token("bos_token"),
        "eos_token": token("eos_token"),
        "kwargs": body.get("chat_template_kwargs").cloned().unwrap_or(json!({})),
    });
    let mut child = Command::new(paths::repo_root().join(".venv/bin/python"))
        .args(["-c", REFERENCE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(".venv/bin/python (scripts/setup.sh)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(req.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn conversations() -> Vec<Value> {
    let tools = json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city, in °C",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]);
    vec![
        json!({"messages": [{"role": "user", "content": "Hello! Où est la gare?"}]}),
        json!({"messages": [
            {"role": "system", "content": "You are the on-call assistant. Be brief."},
            {"role": "user", "content": "Checkout returns 502s."},
            {"role": "assistant", "content": "Which region?"},
            {"role": "user", "content": "eu-west-1"}]}),
        json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "Describe this:"},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
            {"type": "text", "text": "in one line."}]}]}),
        json!({"tools": tools, "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}]}),
        json!({"tools": tools, "messages": [
            {"role": "system", "content": "Use tools when needed."},
            {"role": "user", "content": "And in Tōkyō?"}]}),
        json!({"add_generation_prompt": false, "chat_template_kwargs": {"enable_thinking": false},
               "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."}]}),
    ]
}

#[test]
fn rendering_equals_jinja2_on_real_templates() {
    for (name, dir) in models() {
        let cfg_bytes = std::fs::read(dir.join("tokenizer_config.json"))
            .unwrap_or_else(|e| panic!("{}: {e} (scripts/setup.sh)", dir.display()));
        let cfg: Value = serde_json::from_slice(&cfg_bytes).unwrap();
        let template = cfg["chat_template"].as_str().unwrap();
        let bundle = ModelBundle::new(
            name,
            &std::fs::read(dir.join("tokenizer.json")).unwrap(),
            Some(&cfg_bytes),
            BlockSize::new(16).unwrap(),
        )
        .unwrap();
        let mut rendered = 0;
        for body in conversations() {
            let req = parse_request(Endpoint::ChatCompletions, body.to_string().as_bytes())
                .unwrap_or_else(|e| panic!("{name}: {body}: {e}"));
            match (bundle.render_chat(&req), reference(template, &cfg, &body)) {
                (Ok(ours), Ok(theirs)) => {
                    assert_eq!(ours.unwrap(), theirs, "{name}: {body}");
                    // and it tokenizes and hashes (the filter routes it)
                    assert!(!bundle.prepare(&req).unwrap().tokens.is_empty());
                    rendered += 1;
                }
                // a template that cannot take this chat (SmolLM2's adds a null content to a
                // string) fails in both; the filter then routes by load and the pod answers
                (Err(ours), Err(_)) => assert!(ours.is_unrenderable(), "{name}: {ours}"),
                (ours, theirs) => panic!("{name}: {body}: ours {ours:?}, Jinja2 {theirs:?}"),
            }
        }
        assert!(
            rendered >= 4,
            "{name}: only {rendered} conversations rendered"
        );
    }
}
