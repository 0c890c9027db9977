//! `--report DIR`: a Markdown report with SVG plots of a comparison.

use std::fmt::Write as _;
use std::path::Path;

use crate::compare::CompareResult;

const W: f64 = 640.0;
const H: f64 = 360.0;
const M: f64 = 56.0;
const RAW: &str = "#d95f02";
const GRANARY: &str = "#1b9e77";

fn svg_open(title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        W / 2.0,
        esc(title)
    )
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A `<line>` from (x1, y1) to (x2, y2) with the attributes `style`.
fn line(svg: &mut String, (x1, y1): (f64, f64), (x2, y2): (f64, f64), style: &str) {
    let _ = writeln!(
        svg,
        "<line x1=\"{x1}\" y1=\"{y1}\" x2=\"{x2}\" y2=\"{y2}\" {style}/>"
    );
}

/// A `<text>` at (x, y) anchored at its `anchor` (`middle`, `end`); `body` is not escaped.
fn text(svg: &mut String, x: f64, y: f64, anchor: &str, body: &str) {
    let _ = writeln!(
        svg,
        "<text x=\"{x}\" y=\"{y}\" text-anchor=\"{anchor}\">{body}</text>"
    );
}

/// A filled `<rect>`.
fn rect(svg: &mut String, x: f64, y: f64, width: f64, height: f64, fill: &str) {
    let _ = writeln!(
        svg,
        "<rect x=\"{x}\" y=\"{y}\" width=\"{width}\" height=\"{height}\" fill=\"{fill}\"/>"
    );
}

/// A label under the x axis, centred at `x`.
fn x_label(svg: &mut String, x: f64, label: &str) {
    text(svg, x, H - M + 16.0, "middle", label);
}

/// A bar of value `v` on an axis up to `ymax`, at `x`, `width` wide, `label` above it.
fn bar(svg: &mut String, x: f64, width: f64, (v, ymax): (f64, f64), fill: &str, label: &str) {
    let h = (H - 2.0 * M) * v / ymax;
    rect(svg, x, H - M - h, width, h, fill);
    text(svg, x + width / 2.0, H - M - h - 4.0, "middle", label);
}

fn axes(svg: &mut String, ymax: f64, ylabel: &str) {
    let (x0, y0, y1) = (M, H - M, M);
    line(svg, (x0, y0), (W - 20.0, y0), "stroke=\"black\"");
    line(svg, (x0, y0), (x0, y1), "stroke=\"black\"");
    for i in 0..=4 {
        let v = ymax * i as f64 / 4.0;
        let y = y0 - (y0 - y1) * i as f64 / 4.0;
        line(svg, (x0 + 1.0, y), (W - 20.0, y), "stroke=\"#ddd\"");
        text(svg, x0 - 6.0, y + 4.0, "end", &fmt_num(v));
    }
    let _ = writeln!(
        svg,
        "<text transform=\"translate(14,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        H / 2.0,
        esc(ylabel)
    );
}

fn fmt_num(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn legend(svg: &mut String, top: f64, items: &[(&str, &str)]) {
    for (i, (name, color)) in items.iter().enumerate() {
        let x = W - 200.0;
        let y = top + 18.0 * i as f64;
        rect(svg, x, y - 10.0, 12.0, 12.0, color);
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{y}\">{}</text>",
            x + 18.0,
            esc(name)
        );
    }
}

/// Grouped bars: samples/s per epoch, raw vs granary.
pub fn throughput_svg(r: &CompareResult) -> String {
    let mut svg = svg_open("Samples per second, per epoch");
    let epochs = r.raw_epochs.iter().chain(&r.granary_epochs);
    let ymax = epochs.map(|e| e.samples_per_s).fold(1.0, f64::max) * 1.1;
    axes(&mut svg, ymax, "samples/s");
    let n = r.raw_epochs.len().max(1) as f64;
    let slot = (W - 20.0 - M) / n;
    let width = slot * 0.35;
    for (i, (raw, g)) in r.raw_epochs.iter().zip(&r.granary_epochs).enumerate() {
        let x = M + slot * i as f64 + slot * 0.12;
        for (j, (v, color)) in [(raw.samples_per_s, RAW), (g.samples_per_s, GRANARY)]
            .into_iter()
            .enumerate()
        {
            let bx = x + j as f64 * (width + 4.0);
            bar(&mut svg, bx, width, (v, ymax), color, &fmt_num(v));
        }
        x_label(&mut svg, x + width, &format!("epoch {}", raw.epoch));
    }
    legend(
        &mut svg,
        40.0,
        &[
            ("raw files (ImageFolder-style)", RAW),
            ("granary (chunk-wise)", GRANARY),
        ],
    );
    svg + "</svg>\n"
}

/// Cumulative distribution of per-sample wait times (log-scaled x), first epoch of each side.
pub fn latency_svg(r: &CompareResult) -> String {
    let mut svg = svg_open("Per-sample wait time, cumulative distribution (epoch 0)");
    let (raw, granary) = (
        &r.raw_epochs[0].latencies_us,
        &r.granary_epochs[0].latencies_us,
    );
    let positive = || raw.iter().chain(granary).copied().filter(|v| *v > 0.0);
    let min = positive().fold(f64::INFINITY, f64::min);
    let lo = min.max(0.1).log10().floor();
    let max = positive().fold(1.0, f64::max);
    let hi = max.log10().ceil().max(lo + 1.0);
    axes(&mut svg, 1.0, "fraction of samples");
    let px = |v: f64| M + (W - 20.0 - M) * ((v.max(1e-3).log10() - lo) / (hi - lo)).clamp(0.0, 1.0);
    let py = |f: f64| H - M - (H - 2.0 * M) * f;
    for d in lo as i32..=hi as i32 {
        let label = format!("{} us", fmt_num(10f64.powi(d)));
        x_label(&mut svg, px(10f64.powi(d)), &label);
    }
    for (lat, color) in [(raw, RAW), (granary, GRANARY)] {
        if lat.is_empty() {
            continue;
        }
        let step = (lat.len() / 400).max(1);
        let mut pts = String::new();
        for (i, v) in lat
            .iter()
            .enumerate()
            .step_by(step)
            .chain(std::iter::once((lat.len() - 1, &lat[lat.len() - 1])))
        {
            let _ = write!(
                pts,
                "{:.1},{:.1} ",
                px(*v),
                py((i + 1) as f64 / lat.len() as f64)
            );
        }
        let _ = writeln!(
            svg,
            "<polyline points=\"{pts}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"/>"
        );
    }
    legend(
        &mut svg,
        H - M - 40.0,
        &[("raw files", RAW), ("granary", GRANARY)],
    );
    svg + "</svg>\n"
}

/// Bars: granary / raw samples-per-second ratio per epoch.
pub fn ratio_svg(r: &CompareResult) -> String {
    let mut svg = svg_open("granary / raw, samples per second");
    let ymax = r.ratios.iter().copied().fold(1.0, f64::max) * 1.15;
    axes(&mut svg, ymax, "ratio (x)");
    let n = r.ratios.len().max(1) as f64;
    let slot = (W - 20.0 - M) / n;
    for (i, &v) in r.ratios.iter().enumerate() {
        let x = M + slot * i as f64 + slot * 0.25;
        let width = slot * 0.5;
        bar(&mut svg, x, width, (v, ymax), GRANARY, &format!("{v:.2}x"));
        x_label(&mut svg, x + width / 2.0, &format!("epoch {i}"));
    }
    let y1 = H - M - (H - 2.0 * M) / ymax;
    let dashed = "stroke=\"black\" stroke-dasharray=\"4 3\"";
    line(&mut svg, (M, y1), (W - 20.0, y1), dashed);
    svg + "</svg>\n"
}

/// Writes `report.md`, `throughput.svg`, `latency.svg` and `ratio.svg` into `dir`.
pub fn write_report(dir: &Path, r: &CompareResult, table: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("throughput.svg"), throughput_svg(r))?;
    std::fs::write(dir.join("latency.svg"), latency_svg(r))?;
    std::fs::write(dir.join("ratio.svg"), ratio_svg(r))?;
    let (g, raw) = (&r.granary_epochs[0], &r.raw_epochs[0]);
    let md = format!(
        "# granary vs raw files\n\n\
         Raw tree `{}` read as ImageFolder + DataLoader do (list the tree, then open/read/close each \
         file in a shuffled order), against the packed dataset `{}` read chunk-wise, {} workers each, \
         on the same storage. Both sides checksum every sample; digests {}.\n\n\
         **granary delivered {:.2}x the samples per second of raw files** (epoch 0: {:.0} vs {:.0}), \
         started {:.1}x faster ({:.4} s vs {:.4} s) and issued {:.0}x fewer metadata operations \
         ({} vs {}).\n\n\
         ![throughput](throughput.svg)\n\n![latency](latency.svg)\n\n![ratio](ratio.svg)\n\n\
         ```\n{table}```\n",
        r.raw.display(),
        r.packed.display(),
        r.workers,
        if r.digests_match { "match: both delivered the same bytes" } else { "**differ**" },
        r.ratios[0],
        g.samples_per_s,
        raw.samples_per_s,
        r.startup_ratio,
        g.startup_s,
        raw.startup_s,
        r.metadata_ratio,
        g.metadata_ops,
        raw.metadata_ops
    );
    std::fs::write(dir.join("report.md"), md)
}
