//! The poller: one VM of the Envoy (elected by a lease in shared data) asks every pod for its
//! cache events and load each `poll_interval_ms` (`GET /v1/cache/events?since=SEQ`, through
//! the pods cluster), and applies the answers to the shared state all workers route from.
//!
//! - Scheduling ([`Poller`]): at most one poll per pod in flight; a pod that says `more` is
//!   asked again at once, up to [`CATCH_UP_PAGES`] pages per tick, so a busy pod is followed
//!   in small bounded steps instead of one stall per tick.
//! - Applying a page ([`apply_page`]): the state rules are `prefix_core::liveness`; then the
//!   snapshot of a reset and the page's live events (after its last `AllCleared`) are
//!   recorded: `BlockStored` makes the pod an owner (so blocks another Envoy placed are
//!   learned), `BlockRemoved` forgets it.
//! - With `events` in the config, the page is asked of the pod's `kv-events` sidecar (vLLM's
//!   and SGLang's own KV-cache events, as a page) instead of the pod.
//! - Pods without the events endpoint (a 404: vLLM, SGLang, llama.cpp) are followed through
//!   `GET /health` and then `GET /metrics` ([`apply_metrics`]): health, load, restarts.
//! - Failures ([`apply_failure`]; a request's failures: [`crate::pods::mark_down`]): failed polls count towards
//!   `down_after_failures`; a refused connection on the request path marks the pod down now.
//! - Membership ([`apply_members`], with `discovery`): each tick also asks Envoy's admin for
//!   the pods cluster's members (`GET /clusters?format=json`); a pod that joins takes a free
//!   slot and is routed to at once, a pod that leaves loses its slot and its ownership.

use crate::host::{Host, Level, SetOutcome, Store};
use crate::members::{read_slots, write_slots};
use crate::metrics::Metrics;
use crate::ownership::OwnershipTable;
use crate::pods::{try_lease, update_state, Keys, PodState};
use crate::router::Router;
use prefix_core::liveness::{self, PageEffect, PodKind};
use prefix_core::membership::Change;
use prefix_core::protocol::envoy_clusters::members_of;
use prefix_core::protocol::pod_metrics::read_metrics;
use prefix_core::protocol::{headers, CacheEvent, EventsPage, EVENTS_PATH};
use prefix_core::table::TableLayout;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

/// Pages of cache events a pod may be polled for right away, per tick, beyond the tick's own
/// poll: enough to drain the server's whole bounded history (8 × 512 events) in one period.
pub const CATCH_UP_PAGES: u32 = 8;

/// Shortest time a poll (or the members ask) is given to answer: a poll interval shorter
/// than this does not make a pod under load that answers in 300 ms count as failing.
pub const MIN_POLL_TIMEOUT_MS: u64 = 500;

/// Largest admin answer read for the members (a pretty-printed host status is about 1 KB:
/// this holds well over the 1024 members a router follows, with other clusters beside).
pub const MAX_CLUSTERS_BODY: usize = 8 << 20;

/// What one poll changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// Entries written for stored blocks…
    pub stored: u32,
    /// …of which filled an empty way.
    pub filled: u32,
    pub removed: u32,
    /// The pod's generation changed (first contact, restart, reset or clear).
    pub new_generation: bool,
    /// The pod came back from down.
    pub recovered: bool,
    /// The pod has just been found to give no load metrics: followed by its health alone.
    pub health_only: bool,
    /// Poll again now, from this sequence number: the pod restarted (re-read from 0) or has
    /// more events waiting (a busy pod can produce more than a page per poll period; waiting
    /// a whole period per page would fall behind its bounded history and force a resync).
    pub again_since: Option<u64>,
}

/// Applies a successful poll's page to the pod's state and the ownership table.
pub fn apply_page<S: Store>(
    store: &S,
    keys: &Keys,
    layout: &TableLayout,
    pod: &str,
    page: &EventsPage,
    now_ns: u64,
) -> Result<Applied, String> {
    let mut fx = PageEffect::default();
    let st = update_state(store, keys, pod, |st| {
        fx = liveness::on_page(st, page, now_ns)
    })
    .ok_or_else(|| format!("could not update state of {pod}"))?;
    let mut out = Applied {
        new_generation: fx.new_generation,
        recovered: fx.recovered,
        ..Applied::default()
    };
    if fx.restarted {
        out.again_since = Some(0);
        return Ok(out);
    }
    out.again_since = page.more.then_some(st.seq);
    let table = OwnershipTable::new(store, layout);
    let record = |out: &mut Applied, hashes: &[_]| {
        let r = table.record(hashes, pod, st.generation, None);
        out.stored += r.written;
        out.filled += r.filled;
    };
    if let Some(snapshot) = &page.snapshot {
        record(&mut out, snapshot);
    }
    for e in page.live_events() {
        match &e.event {
            CacheEvent::BlockStored { hashes } => record(&mut out, hashes),
            CacheEvent::BlockRemoved { hashes } => out.removed += table.remove(hashes, pod),
            CacheEvent::AllCleared => {}
        }
    }
    Ok(out)
}

/// A poll that failed (no answer, non-200, a body that is not a page). Returns the new state
/// and whether the pod went down with this failure.
pub fn apply_failure<S: Store>(
    store: &S,
    keys: &Keys,
    pod: &str,
    down_after: u32,
    unreachable: bool,
) -> Option<(PodState, bool)> {
    let mut went_down = false;
    let st = update_state(store, keys, pod, |st| {
        went_down = liveness::on_poll_failure(st, down_after, unreachable)
    })?;
    Some((st, went_down))
}

/// Applies a metrics-only pod's good health check and its `/metrics` body: `None` when it had
/// none to give (a non-200 answer, or none of the model-server load metrics in it), and the
/// pod is then followed by its health alone ([`PodKind::Health`]): a server started without
/// its metrics is still routed to, not marked down.
pub fn apply_metrics<S: Store>(
    store: &S,
    keys: &Keys,
    pod: &str,
    body: Option<&[u8]>,
    now_ns: u64,
) -> Result<Applied, String> {
    let report = body.and_then(|b| read_metrics(&String::from_utf8_lossy(b)));
    let mut fx = PageEffect::default();
    let mut became_health_only = false;
    update_state(store, keys, pod, |st| {
        fx = match &report {
            Some(r) => liveness::on_metrics(st, r, now_ns),
            None => {
                became_health_only = st.kind != PodKind::Health;
                liveness::on_health_only(st, now_ns)
            }
        }
    })
    .ok_or_else(|| format!("could not update state of {pod}"))?;
    Ok(Applied {
        new_generation: fx.new_generation,
        recovered: fx.recovered,
        health_only: became_health_only,
        ..Applied::default()
    })
}

/// Applies the pods cluster's current members (Envoy's `/clusters?format=json` answer): a
/// new slot assignment, written with compare-and-swap; pods that left get a new generation
/// (their table entries stop counting, and if they come back they are met afresh). `Ok` with
/// an empty change when nothing changed.
pub fn apply_members<S: Store>(
    store: &S,
    router: &Router,
    cluster: &str,
    body: &[u8],
) -> Result<Change, String> {
    let current = members_of(body, cluster)?;
    for _ in 0..4 {
        let (stored, cas) = read_slots(store, &router.members_key);
        let change = stored
            .unwrap_or_else(|| router.slots(store))
            .update(&current);
        if change.is_empty() && cas.is_some() {
            return Ok(change);
        }
        match write_slots(store, &router.members_key, &change.slots, cas) {
            SetOutcome::Written => {
                for addr in &change.left {
                    update_state(store, &router.keys, addr, liveness::on_left);
                }
                // the members changed: every worker re-reads them with the states
                store.shared_set(&router.keys.states_version(), b"v", None);
                return Ok(change);
            }
            SetOutcome::CasMismatch => continue,
            SetOutcome::Failed => break,
        }
    }
    Err("could not store the members".to_owned())
}

/// What a poll asked a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    /// `GET /v1/cache/events?since=SEQ` (this project's server)
    Events(u64),
    /// `GET /health`, then `/metrics` (pods without events)
    Health,
    Metrics,
}

impl Ask {
    fn path(self) -> String {
        match self {
            Ask::Events(since) => format!("{EVENTS_PATH}?since={since}"),
            Ask::Health => "/health".to_owned(),
            Ask::Metrics => "/metrics".to_owned(),
        }
    }
}

/// A call that is out.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Out {
    /// a poll of the pod at this address
    Pod(String, Ask),
    /// Envoy's admin, for the members
    Members,
}

/// Poll scheduling for one VM: which calls are out, and how many catch-up pages each pod had
/// this tick.
#[derive(Default)]
pub struct Poller {
    /// call token → what was asked of whom
    out: RefCell<HashMap<u32, Out>>,
    /// per pod address: pages fetched at once since the last tick
    catch_up: RefCell<HashMap<String, u32>>,
}

impl Poller {
    /// One tick: if this VM holds (or takes) the poller lease, report every pod's metrics and
    /// poll each pod whose previous poll is not still out.
    pub fn tick<H: Host>(&self, host: &H, router: &Router, metrics: &Metrics<H>, vm_id: u64) {
        let now = host.now_nanos();
        let ttl = router.config.poll_interval_ms.saturating_mul(3_000_000);
        if !try_lease(host, &router.keys, vm_id, now, ttl) {
            return; // another VM is the poller
        }
        if let Some(d) = &router.config.discovery {
            self.ask_members(host, router, &d.admin_cluster);
        }
        let fleet = router.fleet(host);
        self.catch_up.borrow_mut().clear();
        metrics.members(&fleet.members, &fleet.states, &fleet.inflight, now);
        for (i, st) in fleet.states.iter().enumerate() {
            let addr = fleet.members.addr(i);
            let out = |o: &Out| matches!(o, Out::Pod(a, _) if a == addr);
            if self.out.borrow().values().any(out) {
                continue; // the previous poll of this pod is still out
            }
            let ask = match st.kind {
                PodKind::Metrics | PodKind::Health => Ask::Health,
                PodKind::Unknown | PodKind::Events => Ask::Events(st.seq),
            };
            self.poll(host, router, metrics, addr, ask);
        }
    }

    /// Asks Envoy's admin for the members (unless the last ask is still out).
    fn ask_members<H: Host>(&self, host: &H, router: &Router, admin_cluster: &str) {
        if self.out.borrow().values().any(|o| *o == Out::Members) {
            return;
        }
        let request = [
            (":method", "GET"),
            (":path", "/clusters?format=json"),
            (":authority", "envoy-admin"),
        ];
        let timeout =
            Duration::from_millis(router.config.poll_interval_ms.max(MIN_POLL_TIMEOUT_MS));
        match host.dispatch_http_call(admin_cluster, &request, timeout) {
            Ok(token) => {
                self.out.borrow_mut().insert(token, Out::Members);
            }
            Err(e) => host.log(
                Level::Warn,
                &format!("prefix-router: cannot ask Envoy's admin for the members through cluster '{admin_cluster}': {e}"),
            ),
        }
    }

    /// Envoy's answer about the members.
    fn on_members<H: Host>(
        &self,
        host: &H,
        router: &Router,
        metrics: &Metrics<H>,
        body_size: usize,
    ) {
        let Some(d) = &router.config.discovery else {
            return;
        };
        let result = host
            .http_call_ok_body(body_size, MAX_CLUSTERS_BODY)
            .and_then(|body| apply_members(host, router, &d.cluster, &body));
        match result {
            Ok(c) if c.is_empty() => {}
            Ok(c) => {
                metrics.membership_changed();
                host.log(
                    Level::Info,
                    &format!(
                        "prefix-router: members of cluster '{}' changed: joined {:?}, left {:?}{}",
                        d.cluster,
                        c.joined,
                        c.left,
                        if c.dropped > 0 {
                            format!(", {} over the limit left out", c.dropped)
                        } else {
                            String::new()
                        }
                    ),
                );
            }
            Err(e) => {
                metrics.poll_failed();
                host.log(
                    Level::Warn,
                    &format!("prefix-router: members of cluster '{}' unknown, keeping the last ones: Envoy admin {e}", d.cluster),
                );
            }
        }
    }

    /// Sends `ask` to the pod at `addr`.
    fn poll<H: Host>(&self, host: &H, router: &Router, metrics: &Metrics<H>, addr: &str, ask: Ask) {
        let timeout =
            Duration::from_millis(router.config.poll_interval_ms.max(MIN_POLL_TIMEOUT_MS));
        let path = ask.path();
        // the events page may be served beside the pod (a `kv-events` sidecar for vLLM)
        let target = match ask {
            Ask::Events(_) => router.config.events_addr(addr),
            Ask::Health | Ask::Metrics => addr.into(),
        };
        let mut request = vec![
            (":method", "GET"),
            (":path", path.as_str()),
            (":authority", &target),
            (headers::DESTINATION, &target),
        ];
        if let Some((name, value)) = &router.pod_auth {
            request.push((name.as_str(), value.as_str()));
        }
        match host.dispatch_http_call(&router.config.cluster, &request, timeout) {
            Ok(token) => {
                self.out
                    .borrow_mut()
                    .insert(token, Out::Pod(addr.to_owned(), ask));
            }
            Err(e) => {
                host.log(
                    Level::Warn,
                    &format!(
                        "prefix-router: cannot poll {addr} through cluster '{}': {e}",
                        router.config.cluster
                    ),
                );
                self.failed(host, router, metrics, addr, &e, false);
            }
        }
    }

    fn failed<H: Host>(
        &self,
        host: &H,
        router: &Router,
        metrics: &Metrics<H>,
        addr: &str,
        why: &str,
        unreachable: bool,
    ) {
        metrics.poll_failed();
        let down_after = router.config.down_after_failures;
        if let Some((_, true)) = apply_failure(host, &router.keys, addr, down_after, unreachable) {
            host.log(
                Level::Warn,
                &format!("prefix-router: pod {addr} marked down: {why}"),
            );
        }
    }

    /// The answer to a poll (inside `on_http_call_response`); false for a call this poller did
    /// not make (it is someone else's to handle).
    pub fn on_response<H: Host>(
        &self,
        host: &H,
        router: &Router,
        metrics: &Metrics<H>,
        token: u32,
        body_size: usize,
    ) -> bool {
        let Some(out) = self.out.borrow_mut().remove(&token) else {
            return false;
        };
        self.answered(host, router, metrics, out, body_size);
        true
    }

    /// One of this poller's calls came back.
    fn answered<H: Host>(
        &self,
        host: &H,
        router: &Router,
        metrics: &Metrics<H>,
        out: Out,
        body_size: usize,
    ) {
        let (addr, ask) = match out {
            Out::Members => return self.on_members(host, router, metrics, body_size),
            Out::Pod(addr, ask) => (addr, ask),
        };
        let addr = addr.as_str();
        if router.fleet(host).members.index_of(addr).is_none() {
            return; // it left while the poll was out: nothing to learn about a non-member
        }
        let status = host.http_call_status();
        let body = || host.http_call_body(body_size).unwrap_or_default();
        let now = host.now_nanos();
        let applied = match (ask, status.as_deref()) {
            (Ask::Events(_), Some("200")) => serde_json::from_slice::<EventsPage>(&body())
                .map_err(|e| format!("bad events page: {e}"))
                .and_then(|p| apply_page(host, &router.keys, &router.layout, addr, &p, now)),
            (Ask::Events(_), Some("404")) => {
                // not this project's server: follow its health and metrics from now on
                update_state(host, &router.keys, addr, liveness::on_no_events);
                host.log(
                    Level::Info,
                    &format!("prefix-router: pod {addr} has no {EVENTS_PATH}; following its /health and /metrics"),
                );
                return self.poll(host, router, metrics, addr, Ask::Health);
            }
            (Ask::Health, Some("200")) => {
                return self.poll(host, router, metrics, addr, Ask::Metrics)
            }
            (Ask::Metrics, Some("200")) => {
                apply_metrics(host, &router.keys, addr, Some(&body()), now)
            }
            // it answered /health a moment ago: no metrics is not a reason to stop routing to it
            (Ask::Metrics, Some(_))
                if !liveness::is_unreachable_reply(status.as_deref(), &body()) =>
            {
                apply_metrics(host, &router.keys, addr, None, now)
            }
            (ask, other) => {
                let body = body();
                let unreachable = liveness::is_unreachable_reply(other, &body);
                let excerpt =
                    String::from_utf8_lossy(body.get(..160).unwrap_or(&body)).into_owned();
                let why = format!(
                    "{} answered status {}: {excerpt}",
                    ask.path(),
                    other.unwrap_or("none (no answer)")
                );
                return self.failed(host, router, metrics, addr, &why, unreachable);
            }
        };
        let a = match applied {
            Ok(a) => a,
            Err(e) => return self.failed(host, router, metrics, addr, &e, false),
        };
        if a.health_only {
            host.log(
                Level::Warn,
                &format!("prefix-router: pod {addr} serves no model-server load metrics at /metrics (llama-server needs --metrics); following its /health only, load unknown"),
            );
        }
        if a.recovered {
            host.log(Level::Info, &format!("prefix-router: pod {addr} is back"));
        }
        if a.new_generation {
            host.log(
                Level::Info,
                &format!("prefix-router: pod {addr} has a new cache generation (first contact, restart or resync)"),
            );
        }
        metrics.events(&a);
        let Some(since) = a.again_since else {
            return;
        };
        let mut catch_up = self.catch_up.borrow_mut();
        let n = catch_up.entry(addr.to_owned()).or_default();
        if *n < CATCH_UP_PAGES {
            *n += 1;
            drop(catch_up);
            self.poll(host, router, metrics, addr, Ask::Events(since));
        }
    }
}

/// Parses a page body and applies it (what `on_response` does with a 200), for tests.
#[cfg(test)]
pub fn apply_body<S: Store>(
    store: &S,
    keys: &Keys,
    layout: &TableLayout,
    pod: &str,
    body: &[u8],
    now_ns: u64,
) -> Result<Applied, String> {
    let page: EventsPage = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    apply_page(store, keys, layout, pod, &page, now_ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;
    use crate::pods::{mark_down, read_state};
    use prefix_core::BlockHash;
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

        let a = apply_body(
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
        let a = apply_body(&host, &keys, &layout, POD, &page("e2", 1, json!([])), 20).unwrap();
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
        assert!(
            apply_failure(&host, &keys, POD, 2, false)
                .unwrap()
                .0
                .healthy
        );
        assert_eq!(
            apply_failure(&host, &keys, POD, 2, false).map(|(s, down)| (s.healthy, down)),
            Some((false, true))
        );
        let a = apply_body(&host, &keys, &layout, POD, &page("e", 0, json!([])), 5).unwrap();
        assert!(a.recovered);
        assert!(read_state(&host, &keys, POD).0.healthy);
        assert!(!mark_down(&host, &keys, POD, 2).unwrap().healthy);
        assert!(apply_body(&host, &keys, &layout, POD, b"not json", 6).is_err());
    }

    /// `llama-server --metrics` output with `computed` prompt tokens so far.
    fn llama_metrics(computed: u32) -> Vec<u8> {
        format!(
            "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens\n\
             # TYPE llamacpp:prompt_tokens_total counter\n\
             llamacpp:prompt_tokens_total {computed}\n\
             llamacpp:prompt_tokens_cached_total 0\n\
             llamacpp:n_busy_slots_per_decode 1\n\
             llamacpp:requests_processing 0\n\
             llamacpp:requests_deferred 0\n"
        )
        .into_bytes()
    }

    #[test]
    fn a_metrics_pod_killed_and_restarted_gets_a_new_generation() {
        let host = FakeHost::default();
        let keys = Keys::new("ns");
        update_state(&host, &keys, POD, liveness::on_no_events).unwrap();
        let first = apply_metrics(&host, &keys, POD, Some(&llama_metrics(0)), 1).unwrap();
        assert!(
            !first.new_generation,
            "first contact keeps the router's records"
        );
        let served = apply_metrics(&host, &keys, POD, Some(&llama_metrics(149)), 2).unwrap();
        assert!(!served.new_generation);
        // killed: polls find nobody listening
        apply_failure(&host, &keys, POD, 2, true).unwrap();
        apply_failure(&host, &keys, POD, 2, true).unwrap();
        // restarted: its counter starts again from zero
        let back = apply_metrics(&host, &keys, POD, Some(&llama_metrics(0)), 3).unwrap();
        assert!(back.recovered && back.new_generation);
        // killed right after its first request, before a poll saw the counter move: the
        // refused connection alone says the process behind the address is new
        assert!(!mark_down(&host, &keys, POD, 2).unwrap().healthy);
        let back = apply_metrics(&host, &keys, POD, Some(&llama_metrics(0)), 4).unwrap();
        assert!(back.recovered && back.new_generation);
        // a busy pod whose polls time out is the same process when it answers again
        apply_failure(&host, &keys, POD, 2, false).unwrap();
        apply_failure(&host, &keys, POD, 2, false).unwrap();
        let back = apply_metrics(&host, &keys, POD, Some(&llama_metrics(0)), 5).unwrap();
        assert!(back.recovered && !back.new_generation);
    }

    #[test]
    fn a_pod_without_load_metrics_is_followed_by_its_health() {
        let host = FakeHost::default();
        let keys = Keys::new("ns");
        update_state(&host, &keys, POD, liveness::on_no_events).unwrap();
        // llama-server without --metrics answers 501: no body to read
        let first = apply_metrics(&host, &keys, POD, None, 1).unwrap();
        assert!(first.health_only, "said once");
        let st = read_state(&host, &keys, POD).0;
        assert!(st.healthy);
        assert_eq!(st.signals(), 3);
        // a /metrics without any model-server series is the same
        let again = apply_metrics(&host, &keys, POD, Some(b"process_cpu_seconds_total 3\n"), 2);
        assert!(!again.unwrap().health_only, "not said again");
        assert!(read_state(&host, &keys, POD).0.healthy);
        // restarted with --metrics: followed by them
        let with = apply_metrics(&host, &keys, POD, Some(&llama_metrics(5)), 3).unwrap();
        assert!(!with.health_only);
        assert_eq!(read_state(&host, &keys, POD).0.signals(), 2);
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
        let a = apply_body(&host, &keys, &layout, POD, body(1, true).as_bytes(), 1).unwrap();
        assert_eq!(a.again_since, Some(1));
        let a = apply_body(&host, &keys, &layout, POD, body(2, false).as_bytes(), 2).unwrap();
        assert_eq!(a.again_since, None, "caught up: wait for the next tick");
        assert_eq!(read_state(&host, &keys, POD).0.seq, 2);
    }

    #[test]
    fn reset_takes_the_snapshot() {
        let host = FakeHost::default();
        let keys = Keys::new("ns");
        let layout = TableLayout::new("ns/t", 64);
        let body = json!({"epoch": "e", "seq": 9, "reset": true, "snapshot": [BlockHash(5).to_hex()], "events": []}).to_string();
        let a = apply_body(&host, &keys, &layout, POD, body.as_bytes(), 1).unwrap();
        assert!(a.new_generation);
        let st = read_state(&host, &keys, POD).0;
        let e = OwnershipTable::new(&host, &layout)
            .owner(BlockHash(5))
            .unwrap();
        assert_eq!(e.generation, st.generation);
        assert_eq!(st.seq, 9);
    }

    #[test]
    fn a_clear_drops_the_blocks_stored_before_it_in_the_same_page() {
        let host = FakeHost::default();
        let keys = Keys::new("ns");
        let layout = TableLayout::new("ns/t", 64);
        let body = json!({"epoch": "e", "seq": 3, "events": [
            {"seq": 1, "type": "BlockStored", "hashes": [BlockHash(1).to_hex()]},
            {"seq": 2, "type": "AllCleared"},
            {"seq": 3, "type": "BlockStored", "hashes": [BlockHash(2).to_hex()]},
        ]})
        .to_string();
        let a = apply_body(&host, &keys, &layout, POD, body.as_bytes(), 1).unwrap();
        assert_eq!(a.stored, 1);
        let st = read_state(&host, &keys, POD).0;
        let t = OwnershipTable::new(&host, &layout);
        assert!(
            t.owner(BlockHash(1)).is_none(),
            "cleared after it was stored"
        );
        assert_eq!(
            t.owner(BlockHash(2)).map(|e| e.generation),
            Some(st.generation)
        );
    }
}
