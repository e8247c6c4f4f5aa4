//! Every kernel path this CPU has, forced in turn through `ENGINE_KERNELS` on the real
//! binary (built with default flags): each starts, says which kernels it runs, and answers a
//! greedy completion like the others. `portable` is what a CPU without AVX2 runs (until
//! 2026-12-07 the binary needed AVX2 and died with SIGILL there). Paths this CPU lacks are
//! printed as not run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gguf_engine::cpu::{self, Level, KERNELS_ENV};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use strum::IntoEnumIterator;

/// Tokens generated per path.
const TOKENS: usize = 12;
/// Of those, how many must equal the portable path's (a near-tie may flip one and the
/// continuation diverge from there; a broken kernel agrees on none).
const MIN_SAME_PREFIX: usize = 6;

struct Pod {
    child: Child,
    url: String,
    /// The kernel level the server's start-up line names.
    kernels: String,
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(level: Level) -> Pod {
    let port = test_harness::process::free_port().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_model-server"))
        .args(["--engine", "gguf", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .env(KERNELS_ENV, level.to_string())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // the start-up line names the kernels (tracing writes to stdout)
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("kernels=").nth(1) {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_owned());
            }
        }
    });
    let kernels = rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("{level}: the server never started"));
    let pod = Pod {
        child,
        url: format!("http://127.0.0.1:{port}"),
        kernels,
    };
    let health = format!("{}/health", pod.url);
    assert!(
        test_harness::cluster::wait_healthy(&health, Duration::from_secs(60)),
        "{level}: never healthy"
    );
    pod
}

/// The greedy continuation's token ids (decoded one by one from the answer's text would lose
/// merges: asked of the server's tokenizer instead).
fn complete(pod: &Pod) -> Vec<u64> {
    let http = test_harness::cluster::client();
    let body = json!({"prompt": "The three primary colours are red, yellow and", "max_tokens": TOKENS,
                      "temperature": 0, "ignore_eos": true});
    let v: Value = http
        .post(format!("{}/v1/completions", pod.url))
        .json(&body)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let text = v["choices"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text: {v}"))
        .to_owned();
    let t: Value = http
        .post(format!("{}/tokenize", pod.url))
        .json(&json!({ "prompt": text }))
        .send()
        .unwrap()
        .json()
        .unwrap();
    t["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn every_kernel_path_this_cpu_has_starts_and_agrees() {
    let supported = cpu::supported();
    for level in Level::iter().filter(|l| !supported.contains(l)) {
        println!("{level}: not run (this CPU lacks it)");
    }
    let mut portable: Option<Vec<u64>> = None;
    for level in supported {
        let pod = start(level);
        // AMX also needs Linux's permission for the tile state: the server may run AVX-512
        assert!(
            pod.kernels == level.to_string() || (level == Level::Amx && pod.kernels == "avx512"),
            "forced {level}, the server runs {}",
            pod.kernels
        );
        let ids = complete(&pod);
        assert!(!ids.is_empty(), "{level}: an empty answer");
        let same = match &portable {
            None => {
                portable = Some(ids.clone());
                ids.len()
            }
            Some(p) => p.iter().zip(&ids).take_while(|(a, b)| a == b).count(),
        };
        println!(
            "{level}: ran ({} kernels), {same} leading tokens as the portable path's",
            pod.kernels
        );
        assert!(
            same >= MIN_SAME_PREFIX.min(ids.len()),
            "{level}: only {same} leading tokens agree with the portable path"
        );
    }
}
