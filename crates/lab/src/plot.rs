//! Accuracy against round and against bytes communicated, as PNG and SVG.

use std::path::Path;
use std::sync::Once;

use crate::error::{LabError, Result};
use fedfuse_fed::RoundMetrics;
use plotters::coord::Shift;
use plotters::prelude::*;

/// DejaVu Sans, bundled: plotters' own font lookup needs fontconfig, which a fresh machine lacks.
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

fn register_font() {
    REGISTER.call_once(|| {
        // The bytes are a valid TTF shipped with the binary; failure would only lose text.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// One chart: lines of (x, mean, std) points.
pub struct Chart {
    /// Caption.
    pub title: String,
    /// Label of the x axis.
    pub x_label: String,
    /// One line per series.
    pub lines: Vec<Line>,
}

/// One series; `std` > 0 draws an error bar.
pub struct Line {
    /// Legend label.
    pub label: String,
    /// (x, y, std) points.
    pub points: Vec<(f64, f64, f64)>,
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(127, 127, 127),
    RGBColor(23, 190, 207),
];

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &Chart) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| LabError::Plot {
        title: c.title.clone(),
        reason: format!("{e:?}"),
    };
    root.fill(&WHITE).map_err(err)?;
    let all = || c.lines.iter().flat_map(|l| l.points.iter());
    let x_max = all().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    let x_min = all().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let pad = ((x_max - x_min) * 0.05).max(0.5);
    let (x_min, x_max) = if x_max.is_finite() {
        (x_min - pad, x_max + pad)
    } else {
        (0.0, 1.0)
    };
    let y_min = all().map(|p| p.1 - p.2).fold(1.0, f64::min).min(0.9);
    let mut chart = ChartBuilder::on(&root)
        .caption(&c.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(x_min..x_max, (y_min - 0.02).max(0.0)..1.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(c.x_label.as_str())
        .y_desc("test accuracy")
        .draw()
        .map_err(err)?;
    for (i, line) in c.lines.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(
                line.points.iter().map(|p| (p.0, p.1)),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(line.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                line.points
                    .iter()
                    .map(|p| Circle::new((p.0, p.1), 3, color.filled())),
            )
            .map_err(err)?;
        chart
            .draw_series(line.points.iter().filter(|p| p.2 > 0.0).map(|p| {
                PathElement::new(
                    vec![(p.0, p.1 - p.2), (p.0, p.1 + p.2)],
                    color.stroke_width(1),
                )
            }))
            .map_err(err)?;
    }
    if c.lines.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerLeft)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Writes `stem.png` and `stem.svg`.
pub fn write_chart(out: &Path, stem: &str, chart: &Chart) -> Result<()> {
    register_font();
    let png = out.join(format!("{stem}.png"));
    draw(
        BitMapBackend::new(&png, (900, 560)).into_drawing_area(),
        chart,
    )?;
    let svg = out.join(format!("{stem}.svg"));
    draw(SVGBackend::new(&svg, (900, 560)).into_drawing_area(), chart)?;
    Ok(())
}

/// Writes one `accuracy_{facet}.{png,svg}` per chart of a sweep.
pub fn write_sweep_plots(out: &Path, _title: &str, charts: &[Chart]) -> Result<()> {
    for chart in charts {
        let facet = chart.title.split(": ").last().unwrap_or("all");
        let stem: String = facet
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        write_chart(out, &format!("accuracy_{stem}"), chart)?;
    }
    Ok(())
}

/// Writes `accuracy_vs_round.{png,svg}` and `accuracy_vs_bytes.{png,svg}` into `out`, through
/// the rounds that evaluated the global model (`eval_every`).
pub fn write_plots(out: &Path, rounds: &[RoundMetrics]) -> Result<()> {
    let mut cumulative = 0u64;
    let by_bytes: Vec<(f64, f64, f64)> = rounds
        .iter()
        .map(|r| {
            cumulative += r.bytes_up + r.bytes_down;
            (cumulative as f64 / 1e6, r.global_accuracy, 0.0)
        })
        .filter(|p| p.1.is_finite())
        .collect();
    let by_round: Vec<(f64, f64, f64)> = rounds
        .iter()
        .map(|r| (r.round as f64, r.global_accuracy, 0.0))
        .filter(|p| p.1.is_finite())
        .collect();
    let single = |title: &str, x_label: &str, points| Chart {
        title: title.into(),
        x_label: x_label.into(),
        lines: vec![Line {
            label: "global model".into(),
            points,
        }],
    };
    write_chart(
        out,
        "accuracy_vs_round",
        &single("accuracy per round", "round", by_round),
    )?;
    write_chart(
        out,
        "accuracy_vs_bytes",
        &single(
            "accuracy per traffic",
            "MB communicated (up + down)",
            by_bytes,
        ),
    )
}

/// Writes a stacked-bar chart of how many samples of each class every client holds (one bar
/// per client, one colour per class; `counts[client][class]`) to `path` as SVG, atomically.
pub fn write_class_histogram(path: &Path, title: &str, counts: &[Vec<usize>]) -> Result<()> {
    register_font();
    let mut svg = String::new();
    draw_class_histogram(
        SVGBackend::with_string(&mut svg, (900, 560)).into_drawing_area(),
        title,
        counts,
    )?;
    crate::table::write_atomic(path, svg.as_bytes())
}

/// Colour of class `k`: the palette and the rest of matplotlib's tab10, then spread hues.
fn class_style(k: usize) -> ShapeStyle {
    const TAB10_REST: [RGBColor; 2] = [RGBColor(227, 119, 194), RGBColor(188, 189, 34)];
    match PALETTE.iter().chain(&TAB10_REST).nth(k) {
        Some(c) => c.filled(),
        None => HSLColor((k as f64 * 0.618_034).fract(), 0.55, 0.5).filled(),
    }
}

fn draw_class_histogram<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    counts: &[Vec<usize>],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| LabError::Plot {
        title: title.to_string(),
        reason: format!("{e:?}"),
    };
    /// Classes named in the legend; more would not fit.
    const LEGEND: usize = 24;
    root.fill(&WHITE).map_err(err)?;
    let (plot, legend) = root.split_horizontally(790);
    let clients = counts.len().max(1) as i32;
    let classes = counts.iter().map(Vec::len).max().unwrap_or(0);
    let tallest = counts
        .iter()
        .map(|c| c.iter().sum::<usize>())
        .max()
        .unwrap_or(0)
        .max(1);
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d((0..clients).into_segmented(), 0..tallest + tallest / 20 + 1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("client")
        .y_desc("samples")
        .draw()
        .map_err(err)?;
    for k in 0..classes {
        let bars = counts.iter().enumerate().filter_map(|(c, row)| {
            let below: usize = row[..k.min(row.len())].iter().sum();
            let n = row.get(k).copied().unwrap_or(0);
            let c = c as i32;
            (n > 0).then(|| {
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(c), below),
                        (SegmentValue::Exact(c + 1), below + n),
                    ],
                    class_style(k),
                );
                bar.set_margin(0, 0, 2, 2);
                bar
            })
        });
        chart.draw_series(bars).map_err(err)?;
    }
    for k in 0..classes.min(LEGEND) {
        let y = 40 + 20 * k as i32;
        legend
            .draw(&Rectangle::new([(8, y), (22, y + 14)], class_style(k)))
            .map_err(err)?;
        legend
            .draw(&Text::new(
                format!("class {k}"),
                (28, y),
                ("sans-serif", 14).into_font(),
            ))
            .map_err(err)?;
    }
    if classes > LEGEND {
        let y = 40 + 20 * LEGEND as i32;
        legend
            .draw(&Text::new(
                format!("... {} classes", classes),
                (8, y),
                ("sans-serif", 14).into_font(),
            ))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
