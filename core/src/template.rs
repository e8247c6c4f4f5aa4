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
    /// The template refuses a system message anywhere but first (probed once, as vLLM
    /// probes: `[system, user, system, user]` raises).
    system_first: bool,
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
        let mut t = ChatTemplate {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            system_first: false,
        };
        let probe = ["system", "user", "system", "user"].map(|r| ChatMessage::text(r, "t"));
        t.system_first = t.render(&probe, &ChatOptions::default()).is_err();
        Ok(t)
    }

    /// Anthropic-style messages for a template that allows a system message only first:
    /// the later system messages' text appended to the leading one (or made the leading
    /// one), as vLLM merges them. `leading`: the first message is the request's own system.
    fn merge_inline_system(messages: &[ChatMessage], leading: bool) -> Vec<ChatMessage> {
        let skip = usize::from(leading);
        let mut merged: String = messages
            .iter()
            .take(skip)
            .filter_map(ChatMessage::content)
            .collect();
        let mut rest = Vec::with_capacity(messages.len());
        for m in &messages[skip.min(messages.len())..] {
            match m.role() {
                "system" => merged.push_str(m.content().unwrap_or_default()),
                _ => rest.push(m.clone()),
            }
        }
        if merged.is_empty() && !leading {
            return rest;
        }
        let mut out = vec![ChatMessage::text("system", &merged)];
        out.extend(rest);
        out
    }

    /// Renders `messages` with `opts` (the generation prompt by default).
    pub fn render(&self, messages: &[ChatMessage], opts: &ChatOptions) -> Result<String, ApiError> {
        let merged;
        let messages = match opts.merge_inline_system {
            Some(leading) if self.system_first => {
                merged = Self::merge_inline_system(messages, leading);
                &merged[..]
            }
            _ => messages,
        };
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
    py_json(&json, indent, false).map_err(|e| Error::new(ErrorKind::BadSerialization, e))
}

/// `json.dumps(v, indent=indent, ensure_ascii=ascii)` as Python writes it.
pub(crate) fn py_json(
    v: &serde_json::Value,
    indent: Option<usize>,
    ascii: bool,
) -> Result<String, String> {
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let f = serde_json::ser::PrettyFormatter::with_indent(&pad);
            serde::Serialize::serialize(v, &mut serde_json::Serializer::with_formatter(&mut out, f))
        }
        None => serde::Serialize::serialize(
            v,
            &mut serde_json::Serializer::with_formatter(&mut out, PyCompact { ascii }),
        ),
    };
    written.map_err(|e| e.to_string())?;
    String::from_utf8(out).map_err(|e| e.to_string())
}

/// Python's default JSON separators, `", "` and `": "`; with `ascii`, every character past
/// ASCII as a `\uXXXX` escape (UTF-16 pairs past the BMP), as `ensure_ascii=True` does.
struct PyCompact {
    ascii: bool,
}

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
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        if !self.ascii || fragment.is_ascii() {
            return w.write_all(fragment.as_bytes());
        }
        for c in fragment.chars() {
            if c.is_ascii() {
                w.write_all(&[c as u8])?;
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    write!(w, "\\u{u:04x}")?;
                }
            }
        }
        Ok(())
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

    #[test]
    fn inline_system_is_merged_only_where_the_template_wants_it_first() {
        // Qwen-style guard: a system message anywhere but first raises
        let strict = ChatTemplate::new(
            "{% for m in messages %}{% if m.role == 'system' and not loop.first %}{{ raise_exception('system first') }}{% endif %}[{{ m.role }}:{{ m.content }}]{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let lenient = ChatTemplate::new(
            "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert!(strict.system_first && !lenient.system_first);
        let msgs = [
            ChatMessage::text("system", "A."),
            ChatMessage::text("user", "hi"),
            ChatMessage::text("system", "B."),
            ChatMessage::text("user", "go"),
        ];
        let mut o = ChatOptions {
            merge_inline_system: Some(true),
            ..ChatOptions::default()
        };
        assert_eq!(
            strict.render(&msgs, &o).unwrap(),
            "[system:A.B.][user:hi][user:go]"
        );
        assert_eq!(
            lenient.render(&msgs, &o).unwrap(),
            "[system:A.][user:hi][system:B.][user:go]"
        );
        // no top-level system: the inline ones become the leading one
        o.merge_inline_system = Some(false);
        assert_eq!(
            strict.render(&msgs[1..], &o).unwrap(),
            "[system:B.][user:hi][user:go]"
        );
        // chat completions never merge: the template's refusal stands
        assert!(strict.render(&msgs, &ChatOptions::default()).is_err());
    }
}
