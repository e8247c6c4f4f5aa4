//! Filter metrics, defined through proxy-wasm so they appear in Envoy's `/stats/prometheus`
//! (Envoy prefixes custom wasm metrics with `wasmcustom`).

use prefix_core::policy::Reason;
use proxy_wasm::hostcalls::{define_metric, increment_metric, record_metric};
use proxy_wasm::types::MetricType;

#[derive(Default, Clone, Copy)]
pub struct Metrics {
    prefix_hit: Option<u32>,
    cold: Option<u32>,
    short_prompt: Option<u32>,
    passthrough: Option<u32>,
    fallback: Option<u32>,
    matched_blocks: Option<u32>,
    table_entries: Option<u32>,
    table_replacements: Option<u32>,
    table_conflicts: Option<u32>,
    fail_open: Option<u32>,
    rejected: Option<u32>,
    tokenize_us: Option<u32>,
}

fn def(kind: MetricType, name: &str) -> Option<u32> {
    define_metric(kind, name).ok()
}

impl Metrics {
    /// Defines every metric (idempotent per VM). A metric that cannot be defined is skipped.
    pub fn define() -> Self {
        use MetricType::{Counter, Gauge, Histogram};
        Metrics {
            prefix_hit: def(Counter, "prefix_router_decisions_prefix_hit"),
            cold: def(Counter, "prefix_router_decisions_cold"),
            short_prompt: def(Counter, "prefix_router_decisions_short_prompt"),
            passthrough: def(Counter, "prefix_router_decisions_passthrough"),
            fallback: def(Counter, "prefix_router_decisions_fallback"),
            matched_blocks: def(Counter, "prefix_router_matched_blocks"),
            table_entries: def(Gauge, "prefix_router_table_entries"),
            table_replacements: def(Counter, "prefix_router_table_replacements"),
            table_conflicts: def(Counter, "prefix_router_table_conflicts"),
            fail_open: def(Counter, "prefix_router_fail_open"),
            rejected: def(Counter, "prefix_router_rejected"),
            tokenize_us: def(Histogram, "prefix_router_route_us"),
        }
    }

    fn inc(id: Option<u32>, by: i64) {
        if let Some(id) = id {
            if by != 0 {
                let _ = increment_metric(id, by);
            }
        }
    }

    pub fn decision(&self, reason: Reason) {
        let id = match reason {
            Reason::PrefixHit { blocks } => {
                Self::inc(self.matched_blocks, blocks as i64);
                self.prefix_hit
            }
            Reason::Cold => self.cold,
            Reason::ShortPrompt => self.short_prompt,
            Reason::Passthrough => self.passthrough,
            Reason::Fallback => {
                Self::inc(self.fail_open, 1);
                self.fallback
            }
        };
        Self::inc(id, 1);
    }

    pub fn table(&self, filled: u32, replaced: u32, conflicts: u32) {
        Self::inc(self.table_entries, filled.into());
        Self::inc(self.table_replacements, replaced.into());
        Self::inc(self.table_conflicts, conflicts.into());
    }

    pub fn rejected(&self) {
        Self::inc(self.rejected, 1);
    }

    pub fn route_time(&self, micros: u64) {
        if let Some(id) = self.tokenize_us {
            let _ = record_metric(id, micros);
        }
    }
}
