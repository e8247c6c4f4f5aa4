//! The serving side of the cache-events page: a bounded history of cache events with sequence
//! numbers, paged for routers to follow, and resync with a snapshot. The page and event types
//! are [`super::events`]'; this is what a pod (this project's server) or a sidecar that
//! publishes another server's events (`kv-events`, for vLLM) keeps to answer them.

use super::events::{CacheEvent, EventsPage, SeqEvent};
use crate::block::BlockHash;
use std::collections::VecDeque;

#[derive(Debug)]
pub struct EventLog {
    epoch: u64,
    next_seq: u64,
    events: VecDeque<SeqEvent>,
    max_events: usize,
}

/// Events per page…
pub const PAGE: usize = 512;
/// …and block hashes per page (a page holds at least one event, however large). A router
/// applies a page in one go, so pages are bounded by the work they carry, not only by their
/// event count: one stored 8k-token prompt is a single event with 62 hashes.
pub const PAGE_HASHES: usize = 2048;

impl EventLog {
    pub fn new(epoch: u64, max_events: usize) -> Self {
        EventLog {
            epoch,
            next_seq: 1,
            events: VecDeque::new(),
            max_events: max_events.max(1),
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The newest sequence number handed out (0 before any event).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    pub fn push(&mut self, event: CacheEvent) {
        if let CacheEvent::BlockStored { hashes } | CacheEvent::BlockRemoved { hashes } = &event {
            if hashes.is_empty() {
                return;
            }
        }
        self.events.push_back(SeqEvent {
            seq: self.next_seq,
            event,
        });
        self.next_seq += 1;
        while self.events.len() > self.max_events {
            self.events.pop_front();
        }
    }

    /// Events after `since`; `held` lists every held block, called only for a resync.
    pub fn since(&self, since: u64, held: impl FnOnce() -> Vec<BlockHash>) -> EventsPage {
        let oldest = self.events.front().map(|e| e.seq).unwrap_or(self.next_seq);
        let epoch = format!("{:016x}", self.epoch);
        // A gap (history dropped) or a future seq (client saw another epoch) → resync.
        if since.saturating_add(1) < oldest || since > self.last_seq() {
            return EventsPage {
                epoch,
                seq: self.last_seq(),
                reset: true,
                snapshot: Some(held()),
                events: Vec::new(),
                more: false,
                pod: String::new(),
                load: Default::default(),
            };
        }
        let (mut taken, mut hashes) = (0, 0);
        let events: Vec<SeqEvent> = self
            .events
            .iter()
            .filter(|e| e.seq > since)
            .take(PAGE)
            .take_while(|e| {
                taken += 1;
                hashes += e.event.hash_count();
                taken == 1 || hashes <= PAGE_HASHES
            })
            .cloned()
            .collect();
        let seq = events.last().map(|e| e.seq).unwrap_or(since);
        EventsPage {
            epoch,
            seq,
            reset: false,
            snapshot: None,
            more: seq < self.last_seq(),
            events,
            pod: String::new(),
            load: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(n: u64) -> CacheEvent {
        CacheEvent::BlockStored {
            hashes: vec![BlockHash(n)],
        }
    }

    #[test]
    fn paging_and_resync() {
        let mut log = EventLog::new(7, 3);
        assert_eq!(log.since(0, Vec::new).events.len(), 0);
        for i in 0..5 {
            log.push(stored(i));
        }
        log.push(CacheEvent::BlockRemoved { hashes: vec![] }); // empty: ignored
        assert_eq!(log.last_seq(), 5);
        // only the 3 newest (3, 4, 5) are kept
        let p = log.since(2, Vec::new);
        assert!(!p.reset);
        assert_eq!(
            p.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![3, 4, 5]
        );
        assert_eq!(p.seq, 5);
        let p = log.since(5, Vec::new);
        assert!(p.events.is_empty() && !p.reset && p.seq == 5);
        // too far behind → snapshot
        let p = log.since(1, || vec![BlockHash(42)]);
        assert!(p.reset);
        assert_eq!(p.snapshot, Some(vec![BlockHash(42)]));
        // from the future (another epoch) → snapshot, the largest number included
        assert!(log.since(99, Vec::new).reset);
        assert!(log.since(u64::MAX, Vec::new).reset);
        assert_eq!(p.epoch, "0000000000000007");
    }

    #[test]
    fn pages_are_bounded_by_hashes_too() {
        let mut log = EventLog::new(1, 100);
        let big = |n: u64| CacheEvent::BlockStored {
            hashes: (0..n).map(BlockHash).collect(),
        };
        log.push(big(PAGE_HASHES as u64 + 5)); // larger than a page on its own
        log.push(big(1000));
        log.push(big(1000));
        log.push(big(1000));
        let p = log.since(0, Vec::new);
        assert_eq!(p.events.len(), 1, "an oversized event still makes progress");
        assert!(p.more);
        let p = log.since(1, Vec::new);
        assert_eq!(p.events.len(), 2, "1000 + 1000 fit, a third would not");
        assert_eq!(p.seq, 3);
        assert!(p.more);
        let p = log.since(3, Vec::new);
        assert_eq!((p.events.len(), p.more), (1, false));
        // an event without hashes first does not let an oversized one in behind it
        log.push(CacheEvent::AllCleared);
        log.push(big(PAGE_HASHES as u64 + 1));
        let p = log.since(4, Vec::new);
        assert_eq!((p.events.len(), p.more), (1, true));
    }
}
