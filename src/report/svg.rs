//! Small, dependency-free SVG charts: line charts (with an optional band), stacked bars and
//! histograms, with labelled axes, "nice" ticks and a legend. Colours are the Okabe–Ito
//! palette, which stays distinguishable under the common forms of colour blindness.

use std::fmt::Write;

/// Okabe–Ito colours, in the order series get them.
pub const PALETTE: [&str; 7] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000",
];

const W: f64 = 720.0;
const H: f64 = 320.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 48.0;

pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Round tick values covering `[lo, hi]`.
pub fn ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo {
        return vec![lo];
    }
    let raw = (hi - lo) / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let start = (lo / step).ceil() * step;
    (0..)
        .map(|i| start + i as f64 * step)
        .take_while(|v| *v <= hi + step * 1e-9)
        .collect()
}

fn fmt_tick(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-2..1e4).contains(&a) {
        format!("{v:.1e}")
    } else if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

struct Frame {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Frame {
    fn new(x0: f64, x1: f64, y0: f64, y1: f64) -> Self {
        let (x0, x1) = if x1 > x0 {
            (x0, x1)
        } else {
            (x0 - 0.5, x0 + 0.5)
        };
        let (y0, y1) = if y1 > y0 {
            (y0, y1)
        } else {
            (y0 - 0.5, y0 + 0.5)
        };
        Self { x0, x1, y0, y1 }
    }
    fn x(&self, v: f64) -> f64 {
        LEFT + (v - self.x0) / (self.x1 - self.x0) * (W - LEFT - RIGHT)
    }
    fn y(&self, v: f64) -> f64 {
        H - BOTTOM - (v - self.y0) / (self.y1 - self.y0) * (H - TOP - BOTTOM)
    }
}

fn open(out: &mut String, title: &str, desc: &str) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{t}"><title>{t}</title><desc>{d}</desc><rect width="{W}" height="{H}" fill="white"/><text x="{LEFT}" y="22" font-size="15" font-weight="bold">{t}</text>"#,
        t = escape(title),
        d = escape(desc)
    );
}

fn axes(out: &mut String, f: &Frame, x_label: &str, y_label: &str, x_ticks: &[f64]) {
    let _ = write!(
        out,
        r##"<g font-size="11" fill="#333"><line x1="{LEFT}" y1="{b}" x2="{r}" y2="{b}" stroke="#333"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{b}" stroke="#333"/>"##,
        b = H - BOTTOM,
        r = W - RIGHT
    );
    for t in ticks(f.y0, f.y1, 5) {
        let y = f.y(t);
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{r}" y2="{y:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{v}</text>"##,
            r = W - RIGHT,
            tx = LEFT - 6.0,
            ty = y + 4.0,
            v = fmt_tick(t)
        );
    }
    for &t in x_ticks {
        let x = f.x(t);
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="{b}" x2="{x:.1}" y2="{b2}" stroke="#333"/><text x="{x:.1}" y="{ty}" text-anchor="middle">{v}</text>"##,
            b = H - BOTTOM,
            b2 = H - BOTTOM + 5.0,
            ty = H - BOTTOM + 18.0,
            v = fmt_tick(t)
        );
    }
    let _ = write!(
        out,
        r#"<text x="{cx}" y="{ly}" text-anchor="middle" font-size="12">{xl}</text><text transform="translate(16 {cy}) rotate(-90)" text-anchor="middle" font-size="12">{yl}</text></g>"#,
        cx = (LEFT + W - RIGHT) / 2.0,
        ly = H - 8.0,
        cy = (TOP + H - BOTTOM) / 2.0,
        xl = escape(x_label),
        yl = escape(y_label)
    );
}

fn legend(out: &mut String, names: &[(String, &str)]) {
    let mut x = W - RIGHT;
    let _ = write!(out, r#"<g font-size="11">"#);
    for (name, color) in names.iter().rev() {
        let w = 24.0 + 6.5 * name.chars().count() as f64;
        x -= w;
        let _ = write!(
            out,
            r#"<rect x="{x:.1}" y="12" width="12" height="12" fill="{color}"/><text x="{tx:.1}" y="22">{n}</text>"#,
            tx = x + 16.0,
            n = escape(name)
        );
    }
    out.push_str("</g>");
}

/// A named series of points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart; `band` (x, lo, hi) is drawn shaded under the first series.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    band: Option<&[(f64, f64, f64)]>,
) -> String {
    let pts = series.iter().flat_map(|s| s.points.iter().copied());
    let band_pts = band
        .unwrap_or(&[])
        .iter()
        .flat_map(|&(x, lo, hi)| [(x, lo), (x, hi)]);
    let all: Vec<(f64, f64)> = pts
        .chain(band_pts)
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in &all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if all.is_empty() {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let pad = (y1 - y0) * 0.05;
    let f = Frame::new(x0, x1, y0 - pad, y1 + pad);
    let mut out = String::new();
    open(&mut out, title, &format!("{y_label} against {x_label}"));
    axes(&mut out, &f, x_label, y_label, &ticks(f.x0, f.x1, 8));
    if let Some(b) = band.filter(|b| !b.is_empty()) {
        let mut d = String::new();
        for (i, &(x, _, hi)) in b.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1} ",
                if i == 0 { "M" } else { "L" },
                f.x(x),
                f.y(hi)
            );
        }
        for &(x, lo, _) in b.iter().rev() {
            let _ = write!(d, "L{:.1},{:.1} ", f.x(x), f.y(lo));
        }
        let _ = write!(
            out,
            r#"<path class="band" d="{d}Z" fill="{}" fill-opacity="0.18" stroke="none"/>"#,
            PALETTE[0]
        );
    }
    let mut names = Vec::new();
    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        names.push((s.name.clone(), color));
        let mut d = String::new();
        for (j, &(x, y)) in s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .enumerate()
        {
            let _ = write!(
                d,
                "{}{:.1},{:.1} ",
                if j == 0 { "M" } else { "L" },
                f.x(x),
                f.y(y)
            );
        }
        let _ = write!(
            out,
            r#"<path class="series" data-name="{}" d="{d}" fill="none" stroke="{color}" stroke-width="1.8"/>"#,
            escape(&s.name)
        );
        if s.points.len() <= 64 {
            for &(x, y) in &s.points {
                let _ = write!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="2.2" fill="{color}"/>"#,
                    f.x(x),
                    f.y(y)
                );
            }
        }
    }
    if band.is_some() {
        names.push(("95% interval".into(), "#9cc3e0"));
    }
    legend(&mut out, &names);
    out.push_str("</svg>");
    out
}

/// Horizontal stacked bars: one bar per label, one segment per part.
pub fn stacked_bars(
    title: &str,
    x_label: &str,
    labels: &[String],
    parts: &[&str],
    values: &[Vec<f64>],
) -> String {
    let total = values
        .iter()
        .map(|v| v.iter().sum::<f64>())
        .fold(0.0, f64::max)
        .max(1e-9);
    let f = Frame::new(0.0, total, 0.0, 1.0);
    let mut out = String::new();
    open(&mut out, title, &format!("{} per rank", parts.join(", ")));
    let _ = write!(
        out,
        r##"<g font-size="11" fill="#333"><line x1="{LEFT}" y1="{b}" x2="{r}" y2="{b}" stroke="#333"/>"##,
        b = H - BOTTOM,
        r = W - RIGHT
    );
    for t in ticks(0.0, total, 6) {
        let x = f.x(t);
        let _ = write!(
            out,
            r#"<text x="{x:.1}" y="{y}" text-anchor="middle">{}</text>"#,
            fmt_tick(t),
            y = H - BOTTOM + 16.0
        );
    }
    let _ = write!(
        out,
        r#"<text x="{cx}" y="{ly}" text-anchor="middle" font-size="12">{}</text></g>"#,
        escape(x_label),
        cx = (LEFT + W - RIGHT) / 2.0,
        ly = H - 8.0
    );
    let n = labels.len().max(1) as f64;
    let slot = (H - TOP - BOTTOM) / n;
    let bar = (slot * 0.7).min(40.0);
    for (i, (label, vals)) in labels.iter().zip(values).enumerate() {
        let y = TOP + slot * i as f64 + (slot - bar) / 2.0;
        let _ = write!(
            out,
            r#"<text x="{tx}" y="{ty:.1}" text-anchor="end" font-size="11">{}</text>"#,
            escape(label),
            tx = LEFT - 6.0,
            ty = y + bar / 2.0 + 4.0
        );
        let mut acc = 0.0;
        for (j, &v) in vals.iter().enumerate() {
            let (xa, xb) = (f.x(acc), f.x(acc + v));
            let _ = write!(
                out,
                r#"<rect class="segment" data-part="{}" data-value="{v}" x="{xa:.1}" y="{y:.1}" width="{:.1}" height="{bar:.1}" fill="{}"><title>{}: {v:.3} s</title></rect>"#,
                escape(parts[j]),
                (xb - xa).max(0.0),
                PALETTE[j % PALETTE.len()],
                escape(parts[j])
            );
            acc += v;
        }
    }
    let names: Vec<(String, &str)> = parts
        .iter()
        .enumerate()
        .map(|(j, p)| (p.to_string(), PALETTE[j % PALETTE.len()]))
        .collect();
    legend(&mut out, &names);
    out.push_str("</svg>");
    out
}

/// A histogram of `values` in `bins` equal bins.
pub fn histogram(title: &str, x_label: &str, values: &[f64], bins: usize) -> String {
    let lo = values.iter().copied().fold(f64::MAX, f64::min);
    let hi = values.iter().copied().fold(f64::MIN, f64::max);
    let (lo, hi) = if values.is_empty() {
        (0.0, 1.0)
    } else if hi > lo {
        (lo, hi)
    } else {
        (lo - 0.5, hi + 0.5)
    };
    let bins = bins.max(1);
    let width = (hi - lo) / bins as f64;
    let mut counts = vec![0usize; bins];
    for &v in values {
        counts[(((v - lo) / width) as usize).min(bins - 1)] += 1;
    }
    let top = *counts.iter().max().unwrap_or(&1) as f64;
    let f = Frame::new(lo, hi, 0.0, top.max(1.0) * 1.08);
    let mut out = String::new();
    open(&mut out, title, &format!("count of windows by {x_label}"));
    axes(&mut out, &f, x_label, "windows", &ticks(lo, hi, 8));
    for (i, &c) in counts.iter().enumerate() {
        let (xa, xb) = (f.x(lo + width * i as f64), f.x(lo + width * (i + 1) as f64));
        let (ya, yb) = (f.y(c as f64), f.y(0.0));
        let _ = write!(
            out,
            r#"<rect class="bin" data-count="{c}" x="{:.1}" y="{ya:.1}" width="{:.1}" height="{:.1}" fill="{}" stroke="white"/>"#,
            xa,
            (xb - xa).max(0.0),
            (yb - ya).max(0.0),
            PALETTE[0]
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(21.3, 28.9, 4), vec![22.0, 24.0, 26.0, 28.0]);
        assert_eq!(ticks(0.0, 0.9, 4), vec![0.0, 0.25, 0.5, 0.75]);
        assert_eq!(ticks(5.0, 5.0, 4), vec![5.0]);
    }

    #[test]
    fn charts_are_single_svg_elements_with_escaped_text() {
        let s = line_chart(
            "a < b",
            "x",
            "y",
            &[Series {
                name: "r&0".into(),
                points: vec![(0.0, 1.0), (1.0, 2.0)],
            }],
            Some(&[(0.0, 0.5, 1.5), (1.0, 1.5, 2.5)]),
        );
        assert!(s.starts_with("<svg") && s.ends_with("</svg>"));
        assert!(s.contains("a &lt; b") && s.contains("r&amp;0"));
        assert_eq!(s.matches("<svg").count(), 1);
        let h = histogram("h", "nll", &[1.0, 1.1, 2.0, 3.0], 2);
        assert_eq!(h.matches("class=\"bin\"").count(), 2);
        assert!(h.contains("data-count=\"2\""));
        let b = stacked_bars(
            "u",
            "s",
            &["rank 0".into()],
            &["compute", "idle"],
            &[vec![3.0, 1.0]],
        );
        assert_eq!(b.matches("class=\"segment\"").count(), 2);
    }
}
