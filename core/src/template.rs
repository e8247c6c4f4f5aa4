//! Chat-template rendering with the model's own Jinja template.
//!
//! The template comes from the model (GGUF `tokenizer.chat_template`, or a file); it is rendered
//! with minijinja the way Hugging Face `apply_chat_template` (and so vLLM) does: the messages
//! as sent, `tools`, `add_generation_prompt`, `chat_template_kwargs`, `bos_token`,
//! `eos_token`, Python's string methods (`.startswith()`, `.strip()`, … through
//! minijinja-contrib's pycompat, which Qwen-style templates call), and
//! `continue_final_message` (the final message left open). The filter and the server render
//! byte-identical text and therefore identical tokens.

use crate::error::ApiError;
use crate::request::{ChatMessage, ChatOptions};
use minijinja::{context, Environment, Error, ErrorKind};

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

/// A template that does not compile.
#[derive(Debug, thiserror::Error)]
#[error("chat template does not compile: {0}")]
pub struct TemplateError(String);

const NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` are exposed to the template as HF does.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // what Hugging Face adds to its Jinja environment
        env.add_filter("tojson", py_tojson);
        env.add_function("strftime_now", |format: String| -> String {
            // UTC on both ends (the filter has no time zone): a pod on local time renders
            // another date around midnight
            chrono::Utc::now().format(&format).to_string()
        });
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| TemplateError(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// Renders `messages` with `opts` (the generation prompt by default).
    pub fn render(&self, messages: &[ChatMessage], opts: &ChatOptions) -> Result<String, ApiError> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ApiError::internal(format!("chat template missing: {e}")))?;
        let kwargs = minijinja::Value::from_serialize(&opts.kwargs);
        let text = tmpl
            .render(context! {
                messages => messages,
                tools => opts.tools,
                add_generation_prompt => opts.add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                ..kwargs
            })
            // A template that raises (e.g. "roles must alternate") rejects the conversation.
            .map_err(|e| {
                ApiError::unrenderable(
                    format!("messages could not be rendered with the model's chat template: {e}"),
                    Some("messages"),
                )
            })?;
        if !opts.continue_final_message {
            return Ok(text);
        }
        // as Hugging Face does: cut everything after the final message's content, as sent or
        // else trimmed (some templates trim messages)
        let last = messages.last().and_then(ChatMessage::content).unwrap_or("");
        let cut = [last, last.trim()]
            .into_iter()
            .filter(|m| !m.is_empty())
            .find_map(|m| text.rfind(m).map(|at| at + m.len()));
        match cut {
            Some(end) => Ok(text[..end].to_owned()),
            None => Err(ApiError::unrenderable(
                "continue_final_message is set but the final message's content does not appear in the rendered chat",
                Some("messages"),
            )),
        }
    }
}

/// Hugging Face's `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=indent)` —
/// `", "` and `": "` between items (`","` and newlines with an indent), non-ASCII text as is,
/// keys in the order they came. (minijinja's own filter is compact and HTML-escapes, which
/// would render tool definitions differently from vLLM.)
fn py_tojson(value: minijinja::Value, kwargs: minijinja::value::Kwargs) -> Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?; // HF always passes False semantics
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let f = serde_json::ser::PrettyFormatter::with_indent(&pad);
            serde::Serialize::serialize(
                &json,
                &mut serde_json::Serializer::with_formatter(&mut out, f),
            )
        }
        None => serde::Serialize::serialize(
            &json,
            &mut serde_json::Serializer::with_formatter(&mut out, PyCompact),
        ),
    };
    written.map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    String::from_utf8(out).map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))
}

/// Python's default JSON separators, `", "` and `": "`.
struct PyCompact;

/// `", "` before every array value or object key but the first.
fn py_separator<W: ?Sized + std::io::Write>(w: &mut W, first: bool) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        w.write_all(b", ")
    }
}

impl serde_json::ser::Formatter for PyCompact {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        py_separator(w, first)
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        py_separator(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn opts() -> ChatOptions {
        ChatOptions {
            add_generation_prompt: true,
            ..ChatOptions::default()
        }
    }

    #[test]
    fn renders_chatml() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let out = t
            .render(&[ChatMessage::text("user", "hi")], &opts())
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        // continue the final (assistant) message instead
        let msgs = [
            ChatMessage::text("user", "hi"),
            ChatMessage::text("assistant", "Hel"),
        ];
        let cont = ChatOptions {
            continue_final_message: true,
            ..ChatOptions::default()
        };
        assert_eq!(
            t.render(&msgs, &cont).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHel"
        );
        // trailing space kept where the template keeps it
        let msgs = [
            ChatMessage::text("user", "hi"),
            ChatMessage::text("assistant", "Hel "),
        ];
        assert!(t.render(&msgs, &cont).unwrap().ends_with("assistant\nHel "));
    }

    #[test]
    fn python_string_methods_tools_and_kwargs() {
        let src = "{% for m in messages %}{% if m.content.startswith('/') %}cmd:{{ m.content.lstrip('/').upper() }}{% else %}{{ m.content.strip() }}{% endif %}{% endfor %}{% if tools %}|tools:{{ tools | length }}{% endif %}{% if enable_thinking is defined and not enable_thinking %}|no-think{% endif %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let mut o = opts();
        o.tools = Some(serde_json::json!([{"type": "function"}]));
        o.kwargs.insert("enable_thinking".into(), false.into());
        let out = t
            .render(
                &[
                    ChatMessage::text("user", "/run"),
                    ChatMessage::text("user", "  hi  "),
                ],
                &o,
            )
            .unwrap();
        assert_eq!(out, "cmd:RUNhi|tools:1|no-think");
    }

    #[test]
    fn tojson_is_pythons() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}", "", "").unwrap();
        let mut o = opts();
        o.kwargs.insert(
            "x".into(),
            serde_json::json!({"b": [1, 2.5, "é<&>"], "a": {}, "c": null}),
        );
        assert_eq!(
            t.render(&[], &o).unwrap(),
            "{\"b\": [1, 2.5, \"é<&>\"], \"a\": {}, \"c\": null}|{\n  \"b\": [\n    1,\n    2.5,\n    \"é<&>\"\n  ],\n  \"a\": {},\n  \"c\": null\n}"
        );
    }

    #[test]
    fn raise_exception_is_unrenderable() {
        let t = ChatTemplate::new("{{ raise_exception('no system') }}", "", "").unwrap();
        let e = t.render(&[], &opts()).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.is_unrenderable());
        assert!(e.message.contains("no system"));
    }

    #[test]
    fn broken_template_is_an_error() {
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }
}
