//! The cache-events page: what a model-server pod's prefix cache stored and evicted, plus its
//! load, as one answer to `GET /v1/cache/events?since=SEQ`.
//!
//! The same idea as vLLM / llm-d KV-cache events, over plain HTTP polling and no broker:
//! every change gets a sequence number; a router asks for everything after the last number it
//! saw. The pod's history is bounded; a router that fell further behind (or holds a number of
//! another process) gets `reset: true` and a `snapshot` of every held block instead. `epoch`
//! is new at every process start, so a restarted pod (whose cache is empty) is recognised at
//! once.

use crate::block::BlockHash;
use crate::pod_costs::WorkCounters;
use serde::{Deserialize, Serialize};

/// The path the page is served on (query: `since`).
pub const EVENTS_PATH: &str = "/v1/cache/events";

/// One change to a pod's prefix cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum CacheEvent {
    /// These blocks were computed and are now held.
    BlockStored { hashes: Vec<BlockHash> },
    /// These blocks were evicted.
    BlockRemoved { hashes: Vec<BlockHash> },
    /// Every block was dropped.
    AllCleared,
}

impl CacheEvent {
    /// Block hashes the event carries (what applying it costs a router).
    pub fn hash_count(&self) -> usize {
        match self {
            CacheEvent::BlockStored { hashes } | CacheEvent::BlockRemoved { hashes } => {
                hashes.len()
            }
            CacheEvent::AllCleared => 0,
        }
    }
}

/// An event with its sequence number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqEvent {
    pub seq: u64,
    #[serde(flatten)]
    pub event: CacheEvent,
}

/// The pod's load when the page was made: what a router weighs besides cache affinity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoadReport {
    /// Requests being computed.
    pub running: u32,
    /// Requests waiting for a running slot.
    pub waiting: u32,
    /// Prefix-cache blocks in use / capacity (0–1), as vLLM's `kv_cache_usage_perc`.
    pub kv_cache_usage: f64,
    /// Cumulative work counters, from which routers learn what a request costs here
    /// (absent from older pods' pages).
    pub work: WorkCounters,
}

/// One answer to `GET /v1/cache/events?since=SEQ`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventsPage {
    /// Process epoch as 16 hex digits (new at every start).
    pub epoch: String,
    /// The newest sequence number included (ask with `since=seq` next).
    pub seq: u64,
    /// The client was too far behind (or ahead: another epoch): forget this pod's blocks and
    /// take `snapshot` as its full state.
    #[serde(default)]
    pub reset: bool,
    #[serde(default)]
    pub snapshot: Option<Vec<BlockHash>>,
    #[serde(default)]
    pub events: Vec<SeqEvent>,
    /// More events are waiting beyond this page: ask again at once.
    #[serde(default)]
    pub more: bool,
    /// The pod's name (`--pod-name`), for logs.
    #[serde(default)]
    pub pod: String,
    #[serde(default)]
    pub load: LoadReport,
}

impl EventsPage {
    /// The events that still describe the cache after this page: those after its last
    /// `AllCleared` (what came before it was dropped by it). Whether the page cleared the
    /// cache is [`EventsPage::clears`].
    pub fn live_events(&self) -> &[SeqEvent] {
        let last_clear = self
            .events
            .iter()
            .rposition(|e| e.event == CacheEvent::AllCleared);
        match last_clear {
            Some(i) => self.events.get(i + 1..).unwrap_or_default(),
            None => &self.events,
        }
    }

    /// The page holds an `AllCleared`.
    pub fn clears(&self) -> bool {
        self.events
            .iter()
            .any(|e| e.event == CacheEvent::AllCleared)
    }
}
