//! Weight matching (Ainsworth, Hayase & Srinivasa, "Git Re-Basin", ICLR 2023, section 3.2),
//! the data-free fixed-width baseline: every client is aligned to a reference (client 0) by one
//! permutation per matched layer, then all are averaged.
//!
//! The permutations maximise `sum over tensors <W_ref, P W_client>`, where a layer's units
//! appear in its own tensors (rows) and in its readers (input columns), so the problems are
//! coupled: as in the paper, one layer's permutation is solved as a linear assignment with the
//! others held fixed, layers in a random order, until a whole pass improves no layer (or
//! `max_iters` passes). Departure: the paper starts from identity permutations; we start with
//! one bottom-up pass in which each layer is aligned on its own tensors alone (its inputs
//! already aligned by the layer below), since from the identity a layer's readers, not yet
//! aligned, can outweigh its own rows and stall the descent in a wrong optimum (seen on small
//! conv nets whose permuted copies were not recovered). A unit's inner product covers the tensors of
//! `fedfuse_core::layers::unit_uses` that are parameters (weights, biases, norm scales and
//! shifts), not batch norm's running statistics, which are data statistics.

use std::borrow::Cow;
use std::collections::HashMap;

use fedfuse_core::Params;
use fedfuse_core::layers::{LayerSpec, TensorRole, UnitUse, UnitUses};
use fedfuse_core::linalg::{Mat, Parallelism, matmul_on};
use rand::Rng;
use rand::seq::SliceRandom;

use super::lists::{
    FusedLayers, ListClients, UnitAxis, client_weights, fuse_aligned, permute_units,
};
use super::types::check_score_size;
use crate::{FuseError, Result};

/// Settings of weight matching.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WeightMatchingConfig {
    /// Most passes over the layers per client (the paper's reference code: 100).
    pub max_iters: usize,
}

impl Default for WeightMatchingConfig {
    fn default() -> Self {
        Self { max_iters: 100 }
    }
}

impl WeightMatchingConfig {
    /// Checks every setting, naming the first that is out of range.
    pub fn check(&self) -> Result<()> {
        if self.max_iters == 0 || self.max_iters > super::settings::MAX_ITERS {
            return Err(FuseError::InvalidSetting {
                field: "max_iters",
                reason: format!(
                    "{} is outside 1..={}",
                    self.max_iters,
                    super::settings::MAX_ITERS
                ),
            });
        }
        Ok(())
    }
}

/// Weight matching of clients of one layer list (all at the list's widths): each client is
/// aligned to client 0, then the aligned models are averaged, weighted by each client's
/// examples (`class_counts` summed) or equally without counts; batch norms'
/// `num_batches_tracked` is rounded to a whole count. The layer order of each pass is drawn
/// from `rng`. Lists are refused as for [`crate::pfnm_fuse_layers`].
///
/// `assignments[g][j][u]` is the unit of client 0 that client `j`'s unit `u` of matched layer
/// `g` was aligned to.
pub fn weight_matching_fuse<R: Rng + ?Sized>(
    input: &[usize],
    layers: &[LayerSpec],
    clients: &[&Params],
    class_counts: Option<&[Vec<f64>]>,
    cfg: &WeightMatchingConfig,
    rng: &mut R,
) -> Result<FusedLayers> {
    cfg.check()?;
    let list = ListClients::fixed(input, layers, clients)?;
    if let Some(counts) = class_counts
        && counts.len() != list.len()
    {
        return Err(FuseError::InvalidInput(format!(
            "class counts for {} clients but {} models were given",
            counts.len(),
            list.len()
        )));
    }
    if layers.iter().any(LayerSpec::is_transformer) {
        return super::transformer::weight_matching_vit(
            input,
            layers,
            &list.params,
            class_counts,
            cfg.max_iters,
            rng,
        );
    }
    let uses = &list.uses[0];
    let mut clients = list.params.into_iter();
    let Some(reference) = clients.next() else {
        return Err(FuseError::Empty);
    };
    let mut assignments: Vec<Vec<Vec<usize>>> =
        uses.iter().map(|u| vec![(0..u.units).collect()]).collect();
    // Each client is permuted in its own copy (none is made of the reference): a model's
    // tensors can be hundreds of megabytes, and fresh pages cost more than the products.
    let mut permuted = Vec::with_capacity(clients.len());
    for client in clients {
        let perms = align(&reference, &client, uses, cfg.max_iters, rng)?;
        let mut p = client.into_owned();
        for (g, (u, perm)) in uses.iter().zip(&perms).enumerate() {
            permute_units(&mut p, u, perm)?;
            assignments[g].push(perm.clone());
        }
        permuted.push(Cow::Owned(p));
    }
    let mut aligned = vec![reference];
    aligned.append(&mut permuted);
    let weights = client_weights(class_counts, aligned.len());
    fuse_aligned(input, layers, aligned, &weights, assignments)
}

/// Which permutation group a weight's rows (axis 0) and its input columns (axis 1) belong to.
struct Sides<'a> {
    rows: HashMap<&'a str, usize>,
    cols: HashMap<&'a str, (usize, &'a UnitUse)>,
}

impl<'a> Sides<'a> {
    fn of(uses: &'a [UnitUses]) -> Self {
        let mut rows = HashMap::new();
        let mut cols = HashMap::new();
        for (g, u) in uses.iter().enumerate() {
            for o in u.own.iter().filter(|o| o.axis == 0) {
                rows.insert(o.tensor.as_str(), g);
            }
            for r in &u.readers {
                cols.insert(r.tensor.as_str(), (g, r));
            }
        }
        Self { rows, cols }
    }
}

/// One permutation per permutation group taking `client`'s units onto `reference`'s
/// (`perm[u]` = the reference unit of client unit `u`), by coordinate descent. A group tied
/// by a group norm is permuted within each of its norm groups only.
fn align<R: Rng + ?Sized>(
    reference: &Params,
    client: &Params,
    uses: &[UnitUses],
    max_iters: usize,
    rng: &mut R,
) -> Result<Vec<Vec<usize>>> {
    descend(reference, client, uses, max_iters, true, rng).map(|(perms, _)| perms)
}

/// [`align`], optionally scoring every group on every pass (`skip_unchanged` false: the
/// tests' check that skipping changes nothing); also returns how many times a group was
/// scored after the bottom-up pass.
fn descend<R: Rng + ?Sized>(
    reference: &Params,
    client: &Params,
    uses: &[UnitUses],
    max_iters: usize,
    skip_unchanged: bool,
    rng: &mut R,
) -> Result<(Vec<Vec<usize>>, usize)> {
    let mut perms: Vec<Vec<usize>> = uses.iter().map(|u| (0..u.units).collect()).collect();
    let sides = Sides::of(uses);
    let solve = |cost: &Vec<f64>, g: usize| -> Result<Vec<usize>> {
        let n = uses[g].units;
        let mut tied = None;
        let per = n / uses[g].tied.max(1);
        if per < n {
            let cost = tied.insert(cost.clone());
            // Pairs across norm groups: below every real score, so never chosen.
            let (lo, hi) = cost
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &c| {
                    (l.min(c), h.max(c))
                });
            let never = lo - (1.0 + hi - lo) * n as f64;
            for a in 0..n {
                for b in 0..n {
                    if a / per.max(1) != b / per.max(1) {
                        cost[a * n + b] = never;
                    }
                }
            }
        }
        let (_, cols) = lsap::solve(n, n, tied.as_ref().unwrap_or(cost), true).map_err(|e| {
            FuseError::Solver(format!(
                "weight matching of model.layers[{}] ({n} units): {e}",
                uses[g].layer
            ))
        })?;
        // `cols[a]` is the client unit put at reference unit `a`.
        let mut perm = vec![0; n];
        for (a, &b) in cols.iter().enumerate() {
            perm[b] = a;
        }
        Ok(perm)
    };
    // Start bottom-up, each group on its own tensors whose inputs are aligned already (its
    // readers are not aligned yet): from the identity, a group's readers can outweigh its
    // own rows and hold the descent in a wrong optimum.
    let mut scratch = Scratch::default();
    let mut score = |g: usize, perms: &[Vec<usize>], own_aligned: Option<&[bool]>| {
        group_similarity(
            reference,
            client,
            uses,
            g,
            perms,
            &sides,
            own_aligned,
            &mut scratch,
        )
    };
    // A group's scores depend on the permutations of the groups its weights read and of those
    // that write its readers' rows. When none has changed since the group was last scored,
    // scoring it again would give the same matrix and the same assignment, which did not
    // improve then: it is skipped, with the same result.
    let deps: Vec<Vec<usize>> = uses.iter().map(|u| depends_on(u, &sides)).collect();
    let mut clock = 0usize;
    let mut changed_at = vec![0usize; uses.len()];
    let mut scored_at: Vec<Option<usize>> = vec![None; uses.len()];
    let mut aligned = vec![false; uses.len()];
    for g in 0..uses.len() {
        let cost = score(g, &perms, Some(&aligned))?;
        perms[g] = solve(&cost, g)?;
        aligned[g] = true;
        clock += 1;
        changed_at[g] = clock;
    }
    let mut order: Vec<usize> = (0..uses.len()).collect();
    let mut scored = 0;
    for _ in 0..max_iters {
        order.shuffle(rng);
        let mut improved = false;
        for &g in &order {
            if skip_unchanged
                && scored_at[g].is_some_and(|t| deps[g].iter().all(|&h| changed_at[h] < t))
            {
                continue;
            }
            scored += 1;
            let n = uses[g].units;
            let cost = score(g, &perms, None)?;
            clock += 1;
            scored_at[g] = Some(clock);
            let perm = solve(&cost, g)?;
            let total =
                |p: &[usize]| -> f64 { p.iter().enumerate().map(|(b, &a)| cost[a * n + b]).sum() };
            let (old, new) = (total(&perms[g]), total(&perm));
            if new > old + 1e-12 * old.abs().max(1.0) {
                perms[g] = perm;
                improved = true;
                clock += 1;
                changed_at[g] = clock;
            }
        }
        if !improved {
            break;
        }
    }
    Ok((perms, scored))
}

/// The groups whose permutations enter the scores of the group with uses `u`
/// ([`group_similarity`]): those its weights' input columns belong to, and those that write
/// its readers' rows.
fn depends_on(u: &UnitUses, sides: &Sides<'_>) -> Vec<usize> {
    let mut deps: Vec<usize> = u
        .own
        .iter()
        .filter(|o| o.axis == 0)
        .filter_map(|o| sides.cols.get(o.tensor.as_str()).map(|&(h, _)| h))
        .chain(
            u.all()
                .filter(|r| r.axis != 0)
                .filter_map(|r| sides.rows.get(r.tensor.as_str()).copied()),
        )
        .collect();
    deps.sort_unstable();
    deps.dedup();
    deps
}

/// Reusable buffers of the scores: the units' values gathered as rows, and the `n x n` sum.
/// One set per alignment, so the large products do not fault in fresh pages on every call.
#[derive(Default)]
struct Scratch {
    lhs: Vec<f32>,
    rhs: Vec<f32>,
    sum: Vec<f32>,
}

/// Products of at least this many multiply-adds run on gemm's threads (burn-flex's
/// threshold, as the training code's linear layers).
const PARALLEL_PRODUCT: usize = 1 << 18;

/// `n x n` inner products of reference unit `a` (row) with client unit `b` (column) of group
/// `g`, over every parameter that holds or reads the units, with the client's other axes put
/// in the reference's order by the current permutations of the groups they belong to. With
/// `own_aligned`, only the group's own tensors whose inputs are raw or already aligned.
///
/// The products are f32 GEMMs, as the weights are: the scores only rank permutations, and
/// f32 halves the bytes and doubles the lanes of the f64 products used before (a
/// ResNet-18-sized pair: BENCHMARKS, "Weight matching of residual networks").
#[allow(clippy::too_many_arguments)]
fn group_similarity(
    reference: &Params,
    client: &Params,
    uses: &[UnitUses],
    g: usize,
    perms: &[Vec<usize>],
    sides: &Sides<'_>,
    own_aligned: Option<&[bool]>,
    scratch: &mut Scratch,
) -> Result<Vec<f64>> {
    let n = uses[g].units;
    check_score_size(n, n, || {
        format!(
            "weight matching of model.layers[{}] ({n} units)",
            uses[g].layer
        )
    })?;
    let Scratch { lhs, rhs, sum } = scratch;
    sum.clear();
    sum.resize(n * n, 0.0);
    let used: Vec<&UnitUse> = match own_aligned {
        None => uses[g].all().collect(),
        Some(done) => uses[g]
            .own
            .iter()
            .filter(|u| {
                sides
                    .cols
                    .get(u.tensor.as_str())
                    .is_none_or(|&(h, _)| done[h])
            })
            .collect(),
    };
    for u in used {
        if TensorRole::of(&u.tensor) != TensorRole::Param {
            continue;
        }
        let (ta, tb) = (reference.require(&u.tensor)?, client.require(&u.tensor)?);
        let axis = UnitAxis::of(u, &ta.shape)?;
        let k = axis.rows * axis.span;
        if k == 0 || tb.shape != ta.shape || ta.data.len() != n * k {
            return Err(FuseError::InvalidInput(format!(
                "tensor `{}`: {:?} and {:?} do not hold {n} units of the group",
                u.tensor, ta.shape, tb.shape
            )));
        }
        // Units as rows of `rows * span` values, the reference's rows in the client's order:
        // the inner products are one product.
        let (a, b): (&[f32], &[f32]) = if u.axis == 0 {
            // A weight's rows are its units already; its input side (axis 1) is read from
            // the group below, put in the reference's order.
            let b = match sides.cols.get(u.tensor.as_str()) {
                Some(&(h, reader)) => {
                    let inputs = UnitAxis::of(reader, &tb.shape)?;
                    gather_inputs(&tb.data, &inputs, &perms[h], rhs);
                    &rhs[..]
                }
                None => &tb.data[..],
            };
            (&ta.data[..], b)
        } else {
            // A reader's units are its input columns, in every row; its rows belong to the
            // group it writes.
            let row_perm = sides.rows.get(u.tensor.as_str()).map(|&h| &perms[h][..]);
            gather_columns(&ta.data, &axis, row_perm, lhs);
            gather_columns(&tb.data, &axis, None, rhs);
            (&lhs[..], &rhs[..])
        };
        let parallelism = match n * n * k >= PARALLEL_PRODUCT {
            true => Parallelism::Rayon(0),
            false => Parallelism::None,
        };
        matmul_on(
            sum,
            (n, 1),
            Mat::rows(a, n, k, k),
            Mat::rows(b, n, k, k).t(),
            true,
            parallelism,
        );
    }
    Ok(sum.iter().map(|&x| f64::from(x)).collect())
}

/// `data` (a weight whose rows hold units of another group, `inputs` its input axis) with
/// each row's input units put where the reference has them: client input unit `u` moves to
/// `perm[u]`.
fn gather_inputs(data: &[f32], inputs: &UnitAxis, perm: &[usize], out: &mut Vec<f32>) {
    let mut from = vec![0; perm.len()];
    for (u, &to) in perm.iter().enumerate() {
        from[to] = u;
    }
    out.clear();
    for r in 0..inputs.rows {
        for &u in &from {
            out.extend_from_slice(&data[inputs.at(r, u)..][..inputs.span]);
        }
    }
}

/// The units of a reader (`axis`: units along its axis 1) as rows of `rows * span` values:
/// row `a` holds unit `a`'s span of every row, row `r` taken from row `row_perm[r]` where
/// the reference's rows are put in the client's order.
fn gather_columns(data: &[f32], axis: &UnitAxis, row_perm: Option<&[usize]>, out: &mut Vec<f32>) {
    out.clear();
    for a in 0..axis.units {
        for rb in 0..axis.rows {
            let ra = row_perm.map_or(rb, |p| p[rb]);
            out.extend_from_slice(&data[axis.at(ra, a)..][..axis.span]);
        }
    }
}

#[cfg(test)]
mod tests {
    use fedfuse_core::layers::{self, FeatureShape};
    use fedfuse_core::{BlockNorm, LayerSpec, Params};
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use rand_distr::{Distribution, StandardNormal};

    use super::super::lists::ListClients;
    use super::descend;

    /// Two independently drawn residual networks (not permutations of each other) take
    /// several passes to settle; skipping groups whose inputs did not change finds the same
    /// permutations with fewer scorings. 40 pairs: with a reader's rows left out of a
    /// group's inputs, one pair of the first ten and more of the forty come out different.
    #[test]
    fn skipping_unchanged_groups_changes_no_permutation() {
        let input = [3, 8, 8];
        let layers = [
            LayerSpec::conv2d(8, 3).with_padding(1),
            LayerSpec::batch_norm2d(),
            LayerSpec::Relu,
            LayerSpec::residual(8, 1, BlockNorm::Batch),
            LayerSpec::residual(8, 1, BlockNorm::Batch),
            LayerSpec::residual(12, 2, BlockNorm::Batch),
            LayerSpec::residual(12, 1, BlockNorm::Batch),
            LayerSpec::GlobalAvgpool,
            LayerSpec::Flatten,
            LayerSpec::linear(3),
        ];
        let (_, layout) = layers::chain(FeatureShape::of(&input).unwrap(), &layers).unwrap();
        let mut draw = StdRng::seed_from_u64(5);
        let mut random = || {
            let mut p = Params::new();
            for s in &layout {
                let len = s.shape.iter().product();
                let data = (0..len).map(|_| StandardNormal.sample(&mut draw)).collect();
                p.push(s.name.clone(), s.shape.clone(), data).unwrap();
            }
            p
        };
        let mut saved = 0;
        for seed in 0..40 {
            let (a, b) = (random(), random());
            let list = ListClients::fixed(&input, &layers, &[&a, &b]).unwrap();
            let uses = &list.uses[0];
            let run = |skip| {
                let mut rng = StdRng::seed_from_u64(seed);
                descend(&list.params[0], &list.params[1], uses, 100, skip, &mut rng).unwrap()
            };
            let ((every, all_scored), (skipping, fewer)) = (run(false), run(true));
            assert_eq!(skipping, every, "seed {seed}");
            assert!(fewer <= all_scored);
            saved += all_scored - fewer;
        }
        assert!(saved > 0, "no group was ever skipped");
    }
}
