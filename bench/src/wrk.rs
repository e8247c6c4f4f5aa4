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
    std::fs::write(
        &script,
        format!(
            "{prelude}\nlocal n = 0\nrequest = function()\n  n = n + 1\n  local body = {body_lua}\n  return wrk.format('POST', nil, {{['Content-Type'] = 'application/json'}}, body)\nend\n"
        ),
    )?;
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
