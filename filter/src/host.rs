//! The few host calls the routing logic needs, behind a trait so it runs against a fake host
//! in unit tests and against Envoy's shared data in the real filter.

/// Result of a shared-data write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetOutcome {
    Written,
    /// Someone else wrote the key since we read it (compare-and-swap failed).
    CasMismatch,
    Failed,
}

pub trait Host {
    /// The value and its CAS token; `None` when the key does not exist (or on host error).
    fn shared_get(&self, key: &str) -> Option<(Vec<u8>, Option<u32>)>;
    /// Writes `value`; with `cas`, only if the key is unchanged since that read.
    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> SetOutcome;
    /// Wall-clock nanoseconds (monotonic enough for ordering table entries).
    fn now_nanos(&self) -> u64;
}

/// Envoy's shared data, via proxy-wasm host calls.
pub struct EnvoyHost;

impl Host for EnvoyHost {
    fn shared_get(&self, key: &str) -> Option<(Vec<u8>, Option<u32>)> {
        match proxy_wasm::hostcalls::get_shared_data(key) {
            Ok((Some(v), cas)) => Some((v, cas)),
            _ => None,
        }
    }

    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> SetOutcome {
        match proxy_wasm::hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => SetOutcome::Written,
            Err(proxy_wasm::types::Status::CasMismatch) => SetOutcome::CasMismatch,
            Err(_) => SetOutcome::Failed,
        }
    }

    fn now_nanos(&self) -> u64 {
        proxy_wasm::hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    }
}

#[cfg(test)]
pub mod fake {
    //! An in-memory host with Envoy's shared-data semantics (CAS checked for existing keys).
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;

    #[derive(Default)]
    pub struct FakeHost {
        pub data: RefCell<HashMap<String, (Vec<u8>, u32)>>,
        pub clock: Cell<u64>,
        pub fail_reads: Cell<bool>,
    }

    impl Host for FakeHost {
        fn shared_get(&self, key: &str) -> Option<(Vec<u8>, Option<u32>)> {
            if self.fail_reads.get() {
                return None;
            }
            self.data
                .borrow()
                .get(key)
                .map(|(v, c)| (v.clone(), Some(*c)))
        }

        fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> SetOutcome {
            let mut d = self.data.borrow_mut();
            match (d.get_mut(key), cas) {
                (Some((_, c)), Some(want)) if *c != want => SetOutcome::CasMismatch,
                (Some((v, c)), _) => {
                    *v = value.to_vec();
                    *c += 1;
                    SetOutcome::Written
                }
                (None, _) => {
                    d.insert(key.to_owned(), (value.to_vec(), 1));
                    SetOutcome::Written
                }
            }
        }

        fn now_nanos(&self) -> u64 {
            self.clock.set(self.clock.get() + 1);
            self.clock.get()
        }
    }

    /// Counts host reads and writes (to prove how many host calls a path makes).
    #[derive(Default)]
    pub struct Counting {
        pub inner: FakeHost,
        pub gets: Cell<u32>,
        pub sets: Cell<u32>,
    }

    impl Host for Counting {
        fn shared_get(&self, k: &str) -> Option<(Vec<u8>, Option<u32>)> {
            self.gets.set(self.gets.get() + 1);
            self.inner.shared_get(k)
        }
        fn shared_set(&self, k: &str, v: &[u8], cas: Option<u32>) -> SetOutcome {
            self.sets.set(self.sets.get() + 1);
            self.inner.shared_set(k, v, cas)
        }
        fn now_nanos(&self) -> u64 {
            self.inner.now_nanos()
        }
    }
}
