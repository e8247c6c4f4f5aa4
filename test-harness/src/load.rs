//! Open-loop load through Envoy: requests sent at a fixed rate from a pool of client threads,
//! whatever the answers take, each outcome recorded (a closed loop would slow down exactly
//! when a fault makes answers slow, and hide it). Used by the fault tests and
//! `scripts/bench.sh faults`.

use crate::cluster::client;
use serde::Serialize;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Client threads: enough for the requests in flight at the rates used here.
const WORKERS: usize = 32;

/// One request of the load: when it was sent (s since the load began), and how it ended.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub sent_s: f64,
    pub done_s: f64,
    pub stream: bool,
    /// A 200 answer had begun (a failure then came while its body was read: nothing could
    /// retry it)
    pub started: bool,
    /// `None` when it succeeded; else the status or error
    pub failure: Option<String>,
}

/// Open-loop load at `rate` requests/s from a pool of client threads, until stopped.
pub struct Load {
    stop: Arc<AtomicBool>,
    start: Instant,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    /// Starts sending `body(i)` (the JSON and whether it streams) to `url`, `rate` per second.
    pub fn start(
        url: String,
        rate: f64,
        body: impl Fn(usize) -> (Value, bool) + Send + Sync + 'static,
    ) -> Load {
        let body = Arc::new(body);
        let stop: Arc<AtomicBool> = Arc::default();
        let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
        let start = Instant::now();
        let (tx, rx) = mpsc::channel::<(usize, f64)>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for _ in 0..WORKERS {
            let (rx, outcomes, url) = (Arc::clone(&rx), Arc::clone(&outcomes), url.clone());
            let body = Arc::clone(&body);
            threads.push(std::thread::spawn(move || {
                let http = client();
                loop {
                    let job = rx.lock().ok().and_then(|r| r.recv().ok());
                    let Some((i, sent_s)) = job else { break };
                    let (b, stream) = body(i);
                    let answer = http.post(&url).json(&b).send();
                    let started = answer.as_ref().is_ok_and(|r| r.status() == 200);
                    let failure = match answer {
                        Ok(r) if r.status() == 200 => match r.bytes() {
                            Ok(bytes) if !stream || bytes.ends_with(b"data: [DONE]\n\n") => None,
                            Ok(_) => Some("stream cut".to_owned()),
                            Err(e) => Some(format!("body: {e}")),
                        },
                        Ok(r) => {
                            let status = r.status();
                            let body = r.text().unwrap_or_default();
                            let body: String = body.chars().take(300).collect();
                            Some(format!("status {status}: {body}"))
                        }
                        Err(e) => Some(format!("{e}")),
                    };
                    let done_s = start.elapsed().as_secs_f64();
                    if let Ok(mut o) = outcomes.lock() {
                        o.push(Outcome {
                            sent_s,
                            done_s,
                            stream,
                            started,
                            failure,
                        });
                    }
                }
            }));
        }
        let s = Arc::clone(&stop);
        threads.push(std::thread::spawn(move || {
            let period = Duration::from_secs_f64(1.0 / rate);
            let mut i = 0usize;
            while !s.load(Ordering::Relaxed) {
                let due = start + period.mul_f64(i as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                if tx.send((i, start.elapsed().as_secs_f64())).is_err() {
                    break;
                }
                i += 1;
            }
        }));
        Load {
            stop,
            start,
            outcomes,
            threads,
        }
    }

    /// Seconds since the load began (the clock of [`Outcome`]).
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Stops sending, waits for the requests in flight, and returns every outcome.
    pub fn finish(self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::Relaxed);
        // the scheduler ends first, dropping the sender; workers drain and end
        for t in self.threads {
            let _ = t.join();
        }
        self.outcomes.lock().map(|o| o.clone()).unwrap_or_default()
    }
}

/// Requests in flight at instant `t`.
pub fn in_flight_at(outcomes: &[Outcome], t: f64) -> usize {
    outcomes
        .iter()
        .filter(|o| o.sent_s <= t && o.done_s >= t)
        .count()
}
