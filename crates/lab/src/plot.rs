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

/// Writes `accuracy_vs_round.{png,svg}` and `accuracy_vs_bytes.{png,svg}` into `out`.
pub fn write_plots(out: &Path, rounds: &[RoundMetrics]) -> Result<()> {
    let mut cumulative = 0u64;
    let by_bytes: Vec<(f64, f64, f64)> = rounds
        .iter()
        .map(|r| {
            cumulative += r.bytes_up + r.bytes_down;
            (cumulative as f64 / 1e6, r.global_accuracy, 0.0)
        })
        .collect();
    let by_round: Vec<(f64, f64, f64)> = rounds
        .iter()
        .map(|r| (r.round as f64, r.global_accuracy, 0.0))
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
