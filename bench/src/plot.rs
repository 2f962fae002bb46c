//! PNG charts of a run (plotters, bitmap backend): lines over message
//! size on a log2 axis, and bars.
//!
//! Text needs a TrueType font, loaded at run time from the system
//! (`fonts-dejavu-core`, installed by scripts/setup) or from the file
//! named by `IWARP_BENCH_FONT`; nothing is downloaded.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::register_font;

use crate::report::size_str;

/// Where a sans-serif font is looked for, in order (after
/// `IWARP_BENCH_FONT`).
pub const FONTS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Register a TrueType font as plotters' "sans-serif" (once per process).
pub fn load_font() -> Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let env = std::env::var("IWARP_BENCH_FONT").ok();
            let candidates = env.iter().map(String::as_str).chain(FONTS);
            for path in candidates {
                let Ok(bytes) = std::fs::read(path) else {
                    continue;
                };
                // plotters keeps the font for the whole process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                for style in [FontStyle::Normal, FontStyle::Bold] {
                    register_font("sans-serif", style, bytes)
                        .map_err(|_| format!("{path}: not a usable TrueType font"))?;
                }
                return Ok(());
            }
            Err(format!(
                "no TrueType font found (tried {}; install fonts-dejavu-core or set IWARP_BENCH_FONT)",
                FONTS.join(", ")
            ))
        })
        .clone()
}

/// One line of a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (message size in bytes, value), sizes > 0.
    pub points: Vec<(f64, f64)>,
}

/// Chart size in pixels.
const SIZE: (u32, u32) = (1000, 640);

fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    C[i % C.len()]
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A line chart of `series` over message size (log2 x axis); the y axis
/// is logarithmic with `log_y`, else linear from 0. Constant lines
/// (ceilings) are `hlines`: (legend, value).
pub fn lines(
    path: &Path,
    title: &str,
    y_desc: &str,
    series: &[Series],
    hlines: &[(String, f64)],
    log_y: bool,
) -> Result<(), String> {
    load_font()?;
    let pts = || series.iter().flat_map(|s| s.points.iter().copied());
    let xs: Vec<f64> = pts().filter(|p| p.0 > 0.0).map(|p| p.0.log2()).collect();
    let ys: Vec<f64> = pts()
        .map(|p| p.1)
        .chain(hlines.iter().map(|h| h.1))
        .filter(|y| y.is_finite() && (!log_y || *y > 0.0))
        .collect();
    if xs.is_empty() || ys.is_empty() {
        return Err(format!("{title}: nothing to plot"));
    }
    let (x0, x1) = xs
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    let (x0, x1) = (x0.floor(), x1.ceil().max(x0.floor() + 1.0));
    let (y0, y1) = ys
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &y| (a.min(y), b.max(y)));
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(50)
        .y_label_area_size(70);
    let xfmt = |v: &f64| size_str(2f64.powf(v.round()) as usize);
    let legend = |i: usize| {
        move |(x, y): (i32, i32)| {
            PathElement::new(vec![(x, y), (x + 20, y)], color(i).stroke_width(3))
        }
    };
    if log_y {
        let mut chart = builder
            .build_cartesian_2d(x0..x1, (y0 * 0.8..y1 * 1.25).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("message size (bytes, log2)")
            .y_desc(y_desc)
            .x_labels((x1 - x0) as usize + 1)
            .x_label_formatter(&xfmt)
            .y_label_formatter(&|v: &f64| format!("{v}"))
            .light_line_style(WHITE)
            .draw()
            .map_err(err)?;
        for (i, s) in series.iter().enumerate() {
            let p: Vec<(f64, f64)> = s
                .points
                .iter()
                .filter(|p| p.0 > 0.0 && p.1 > 0.0)
                .map(|p| (p.0.log2(), p.1))
                .collect();
            chart
                .draw_series(LineSeries::new(p.clone(), color(i).stroke_width(2)))
                .map_err(err)?
                .label(s.name.clone())
                .legend(legend(i));
            chart
                .draw_series(p.iter().map(|&c| Circle::new(c, 3, color(i).filled())))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    } else {
        let mut chart = builder
            .build_cartesian_2d(x0..x1, 0f64..y1 * 1.1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("message size (bytes, log2)")
            .y_desc(y_desc)
            .x_labels((x1 - x0) as usize + 1)
            .x_label_formatter(&xfmt)
            .draw()
            .map_err(err)?;
        let n = series.len();
        for (i, s) in series.iter().enumerate() {
            let p: Vec<(f64, f64)> = s
                .points
                .iter()
                .filter(|p| p.0 > 0.0 && p.1.is_finite())
                .map(|p| (p.0.log2(), p.1))
                .collect();
            chart
                .draw_series(LineSeries::new(p.clone(), color(i).stroke_width(2)))
                .map_err(err)?
                .label(s.name.clone())
                .legend(legend(i));
            chart
                .draw_series(p.iter().map(|&c| Circle::new(c, 3, color(i).filled())))
                .map_err(err)?;
        }
        for (j, (name, v)) in hlines.iter().enumerate() {
            let c = color(n + j);
            let style = ShapeStyle {
                color: c.to_rgba(),
                filled: false,
                stroke_width: 1,
            };
            chart
                .draw_series(DashedLineSeries::new(vec![(x0, *v), (x1, *v)], 8, 5, style))
                .map_err(err)?
                .label(name.clone())
                .legend(legend(n + j));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// A bar chart: one bar per (label, value), value ≥ 0.
pub fn bars(path: &Path, title: &str, y_desc: &str, bars: &[(String, f64)]) -> Result<(), String> {
    load_font()?;
    let bars: Vec<&(String, f64)> = bars.iter().filter(|b| b.1.is_finite()).collect();
    if bars.is_empty() {
        return Err(format!("{title}: nothing to plot"));
    }
    let top = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1e-9) * 1.15;
    let n = bars.len();
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let xfmt = |v: &f64| {
        let i = v.floor();
        if (v - i - 0.5).abs() < 0.26 && i >= 0.0 {
            labels.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(if n > 4 { 140 } else { 50 })
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, 0f64..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(y_desc)
        .x_labels(4 * n + 1)
        .x_label_formatter(&xfmt)
        .x_label_style(if n > 4 {
            ("sans-serif", 13)
                .into_font()
                .transform(FontTransform::Rotate90)
                .into_text_style(&root)
        } else {
            ("sans-serif", 14).into_font().into_text_style(&root)
        })
        .draw()
        .map_err(err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let x = i as f64;
            Rectangle::new([(x + 0.15, 0.0), (x + 0.85, b.1)], color(i).filled())
        }))
        .map_err(err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            Text::new(
                format!("{:.3}", b.1),
                (i as f64 + 0.2, b.1 + top * 0.02),
                ("sans-serif", 14),
            )
        }))
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("iwarp-plot-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.join(name)
    }

    fn size_of(p: &Path) -> u64 {
        std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
    }

    #[test]
    fn charts_are_written() {
        if load_font().is_err() {
            eprintln!("no font on this machine: chart test skipped");
            return;
        }
        let s = vec![
            Series {
                name: "a".into(),
                points: vec![(1.0, 2.0), (1024.0, 5.0), (1048576.0, 300.0)],
            },
            Series {
                name: "b".into(),
                points: vec![(4.0, 3.0), (65536.0, 40.0)],
            },
        ];
        let p = tmp("lines-log.png");
        lines(&p, "latency", "µs", &s, &[], true).unwrap();
        assert!(size_of(&p) > 1000);
        let p = tmp("lines-lin.png");
        lines(&p, "bw", "Gb/s", &s, &[("ceiling".into(), 7.0)], false).unwrap();
        assert!(size_of(&p) > 1000);
        let p = tmp("bars.png");
        let b: Vec<(String, f64)> = (0..6).map(|i| (format!("cfg{i}"), i as f64)).collect();
        bars(&p, "load", "cpu s/GB", &b).unwrap();
        assert!(size_of(&p) > 1000);
        assert!(lines(&tmp("x.png"), "empty", "", &[], &[], true).is_err());
        assert!(bars(&tmp("y.png"), "empty", "", &[]).is_err());
    }
}
