//! Load with wrk (Debian), bounded in time, against 127.0.0.1 only; parses its report.

use anyhow::{bail, Context};
use serde::Serialize;
use std::path::Path;
use std::process::Command;

#[derive(Debug, Clone, Serialize)]
pub struct LoadResult {
    pub requests_per_sec: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub requests: u64,
    pub errors: u64,
}

impl LoadResult {
    /// Runs of equal length taken as one: requests and errors summed, requests/s their mean,
    /// each latency percentile the request-weighted mean of the runs' (wrk reports
    /// percentiles, not its histogram, so this is an estimate); `None` for no runs.
    pub fn merged(runs: &[LoadResult]) -> Option<LoadResult> {
        let n = runs.len();
        let requests: u64 = runs.iter().map(|r| r.requests).sum();
        let weighted = |f: fn(&LoadResult) -> f64| {
            let w = |r: &LoadResult| (r.requests as f64).max(1e-9);
            runs.iter().map(|r| f(r) * w(r)).sum::<f64>() / runs.iter().map(w).sum::<f64>()
        };
        (n > 0).then(|| LoadResult {
            requests_per_sec: runs.iter().map(|r| r.requests_per_sec).sum::<f64>() / n as f64,
            p50_ms: weighted(|r| r.p50_ms),
            p90_ms: weighted(|r| r.p90_ms),
            p99_ms: weighted(|r| r.p99_ms),
            requests,
            errors: runs.iter().map(|r| r.errors).sum(),
        })
    }
}

/// Runs wrk for `seconds` with `connections` against `url`, POSTing JSON bodies made by the
/// Lua `body_lua` expression (it may use the request counter `n` to make each body unique).
pub fn run(
    url: &str,
    body_lua: &str,
    connections: u32,
    seconds: u32,
    dir: &Path,
) -> anyhow::Result<LoadResult> {
    run_script(url, "", body_lua, connections, seconds, dir)
}

/// [`run`] with Lua `prelude` run once per wrk thread first (functions `body_lua` may call).
pub fn run_script(
    url: &str,
    prelude: &str,
    body_lua: &str,
    connections: u32,
    seconds: u32,
    dir: &Path,
) -> anyhow::Result<LoadResult> {
    if !url.starts_with("http://127.0.0.1:") {
        bail!("load is only ever sent to 127.0.0.1");
    }
    let script = dir.join(format!("wrk-{}.lua", std::process::id()));
    std::fs::write(&script, lua_script(prelude, body_lua, next_counter_start()))?;
    let out = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
            "--timeout",
            "10s",
            "--latency",
            "-s",
        ])
        .arg(&script)
        .arg(url)
        .output()
        .context("running wrk (scripts/setup.sh installs it)")?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        bail!("wrk failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    }
    parse(&text).with_context(|| format!("parsing wrk output:\n{text}"))
}

/// Counters of one wrk run start here and stay below the next run's start.
const COUNTER_SPAN: u64 = 10_000_000;

/// Where the next run's request counter starts: each run of this process gets its own range,
/// so prompts "unique by a counter" are unique across runs too (counting from 0 every run,
/// a warm-up's prompts came back in the measured run and the unloaded run after it, and the
/// filter took them down its repeated-prompt path).
fn next_counter_start() -> u64 {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * COUNTER_SPAN
}

/// The Lua script of one run: `prelude`, then a request function whose bodies are
/// `body_lua`, with `n` counting requests from `start`.
fn lua_script(prelude: &str, body_lua: &str, start: u64) -> String {
    format!(
        "{prelude}\nlocal n = {start}\nrequest = function()\n  n = n + 1\n  local body = {body_lua}\n  return wrk.format('POST', nil, {{['Content-Type'] = 'application/json'}}, body)\nend\n"
    )
}

fn duration_ms(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mult) = if let Some(v) = s.strip_suffix("us") {
        (v, 0.001)
    } else if let Some(v) = s.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1000.0)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|x| x * mult)
}

pub fn parse(text: &str) -> Option<LoadResult> {
    let pct = |p: &str| {
        text.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(p).and_then(duration_ms))
    };
    let rps = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())?;
    let requests = text
        .lines()
        .find(|l| l.contains("requests in"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    let non2xx: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Non-2xx or 3xx responses:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let socket_errors: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Socket errors:"))
        .map(|v| {
            v.split(',')
                .filter_map(|kv| kv.split_whitespace().nth(1))
                .filter_map(|n| n.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    Some(LoadResult {
        requests_per_sec: rps,
        p50_ms: pct("50%")?,
        p90_ms: pct("90%")?,
        p99_ms: pct("99%")?,
        requests,
        errors: non2xx + socket_errors,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn merges_runs_of_equal_length() {
        let run = |rps: f64, p50: f64, requests: u64| super::LoadResult {
            requests_per_sec: rps,
            p50_ms: p50,
            p90_ms: p50 * 2.0,
            p99_ms: p50 * 4.0,
            requests,
            errors: 1,
        };
        let m =
            super::LoadResult::merged(&[run(1000.0, 1.0, 1000), run(3000.0, 3.0, 3000)]).unwrap();
        assert_eq!((m.requests, m.errors), (4000, 2));
        assert!((m.requests_per_sec - 2000.0).abs() < 1e-9);
        assert!((m.p50_ms - 2.5).abs() < 1e-9, "weighted by requests");
        assert!((m.p99_ms - 10.0).abs() < 1e-9);
        assert!(super::LoadResult::merged(&[]).is_none());
    }

    #[test]
    fn each_run_counts_from_its_own_start() {
        let (a, b) = (super::next_counter_start(), super::next_counter_start());
        assert!(b >= a + super::COUNTER_SPAN, "{a} {b}");
        let script = super::lua_script("", "'x' .. n", a);
        assert!(script.contains(&format!("local n = {a}\n")), "{script}");
        // LuaJIT prints integers below 1e14 in full: the counters stay plain digits
        assert!(b < 100_000_000_000_000);
    }

    #[test]
    fn parses_wrk_report() {
        let text = "Running 2s test @ http://127.0.0.1:1/\n  1 threads and 4 connections\n  Latency Distribution\n     50%  512.00us\n     75%    1.10ms\n     90%    2.50ms\n     99%    1.20s\n  4000 requests in 2.00s, 1.00MB read\n  Non-2xx or 3xx responses: 3\nRequests/sec:   1999.50\n";
        let r = super::parse(text).unwrap();
        assert_eq!(r.requests, 4000);
        assert!((r.p50_ms - 0.512).abs() < 1e-9);
        assert!((r.p99_ms - 1200.0).abs() < 1e-9);
        assert_eq!(r.errors, 3);
        assert!((r.requests_per_sec - 1999.5).abs() < 1e-9);
    }
}
