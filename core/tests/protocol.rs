//! The wire messages between model server and filter: one type each, round-tripped, and pinned
//! against a golden JSON sample (what the server sends today; a change here is a protocol
//! change every deployed filter must understand).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use prefix_core::protocol::{CacheEvent, EventsPage, LoadReport, SeqEvent};
use prefix_core::BlockHash;

fn golden() -> serde_json::Value {
    let text = include_str!("data/events_page.json");
    serde_json::from_str(text).unwrap()
}

fn sample() -> EventsPage {
    EventsPage {
        epoch: "00000000000000aa".into(),
        seq: 4,
        reset: false,
        snapshot: None,
        events: vec![
            SeqEvent {
                seq: 2,
                event: CacheEvent::BlockStored {
                    hashes: vec![BlockHash(1), BlockHash(2)],
                },
            },
            SeqEvent {
                seq: 3,
                event: CacheEvent::BlockRemoved {
                    hashes: vec![BlockHash(1)],
                },
            },
            SeqEvent {
                seq: 4,
                event: CacheEvent::AllCleared,
            },
        ],
        more: true,
        pod: "pod-0".into(),
        load: LoadReport {
            running: 1,
            waiting: 2,
            kv_cache_usage: 0.25,
            work: prefix_core::pod_costs::WorkCounters {
                prefills: Some(3.0),
                prefill_seconds: Some(0.25),
                computed_tokens: Some(2048.0),
                finished: Some(2.0),
                slot_seconds: Some(0.5),
                max_num_seqs: Some(4),
                cache_tokens: Some(32768.0),
            },
        },
    }
}

#[test]
fn events_page_serializes_to_the_golden_sample() {
    assert_eq!(serde_json::to_value(sample()).unwrap(), golden());
}

#[test]
fn events_page_round_trips() {
    let bytes = serde_json::to_vec(&sample()).unwrap();
    let back: EventsPage = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(back, sample());
    let from_golden: EventsPage = serde_json::from_value(golden()).unwrap();
    assert_eq!(from_golden, sample());
}

#[test]
fn a_reset_page_carries_its_snapshot() {
    let page = EventsPage {
        reset: true,
        snapshot: Some(vec![BlockHash(9)]),
        events: vec![],
        more: false,
        ..sample()
    };
    let back: EventsPage = serde_json::from_str(&serde_json::to_string(&page).unwrap()).unwrap();
    assert_eq!(back, page);
}

#[test]
fn older_pages_without_optional_fields_still_parse() {
    // what a server that predates `pod`/`load`/`more` would send
    let page: EventsPage = serde_json::from_str(r#"{"epoch":"e","seq":0}"#).unwrap();
    assert_eq!(page.load, LoadReport::default());
    assert!(!page.more && !page.reset && page.events.is_empty());
}

#[test]
fn malformed_pages_are_errors() {
    for bad in [
        r#"{"seq":1}"#,
        r#"{"epoch":"e","seq":1,"events":[{"seq":1,"type":"Nope"}]}"#,
        r#"{"epoch":"e","seq":1,"events":[{"seq":1,"type":"BlockStored","hashes":["xyz"]}]}"#,
    ] {
        assert!(serde_json::from_str::<EventsPage>(bad).is_err(), "{bad}");
    }
}
