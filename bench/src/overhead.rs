//! What the filter costs: the same Envoy with and without it in front of zero-cost sim pods,
//! beside the same load sent straight to the pod, through Envoy with the floor filter (a
//! wasm filter that only reads the body: what any body-reading router in Envoy pays), and
//! through sglang-router's `cache_aware` policy (the peer users compare the filter with).
//! Each load is taken in rounds that visit every front in turn, so that this shared
//! machine's slow spells fall on all of them alike.

use super::peers::{self, Peer};
use super::wrk::{self, LoadResult};
use serde::Serialize;
use std::path::{Path, PathBuf};
use test_harness::cluster::{run_dir, start_envoy_unvalidated, start_pods};
use test_harness::fleet::ZERO_COST;

/// How the requests of one overhead case differ from each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Prompts {
    /// Unique by a leading counter: every prompt is new to the table (hash, table writes),
    /// but its text after the counter repeats, so the tokenizer's chunk cache serves most of
    /// it (as for a shared document or system prompt behind a new first line).
    Counter,
    /// The same prompt every time: the hit path (segment cache, the table already knows it).
    Same,
    /// Every prompt's words drawn at random from the text's: no chunk, segment or block
    /// repeats (the per-word cache still knows the words); the tokenizer's full work.
    Shuffled,
}

impl Prompts {
    /// The row's label suffix in the printed table.
    pub fn label(self) -> &'static str {
        match self {
            Prompts::Counter => "",
            Prompts::Same => " same",
            Prompts::Shuffled => " shuffled",
        }
    }
}

#[derive(Debug, Serialize)]
pub struct OverheadRow {
    pub prompt_tokens: usize,
    pub prompts: Prompts,
    /// one connection, no queueing: the latency the filter adds to a single request
    pub unloaded_without_filter: LoadResult,
    pub unloaded_with_filter: LoadResult,
    pub added_p50_unloaded_ms: f64,
    pub without_filter: LoadResult,
    pub with_filter: LoadResult,
    pub added_p50_ms: f64,
    pub added_p99_ms: f64,
    pub rps_ratio: f64,
    /// Time spent inside the filter per request under this load, from its own histograms
    /// (Envoy's last stats-flush interval, [`FLUSH`], read right after the filter's last
    /// saturated round): p50 / p99 in µs.
    pub filter_route_us: Option<(f64, f64)>,
    /// …of which parse + render + tokenize + hash.
    pub filter_tokenize_us: Option<(f64, f64)>,
    /// The same load sent straight to the pod, through Envoy with the floor filter, and
    /// through sglang-router `cache_aware` (each `None` when it could not run here).
    pub direct: Option<FrontLoad>,
    pub floor: Option<FrontLoad>,
    pub sglang_cache_aware: Option<FrontLoad>,
    /// CPU time the proxy process (every thread) used per request under the saturated load:
    /// the cost each front adds, whatever the other processes on the cores did (µs).
    pub cpu_us_without_filter: Option<f64>,
    pub cpu_us_with_filter: Option<f64>,
}

/// One other front's figures for one case: saturated and unloaded, as for the two Envoys.
#[derive(Debug, Serialize)]
pub struct FrontLoad {
    pub saturated: LoadResult,
    pub unloaded: LoadResult,
    /// as [`OverheadRow::cpu_us_with_filter`] (`None` for the pod itself)
    pub cpu_us: Option<f64>,
}

/// CPU seconds process `pid` (all its threads) has used so far: utime + stime of
/// `/proc/<pid>/stat`, in clock ticks of USER_HZ (100 on Linux, whatever the kernel's HZ).
pub fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    // the command name (field 2) is in parentheses and may hold spaces: count from after it
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // fields[0] is field 3 (state); utime and stime are fields 14 and 15
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

/// What a front is, in the order each round visits them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Front {
    /// Envoy alone (the same config without the filter)
    Plain,
    /// Envoy + the filter
    Filtered,
    /// the pod itself, without a proxy (one pod only)
    Direct,
    /// Envoy + the floor filter (reads the body, routes nowhere)
    Floor,
    /// sglang-router cache_aware
    Sglang,
}

/// One front's measurements for one case, as the rounds go.
struct Measured {
    front: Front,
    url: String,
    /// the proxy's process, whose CPU is counted (`None`: the pod itself)
    pid: Option<u32>,
    saturated: Vec<LoadResult>,
    /// CPU seconds the process used over the saturated rounds (`None` once a reading failed)
    cpu_s: Option<f64>,
    unloaded: Vec<LoadResult>,
}

impl Measured {
    fn new(front: Front, url: String, pid: Option<u32>) -> Self {
        Measured {
            front,
            url,
            pid,
            saturated: Vec::new(),
            cpu_s: pid.map(|_| 0.0),
            unloaded: Vec::new(),
        }
    }

    /// Runs one saturated round against its URL, counting the process's CPU meanwhile.
    fn saturate(
        &mut self,
        load: impl FnOnce(&str) -> anyhow::Result<LoadResult>,
    ) -> anyhow::Result<()> {
        let before = cpu_seconds(self.pid);
        self.saturated.push(load(&self.url)?);
        let used = cpu_seconds(self.pid).zip(before).map(|(a, b)| a - b);
        self.cpu_s = self.cpu_s.zip(used).map(|(sum, u)| sum + u);
        Ok(())
    }

    /// Its rounds as one saturated and one unloaded load, and its CPU per request (µs).
    fn done(self) -> Option<FrontLoad> {
        let saturated = LoadResult::merged(&self.saturated)?;
        let cpu_us = self
            .cpu_s
            .filter(|_| saturated.requests > 0)
            .map(|s| s * 1e6 / saturated.requests as f64);
        Some(FrontLoad {
            saturated,
            unloaded: LoadResult::merged(&self.unloaded)?,
            cpu_us,
        })
    }
}

/// Saturated rounds per case for `seconds` of load per front: one per second up to five,
/// then as many seconds each as divide evenly (wrk runs whole seconds).
fn rounds_of(seconds: u32) -> (u32, u32) {
    let rounds = seconds.clamp(1, 5);
    (rounds, (seconds / rounds).max(1))
}

impl OverheadRow {
    /// Envoy + filter's req/s over `front`'s, saturated (goal against sglang-router: ≥ 1).
    pub fn filter_rps_over(&self, front: Option<&FrontLoad>) -> Option<f64> {
        front.map(|f| self.with_filter.requests_per_sec / f.saturated.requests_per_sec.max(1e-9))
    }

    /// `front`'s req/s over Envoy alone's, saturated.
    pub fn rps_over_plain(&self, front: Option<&FrontLoad>) -> Option<f64> {
        front.map(|f| f.saturated.requests_per_sec / self.without_filter.requests_per_sec.max(1e-9))
    }

    /// What `front` adds to one unloaded request's p50 over sending it straight to the pod.
    pub fn added_over_direct_ms(&self, front: &LoadResult) -> Option<f64> {
        self.direct
            .as_ref()
            .map(|d| front.p50_ms - d.unloaded.p50_ms)
    }
}

/// The floor filter's module, when `scripts/bench.sh` built it
/// (`$PREFIX_ROUTER_FLOOR_WASM` overrides).
pub fn floor_wasm_path() -> PathBuf {
    std::env::var_os("PREFIX_ROUTER_FLOOR_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            test_harness::paths::wasm_path().with_file_name("prefix_router_floor_filter.wasm")
        })
}

#[derive(Debug, Serialize)]
pub struct VmFootprint {
    /// per-VM tokenizer fetch + build time reported by the filter at start (ms)
    pub vm_start_ms: Vec<u64>,
    pub envoy_rss_without_filter_mb: f64,
    pub envoy_rss_with_filter_mb: f64,
    /// (RSS with − RSS without) / number of filter VMs
    pub mb_per_vm: f64,
}

pub(crate) fn rss_mb(pid: Option<u32>) -> f64 {
    let Some(pid) = pid else { return 0.0 };
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| {
                    v.split_whitespace()
                        .next()
                        .and_then(|n| n.parse::<f64>().ok())
                })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// `cases`: (token count, prompt text, how requests differ). Each case is measured saturated
/// (`connections`) and unloaded (one).
pub fn run(
    cases: &[(usize, String, Prompts)],
    pods: usize,
    seconds: u32,
    connections: u32,
    out: &Path,
) -> anyhow::Result<(Vec<OverheadRow>, VmFootprint)> {
    let dir = run_dir("bench-overhead");
    let pods = start_pods(
        pods,
        &[
            &ZERO_COST[..],
            &[
                "--max-model-len",
                "32768",
                "--max-num-seqs",
                "64",
                "--default-max-tokens",
                "1",
            ],
        ]
        .concat(),
        &dir,
    )?;
    let addrs: Vec<String> = pods.iter().map(|p| p.addr.clone()).collect();
    let plain = start_envoy_unvalidated("envoy-plain", &addrs, false, |_| {}, &dir)?;
    let filtered = start_envoy_unvalidated(
        "envoy-filter",
        &addrs,
        true,
        |s| {
            s.debug_headers = false;
            // the last stats interval read after a load is then that load's last second
            s.stats_flush_interval = Some(FLUSH.into());
        },
        &dir,
    )?;
    let floor_wasm = floor_wasm_path();
    let floor = if floor_wasm.is_file() {
        Some(start_envoy_unvalidated(
            "envoy-floor",
            &addrs,
            true,
            |s| {
                s.wasm = Some(floor_wasm);
                s.poll_interval_ms = 0;
            },
            &dir,
        )?)
    } else {
        println!(
            "   (no floor row: {} not built; scripts/bench.sh builds it)",
            floor_wasm.display()
        );
        None
    };
    let sglang = if Peer::Sglang.installed() {
        Some(peers::start(Peer::Sglang, "cache_aware", &addrs, &dir)?)
    } else {
        println!("   (no sglang-router row: not installed; scripts/install-peers.sh)");
        None
    };
    let mut rows = Vec::new();
    let (rounds, round_s) = rounds_of(seconds);
    // sglang-router requires the model's name; the others take it as well
    let model = format!(
        "\"model\":\"{}\",",
        prefix_core::protocol::defaults::MODEL_NAME
    );
    for (tokens, text, prompts) in cases {
        let (prelude, body) = match prompts {
            Prompts::Same => (
                String::new(),
                format!("'{{{model}\"prompt\":\"{text}\",\"max_tokens\":1}}'"),
            ),
            Prompts::Counter => (
                String::new(),
                format!("'{{{model}\"prompt\":\"' .. n .. ' {text}\",\"max_tokens\":1}}'"),
            ),
            Prompts::Shuffled => (
                format!(
                    "local words = {{}}\nfor w in string.gmatch([==[{text}]==], \"%S+\") do words[#words + 1] = w end\n\
                     math.randomseed(os.time())\n\
                     local function shuffled()\n  local t = {{}}\n  for i = 1, #words do t[i] = words[math.random(#words)] end\n  return table.concat(t, \" \")\nend"
                ),
                format!("'{{{model}\"prompt\":\"' .. shuffled() .. '\",\"max_tokens\":1}}'"),
            ),
        };
        let run = |url: &str, c: u32, s: u32| wrk::run_script(url, &prelude, &body, c, s, &dir);
        // Every front of this case, in the order each round visits them.
        let path = "/v1/completions";
        let direct = match addrs.as_slice() {
            [a] => Some(Measured::new(
                Front::Direct,
                format!("http://{a}{path}"),
                None,
            )),
            _ => None,
        };
        let mut fronts: Vec<Measured> = [
            Some(Measured::new(
                Front::Plain,
                plain.url(path),
                plain.proc.pid(),
            )),
            Some(Measured::new(
                Front::Filtered,
                filtered.url(path),
                filtered.proc.pid(),
            )),
            direct,
            floor
                .as_ref()
                .map(|e| Measured::new(Front::Floor, e.url(path), e.proc.pid())),
            sglang
                .as_ref()
                .map(|r| Measured::new(Front::Sglang, r.url(path), r.proc.pid())),
        ]
        .into_iter()
        .flatten()
        .collect();
        for f in &fronts {
            run(&f.url, 2, 1)?; // warm every path
        }
        // Saturated, in rounds that visit every front in turn, so a slow minute on this shared
        // machine lands on all of them rather than on whichever ran then.
        let mut times = FilterTimes::default();
        for round in 0..rounds {
            for f in &mut fronts {
                f.saturate(|url| run(url, connections, round_s))?;
                if f.front == Front::Filtered && round + 1 == rounds {
                    // right after its last round, so Envoy's last stats interval is this load's
                    times = FilterTimes::of(&filter_stats(&filtered), Span::Interval);
                }
            }
        }
        // unloaded (one connection), in rounds the same way
        let (quiet_rounds, quiet_s) = rounds_of((seconds / 2).max(2));
        for _ in 0..quiet_rounds {
            for f in &mut fronts {
                let r = run(&f.url, 1, quiet_s)?;
                f.unloaded.push(r);
            }
        }
        let mut loads: Vec<(Front, Option<FrontLoad>)> =
            fronts.into_iter().map(|m| (m.front, m.done())).collect();
        let mut take = |front: Front| {
            loads
                .iter_mut()
                .find(|(f, _)| *f == front)
                .and_then(|(_, load)| load.take())
        };
        let (direct, floor, sglang_cache_aware) =
            (take(Front::Direct), take(Front::Floor), take(Front::Sglang));
        let (Some(without), Some(with)) = (take(Front::Plain), take(Front::Filtered)) else {
            anyhow::bail!("no load measured through Envoy");
        };
        let (unloaded_without_filter, without_filter, cpu_us_without_filter) =
            (without.unloaded, without.saturated, without.cpu_us);
        let (unloaded_with_filter, with_filter, cpu_us_with_filter) =
            (with.unloaded, with.saturated, with.cpu_us);
        rows.push(OverheadRow {
            prompt_tokens: *tokens,
            prompts: *prompts,
            added_p50_unloaded_ms: unloaded_with_filter.p50_ms - unloaded_without_filter.p50_ms,
            unloaded_without_filter,
            unloaded_with_filter,
            added_p50_ms: with_filter.p50_ms - without_filter.p50_ms,
            added_p99_ms: with_filter.p99_ms - without_filter.p99_ms,
            rps_ratio: with_filter.requests_per_sec / without_filter.requests_per_sec.max(1e-9),
            filter_route_us: times.route_us,
            filter_tokenize_us: times.tokenize_us,
            without_filter,
            with_filter,
            direct,
            floor,
            sglang_cache_aware,
            cpu_us_without_filter,
            cpu_us_with_filter,
        });
    }
    let log = std::fs::read_to_string(&filtered.proc.log).unwrap_or_default();
    let vm_start_ms: Vec<u64> = vm_loads(&log).iter().map(|(f, b)| f + b).collect();
    let with = rss_mb(filtered.proc.pid());
    let without = rss_mb(plain.proc.pid());
    let vms = vm_start_ms.len().max(1) as f64;
    let footprint = VmFootprint {
        envoy_rss_with_filter_mb: with,
        envoy_rss_without_filter_mb: without,
        mb_per_vm: (with - without) / vms,
        vm_start_ms,
    };
    let _ = std::fs::copy(&filtered.proc.log, out.join("envoy-filter.log"));
    Ok((rows, footprint))
}

/// Envoy's stats flush interval in the benchmark: a filter histogram read right after a load
/// is the last flush interval's (Envoy's default 5 s outlasts a 3 s run, which then read
/// as "n/a").
pub const FLUSH: &str = "1s";

/// The filter's histograms of its own time per request, as Envoy's admin prints them: route
/// (parse, render, tokenize, hash, look up, choose) and tokenize (render, tokenize and hash,
/// with the owner lookups that decide how deep).
pub fn filter_stats(envoy: &test_harness::cluster::Envoy) -> String {
    test_harness::cluster::client()
        .get(envoy.admin_url("/stats?filter=prefix_router_(route|tokenize)_us$"))
        .send()
        .and_then(|r| r.text())
        .unwrap_or_default()
}

/// Which of the two values Envoy prints per quantile of a histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// the last stats-flush interval ([`FLUSH`] here): the load just before it was read
    Interval,
    /// everything since Envoy started: a whole run on a fresh Envoy, however short
    Cumulative,
}

/// P50 and P99 (µs) of the filter's route and tokenize histograms, `None` without samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct FilterTimes {
    pub route_us: Option<(f64, f64)>,
    pub tokenize_us: Option<(f64, f64)>,
}

impl FilterTimes {
    pub fn of(stats: &str, span: Span) -> FilterTimes {
        FilterTimes {
            route_us: p50_p99(stats, "prefix_router_route_us", span),
            tokenize_us: p50_p99(stats, "prefix_router_tokenize_us", span),
        }
    }
}

/// P50 and P99 from Envoy's text histogram line `name: P0(i,c) … P50(i,c) … P99(i,c) …`
/// (i = interval, c = cumulative).
fn p50_p99(stats: &str, name: &str, span: Span) -> Option<(f64, f64)> {
    // Envoy names wasm metrics `wasmcustom.<name>` outside the Prometheus format
    let line = stats.lines().find_map(|l| {
        l.strip_prefix("wasmcustom.")
            .unwrap_or(l)
            .strip_prefix(&format!("{name}: "))
    })?;
    let value = |q: &str| -> Option<f64> {
        let rest = line.split_whitespace().find_map(|w| w.strip_prefix(q))?;
        let (interval, cumulative) = rest.trim_end_matches(')').split_once(',')?;
        let v: f64 = match span {
            Span::Interval => interval,
            Span::Cumulative => cumulative,
        }
        .parse()
        .ok()?;
        v.is_finite().then_some(v)
    };
    Some((value("P50(")?, value("P99(")?))
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_this_process_cpu_time() {
        let me = Some(std::process::id());
        let before = super::cpu_seconds(me).unwrap();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(50) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        let after = super::cpu_seconds(me).unwrap();
        assert!(after >= before, "{after} < {before}");
        assert_eq!(super::cpu_seconds(Some(u32::MAX)), None, "no such process");
    }

    #[test]
    fn reads_interval_and_cumulative_quantiles() {
        use super::{FilterTimes, Span};
        let text =
            "wasmcustom.prefix_router_route_us: P0(80,70) P25(90,85) P50(101.5,99) P75(120,110) \
                    P90(150,140) P95(170,160) P99(250,240) P99.5(260,250) P99.9(270,260) \
                    P100(280,270)\nprefix_router_tokenize_us: P0(nan,1) P50(nan,2) P99(nan,3)";
        let interval = FilterTimes::of(text, Span::Interval);
        assert_eq!(interval.route_us, Some((101.5, 250.0)));
        assert_eq!(interval.tokenize_us, None, "no samples in the interval");
        let cumulative = FilterTimes::of(text, Span::Cumulative);
        assert_eq!(cumulative.route_us, Some((99.0, 240.0)));
        assert_eq!(cumulative.tokenize_us, Some((2.0, 3.0)));
        assert_eq!(
            FilterTimes::of("", Span::Cumulative),
            FilterTimes::default()
        );
    }
}

/// Each filter VM's (fetch ms, build ms) of its tokenizer, from the lines it logs when loaded.
fn vm_loads(log: &str) -> Vec<(u64, u64)> {
    log.lines()
        .filter_map(|l| {
            let rest = l.split("fetched in ").nth(1)?;
            let fetch = rest.split_whitespace().next()?.parse().ok()?;
            let build = rest
                .split("built in ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            Some((fetch, build))
        })
        .collect()
}

/// One tokenizer family's cost in the filter, its tokenizer fetched at start from files
/// Envoy serves (`tokenizer_dir`): how long each VM took to fetch and build it, Envoy's memory
/// with it, the latency it adds to one unloaded request with a unique ~2k-word prompt, and the
/// filter's own routing time.
#[derive(Debug, Serialize)]
pub struct FamilyRow {
    pub family: String,
    pub tokenizer_json_bytes: u64,
    /// per VM: (fetch ms, build ms), from the filter's log
    pub vm_load_ms: Vec<(u64, u64)>,
    pub envoy_rss_mb: f64,
    pub envoy_rss_without_filter_mb: f64,
    pub added_p50_unloaded_ms: f64,
    pub filter_route_us: Option<(f64, f64)>,
    pub filter_tokenize_us: Option<(f64, f64)>,
}

/// [`FamilyRow`]s for `families` (name, model directory), on `pods` zero-cost pods.
pub fn families(
    families: &[(&str, std::path::PathBuf)],
    text: &str,
    seconds: u32,
    out: &Path,
) -> anyhow::Result<Vec<FamilyRow>> {
    let dir = run_dir("bench-families");
    let pods = start_pods(
        1,
        &[&ZERO_COST[..], &["--max-model-len", "32768"]].concat(),
        &dir,
    )?;
    let addrs: Vec<String> = pods.iter().map(|p| p.addr.clone()).collect();
    let plain = start_envoy_unvalidated("envoy-plain", &addrs, false, |_| {}, &dir)?;
    let body = format!("'{{\"prompt\":\"' .. n .. ' {text}\",\"max_tokens\":1}}'");
    let url_plain = plain.url("/v1/completions");
    wrk::run(&url_plain, &body, 2, 1, &dir)?;
    let without = wrk::run(&url_plain, &body, 1, seconds, &dir)?;
    let mut rows = Vec::new();
    for (family, model_dir) in families {
        let assets = test_harness::process::free_port()?;
        let envoy = start_envoy_unvalidated(
            &format!("envoy-{family}"),
            &addrs,
            true,
            |s| {
                s.debug_headers = false;
                s.stats_flush_interval = Some(FLUSH.into());
                s.tokenizer_dir = Some(model_dir.clone());
                s.assets_port = assets;
            },
            &dir,
        )?;
        // every VM has its tokenizer once the log says so (one line per VM)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let loads = || vm_loads(&std::fs::read_to_string(&envoy.proc.log).unwrap_or_default());
        while loads().len() < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let url = envoy.url("/v1/completions");
        wrk::run(&url, &body, 2, 1, &dir)?;
        let with = wrk::run(&url, &body, 1, seconds, &dir)?;
        let times = FilterTimes::of(&filter_stats(&envoy), Span::Interval);
        rows.push(FamilyRow {
            family: (*family).to_owned(),
            tokenizer_json_bytes: std::fs::metadata(model_dir.join("tokenizer.json"))
                .map(|m| m.len())
                .unwrap_or(0),
            vm_load_ms: loads(),
            envoy_rss_mb: rss_mb(envoy.proc.pid()),
            envoy_rss_without_filter_mb: rss_mb(plain.proc.pid()),
            added_p50_unloaded_ms: with.p50_ms - without.p50_ms,
            filter_route_us: times.route_us,
            filter_tokenize_us: times.tokenize_us,
        });
        let _ = std::fs::copy(&envoy.proc.log, out.join(format!("envoy-{family}.log")));
    }
    Ok(rows)
}
