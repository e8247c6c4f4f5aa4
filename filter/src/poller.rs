//! Applying what a pod's `/v1/cache/events` poll says (or that it did not answer) to the
//! shared state: health, load, cache generation, and ownership entries from its events.
//!
//! - A new process epoch (restart) bumps the pod's generation: every table entry it had is
//!   invalid at once, with no need to list keys. Events are then re-read from the start.
//! - The first contact with a pod also starts a fresh generation (the pod may have restarted
//!   before anyone polled it), and its full event history re-records what it holds.
//! - `reset` (the router fell behind the pod's bounded history) does the same and takes the
//!   snapshot as the pod's blocks.
//! - `BlockStored` records the pod as owner (so blocks routed by *another* Envoy are learned);
//!   `BlockRemoved` forgets the pod's entries for evicted blocks.
//! - `down_after_failures` failed polls in a row mark the pod down; one good poll brings it back.

use crate::host::Host;
use crate::ownership::OwnershipTable;
use crate::pods::{update_state, Keys, PodState};
use prefix_core::table::TableLayout;
use prefix_core::BlockHash;
use serde::Deserialize;
use xxhash_rust::xxh3::xxh3_64;

#[derive(Deserialize)]
struct Page {
    epoch: String,
    seq: u64,
    #[serde(default)]
    reset: bool,
    #[serde(default)]
    snapshot: Option<Vec<BlockHash>>,
    #[serde(default)]
    events: Vec<Event>,
    /// The pod has more events than fit in one page.
    #[serde(default)]
    more: bool,
    #[serde(default)]
    load: Load,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum Event {
    BlockStored { hashes: Vec<BlockHash> },
    BlockRemoved { hashes: Vec<BlockHash> },
    AllCleared,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Load {
    running: u32,
    waiting: u32,
    kv_cache_usage: f64,
}

/// What one poll changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub stored: u32,
    pub removed: u32,
    /// The pod's generation changed (restart, reset or clear).
    pub new_generation: bool,
    /// The pod came back from down.
    pub recovered: bool,
    /// Poll again now, from this sequence number: the pod has more events waiting (a busy
    /// pod can produce more than a page per poll period; waiting a whole period per page
    /// would fall behind its bounded history and force a full resync).
    pub again_since: Option<u64>,
}

fn next_generation(old: u64, salt: &str, seq: u64) -> u64 {
    let mut b = old.to_le_bytes().to_vec();
    b.extend_from_slice(salt.as_bytes());
    b.extend_from_slice(&seq.to_le_bytes());
    xxh3_64(&b).max(1)
}

/// Applies a successful poll response body. `Err` if the body is not a valid events page
/// (then it counts as a failed poll).
pub fn apply_success<H: Host>(
    host: &H,
    keys: &Keys,
    layout: &TableLayout,
    pod: &str,
    body: &[u8],
    now_ns: u64,
) -> Result<Applied, String> {
    let page: Page =
        serde_json::from_slice(body).map_err(|e| format!("bad events page from {pod}: {e}"))?;
    let table = OwnershipTable::new(host, layout);
    let mut out = Applied::default();
    let mut before = PodState::default();
    let st = update_state(host, keys, pod, |st| {
        before = st.clone();
        out = Applied::default();
        if !st.healthy {
            out.recovered = true;
        }
        st.healthy = true;
        st.fails = 0;
        st.running = page.load.running;
        st.waiting = page.load.waiting;
        st.kv_cache_usage = page.load.kv_cache_usage;
        st.last_ok_ns = now_ns;
        if !st.epoch.is_empty() && st.epoch != page.epoch {
            // restarted: everything it had is gone; re-read its events from the start
            st.generation = next_generation(st.generation, &page.epoch, 0);
            st.epoch = page.epoch.clone();
            st.seq = 0;
            out.new_generation = true;
            return;
        }
        if st.epoch.is_empty() {
            // First contact. Entries recorded before it (generation 0) cannot be trusted: the
            // pod may have restarted since. Start its own generation; the events below (all of
            // them, since=0) re-record what it really holds.
            st.generation = next_generation(st.generation, &page.epoch, 0);
            out.new_generation = true;
        }
        st.epoch = page.epoch.clone();
        if page.reset {
            st.generation = next_generation(st.generation, &page.epoch, page.seq);
            out.new_generation = true;
        }
        for e in &page.events {
            if matches!(e, Event::AllCleared) {
                st.generation = next_generation(st.generation, &page.epoch, page.seq);
                out.new_generation = true;
            }
        }
        st.seq = page.seq;
    })
    .ok_or_else(|| format!("could not update state of {pod}"))?;
    if out.new_generation && st.seq == 0 && before.epoch != page.epoch && !before.epoch.is_empty() {
        // restart: its events are read from the start, right away
        out.again_since = Some(0);
        return Ok(out);
    }
    out.again_since = page.more.then_some(st.seq);
    if let Some(snapshot) = &page.snapshot {
        out.stored += table.record(snapshot, pod, st.generation).written;
    }
    for e in &page.events {
        match e {
            Event::BlockStored { hashes } => {
                out.stored += table.record(hashes, pod, st.generation).written
            }
            Event::BlockRemoved { hashes } => out.removed += table.remove(hashes, pod),
            Event::AllCleared => {}
        }
    }
    Ok(out)
}

/// A poll that failed (no answer, non-200, bad body). Returns the new state.
pub fn apply_failure<H: Host>(
    host: &H,
    keys: &Keys,
    pod: &str,
    down_after: u32,
) -> Option<PodState> {
    update_state(host, keys, pod, |st| {
        st.fails = st.fails.saturating_add(1);
        if st.fails >= down_after {
            st.healthy = false;
        }
    })
}

/// The request path saw the pod refuse a connection: mark it down now rather than waiting
/// for the next polls (the poller brings it back when it answers again).
pub fn mark_down<H: Host>(host: &H, keys: &Keys, pod: &str, down_after: u32) -> Option<PodState> {
    update_state(host, keys, pod, |st| {
        st.fails = st.fails.max(down_after);
        st.healthy = false;
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;
    use crate::pods::read_state;
    use serde_json::json;

    const POD: &str = "127.0.0.1:9";

    fn page(epoch: &str, seq: u64, events: serde_json::Value) -> Vec<u8> {
        json!({"epoch": epoch, "seq": seq, "reset": false, "events": events, "load": {"running": 1, "waiting": 2, "kv_cache_usage": 0.5}})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn events_drive_the_table_and_restarts_expire_it() {
        let host = FakeHost::default();
        let keys = Keys::new("ns");
        let layout = TableLayout::new("ns/t", 256);
        let t = OwnershipTable::new(&host, &layout);
        let h1 = BlockHash(0x1111);
        let h2 = BlockHash(0x2222);

        let a = apply_success(
            &host,
            &keys,
            &layout,
            POD,
            &page(
                "e1",
                2,
                json!([
                    {"seq": 1, "type": "BlockStored", "hashes": [h1.to_hex(), h2.to_hex()]},
                    {"seq": 2, "type": "BlockRemoved", "hashes": [h2.to_hex()]},
                ]),
            ),
            10,
        )
        .unwrap();
        assert_eq!((a.stored, a.removed), (2, 1));
        assert!(
            a.new_generation,
            "first contact starts the pod's own generation"
        );
        let (st, _) = read_state(&host, &keys, POD);
        assert_eq!((st.seq, st.waiting), (2, 2));
        assert_ne!(st.generation, 0);
        assert_eq!(t.owner(h1).map(|e| e.generation), Some(st.generation));
        assert!(t.owner(h2).is_none());
        let first_generation = st.generation;

        // restart: new epoch → new generation, seq back to 0, old entries no longer match
        let a = apply_success(&host, &keys, &layout, POD, &page("e2", 1, json!([])), 20).unwrap();
        assert!(a.new_generation);
        assert_eq!(a.again_since, Some(0), "a restarted pod is re-read at once");
        let (st, _) = read_state(&host, &keys, POD);
        assert_ne!(st.generation, first_generation);
        assert_eq!(st.seq, 0);
        assert_ne!(t.owner(h1).map(|e| e.generation), Some(st.generation));
    }

    #[test]
    fn failures_mark_down_and_success_recovers() {
        let host = FakeHost::default();
        let keys = Keys::new("ns");
        let layout = TableLayout::new("ns/t", 16);
        assert!(apply_failure(&host, &keys, POD, 2).unwrap().healthy);
        assert!(!apply_failure(&host, &keys, POD, 2).unwrap().healthy);
        let a = apply_success(&host, &keys, &layout, POD, &page("e", 0, json!([])), 5).unwrap();
        assert!(a.recovered);
        assert!(read_state(&host, &keys, POD).0.healthy);
        assert!(!mark_down(&host, &keys, POD, 2).unwrap().healthy);
        assert!(apply_success(&host, &keys, &layout, POD, b"not json", 6).is_err());
    }

    #[test]
    fn a_full_page_asks_for_the_next_at_once() {
        let host = FakeHost::default();
        let keys = Keys::new("ns");
        let layout = TableLayout::new("ns/t", 64);
        let stored = |seq: u64| json!({"seq": seq, "type": "BlockStored", "hashes": [BlockHash(seq).to_hex()]});
        let body = |seq: u64, more: bool| {
            json!({"epoch": "e", "seq": seq, "events": [stored(seq)], "more": more}).to_string()
        };
        let a = apply_success(&host, &keys, &layout, POD, body(1, true).as_bytes(), 1).unwrap();
        assert_eq!(a.again_since, Some(1));
        let a = apply_success(&host, &keys, &layout, POD, body(2, false).as_bytes(), 2).unwrap();
        assert_eq!(a.again_since, None, "caught up: wait for the next tick");
        assert_eq!(read_state(&host, &keys, POD).0.seq, 2);
    }

    #[test]
    fn reset_takes_the_snapshot() {
        let host = FakeHost::default();
        let keys = Keys::new("ns");
        let layout = TableLayout::new("ns/t", 64);
        let body = json!({"epoch": "e", "seq": 9, "reset": true, "snapshot": [BlockHash(5).to_hex()], "events": []}).to_string();
        let a = apply_success(&host, &keys, &layout, POD, body.as_bytes(), 1).unwrap();
        assert!(a.new_generation);
        let st = read_state(&host, &keys, POD).0;
        let e = OwnershipTable::new(&host, &layout)
            .owner(BlockHash(5))
            .unwrap();
        assert_eq!(e.generation, st.generation);
        assert_eq!(st.seq, 9);
    }
}
