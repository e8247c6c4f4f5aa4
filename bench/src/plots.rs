//! Charts of a policy comparison (plotters; PNG and SVG): TTFT CDF per policy, hit rate
//! against the oracle, and requests per pod.

use super::policies::PolicyRun;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::path::Path;

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

/// Registers a system font for chart text (Debian's DejaVu, installed by setup).
pub fn init_font() -> anyhow::Result<()> {
    let path = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
    let bytes: &'static [u8] = Box::leak(
        std::fs::read(path)
            .map_err(|e| {
                anyhow::anyhow!("{path}: {e} (scripts/setup.sh installs fonts-dejavu-core)")
            })?
            .into_boxed_slice(),
    );
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("bad font {path}"))?;
    Ok(())
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plot: {e:?}")
}

/// Draws the series labels at `position` and writes the chart out.
fn finish<'a, DB: DrawingBackend + 'a>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .position(position)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// TTFT CDF, one line per policy, for one workload.
fn ttft_cdf<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    workload: &str,
    runs: &[&PolicyRun],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    let max = runs
        .iter()
        .flat_map(|r| r.ttfts.iter().copied())
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("TTFT CDF — {workload}"), ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..max * 1.05, 0.0..1.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("time to first token (ms)")
        .y_desc("fraction of requests")
        .draw()
        .map_err(err)?;
    for (i, r) in runs.iter().enumerate() {
        let mut v = r.ttfts.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len().max(1) as f64;
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                v.iter().enumerate().map(|(k, &x)| (x, (k + 1) as f64 / n)),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(r.policy)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    finish(&root, &mut chart, SeriesLabelPosition::LowerRight)
}

/// Grouped bars: `value(run)` per workload (groups) and policy (bars); `extra` draws an
/// optional marker per workload (the oracle).
fn bars<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    y_desc: &str,
    runs: &[PolicyRun],
    value: impl Fn(&PolicyRun) -> f64,
    marker: Option<&dyn Fn(&str) -> f64>,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    let mut workloads: Vec<&str> = runs.iter().map(|r| r.workload).collect();
    workloads.dedup();
    // first-seen order, so each policy has the same colour in every chart
    let mut policies: Vec<&str> = Vec::new();
    for r in runs {
        if !policies.contains(&r.policy) {
            policies.push(r.policy);
        }
    }
    let ymax = runs
        .iter()
        .map(&value)
        .chain(workloads.iter().filter_map(|w| marker.map(|m| m(w))))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.15;
    let groups = workloads.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..groups, 0.0..ymax)
        .map_err(err)?;
    let names = workloads.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(workloads.len() * 2 + 1)
        .x_label_formatter(&move |x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 {
                names.get(i).map(|s| s.to_string()).unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .draw()
        .map_err(err)?;
    let width = 0.8 / policies.len().max(1) as f64;
    for (pi, p) in policies.iter().enumerate() {
        let color = COLORS[pi % COLORS.len()];
        let rects: Vec<Rectangle<(f64, f64)>> = runs
            .iter()
            .filter(|r| r.policy == *p)
            .filter_map(|r| {
                let g = workloads.iter().position(|w| *w == r.workload)? as f64;
                let x0 = g + 0.1 + pi as f64 * width;
                let v = value(r);
                v.is_finite()
                    .then(|| Rectangle::new([(x0, 0.0), (x0 + width * 0.9, v)], color.filled()))
            })
            .collect();
        chart
            .draw_series(rects)
            .map_err(err)?
            .label(*p)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
    }
    if let Some(m) = marker {
        let lines: Vec<PathElement<(f64, f64)>> = workloads
            .iter()
            .enumerate()
            .map(|(g, w)| {
                PathElement::new(
                    vec![(g as f64 + 0.05, m(w)), (g as f64 + 0.95, m(w))],
                    BLACK.stroke_width(2),
                )
            })
            .collect();
        chart
            .draw_series(lines)
            .map_err(err)?
            .label("oracle")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    }
    finish(&root, &mut chart, SeriesLabelPosition::UpperRight)
}

/// Writes every chart as PNG and SVG into `out`; returns the file names.
pub fn write_all(runs: &[PolicyRun], out: &Path) -> anyhow::Result<Vec<String>> {
    init_font()?;
    let mut files = Vec::new();
    let mut workloads: Vec<&str> = runs.iter().map(|r| r.workload).collect();
    workloads.dedup();
    for w in &workloads {
        let rs: Vec<&PolicyRun> = runs.iter().filter(|r| r.workload == *w).collect();
        let png = out.join(format!("ttft-cdf-{w}.png"));
        ttft_cdf(
            BitMapBackend::new(&png, (900, 560)).into_drawing_area(),
            w,
            &rs,
        )?;
        let svg = out.join(format!("ttft-cdf-{w}.svg"));
        ttft_cdf(
            SVGBackend::new(&svg, (900, 560)).into_drawing_area(),
            w,
            &rs,
        )?;
        files.push(format!("ttft-cdf-{w}.png"));
    }
    let oracle = |w: &str| {
        runs.iter()
            .find(|r| r.workload == w)
            .map(|r| r.oracle.hit_rate)
            .unwrap_or(0.0)
    };
    for (name, backend_png) in [("hit-rate", true), ("hit-rate", false)] {
        let path = out.join(format!(
            "{name}.{}",
            if backend_png { "png" } else { "svg" }
        ));
        if backend_png {
            bars(
                BitMapBackend::new(&path, (900, 560)).into_drawing_area(),
                "Prefix-cache hit rate vs oracle",
                "hit rate (tokens)",
                runs,
                |r| r.hit_rate,
                Some(&oracle),
            )?;
        } else {
            bars(
                SVGBackend::new(&path, (900, 560)).into_drawing_area(),
                "Prefix-cache hit rate vs oracle",
                "hit rate (tokens)",
                runs,
                |r| r.hit_rate,
                Some(&oracle),
            )?;
        }
    }
    files.push("hit-rate.png".into());
    for ext in ["png", "svg"] {
        let path = out.join(format!("per-pod-spread.{ext}"));
        let title = "Per-pod load: busiest pod / mean (1 = even)";
        if ext == "png" {
            bars(
                BitMapBackend::new(&path, (900, 560)).into_drawing_area(),
                title,
                "max / mean requests",
                runs,
                |r| r.spread,
                None,
            )?;
        } else {
            bars(
                SVGBackend::new(&path, (900, 560)).into_drawing_area(),
                title,
                "max / mean requests",
                runs,
                |r| r.spread,
                None,
            )?;
        }
    }
    files.push("per-pod-spread.png".into());
    Ok(files)
}
