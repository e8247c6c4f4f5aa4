//! What the routers know about each pod, kept in Envoy shared data so every worker VM (and
//! the elected poller) sees the same: its [`PodState`] (health, load, cache generation; the
//! rules that change it are `prefix_core::liveness`), the fleet's in-flight requests, and the
//! poller's lease.

use crate::host::{SetOutcome, Store};
pub use prefix_core::liveness::PodState;
use prefix_core::router_config::PodAddr;

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
    /// Bumped after every pod-state write: a reader whose last look at it has the same CAS
    /// token still holds every pod's current state, and need not read them again.
    pub fn states_version(&self) -> String {
        format!("{}/pod-states-version", self.ns)
    }
    /// Every pod's in-flight count, packed in one value (a u32 per member slot), so a request
    /// reads the whole fleet's load with one host call. Named by the fleet ([`fleet_id`]):
    /// plugins with other pods never read each other's counts.
    pub fn inflight(&self, fleet: u64) -> String {
        format!("{}/inflight/{fleet:016x}", self.ns)
    }
    /// The fleet's member slots (`prefix_core::membership::Slots`).
    pub fn members(&self, fleet: u64) -> String {
        format!("{}/members/{fleet:016x}", self.ns)
    }
    pub fn lease(&self) -> String {
        format!("{}/poller", self.ns)
    }
}

/// Names where a fleet's pods come from: the configured list, or the Envoy cluster followed.
pub fn fleet_id(pods: &[PodAddr], discovery_cluster: Option<&str>) -> u64 {
    let mut names: Vec<&str> = pods.iter().map(PodAddr::as_str).collect();
    if let Some(c) = discovery_cluster {
        names.push("discovery:");
        names.push(c);
    }
    xxhash_rust::xxh3::xxh3_64(names.join(",").as_bytes())
}

/// A stored state value (default: healthy, generation 0, when unreadable).
pub fn parse_state(v: &[u8]) -> PodState {
    serde_json::from_slice(v).unwrap_or_default()
}

/// Reads a pod's state (the default when never written or unreadable).
pub fn read_state<H: Store>(host: &H, keys: &Keys, pod: &str) -> (PodState, Option<u32>) {
    match host.shared_get(&keys.state(pod)) {
        Some((v, cas)) => (parse_state(&v), cas),
        None => (PodState::default(), None),
    }
}

/// Read-modify-write of a pod's state with compare-and-swap (a few retries).
pub fn update_state<H: Store>(
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
            SetOutcome::Written => {
                // after the state: whoever sees the new version reads the new state
                host.shared_set(&keys.states_version(), b"v", None);
                return Some(st);
            }
            SetOutcome::CasMismatch => continue,
            SetOutcome::Failed => return None,
        }
    }
    None
}

/// The request path saw the pod refuse a connection (or fail a try Envoy then retried
/// elsewhere): mark it down now rather than waiting for the next polls (the poller brings it
/// back when it answers again).
pub fn mark_down<S: Store>(store: &S, keys: &Keys, pod: &str, down_after: u32) -> Option<PodState> {
    let now = store.now_nanos();
    update_state(store, keys, pod, |st| {
        prefix_core::liveness::on_connect_failure(st, down_after, now)
    })
}

/// The fleet's in-flight counts as one stored value read: a count per pod and the value's
/// CAS token (`None` when never written).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inflight {
    pub counts: Vec<u32>,
    pub cas: Option<u32>,
}

impl Inflight {
    /// Requests in flight on the whole fleet.
    pub fn total(&self) -> u32 {
        self.counts.iter().fold(0u32, |a, &c| a.saturating_add(c))
    }

    /// Reads the packed counts: at least `width` of them (zeros for a missing or short value),
    /// and every count the stored value holds beyond that, so a worker whose view of the
    /// members is older (narrower) never truncates the counts of newer members when it writes.
    pub fn read<H: Store>(host: &H, key: &str, width: usize) -> Inflight {
        let (v, cas) = host.shared_get(key).unwrap_or_default();
        let counts = (0..width.max(v.len() / 4))
            .map(|i| {
                v.get(i * 4..i * 4 + 4)
                    .and_then(|b| b.try_into().ok())
                    .map(u32::from_le_bytes)
                    .unwrap_or(0)
            })
            .collect();
        Inflight { counts, cas }
    }

    /// Creates the packed counts (all zero) unless they exist: every later update is then a
    /// compare-and-swap (Envoy inserts a missing key last-writer-wins, which could lose a count).
    pub fn create<H: Store>(host: &H, key: &str, pods: usize) {
        if host.shared_get(key).is_none() {
            host.shared_set(key, &vec![0; pods * 4], None);
        }
    }

    /// In-flight count of pod `i` (0 if out of range).
    pub fn of(&self, i: usize) -> u32 {
        self.counts.get(i).copied().unwrap_or(0)
    }

    /// Packed counts of every pod (little-endian u32 each, in `pods` order).
    fn encode(&self) -> Vec<u8> {
        self.counts.iter().flat_map(|c| c.to_le_bytes()).collect()
    }

    /// Adds `delta` to pod `pod`'s count (never below 0) with compare-and-swap against this
    /// read, re-reading after a lost race (a few times). Returns the pod's new count.
    pub fn add<H: Store>(mut self, host: &H, key: &str, pod: usize, delta: i32) -> Option<u32> {
        for _ in 0..8 {
            let slot = self.counts.get_mut(pod)?;
            *slot = slot.saturating_add_signed(delta);
            let next = *slot;
            match host.shared_set(key, &self.encode(), self.cas) {
                SetOutcome::Written => return Some(next),
                SetOutcome::CasMismatch => self = Inflight::read(host, key, self.counts.len()),
                SetOutcome::Failed => return None,
            }
        }
        None
    }
}

/// Poller election: one VM in the whole Envoy polls. The lease is `holder u64 | expires u64`;
/// a VM takes it when it is free, expired, or already its own.
pub fn try_lease<H: Store>(host: &H, keys: &Keys, vm_id: u64, now_ns: u64, ttl_ns: u64) -> bool {
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

    fn pods(addrs: &[&str]) -> Vec<PodAddr> {
        addrs
            .iter()
            .map(|a| PodAddr::try_from(a.to_string()).unwrap())
            .collect()
    }

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
        let key = Keys::new("ns").inflight(1);
        let add = |pod, delta| Inflight::read(&h, &key, 3).add(&h, &key, pod, delta);
        assert_eq!(add(1, 1), Some(1));
        assert_eq!(add(1, 1), Some(2));
        assert_eq!(add(2, 1), Some(1));
        assert_eq!(add(1, -1), Some(1));
        assert_eq!(add(2, -5), Some(0));
        assert_eq!(add(3, 1), None, "no such pod");
        assert_eq!(Inflight::read(&h, &key, 3).counts, vec![0, 1, 0]);
    }

    #[test]
    fn inflight_update_survives_a_lost_race() {
        let h = FakeHost::default();
        let key = Keys::new("ns").inflight(1);
        Inflight::read(&h, &key, 2).add(&h, &key, 0, 0).unwrap(); // the key exists
        let stale = Inflight::read(&h, &key, 2);
        // another worker counts a request on pod 0 after our read
        Inflight::read(&h, &key, 2).add(&h, &key, 0, 1).unwrap();
        assert_eq!(stale.add(&h, &key, 1, 1), Some(1));
        assert_eq!(
            Inflight::read(&h, &key, 2).counts,
            vec![1, 1],
            "nothing lost"
        );
    }

    #[test]
    fn created_counts_are_never_reset() {
        let h = FakeHost::default();
        let key = Keys::new("ns").inflight(1);
        Inflight::create(&h, &key, 2);
        let zero = Inflight::read(&h, &key, 2);
        assert_eq!(
            (zero.counts.clone(), zero.cas.is_some()),
            (vec![0, 0], true)
        );
        zero.add(&h, &key, 1, 1).unwrap();
        Inflight::create(&h, &key, 2); // another VM starting later
        assert_eq!(Inflight::read(&h, &key, 2).counts, vec![0, 1]);
    }

    #[test]
    fn a_narrower_view_keeps_the_wider_counts() {
        let h = FakeHost::default();
        let key = Keys::new("ns").inflight(1);
        Inflight::create(&h, &key, 2);
        Inflight::read(&h, &key, 3).add(&h, &key, 2, 1).unwrap(); // a member joined in slot 2
        Inflight::read(&h, &key, 2).add(&h, &key, 0, 1).unwrap(); // a worker that knows 2 slots
        assert_eq!(Inflight::read(&h, &key, 2).counts, vec![1, 0, 1]);
    }

    #[test]
    fn fleets_are_named_by_their_pods_or_cluster() {
        let a = pods(&["127.0.0.1:1"]);
        let id = fleet_id(&a, None);
        assert_ne!(id, fleet_id(&pods(&["127.0.0.1:2"]), None));
        assert_eq!(id, fleet_id(&a, None));
        assert_ne!(id, fleet_id(&a, Some("pods")));
        assert_ne!(fleet_id(&[], Some("pods")), fleet_id(&[], Some("other")));
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
