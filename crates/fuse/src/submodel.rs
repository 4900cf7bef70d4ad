//! Sub-networks of an MLP: keep some hidden units of every layer (PFNM's matched sub-models
//! for extra rounds, FedDrop's per-round sub-models) and write a trained sub-network back.
//!
//! Hidden layer `l` keeps units `kept[l]` in the given order: rows `kept[l]` of
//! `layers.{l}.weight` and `layers.{l}.bias`, and columns `kept[l]` of `layers.{l+1}.weight`.
//! Input columns and output rows are always kept.

use fedfuse_core::Params;

use crate::{FuseError, Result};

fn bad(reason: String) -> FuseError {
    FuseError::InvalidInput(reason)
}

/// Rows and columns of layer `i` that `kept` selects (`None`: all).
fn selection(kept: &[Vec<usize>], i: usize) -> (Option<&[usize]>, Option<&[usize]>) {
    let rows = kept.get(i).map(Vec::as_slice);
    let cols = i
        .checked_sub(1)
        .and_then(|b| kept.get(b))
        .map(Vec::as_slice);
    (rows, cols)
}

/// The `[out, in]` weight and `[out]` bias of layer `i`, with their shapes checked.
fn layer(params: &Params, i: usize) -> Result<(String, String, usize, usize)> {
    let (wn, bn) = (format!("layers.{i}.weight"), format!("layers.{i}.bias"));
    let w = params.require(&wn)?;
    let b = params.require(&bn)?;
    let &[rows, cols] = w.shape.as_slice() else {
        return Err(bad(format!(
            "`{wn}` has shape {:?}, not [out, in]",
            w.shape
        )));
    };
    if b.shape != [rows] {
        return Err(bad(format!("`{bn}` has shape {:?}, not [{rows}]", b.shape)));
    }
    Ok((wn, bn, rows, cols))
}

fn check_units(units: &[usize], limit: usize, what: &str) -> Result<()> {
    match units.iter().find(|&&u| u >= limit) {
        Some(u) => Err(bad(format!("{what}: unit {u} is outside 0..{limit}"))),
        None => Ok(()),
    }
}

fn layers_of(params: &Params, kept: &[Vec<usize>]) -> Result<usize> {
    let layers = params.len() / 2;
    if !params.len().is_multiple_of(2) || layers != kept.len() + 1 {
        return Err(bad(format!(
            "an MLP of {} tensors does not have {} hidden layers",
            params.len(),
            kept.len()
        )));
    }
    Ok(layers)
}

/// The sub-network of `full` that keeps hidden units `kept[l]` of every hidden layer `l`.
pub fn sub_model(full: &Params, kept: &[Vec<usize>]) -> Result<Params> {
    let layers = layers_of(full, kept)?;
    let mut out = Params::new();
    for i in 0..layers {
        let (wn, bn, rows_full, cols_full) = layer(full, i)?;
        let (rows, cols) = selection(kept, i);
        let rows: Vec<usize> = rows.map_or_else(|| (0..rows_full).collect(), <[usize]>::to_vec);
        let cols: Vec<usize> = cols.map_or_else(|| (0..cols_full).collect(), <[usize]>::to_vec);
        check_units(&rows, rows_full, &wn)?;
        check_units(&cols, cols_full, &wn)?;
        let w = &full.require(&wn)?.data;
        let b = &full.require(&bn)?.data;
        let mut data = Vec::with_capacity(rows.len() * cols.len());
        for &r in &rows {
            let row = &w[r * cols_full..(r + 1) * cols_full];
            data.extend(cols.iter().map(|&c| row[c]));
        }
        let bias = rows.iter().map(|&r| b[r]).collect();
        out.push(wn, vec![rows.len(), cols.len()], data)?;
        out.push(bn, vec![rows.len()], bias)?;
    }
    Ok(out)
}

/// Writes `sub` (a sub-network taken with the same `kept`) back into `full`; the coordinates
/// `sub` does not cover keep their values.
pub fn scatter_sub_model(full: &mut Params, sub: &Params, kept: &[Vec<usize>]) -> Result<()> {
    let layers = layers_of(full, kept)?;
    for i in 0..layers {
        let (wn, bn, rows_full, cols_full) = layer(full, i)?;
        let (rows, cols) = selection(kept, i);
        let rows: Vec<usize> = rows.map_or_else(|| (0..rows_full).collect(), <[usize]>::to_vec);
        let cols: Vec<usize> = cols.map_or_else(|| (0..cols_full).collect(), <[usize]>::to_vec);
        check_units(&rows, rows_full, &wn)?;
        check_units(&cols, cols_full, &wn)?;
        let sw = sub.require(&wn)?;
        let sb = sub.require(&bn)?;
        if sw.shape != [rows.len(), cols.len()] || sb.shape != [rows.len()] {
            return Err(bad(format!(
                "`{wn}` of the sub-network has shape {:?} where [{}, {}] was expected",
                sw.shape,
                rows.len(),
                cols.len()
            )));
        }
        let w = &mut full
            .get_mut(&wn)
            .ok_or_else(|| bad(format!("`{wn}` is missing")))?
            .data;
        for (k, &r) in rows.iter().enumerate() {
            let src = &sw.data[k * cols.len()..(k + 1) * cols.len()];
            let dst = &mut w[r * cols_full..(r + 1) * cols_full];
            for (&c, &v) in cols.iter().zip(src) {
                dst[c] = v;
            }
        }
        let b = &mut full
            .get_mut(&bn)
            .ok_or_else(|| bad(format!("`{bn}` is missing")))?
            .data;
        for (&r, &v) in rows.iter().zip(&sb.data) {
            b[r] = v;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn net() -> Params {
        // 2 inputs -> 3 hidden -> 2 classes.
        let mut p = Params::new();
        p.push("layers.0.weight", vec![3, 2], vec![1., 2., 3., 4., 5., 6.])
            .unwrap();
        p.push("layers.0.bias", vec![3], vec![0.1, 0.2, 0.3])
            .unwrap();
        p.push(
            "layers.1.weight",
            vec![2, 3],
            vec![7., 8., 9., 10., 11., 12.],
        )
        .unwrap();
        p.push("layers.1.bias", vec![2], vec![0.5, 0.6]).unwrap();
        p
    }

    #[test]
    fn takes_rows_and_columns_of_the_kept_units() {
        let sub = sub_model(&net(), &[vec![2, 0]]).unwrap();
        assert_eq!(
            sub.require("layers.0.weight").unwrap().data,
            vec![5., 6., 1., 2.]
        );
        assert_eq!(sub.require("layers.0.bias").unwrap().data, vec![0.3, 0.1]);
        assert_eq!(sub.require("layers.1.weight").unwrap().shape, vec![2, 2]);
        assert_eq!(
            sub.require("layers.1.weight").unwrap().data,
            vec![9., 7., 12., 10.]
        );
        assert_eq!(sub.require("layers.1.bias").unwrap().data, vec![0.5, 0.6]);
        assert!(sub_model(&net(), &[vec![3, 0]]).is_err());
        assert!(sub_model(&net(), &[vec![0], vec![0]]).is_err());
    }

    #[test]
    fn scatter_inverts_sub_model_and_leaves_the_rest() {
        let full = net();
        let kept = [vec![2, 0]];
        let mut sub = sub_model(&full, &kept).unwrap();
        for (_, t) in sub.iter_mut() {
            for v in &mut t.data {
                *v += 100.0;
            }
        }
        let mut back = full.clone();
        scatter_sub_model(&mut back, &sub, &kept).unwrap();
        assert_eq!(
            back.require("layers.0.weight").unwrap().data,
            vec![101., 102., 3., 4., 105., 106.]
        );
        assert_eq!(
            back.require("layers.0.bias").unwrap().data,
            vec![100.1, 0.2, 100.3]
        );
        assert_eq!(
            back.require("layers.1.weight").unwrap().data,
            vec![107., 8., 109., 110., 11., 112.]
        );
        assert_eq!(
            back.require("layers.1.bias").unwrap().data,
            vec![100.5, 100.6]
        );
        // Taking the same sub-network again gives the written values.
        assert_eq!(sub_model(&back, &kept).unwrap(), sub);
        let wrong = sub_model(&full, &[vec![1]]).unwrap();
        assert!(scatter_sub_model(&mut back, &wrong, &kept).is_err());
    }
}
