//! Everything that crosses a process boundary between the filter, the model server and the
//! test harness, defined once: both ends use these very types, so they cannot drift apart.
//!
//! - [`headers`]: HTTP header names (routing, pod identity, debug).
//! - [`defaults`]: values both sides must agree on unless configured (model, block size,
//!   body limit).
//! - [`events`]: the model server's `GET /v1/cache/events` page, which the filter's poller
//!   reads: cache events, the pod's load, its process epoch; [`event_log`] is the history a
//!   publisher keeps to answer it (this project's server, the `kv-events` sidecar).
//! - [`pod_metrics`]: the load and restarts of pods that are not ours, from their `/metrics`.
//! - [`envoy_clusters`]: the pods cluster's current members, from Envoy's own admin.
//! - [`stats`]: the filter's per-pod metric names and the Envoy stats tag that labels them.
//!
//! The server serializes, the filter deserializes; `core/tests/protocol.rs` round-trips every
//! message and pins the JSON against a golden sample.

pub mod defaults;
pub mod envoy_clusters;
pub mod event_log;
pub mod events;
pub mod headers;
pub mod pod_metrics;
pub mod stats;

pub use event_log::EventLog;
pub use events::{CacheEvent, EventsPage, LoadReport, SeqEvent, EVENTS_PATH};
