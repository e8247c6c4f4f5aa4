//! OpenAI-style API errors, shared so the filter and the server reject bad input identically.
//!
//! The wire shape is `{"error":{"message","type","param","code"}}`, as OpenAI and vLLM send it.

use serde::Serialize;

/// `code` of [`ApiError::unrenderable`].
pub const UNRENDERABLE: &str = "prompt_not_renderable";

/// A client-facing error with its HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {kind}: {message}")]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// 400: the request is malformed or invalid; `param` names the offending field.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_owned),
            code: None,
        }
    }

    /// 400 for a request whose prompt cannot be rendered with the chat template (or
    /// tokenized). The server answers it; the filter instead routes the request by load and
    /// lets the pod decide, since the pod's renderer may accept what this one does not.
    pub fn unrenderable(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            code: Some(UNRENDERABLE),
            ..ApiError::invalid(message, param)
        }
    }

    /// See [`ApiError::unrenderable`].
    pub fn is_unrenderable(&self) -> bool {
        self.code == Some(UNRENDERABLE)
    }

    /// 404: the model (or route) does not exist here.
    pub fn not_found(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            status: 404,
            message: message.into(),
            kind: "not_found_error",
            param: param.map(str::to_owned),
            code: Some("model_not_found"),
        }
    }

    /// 413: the body is larger than the configured limit.
    pub fn too_large(limit: usize) -> Self {
        ApiError {
            status: 413,
            message: format!("request body exceeds the limit of {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    /// 405: the path exists, but not for this method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        ApiError {
            status: 405,
            message: format!("{method} is not allowed on {path}"),
            kind: "invalid_request_error",
            param: None,
            code: Some("method_not_allowed"),
        }
    }

    /// 429: the server is at capacity (queue full).
    pub fn overloaded(message: impl Into<String>) -> Self {
        ApiError {
            status: 429,
            message: message.into(),
            kind: "rate_limit_error",
            param: None,
            code: Some("queue_full"),
        }
    }

    /// 500: a server-side failure (never used for client mistakes).
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: 500,
            message: message.into(),
            kind: "internal_server_error",
            param: None,
            code: None,
        }
    }

    /// 401: the server requires an API key and the request has not the right one.
    pub fn unauthorized() -> Self {
        ApiError {
            status: 401,
            message: "a valid API key is required (Authorization: Bearer <key>)".to_owned(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// 400 `context_length_exceeded`: the prompt has `tokens` tokens (`at_least`: a lower
    /// bound, known before tokenizing all of it), more than the model's `max` (vLLM's words).
    pub fn context_length(
        max: usize,
        tokens: usize,
        at_least: bool,
        endpoint: crate::request::Endpoint,
    ) -> Self {
        let param = endpoint.prompt_field();
        let bound = if at_least { "at least " } else { "" };
        ApiError::invalid(
            format!("This model's maximum context length is {max} tokens; the prompt has {bound}{tokens} tokens."),
            Some(param),
        )
        .with_code("context_length_exceeded")
    }

    /// Sets the machine-readable `code`.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The JSON body as OpenAI sends it.
    pub fn to_json(&self) -> String {
        let body = Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        };
        serde_json::to_string(&body).unwrap_or_else(|_| {
            r#"{"error":{"message":"error","type":"internal_server_error","param":null,"code":null}}"#
                .to_owned()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape() {
        let e = ApiError::invalid("bad \"x\"", Some("prompt"));
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["error"]["message"], "bad \"x\"");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "prompt");
        assert!(v["error"]["code"].is_null());
        assert_eq!(e.status, 400);
    }
}
