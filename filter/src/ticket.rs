//! One request's ticket, from its routing decision to the end of its stream: the pod it was
//! placed on (with its fallbacks), the in-flight slot it holds there, the blocks recorded as
//! that pod's that wait for its answer, and what the debug headers say of it.
//!
//! The HTTP context holds one per routed request and hands it each event of the answer:
//! its headers ([`Ticket::answer_headers`]), its first bytes ([`Ticket::answer_started`]) and
//! the stream's end ([`Ticket::end`]). Everything a request leaves in shared data is undone
//! or confirmed here, in one place: the slot is released once, pending blocks are settled
//! only by the chosen pod's success, a pod that failed is marked down.

use crate::host::{Headers, Host, Level, Store};
use crate::members::Placement;
use crate::metrics::Metrics;
use crate::ownership::{OwnershipTable, RecordStats};
use crate::pods::{mark_down, Inflight};
use crate::router::Router;
use prefix_core::liveness::is_connect_failure;
use prefix_core::protocol::headers::{self, debug};
use prefix_core::BlockHash;

/// Blocks recorded for a pod that is still to compute them ([`OwnershipTable::record`]).
#[derive(Debug, Clone)]
pub struct Pending {
    pub hashes: Vec<BlockHash>,
    pub generation: u64,
    /// When its prefill was predicted to end (router clock, ns).
    pub ready_at: u64,
}

/// What routing one request cost and wrote, for the metrics at decision time.
#[derive(Debug, Clone, Default)]
pub struct RouteCost {
    pub table: RecordStats,
    /// Blocks hashed and looked up (up to the one the ticket's `prefix_hash` names).
    pub hashed_blocks: usize,
    /// Time spent rendering, tokenizing and hashing the prompt and looking its blocks up, as
    /// deep as they are owned (µs); the rest of the routing time is the decision and the
    /// shared-data writes.
    pub prepare_us: u64,
}

/// One routed request ([`Router::route_request`], [`Router::by_load`]).
#[derive(Debug, Clone)]
pub struct Ticket {
    pub placed: Placement,
    /// Hash of the deepest block hashed, which names the prefix up to it (the whole prompt's
    /// last full block with debug headers on); `None` for prompts shorter than a block or when
    /// the filter failed open.
    pub prefix_hash: Option<BlockHash>,
    /// `Some((read, total))` bytes when the prompt was read only in part
    /// (`max_prompt_tokens`): the decision rests on the blocks before `read`.
    pub read_short: Option<(usize, usize)>,
    pub cost: RouteCost,
    /// The chosen pod's in-flight count was incremented: released once, at the end.
    slot_held: bool,
    /// Blocks recorded as the chosen pod's from its predicted prefill end, settled when its
    /// answer starts sooner.
    pending: Option<Pending>,
    /// The address that answered, once read (with the answer's headers: no retry follows
    /// them), so the end of the stream does not ask Envoy again.
    served_by: Option<Option<String>>,
}

impl Ticket {
    /// A request placed by load: nothing recorded, no slot held.
    pub fn by_load(placed: Placement) -> Self {
        Ticket::new(placed, None, None, RouteCost::default(), false, None)
    }

    pub(crate) fn new(
        placed: Placement,
        prefix_hash: Option<BlockHash>,
        read_short: Option<(usize, usize)>,
        cost: RouteCost,
        slot_held: bool,
        pending: Option<Pending>,
    ) -> Self {
        Ticket {
            placed,
            prefix_hash,
            read_short,
            cost,
            slot_held,
            pending,
            served_by: None,
        }
    }

    /// Whether the chosen pod's in-flight count is held by this request.
    pub fn holds_slot(&self) -> bool {
        self.slot_held
    }

    /// Blocks waiting for the chosen pod's answer, if any.
    pub fn pending(&self) -> Option<&Pending> {
        self.pending.as_ref()
    }

    /// The answer's headers: only the chosen pod's success means it computed the prompt (any
    /// other answer drops the pending blocks); a refused connection marks the pod down now;
    /// with `debug_headers`, the decision is written on the answer.
    pub fn answer_headers<H: Host>(&mut self, host: &H, router: &Router) {
        let status = host
            .header(Headers::Response, ":status")
            .unwrap_or_default();
        let chosen = self.placed.pod();
        let served = self.served_by.insert(host.upstream_address());
        let served_elsewhere = served.as_deref().is_some_and(|a| a != chosen);
        if !status.starts_with('2') || served_elsewhere {
            self.pending = None;
        }
        let from_pod = || host.header(Headers::Response, headers::POD).is_some();
        if is_connect_failure(&status, from_pod) {
            let down_after = router.config.down_after_failures;
            if mark_down(host, &router.keys, chosen, down_after).is_some() {
                host.log(
                    Level::Warn,
                    &format!(
                        "prefix-router: pod {chosen} failed a request ({status}); marked down"
                    ),
                );
            }
        }
        if router.config.debug_headers {
            self.write_debug_headers(host);
        }
    }

    fn write_debug_headers<H: Host>(&self, host: &H) {
        let d = self.placed.decision;
        let set = |name, value: &str| host.set_header(Headers::Response, name, Some(value));
        set(debug::POD, self.placed.pod());
        set(debug::REASON, d.reason.as_str());
        set(
            debug::MATCHED_BLOCKS,
            &d.reason.matched_blocks().to_string(),
        );
        if let Some(h) = self.prefix_hash {
            set(debug::PREFIX_HASH, &h.to_hex());
        }
        if let Some((read, total)) = self.read_short {
            set(debug::PROMPT_READ, &format!("{read}/{total}"));
        }
    }

    /// The answer's first bytes (a streamed answer's first token, or a whole answer): the
    /// chosen pod has computed the prompt, so its pending blocks are ready now, unless their
    /// predicted time has come already (then nothing is written, nor read).
    pub fn answer_started<S: Store>(&mut self, store: &S, router: &Router) {
        let Some(p) = self.pending.take() else {
            return;
        };
        if store.now_nanos() < p.ready_at {
            OwnershipTable::new(store, &router.layout).record(
                &p.hashes,
                self.placed.pod(),
                p.generation,
                None,
            );
        }
    }

    /// The stream is over, however it ended: the in-flight slot is released, and if Envoy had
    /// to retry a request read by its body on a fallback, that is counted and the chosen
    /// pod's failure noted (the poller confirms or clears it on its next round).
    pub fn end<H: Host>(
        &mut self,
        host: &H,
        router: &Router,
        metrics: Option<&Metrics<H>>,
        read_body: bool,
    ) {
        if std::mem::take(&mut self.slot_held) {
            if let Some(slot) = self.placed.slot() {
                let key = &router.inflight_key;
                Inflight::read(host, key, self.placed.members.width()).add(host, key, slot, -1);
            }
        }
        let chosen = self.placed.pod();
        let served = match self.served_by.take() {
            Some(read) => read,
            None => host.upstream_address(),
        };
        if served.is_some_and(|s| s != chosen) && read_body {
            if let Some(m) = metrics {
                m.served_elsewhere();
            }
            let down_after = router.config.down_after_failures;
            if mark_down(host, &router.keys, chosen, down_after).is_some() {
                host.log(
                    Level::Warn,
                    &format!("prefix-router: pod {chosen} failed a try; another pod answered"),
                );
            }
        }
    }
}
