//! What the routers know about each pod, kept in Envoy shared data so every worker VM (and
//! the elected poller) sees the same: health, load, cache generation, in-flight requests.

use crate::host::{Host, SetOutcome};
use prefix_core::policy::PodLoad;
use serde::{Deserialize, Serialize};

/// One pod's state as last learned by the poller (and by failed responses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PodState {
    /// Ownership-table entries are valid only while this matches theirs.
    pub generation: u64,
    /// The pod process's epoch (empty before the first successful poll).
    pub epoch: String,
    /// Last cache-event sequence number applied.
    pub seq: u64,
    pub healthy: bool,
    pub fails: u32,
    pub running: u32,
    pub waiting: u32,
    pub kv_cache_usage: f64,
    /// Router clock (ns) of the last successful poll; 0 = never.
    pub last_ok_ns: u64,
}

impl Default for PodState {
    fn default() -> Self {
        PodState {
            generation: 0,
            epoch: String::new(),
            seq: 0,
            healthy: true,
            fails: 0,
            running: 0,
            waiting: 0,
            kv_cache_usage: 0.0,
            last_ok_ns: 0,
        }
    }
}

/// Shared-data keys under one router namespace.
#[derive(Debug, Clone)]
pub struct Keys {
    ns: String,
}

impl Keys {
    pub fn new(ns: &str) -> Self {
        Keys { ns: ns.to_owned() }
    }
    pub fn state(&self, pod: &str) -> String {
        format!("{}/pod/{pod}", self.ns)
    }
    pub fn inflight(&self, pod: &str) -> String {
        format!("{}/inflight/{pod}", self.ns)
    }
    pub fn lease(&self) -> String {
        format!("{}/poller", self.ns)
    }
}

/// A stored state value (default: healthy, generation 0, when unreadable).
pub fn parse_state(v: &[u8]) -> PodState {
    serde_json::from_slice(v).unwrap_or_default()
}

/// Reads a pod's state (the default when never written or unreadable).
pub fn read_state<H: Host>(host: &H, keys: &Keys, pod: &str) -> (PodState, Option<u32>) {
    match host.shared_get(&keys.state(pod)) {
        Some((v, cas)) => (parse_state(&v), cas),
        None => (PodState::default(), None),
    }
}

/// Read-modify-write of a pod's state with compare-and-swap (a few retries).
pub fn update_state<H: Host>(
    host: &H,
    keys: &Keys,
    pod: &str,
    mut f: impl FnMut(&mut PodState),
) -> Option<PodState> {
    for _ in 0..4 {
        let (mut st, cas) = read_state(host, keys, pod);
        f(&mut st);
        let bytes = serde_json::to_vec(&st).ok()?;
        match host.shared_set(&keys.state(pod), &bytes, cas) {
            SetOutcome::Written => return Some(st),
            SetOutcome::CasMismatch => continue,
            SetOutcome::Failed => return None,
        }
    }
    None
}

pub(crate) fn read_u64<H: Host>(host: &H, key: &str) -> (u64, Option<u32>) {
    match host.shared_get(key) {
        Some((v, cas)) => {
            let n = v
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .unwrap_or(0);
            (n, cas)
        }
        None => (0, None),
    }
}

/// Requests this router fleet has in flight on `pod`.
pub fn inflight<H: Host>(host: &H, keys: &Keys, pod: &str) -> u64 {
    read_u64(host, &keys.inflight(pod)).0
}

/// Adds `delta` to the in-flight counter (never below 0); returns the new value.
pub fn add_inflight<H: Host>(host: &H, keys: &Keys, pod: &str, delta: i64) -> Option<u64> {
    let key = keys.inflight(pod);
    for _ in 0..8 {
        let (n, cas) = read_u64(host, &key);
        let next = n.saturating_add_signed(delta);
        match host.shared_set(&key, &next.to_le_bytes(), cas) {
            SetOutcome::Written => return Some(next),
            SetOutcome::CasMismatch => continue,
            SetOutcome::Failed => return None,
        }
    }
    None
}

/// The routing view of a pod.
pub fn load_of(st: &PodState, inflight: u64) -> PodLoad {
    PodLoad {
        healthy: st.healthy,
        inflight: u32::try_from(inflight).unwrap_or(u32::MAX),
        waiting: st.waiting,
        kv_cache_usage: st.kv_cache_usage,
    }
}

/// Poller election: one VM in the whole Envoy polls. The lease is `holder u64 | expires u64`;
/// a VM takes it when it is free, expired, or already its own.
pub fn try_lease<H: Host>(host: &H, keys: &Keys, vm_id: u64, now_ns: u64, ttl_ns: u64) -> bool {
    let key = keys.lease();
    let (holder, expires, cas) = match host.shared_get(&key) {
        Some((v, cas)) if v.len() == 16 => {
            let w = |i: usize| {
                v.get(i..i + 8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
                    .unwrap_or(0)
            };
            (w(0), w(8), cas)
        }
        Some((_, cas)) => (0, 0, cas),
        None => (0, 0, None),
    };
    if holder != vm_id && holder != 0 && expires > now_ns {
        return false;
    }
    let mut v = vm_id.to_le_bytes().to_vec();
    v.extend_from_slice(&now_ns.saturating_add(ttl_ns).to_le_bytes());
    host.shared_set(&key, &v, cas) == SetOutcome::Written
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;

    #[test]
    fn state_defaults_and_updates() {
        let h = FakeHost::default();
        let k = Keys::new("ns");
        let (st, _) = read_state(&h, &k, "127.0.0.1:1");
        assert!(st.healthy);
        update_state(&h, &k, "127.0.0.1:1", |s| {
            s.fails = 2;
            s.healthy = false;
        })
        .unwrap();
        let (st, _) = read_state(&h, &k, "127.0.0.1:1");
        assert!(!st.healthy);
        assert_eq!(st.fails, 2);
    }

    #[test]
    fn inflight_counts_and_floors_at_zero() {
        let h = FakeHost::default();
        let k = Keys::new("ns");
        assert_eq!(add_inflight(&h, &k, "p", 1), Some(1));
        assert_eq!(add_inflight(&h, &k, "p", 1), Some(2));
        assert_eq!(add_inflight(&h, &k, "p", -1), Some(1));
        assert_eq!(add_inflight(&h, &k, "p", -5), Some(0));
        assert_eq!(inflight(&h, &k, "p"), 0);
    }

    #[test]
    fn one_poller_at_a_time() {
        let h = FakeHost::default();
        let k = Keys::new("ns");
        assert!(try_lease(&h, &k, 1, 100, 50));
        assert!(!try_lease(&h, &k, 2, 120, 50), "held by 1 until 150");
        assert!(try_lease(&h, &k, 1, 140, 50), "the holder renews");
        assert!(
            try_lease(&h, &k, 2, 200, 50),
            "expired at 190: 2 takes over"
        );
        assert!(!try_lease(&h, &k, 1, 210, 50));
    }
}
