//! A sweep's tables and plots: the rows as `results.csv`, their means over seeds as
//! `summary.csv` and `summary.md`, and the accuracy plots.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::error::Result;

use super::config::method_key;
use super::{Row, SweepConfig, SweepMethod};
use crate::table::{mean_std, write_atomic};

pub(super) fn write_rows(out: &Path, rows: &[Row]) -> Result<()> {
    let mut csv = String::from(
        "partition,clients,hidden,layers,seed,round,method,accuracy,loss,widths,eps,sigma,seconds\n",
    );
    for r in rows {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},{:.3}",
            r.partition,
            r.clients,
            r.hidden,
            r.layers,
            r.seed,
            r.round,
            method_key(r.method),
            r.accuracy,
            r.loss,
            r.widths,
            r.eps.map_or(String::new(), |e| e.to_string()),
            r.sigma.map_or(String::new(), |e| e.to_string()),
            r.seconds
        );
    }
    write_atomic(&out.join("results.csv"), csv.as_bytes())
}

/// Mean and spread over seeds of one (partition, clients, hidden, round, method).
#[derive(Clone, Debug)]
pub(super) struct Summary {
    partition: String,
    clients: usize,
    hidden: String,
    layers: usize,
    round: usize,
    method: SweepMethod,
    n: usize,
    accuracy_mean: f64,
    accuracy_std: f64,
    loss_mean: f64,
    /// Mean total hidden width.
    width_mean: f64,
    eps: Vec<f64>,
    sigma: Vec<f64>,
}

pub(super) fn summarise(rows: &[Row]) -> Vec<Summary> {
    /// (partition, layers, clients, hidden, round, method)
    type Key = (String, usize, usize, String, usize, SweepMethod);
    let mut groups: BTreeMap<Key, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        groups
            .entry((
                r.partition.clone(),
                r.layers,
                r.clients,
                r.hidden.clone(),
                r.round,
                r.method,
            ))
            .or_default()
            .push(r);
    }
    groups
        .into_iter()
        .map(|((partition, layers, clients, hidden, round, method), g)| {
            let acc: Vec<f64> = g.iter().map(|r| r.accuracy).collect();
            let (accuracy_mean, accuracy_std) = mean_std(&acc);
            let widths: Vec<f64> = g
                .iter()
                .filter_map(|r| r.widths.total())
                .map(|w| w as f64)
                .collect();
            Summary {
                partition,
                clients,
                hidden,
                layers,
                round,
                method,
                n: g.len(),
                accuracy_mean,
                accuracy_std,
                loss_mean: g.iter().map(|r| r.loss).sum::<f64>() / g.len() as f64,
                width_mean: if widths.is_empty() {
                    f64::NAN
                } else {
                    widths.iter().sum::<f64>() / widths.len() as f64
                },
                eps: g.iter().filter_map(|r| r.eps).collect(),
                sigma: g.iter().filter_map(|r| r.sigma).collect(),
            }
        })
        .collect()
}

pub(super) fn write_summary(out: &Path, cfg: &SweepConfig, summary: &[Summary]) -> Result<()> {
    let mut csv = String::from(
        "partition,clients,hidden,layers,round,method,seeds,accuracy_mean,accuracy_std,loss_mean,\
         hidden_units_mean,eps_chosen,sigma_chosen\n",
    );
    let mut md = format!(
        "# {}\n\nDataset `{}`; {} seed(s); test accuracy, mean ± std over seeds; hidden units = \
         total global hidden width (mean); eps and sigma as chosen on the validation split, one \
         per seed.\n\n| partition | J | hidden | round | method | accuracy | hidden units | eps \
         chosen | sigma chosen |\n|---|---|---|---|---|---|---|---|---|\n",
        cfg.title,
        cfg.dataset,
        cfg.seeds.len()
    );
    let joined = |v: &[f64]| {
        v.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let or_dash = |s: String| if s.is_empty() { "–".to_string() } else { s };
    for s in summary {
        let (eps, sigma) = (joined(&s.eps), joined(&s.sigma));
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},{}",
            s.partition,
            s.clients,
            s.hidden,
            s.layers,
            s.round,
            method_key(s.method),
            s.n,
            s.accuracy_mean,
            s.accuracy_std,
            s.loss_mean,
            s.width_mean,
            eps,
            sigma
        );
        let width = if s.width_mean.is_nan() {
            "–".to_string()
        } else {
            format!("{:.0}", s.width_mean)
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.4} ± {:.4} | {} | {} | {} |",
            s.partition,
            s.clients,
            s.hidden,
            s.round,
            s.method.label(),
            s.accuracy_mean,
            s.accuracy_std,
            width,
            or_dash(eps),
            or_dash(sigma)
        );
    }
    write_atomic(&out.join("summary.csv"), csv.as_bytes())?;
    write_atomic(&out.join("summary.md"), md.as_bytes())
}

/// Lines of the sweep's plots: one chart per partition (and per fixed other axis), x the axis
/// that varies (round, clients or depth), one line per method.
pub(super) fn sweep_lines(cfg: &SweepConfig, summary: &[Summary]) -> Vec<crate::plot::Chart> {
    let axis = if cfg.rounds > 1 {
        "round"
    } else if cfg.clients.len() > 1 || cfg.hidden.len() == 1 {
        "clients"
    } else {
        "hidden layers"
    };
    type Points = Vec<(f64, f64, f64)>;
    let mut charts: BTreeMap<String, BTreeMap<SweepMethod, Points>> = BTreeMap::new();
    for s in summary {
        let (facet, x) = match axis {
            "round" => (
                format!("{}, J={}, hidden {}", s.partition, s.clients, s.hidden),
                s.round as f64,
            ),
            "clients" => (
                format!("{}, hidden {}", s.partition, s.hidden),
                s.clients as f64,
            ),
            _ => (format!("{}, J={}", s.partition, s.clients), s.layers as f64),
        };
        charts
            .entry(facet)
            .or_default()
            .entry(s.method)
            .or_default()
            .push((x, s.accuracy_mean, s.accuracy_std));
    }
    charts
        .into_iter()
        .map(|(facet, lines)| crate::plot::Chart {
            title: format!("{}: {facet}", cfg.title),
            x_label: axis.to_string(),
            lines: lines
                .into_iter()
                .map(|(m, points)| crate::plot::Line {
                    label: m.label().to_string(),
                    points,
                })
                .collect(),
        })
        .collect()
}
