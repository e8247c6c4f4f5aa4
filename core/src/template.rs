//! Chat-template rendering with the model's own Jinja template.
//!
//! The template comes from the model (GGUF `tokenizer.chat_template`, or a file); it is rendered
//! with minijinja the way Hugging Face `apply_chat_template` does, with
//! `add_generation_prompt = true`, so the filter and the server produce byte-identical text and
//! therefore identical tokens.

use crate::error::ApiError;
use crate::request::ChatMessage;
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

    /// Renders `messages` followed by the assistant generation prompt.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, ApiError> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ApiError::internal(format!("chat template missing: {e}")))?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        // A template that raises (e.g. "roles must alternate") rejects the conversation itself.
        .map_err(|e| {
            ApiError::invalid(
                format!("messages could not be rendered with the model's chat template: {e}"),
                Some("messages"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let out = t
            .render(&[ChatMessage {
                role: "user".into(),
                content: "hi".into(),
            }])
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_is_a_400() {
        let t = ChatTemplate::new("{{ raise_exception('no system') }}", "", "").unwrap();
        let e = t.render(&[]).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("no system"));
    }

    #[test]
    fn broken_template_is_an_error() {
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }
}
