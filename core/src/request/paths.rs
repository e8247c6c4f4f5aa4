//! Which request paths the filter reads, and as what.
//!
//! Every prefix endpoint's path ([`Endpoint::path`]) is read as that endpoint; the
//! [`BALANCED_PATHS`] (embeddings, pooling, scoring) carry nothing a prefix cache reuses, so
//! only their `model` is read, to send them to their model's pool, balanced by load. A pool
//! may declare more paths (`inference_paths: {"/v1/generate": "completions"}`), e.g. where a
//! server serves an OpenAI-shaped body under another path.

use super::Endpoint;
use std::collections::BTreeMap;

/// Paths with nothing to reuse by prefix (embeddings, pooling, scoring): their requests go to
/// their model's pool, balanced by load among its live pods.
pub const BALANCED_PATHS: [&str; 9] = [
    "/v1/embeddings",
    "/pooling",
    "/classify",
    "/v1/classify",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
];

/// How a request to a path is routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub enum PathKind {
    /// Its body is this endpoint's: rendered, tokenized and routed by prefix.
    Prefix(Endpoint),
    /// Only its `model` is read: balanced by load within that model's pool.
    Balanced,
}

impl TryFrom<String> for PathKind {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "balanced" => Ok(PathKind::Balanced),
            name => Endpoint::from_name(name).map(PathKind::Prefix).ok_or_else(|| {
                format!(
                    "'{name}' is not a body kind: completions, chat, responses, messages or balanced"
                )
            }),
        }
    }
}

impl PathKind {
    /// The kind of a POST to `path` (query string ignored): the pool's own declarations
    /// first, then the endpoints every server serves. `None`: not an inference path.
    pub fn of(path: &str, declared: &BTreeMap<String, PathKind>) -> Option<PathKind> {
        let path = path.split('?').next().unwrap_or(path);
        if let Some(k) = declared.get(path) {
            return Some(*k);
        }
        if let Some(e) = Endpoint::from_path(path) {
            return Some(PathKind::Prefix(e));
        }
        BALANCED_PATHS.contains(&path).then_some(PathKind::Balanced)
    }

    /// Whether `path` can be declared (a plain path: no query, fragment or spaces).
    pub fn valid_path(path: &str) -> bool {
        path.starts_with('/') && !path.contains(['?', '#', ' '])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_and_declared_paths() {
        let none = BTreeMap::new();
        let of = |p| PathKind::of(p, &none);
        assert_eq!(
            of("/v1/responses"),
            Some(PathKind::Prefix(Endpoint::Responses))
        );
        assert_eq!(
            of("/v1/messages?beta=true"),
            Some(PathKind::Prefix(Endpoint::Messages))
        );
        assert_eq!(of("/v1/embeddings"), Some(PathKind::Balanced));
        assert_eq!(of("/v1/models"), None);
        let declared = BTreeMap::from([
            (
                "/generate".to_owned(),
                PathKind::try_from("completions".to_owned()).unwrap(),
            ),
            (
                "/v1/embeddings".to_owned(),
                PathKind::Prefix(Endpoint::Completions),
            ),
        ]);
        assert_eq!(
            PathKind::of("/generate", &declared),
            Some(PathKind::Prefix(Endpoint::Completions))
        );
        assert_eq!(
            PathKind::of("/v1/embeddings", &declared),
            Some(PathKind::Prefix(Endpoint::Completions))
        );
        assert!(PathKind::try_from("nope".to_owned()).is_err());
    }
}
