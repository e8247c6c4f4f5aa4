//! How long the hostile requests of `test_harness::hostile` take, through Envoy with the
//! filter and sent to a pod directly, with a small request timed right after each (the
//! tests assert only the answers; the times are here). Two zero-cost sim pods.

use serde::Serialize;
use std::time::{Duration, Instant};
use test_harness::fleet::{Fleet, ZERO_COST};
use test_harness::hostile::cases;

#[derive(Debug, Serialize)]
pub struct HostileRow {
    pub case: &'static str,
    pub target: &'static str,
    pub status: u16,
    pub ms: f64,
    /// CPU the case took Envoy and both pods together (ms, from /proc: 10 ms ticks)
    pub cpu_ms: f64,
    /// a small completion sent right after, through the same target
    pub small_after_ms: f64,
}

pub fn run() -> anyhow::Result<Vec<HostileRow>> {
    let f = Fleet::start("bench-hostile", 2, &ZERO_COST, |_| {})?;
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;
    let gateway = f.envoy.url("").trim_end_matches('/').to_owned();
    let pod = format!("http://{}", f.pods[0].addr);
    let pids: Vec<Option<u32>> = f
        .pods
        .iter()
        .map(|p| p.proc.pid())
        .chain(std::iter::once(f.envoy.proc.pid()))
        .collect();
    let cpu = || -> f64 {
        pids.iter()
            .filter_map(|&p| crate::overhead::cpu_seconds(p))
            .sum::<f64>()
    };
    let small = serde_json::json!({"prompt": "a small request", "max_tokens": 1}).to_string();
    let mut rows = Vec::new();
    for case in cases() {
        for (target, base) in [("envoy", &gateway), ("pod", &pod)] {
            let send = |path: &str, body: Vec<u8>| -> anyhow::Result<(u16, f64)> {
                let t = Instant::now();
                let r = http
                    .post(format!("{base}{path}"))
                    .header("content-type", "application/json")
                    .body(body)
                    .send()?;
                let status = r.status().as_u16();
                let _ = r.bytes()?;
                Ok((status, t.elapsed().as_secs_f64() * 1e3))
            };
            let before = cpu();
            let (status, ms) = send(case.path, case.body.clone())?;
            let cpu_ms = (cpu() - before) * 1e3;
            let (_, small_after_ms) = send("/v1/completions", small.clone().into_bytes())?;
            rows.push(HostileRow {
                case: case.name,
                target,
                status,
                ms,
                cpu_ms,
                small_after_ms,
            });
        }
    }
    Ok(rows)
}

/// The rows, then the largest time and CPU of any case.
pub fn table(rows: &[HostileRow]) -> String {
    let mut out = format!(
        "   {:<46} {:<6} {:>6} {:>10} {:>8} {:>14}\n",
        "case", "target", "status", "ms", "cpu ms", "small after ms"
    );
    for r in rows {
        out += &format!(
            "   {:<46} {:<6} {:>6} {:>10.1} {:>8.0} {:>14.1}\n",
            r.case, r.target, r.status, r.ms, r.cpu_ms, r.small_after_ms
        );
    }
    let max = |f: fn(&HostileRow) -> f64| rows.iter().map(f).fold(0.0, f64::max);
    out += &format!(
        "   slowest case {:.0} ms, most CPU {:.0} ms (goal: under 1000 each)\n",
        max(|r| r.ms),
        max(|r| r.cpu_ms)
    );
    out
}
