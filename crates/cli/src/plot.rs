//! Accuracy against round and against bytes communicated, as PNG and SVG.

use std::path::Path;
use std::sync::Once;

use anyhow::{Result, anyhow};
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

struct Series<'a> {
    title: &'a str,
    x_label: &'a str,
    points: Vec<(f64, f64)>,
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, s: &Series<'_>) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plot `{}`: {e:?}", s.title);
    root.fill(&WHITE).map_err(err)?;
    let x_max = s.points.iter().map(|p| p.0).fold(1.0, f64::max);
    let x_min = s.points.iter().map(|p| p.0).fold(x_max, f64::min).min(0.0);
    let y_min = s.points.iter().map(|p| p.1).fold(1.0, f64::min).min(0.9);
    let mut chart = ChartBuilder::on(&root)
        .caption(s.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(x_min..x_max * 1.02, (y_min - 0.02).max(0.0)..1.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(s.x_label)
        .y_desc("global test accuracy")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            s.points.iter().copied(),
            BLUE.stroke_width(2),
        ))
        .map_err(err)?;
    chart
        .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Writes `accuracy_vs_round.{png,svg}` and `accuracy_vs_bytes.{png,svg}` into `out`.
pub fn write_plots(out: &Path, rounds: &[RoundMetrics]) -> Result<()> {
    register_font();
    let mut cumulative = 0u64;
    let by_bytes: Vec<(f64, f64)> = rounds
        .iter()
        .map(|r| {
            cumulative += r.bytes_up + r.bytes_down;
            (cumulative as f64 / 1e6, r.global_accuracy)
        })
        .collect();
    let by_round: Vec<(f64, f64)> = rounds
        .iter()
        .map(|r| (r.round as f64, r.global_accuracy))
        .collect();
    let plots = [
        (
            "accuracy_vs_round",
            Series {
                title: "accuracy per round",
                x_label: "round",
                points: by_round,
            },
        ),
        (
            "accuracy_vs_bytes",
            Series {
                title: "accuracy per traffic",
                x_label: "MB communicated (up + down)",
                points: by_bytes,
            },
        ),
    ];
    for (stem, series) in &plots {
        let png = out.join(format!("{stem}.png"));
        draw(
            BitMapBackend::new(&png, (800, 500)).into_drawing_area(),
            series,
        )?;
        let svg = out.join(format!("{stem}.svg"));
        draw(
            SVGBackend::new(&svg, (800, 500)).into_drawing_area(),
            series,
        )?;
    }
    Ok(())
}
