//! HTTP header names on the request path.

/// The chosen upstream (`host:port`), set by the filter for Envoy's routing; the same header
/// the Gateway API Inference Extension uses. A client-sent value is always removed first.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";

/// The Envoy cluster of the request's model (its `route_cluster`), set by the filter when it
/// serves several models: the listener has one route per cluster matching this header, so a
/// value that names no model's cluster reaches none. A client-sent value is always removed.
pub const ROUTE_CLUSTER: &str = "x-prefix-router-cluster";

/// Set by the model server on every response: the pod that answered. Its absence on a
/// 502/503 means Envoy answered itself (the pod refused or reset the connection).
pub const POD: &str = "x-inference-pod";

/// Debug response headers (filter option `debug_headers`).
pub mod debug {
    /// The pod the filter chose.
    pub const POD: &str = "x-prefix-router-pod";
    /// Why it chose it ([`crate::policy::ReasonKind::header_value`]).
    pub const REASON: &str = "x-prefix-router-reason";
    /// Leading blocks of the prompt the chosen pod held.
    pub const MATCHED_BLOCKS: &str = "x-prefix-router-matched-blocks";
    /// Hash of the prompt's last full block as the filter computed it: equal to the last of
    /// the server's `/tokenize` `block_hashes` when both tokenize and hash identically.
    pub const PREFIX_HASH: &str = "x-prefix-router-prefix-hash";
    /// Present when the router stopped reading the prompt before its end
    /// (`max_prompt_tokens`): `READ/TOTAL` bytes; the decision rests on the blocks read.
    pub const PROMPT_READ: &str = "x-prefix-router-prompt-read";
}
