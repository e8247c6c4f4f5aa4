//! One pod's followed state: its blocks translated to the router's ([`Translator`]), the page
//! history routers read (`EventLog`), the stream's numbers ([`Sequence`]), and the pod's load
//! and start time from its `/metrics`.
//!
//! A pod whose `/metrics` does not answer, or whose events are not subscribed to yet, is not
//! served as healthy: the page answers 503, so
//! the filter counts failed polls and marks it down as it does any pod. A new
//! `process_start_time_seconds` means the pod restarted with an empty cache: its blocks are
//! forgotten even if no event said so.

use crate::config::Config;
use crate::sequence::{Sequence, Step};
use crate::translate::{Skipped, TranslateError, Translator};
use crate::wire::Message;
use prefix_core::protocol::pod_metrics::{read_metrics, MetricsReport};
use prefix_core::protocol::{EventLog, EventsPage, LoadReport};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Counters the sidecar reports on its own `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    pub messages: u64,
    pub undecodable: u64,
    pub gaps: u64,
    pub replayed: u64,
    /// gaps a replay could not close: the pod's blocks were forgotten
    pub resets: u64,
    pub pod_restarts: u64,
    pub refused: u64,
}

pub struct Feed {
    translator: Translator,
    log: EventLog,
    seq: Sequence,
    pod_name: String,
    load: Option<LoadReport>,
    pod_start: Option<f64>,
    /// why the page is not served (the pod does not answer, or its blocks cannot be matched)
    pub trouble: Option<String>,
    /// the event stream is subscribed to (until then, nothing the page says can be trusted)
    pub subscribed: bool,
    pub counters: Counters,
}

impl Feed {
    pub fn new(config: &Config, epoch: u64) -> Self {
        Feed {
            translator: Translator::new(&config.model, config.block_size, config.max_blocks),
            log: EventLog::new(epoch, config.history),
            seq: Sequence::default(),
            pod_name: config.pod_name.clone(),
            load: None,
            pod_start: None,
            trouble: None,
            subscribed: false,
            counters: Counters::default(),
        }
    }

    /// A live message arrived: what to do with it (see [`Sequence::on_live`]).
    pub fn on_live(&mut self, seq: u64) -> Step {
        self.counters.messages += 1;
        let step = self.seq.on_live(seq);
        if step == Step::Restarted {
            self.counters.pod_restarts += 1;
            self.forget();
        }
        step
    }

    /// Applies a message in order and records its number.
    pub fn apply(&mut self, m: &Message) {
        for e in &m.events {
            match self.translator.apply(e) {
                Ok(events) => events.into_iter().for_each(|e| self.log.push(e)),
                Err(e @ TranslateError::BlockSizes { .. }) => {
                    self.counters.refused += 1;
                    if self.trouble.is_none() {
                        tracing::error!("kv-events: {e}");
                    }
                    self.trouble = Some(e.to_string());
                }
            }
        }
        self.seq.applied(m.seq);
    }

    /// Messages were lost for good: forget the pod's blocks and go on from `seq`.
    pub fn give_up_until(&mut self, seq: u64) {
        self.counters.resets += 1;
        self.forget();
        self.seq.resume_at(seq);
    }

    fn forget(&mut self) {
        let e = self.translator.clear();
        self.log.push(e);
    }

    /// The pod's `/metrics` answered (`Some`) or did not.
    pub fn on_metrics(&mut self, report: Option<MetricsReport>) {
        let Some(r) = report else {
            self.load = None;
            return;
        };
        if let (Some(old), Some(new)) = (self.pod_start, r.start_time) {
            if new != old {
                tracing::info!("kv-events: the pod restarted (new process start time): its blocks are forgotten");
                self.counters.pod_restarts += 1;
                self.forget();
            }
        }
        self.pod_start = r.start_time.or(self.pod_start);
        self.load = Some(r.load);
    }

    /// `Err` with the reason when the pod is not to be routed to by what the page says.
    pub fn healthy(&self) -> Result<LoadReport, String> {
        if let Some(t) = &self.trouble {
            return Err(t.clone());
        }
        if !self.subscribed {
            return Err("not subscribed to the pod's events yet".to_owned());
        }
        self.load
            .ok_or_else(|| "the pod's /metrics does not answer".to_owned())
    }

    /// The page for a router that has seen everything up to `since` (see [`Feed::healthy`]).
    pub fn page(&self, since: u64) -> Result<EventsPage, String> {
        let load = self.healthy()?;
        let mut page = self.log.since(since, || self.translator.held());
        page.pod = self.pod_name.clone();
        page.load = load;
        Ok(page)
    }

    pub fn skipped(&self) -> Skipped {
        self.translator.skipped
    }

    pub fn held_blocks(&self) -> usize {
        self.translator.held().len()
    }
}

/// The feed shared by the subscriber, the scraper and the page handler.
#[derive(Clone)]
pub struct SharedFeed(Arc<Mutex<Feed>>);

impl SharedFeed {
    pub fn new(config: &Config) -> Self {
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(48);
        SharedFeed(Arc::new(Mutex::new(Feed::new(config, epoch))))
    }

    /// The feed, even if a holder panicked (its state is still a valid feed).
    pub fn lock(&self) -> MutexGuard<'_, Feed> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Reads the pod's `/metrics` every `metrics_interval_ms`, forever.
pub async fn scrape_pod(config: Config, feed: SharedFeed) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(config.metrics_interval_ms.max(1000)))
        .build()
        .unwrap_or_default();
    let url = format!("{}/metrics", config.pod);
    let mut tick = tokio::time::interval(Duration::from_millis(config.metrics_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let report = match client.get(&url).send().await {
            Ok(r) if r.status().is_success() => r.text().await.ok().and_then(|t| read_metrics(&t)),
            _ => None,
        };
        feed.lock().on_metrics(report);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Args;
    use crate::wire::{BlockStored, PodBlockId, PodEvent};
    use clap::Parser;
    use prefix_core::protocol::CacheEvent;

    fn feed() -> Feed {
        let config = Args::try_parse_from([
            "kv-events",
            "--events",
            "ipc:///x",
            "--pod",
            "http://127.0.0.1:1",
            "--model",
            "m",
            "--block-size",
            "4",
        ])
        .map_err(|e| e.to_string())
        .and_then(|a| a.validate().map_err(|e| e.to_string()));
        match config {
            Ok(c) => {
                let mut f = Feed::new(&c, 7);
                f.subscribed = true;
                f
            }
            Err(e) => unreachable!("{e}"),
        }
    }

    fn report(start: f64) -> Option<MetricsReport> {
        Some(MetricsReport {
            load: LoadReport {
                running: 1,
                ..LoadReport::default()
            },
            start_time: Some(start),
            monotonic: None,
        })
    }

    fn message(seq: u64, id: u64, size: u32) -> Message {
        Message {
            topic: Vec::new(),
            seq,
            ts: 0.0,
            events: vec![PodEvent::BlockStored(BlockStored {
                block_hashes: vec![PodBlockId(id)],
                token_ids: vec![id as u32; size as usize],
                block_size: size,
                ..BlockStored::default()
            })],
            data_parallel_rank: None,
        }
    }

    #[test]
    fn no_page_without_the_pods_metrics() {
        let mut f = feed();
        assert!(f.page(0).is_err());
        f.on_metrics(report(1.0));
        let page = f.page(0).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(page.load.running, 1);
        f.on_metrics(None);
        assert!(
            f.page(0).is_err(),
            "a pod that stopped answering is not served as healthy"
        );
    }

    #[test]
    fn a_new_start_time_forgets_the_pods_blocks() {
        let mut f = feed();
        f.on_metrics(report(1.0));
        assert_eq!(f.on_live(0), Step::Apply);
        f.apply(&message(0, 1, 4));
        assert_eq!(f.held_blocks(), 1);
        f.on_metrics(report(1.0));
        assert_eq!(f.held_blocks(), 1);
        f.on_metrics(report(2.0));
        assert_eq!(f.held_blocks(), 0);
        let page = f.page(0).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(
            page.events.last().map(|e| &e.event),
            Some(&CacheEvent::AllCleared)
        );
    }

    #[test]
    fn refused_block_sizes_stop_the_page() {
        let mut f = feed();
        f.on_metrics(report(1.0));
        f.on_live(0);
        f.apply(&message(0, 1, 3));
        let e = f.page(0).err().unwrap_or_default();
        assert!(e.contains("multiple"), "{e}");
        assert_eq!(f.counters.refused, 1);
    }

    #[test]
    fn giving_up_clears_and_resumes() {
        let mut f = feed();
        f.on_metrics(report(1.0));
        f.on_live(0);
        f.apply(&message(0, 1, 4));
        assert_eq!(f.on_live(5), Step::Gap { from: 1 });
        f.give_up_until(5);
        assert_eq!(f.held_blocks(), 0);
        f.apply(&message(5, 2, 4));
        assert_eq!(f.on_live(6), Step::Apply);
        assert_eq!((f.counters.resets, f.held_blocks()), (1, 1));
    }
}
