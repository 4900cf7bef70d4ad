//! Each partitioner's algorithm, on sample indices.

use rand::seq::SliceRandom;
use rand::{Rng, RngExt};
use rand_distr::{Gamma, StandardNormal};

use crate::error::{DataError, Result};
use crate::tabular::Column;

use super::spec::{ClassAssignment, DIRICHLET_TRIES, GroupMode, PartitionSpec};

/// Sizes of `n` items cut into `k` near-equal contiguous blocks (`np.array_split`).
pub(super) fn split_sizes(n: usize, k: usize) -> impl Iterator<Item = usize> {
    (0..k).map(move |i| n / k + usize::from(i < n % k))
}

/// Cuts `items` into `k` near-equal contiguous blocks (`np.array_split`).
pub(super) fn array_split(items: &[usize], k: usize) -> Vec<Vec<usize>> {
    let mut start = 0;
    split_sizes(items.len(), k)
        .map(|len| {
            let block = items[start..start + len].to_vec();
            start += len;
            block
        })
        .collect()
}

pub(super) fn iid(n: usize, clients: usize, rng: &mut impl Rng) -> Vec<Vec<usize>> {
    let mut perm: Vec<usize> = (0..n).collect();
    perm.shuffle(rng);
    array_split(&perm, clients)
}

/// A global shuffle, then contiguous blocks of the given sizes (which sum to at most `n`).
pub(super) fn contiguous(n: usize, sizes: &[usize], rng: &mut impl Rng) -> Vec<Vec<usize>> {
    let mut perm: Vec<usize> = (0..n).collect();
    perm.shuffle(rng);
    let mut start = 0;
    sizes
        .iter()
        .map(|&len| {
            let block = perm[start..start + len].to_vec();
            start += len;
            block
        })
        .collect()
}

/// Client sizes of Flower's `IdToSizeFncPartitioner`: `floor(n * f(id) / sum f)` for ids
/// `1..=clients`, the left-over samples to the last client.
pub(super) fn id_to_size_sizes(f: impl Fn(f64) -> f64, n: usize, clients: usize) -> Vec<usize> {
    let units: Vec<f64> = (1..=clients).map(|id| f(id as f64)).collect();
    // numpy's pairwise sum equals this left-to-right sum for fewer than 9 terms and for the
    // integer-valued units of linear and square.
    let total: f64 = units.iter().sum();
    let mut sizes: Vec<usize> = units
        .iter()
        .map(|u| (u / total * n as f64) as usize)
        .collect();
    let assigned: usize = sizes.iter().sum();
    if let Some(last) = sizes.last_mut() {
        *last += n.saturating_sub(assigned);
    }
    sizes
}

pub(super) fn id_to_size(
    spec: &PartitionSpec,
    f: impl Fn(f64) -> f64,
    n: usize,
    clients: usize,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let sizes = id_to_size_sizes(f, n, clients);
    // A few sizes and the count: thousands of clients would make a page of numbers.
    let shown = match sizes.len() {
        len if len > 6 => format!("{:?} ... ({len} clients)", &sizes[..6]),
        _ => format!("{sizes:?}"),
    };
    if let Some(i) = sizes.iter().position(|&s| s == 0) {
        return Err(DataError::Partition(format!(
            "{} over {clients} clients of {n} samples gives client {i} no sample (sizes \
             {shown}); use fewer clients",
            spec.kind()
        )));
    }
    if sizes.iter().sum::<usize>() != n {
        return Err(DataError::Partition(format!(
            "{} over {clients} clients of {n} samples gives sizes {shown}, which do not sum \
             to {n}; use fewer clients",
            spec.kind()
        )));
    }
    Ok(contiguous(n, &sizes, rng))
}

/// Indices of each class, in order.
pub(super) fn by_class(labels: &[u32], num_classes: usize) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); num_classes];
    for (i, &l) in labels.iter().enumerate() {
        out[l as usize].push(i);
    }
    out
}

/// One draw of `Dir(alpha, ..., alpha)` with `k` components.
pub(super) fn dirichlet_draw(k: usize, gamma: &Gamma<f64>, rng: &mut impl Rng) -> Vec<f64> {
    let mut p: Vec<f64> = (0..k).map(|_| rng.sample(gamma)).collect();
    let s: f64 = p.iter().sum();
    if s > 0.0 && s.is_finite() {
        p.iter_mut().for_each(|v| *v /= s);
    } else {
        // Every gamma draw underflowed (tiny alpha): all the mass goes to one client.
        p.iter_mut().for_each(|v| *v = 0.0);
        p[rng.random_range(0..k)] = 1.0;
    }
    p
}

pub(super) fn gamma(alpha: f64) -> Result<Gamma<f64>> {
    Gamma::new(alpha, 1.0)
        .map_err(|e| DataError::Partition(format!("Dirichlet alpha {alpha} is not usable: {e}")))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn dirichlet(
    labels: &[u32],
    num_classes: usize,
    clients: usize,
    alpha: f64,
    min_size: usize,
    self_balancing: bool,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let n = labels.len();
    if clients.saturating_mul(min_size) > n {
        return Err(DataError::Partition(format!(
            "{clients} clients x min_partition_size {min_size} = {} exceeds the {n} samples; \
             lower the number of clients or min_partition_size",
            clients.saturating_mul(min_size)
        )));
    }
    let gamma = gamma(alpha)?;
    let classes = by_class(labels, num_classes);
    let avg = n as f64 / clients as f64;
    let mut smallest = 0;
    for _ in 0..DIRICHLET_TRIES {
        let mut parts: Vec<Vec<usize>> = vec![Vec::new(); clients];
        for class in &classes {
            if class.is_empty() {
                continue;
            }
            let mut idx = class.clone();
            idx.shuffle(rng);
            let mut p = dirichlet_draw(clients, &gamma, rng);
            if self_balancing {
                let masked: Vec<f64> = p
                    .iter()
                    .zip(&parts)
                    .map(|(&pj, part)| if (part.len() as f64) < avg { pj } else { 0.0 })
                    .collect();
                let s: f64 = masked.iter().sum();
                if s > 0.0 {
                    p = masked.into_iter().map(|v| v / s).collect();
                }
            }
            // Split points: floor(cumsum(p) * n_k), the last one forced to n_k.
            let nk = idx.len();
            let mut cum = 0.0;
            let mut start = 0;
            for (j, pj) in p.iter().enumerate() {
                cum += pj;
                let end = if j + 1 == clients {
                    nk
                } else {
                    ((cum * nk as f64) as usize).clamp(start, nk)
                };
                parts[j].extend_from_slice(&idx[start..end]);
                start = end;
            }
        }
        smallest = parts.iter().map(Vec::len).min().unwrap_or(0);
        if smallest >= min_size {
            return Ok(parts);
        }
    }
    Err(DataError::Partition(format!(
        "Dirichlet(alpha = {alpha}) over {clients} clients left a client with {smallest} samples, \
         below min_partition_size = {min_size}, in each of {DIRICHLET_TRIES} tries; use fewer \
         clients, a larger alpha, a smaller min_partition_size, or self_balancing"
    )))
}

pub(super) fn inner_dirichlet(
    labels: &[u32],
    num_classes: usize,
    sizes: &[usize],
    alpha: f64,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let n = labels.len();
    let total = sizes.iter().sum::<usize>();
    if total > n {
        return Err(DataError::Partition(format!(
            "inner_dirichlet: partition_sizes sum to {total} but there are only {n} samples; \
             lower them"
        )));
    }
    let gamma = gamma(alpha)?;
    // The classes present, each with its samples; a class's samples are handed out from the
    // end of its list.
    let classes: Vec<Vec<usize>> = by_class(labels, num_classes)
        .into_iter()
        .filter(|c| !c.is_empty())
        .collect();
    let priors: Vec<Vec<f64>> = sizes
        .iter()
        .map(|_| dirichlet_draw(classes.len(), &gamma, rng))
        .collect();
    let mut class_left: Vec<usize> = classes.iter().map(Vec::len).collect();
    let mut left = sizes.to_vec();
    let mut open: Vec<usize> = (0..sizes.len()).filter(|&p| left[p] > 0).collect();
    let mut parts: Vec<Vec<usize>> = sizes.iter().map(|&s| Vec::with_capacity(s)).collect();
    while !open.is_empty() {
        let slot = rng.random_range(0..open.len());
        let p = open[slot];
        // The prior with exhausted classes at zero, renormalised: a draw proportional to the
        // remaining classes' weights. Should every remaining class have underflowed to zero
        // weight (tiny alpha), the draw is uniform over the remaining classes.
        let weight = |c: usize| if class_left[c] > 0 { priors[p][c] } else { 0.0 };
        let mass: f64 = (0..classes.len()).map(weight).sum();
        let c = if mass > 0.0 {
            let u = rng.random::<f64>() * mass;
            let mut cum = 0.0;
            let mut pick = None;
            for c in (0..classes.len()).filter(|&c| weight(c) > 0.0) {
                cum += weight(c);
                pick = Some(c);
                if u < cum {
                    break;
                }
            }
            pick
        } else {
            let remaining: Vec<usize> = (0..classes.len()).filter(|&c| class_left[c] > 0).collect();
            (!remaining.is_empty()).then(|| remaining[rng.random_range(0..remaining.len())])
        };
        let Some(c) = c else {
            break; // cannot happen: the sizes sum to at most n
        };
        class_left[c] -= 1;
        parts[p].push(classes[c][class_left[c]]);
        left[p] -= 1;
        if left[p] == 0 {
            open.remove(slot);
        }
    }
    Ok(parts)
}

pub(super) fn pathological(
    labels: &[u32],
    num_classes: usize,
    clients: usize,
    k: usize,
    mode: ClassAssignment,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let classes = by_class(labels, num_classes);
    let present: Vec<usize> = (0..num_classes)
        .filter(|&c| !classes[c].is_empty())
        .collect();
    let n_present = present.len();
    if k == 0 || k > n_present {
        return Err(DataError::Partition(format!(
            "classes_per_client = {k} must be between 1 and the {n_present} classes present in \
             the labels"
        )));
    }
    let owned = match mode {
        ClassAssignment::Random => random_classes(&present, num_classes, clients, k, rng),
        ClassAssignment::Deterministic => (0..clients)
            .map(|i| (0..k).map(|j| present[(i + j) % n_present]).collect())
            .collect(),
        ClassAssignment::FirstDeterministic => (0..clients)
            .map(|i| {
                let first = present[i % n_present];
                let mut rest: Vec<usize> =
                    present.iter().copied().filter(|&c| c != first).collect();
                rest.shuffle(rng);
                rest.truncate(k - 1);
                std::iter::once(first).chain(rest).collect()
            })
            .collect(),
    };
    let mut owners: Vec<Vec<usize>> = vec![Vec::new(); num_classes];
    for (i, cs) in owned.iter().enumerate() {
        for &c in cs {
            owners[c].push(i);
        }
    }
    if mode != ClassAssignment::Random
        && let Some(c) = (0..num_classes).find(|&c| owners[c].len() > classes[c].len())
    {
        return Err(DataError::Partition(format!(
            "class {c} has {} samples but class_assignment_mode `{}` gives it to {} clients; \
             use fewer clients or classes_per_client",
            classes[c].len(),
            if mode == ClassAssignment::Deterministic {
                "deterministic"
            } else {
                "first-deterministic"
            },
            owners[c].len()
        )));
    }
    let mut parts: Vec<Vec<usize>> = vec![Vec::new(); clients];
    for (c, own) in owners.iter().enumerate() {
        if own.is_empty() {
            continue;
        }
        let mut idx = classes[c].clone();
        idx.shuffle(rng);
        for (block, &client) in array_split(&idx, own.len()).into_iter().zip(own) {
            parts[client].extend(block);
        }
    }
    Ok(parts)
}

/// Random class assignment: each client `k` distinct classes of `present`, then repaired so
/// that every class is owned when `clients * k >= present.len()`.
pub(super) fn random_classes(
    present: &[usize],
    num_classes: usize,
    clients: usize,
    k: usize,
    rng: &mut impl Rng,
) -> Vec<Vec<usize>> {
    let mut owned: Vec<Vec<usize>> = (0..clients)
        .map(|_| {
            let mut pool = present.to_vec();
            pool.shuffle(rng);
            pool.truncate(k);
            pool
        })
        .collect();
    // Repair: while a class is unowned and some class has two owners, hand one of those
    // owners the unowned class instead. Possible whenever clients * k >= classes.
    if clients * k >= present.len() {
        loop {
            let mut count = vec![0usize; num_classes];
            owned.iter().flatten().for_each(|&c| count[c] += 1);
            let unowned: Vec<usize> = present.iter().copied().filter(|&c| count[c] == 0).collect();
            if unowned.is_empty() {
                break;
            }
            let target = unowned[rng.random_range(0..unowned.len())];
            let slots: Vec<(usize, usize)> = owned
                .iter()
                .enumerate()
                .flat_map(|(i, cs)| cs.iter().enumerate().map(move |(j, &c)| (i, j, c)))
                .filter(|&(_, _, c)| count[c] >= 2)
                .map(|(i, j, _)| (i, j))
                .collect();
            if slots.is_empty() {
                break; // cannot happen when clients * k >= classes
            }
            let (i, j) = slots[rng.random_range(0..slots.len())];
            owned[i][j] = target;
        }
    }
    owned
}

pub(super) fn shards(
    labels: &[u32],
    clients: usize,
    per_client: usize,
    shard_size: usize,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let n = labels.len();
    let needed = clients
        .saturating_mul(per_client)
        .saturating_mul(shard_size);
    if needed > n {
        return Err(DataError::Partition(format!(
            "{clients} clients x {per_client} shards x {shard_size} samples = {needed} exceeds the \
             {n} samples; lower the number of clients, shards_per_client or shard_size"
        )));
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(rng);
    order.sort_by_key(|&i| labels[i]); // stable: ties keep the shuffled order
    let mut shard_ids: Vec<usize> = (0..n / shard_size).collect();
    shard_ids.shuffle(rng);
    Ok(shard_ids
        .chunks(per_client)
        .take(clients)
        .map(|ids| {
            ids.iter()
                .flat_map(|&s| order[s * shard_size..(s + 1) * shard_size].iter().copied())
                .collect()
        })
        .collect())
}

/// Each row's natural id, as the rank of its value among the column's distinct values in
/// ascending order (strings for a categorical column, numbers for a real one), and the number
/// of distinct values.
pub(super) fn natural_ids(column: &Column) -> (Vec<usize>, usize) {
    match column {
        Column::Categorical { levels, codes } => {
            let mut used: Vec<usize> = codes.iter().map(|&c| c as usize).collect();
            used.sort_unstable();
            used.dedup();
            used.sort_by(|&a, &b| levels[a].cmp(&levels[b]));
            let mut rank = vec![0; levels.len()];
            for (r, &code) in used.iter().enumerate() {
                rank[code] = r;
            }
            (
                codes.iter().map(|&c| rank[c as usize]).collect(),
                used.len(),
            )
        }
        Column::Real(values) => {
            // `+ 0.0` makes -0 and 0 one value, as numpy's unique does.
            let key = |v: f32| v + 0.0;
            let mut distinct: Vec<f32> = values.iter().map(|&v| key(v)).collect();
            distinct.sort_by(f32::total_cmp);
            distinct.dedup_by(|a, b| a.total_cmp(b).is_eq());
            let ids = values
                .iter()
                .map(|&v| {
                    distinct
                        .binary_search_by(|d| d.total_cmp(&key(v)))
                        .unwrap_or_default()
                })
                .collect();
            (ids, distinct.len())
        }
    }
}

/// The rows of each group: row `r` goes to `group_of[ids[r]]` (or nowhere for `None`).
pub(super) fn rows_by_group(
    ids: &[usize],
    group_of: &[Option<usize>],
    groups: usize,
) -> Vec<Vec<usize>> {
    let mut parts = vec![Vec::new(); groups];
    for (row, &id) in ids.iter().enumerate() {
        if let Some(g) = group_of[id] {
            parts[g].push(row);
        }
    }
    parts
}

#[allow(clippy::too_many_arguments)]
pub(super) fn grouped_natural_id(
    name: &str,
    column: &Column,
    clients: usize,
    group_size: usize,
    mode: GroupMode,
    sort_unique_ids: bool,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let (ids, count) = natural_ids(column);
    let err = |msg: String| Err(DataError::Partition(format!("grouped_natural_id: {msg}")));
    // The ids in the order they are grouped.
    let order: Vec<usize> = if sort_unique_ids {
        (0..count).collect()
    } else {
        let mut rows: Vec<usize> = (0..ids.len()).collect();
        rows.shuffle(rng);
        let mut seen = vec![false; count];
        rows.iter()
            .filter_map(|&r| (!std::mem::replace(&mut seen[ids[r]], true)).then_some(ids[r]))
            .collect()
    };
    if mode != GroupMode::AllowSmaller && group_size > count {
        return err(format!(
            "group_size {group_size} exceeds the {count} distinct values of column `{name}`; \
             lower group_size or use mode allow-smaller (one client)"
        ));
    }
    let whole = count / group_size;
    let groups: Vec<Vec<usize>> = match mode {
        GroupMode::AllowSmaller => order.chunks(group_size).map(<[usize]>::to_vec).collect(),
        GroupMode::AllowBigger => array_split(&order, whole),
        GroupMode::DropReminder => order[..whole * group_size]
            .chunks(group_size)
            .map(<[usize]>::to_vec)
            .collect(),
        GroupMode::Strict if count % group_size != 0 => {
            return err(format!(
                "mode strict needs the {count} distinct values of column `{name}` to divide into \
                 groups of {group_size}, but {} are left over; pick a group_size that divides \
                 {count}, or another mode",
                count % group_size
            ));
        }
        GroupMode::Strict => order.chunks(group_size).map(<[usize]>::to_vec).collect(),
    };
    if groups.len() != clients {
        return err(format!(
            "the {count} distinct values of column `{name}` in groups of {group_size} ({}) make \
             {} clients, but {clients} were asked for; set clients = {}",
            mode.name(),
            groups.len(),
            groups.len()
        ));
    }
    let mut group_of = vec![None; count];
    for (g, members) in groups.iter().enumerate() {
        for &id in members {
            group_of[id] = Some(g);
        }
    }
    Ok(rows_by_group(&ids, &group_of, groups.len()))
}

pub(super) fn continuous(
    name: &str,
    column: &Column,
    clients: usize,
    strictness: f64,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let err = |msg: String| Err(DataError::Partition(format!("continuous: {msg}")));
    let Column::Real(values) = column else {
        return err(format!(
            "column `{name}` is categorical; continuous needs a real-valued column (use \
             natural_id or grouped_natural_id for categories)"
        ));
    };
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return err(format!(
            "column `{name}` holds {} at row {i}; drop or fill such rows first",
            values[i]
        ));
    }
    let n = values.len() as f64;
    let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let std = (values
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n)
        .sqrt();
    if std < 1e-6 && strictness > 0.0 {
        return err(format!(
            "column `{name}` is (nearly) constant (standard deviation {std:e}), so it cannot \
             order the samples; pick another column, or strictness = 0 for IID"
        ));
    }
    let score: Vec<f64> = values
        .iter()
        .map(|&v| {
            let z = if strictness > 0.0 {
                (f64::from(v) - mean) / std
            } else {
                0.0
            };
            let noise: f64 = rng.sample(StandardNormal);
            strictness * z + (1.0 - strictness) * noise
        })
        .collect();
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| score[a].total_cmp(&score[b]));
    Ok(array_split(&order, clients))
}

/// An index of `0..k` drawn with probability proportional to `weight` among the `open` ones
/// (the closed ones at zero, the rest renormalised); uniform over the open ones when their
/// weights are all zero (underflow at tiny concentrations); `None` when none is open.
fn draw_open(
    k: usize,
    weight: impl Fn(usize) -> f64,
    open: impl Fn(usize) -> bool,
    rng: &mut impl Rng,
) -> Option<usize> {
    let w = |i: usize| if open(i) { weight(i) } else { 0.0 };
    let mass: f64 = (0..k).map(w).sum();
    if mass > 0.0 {
        let u = rng.random::<f64>() * mass;
        let mut cum = 0.0;
        let mut pick = None;
        for i in (0..k).filter(|&i| w(i) > 0.0) {
            cum += w(i);
            pick = Some(i);
            if u < cum {
                break;
            }
        }
        pick
    } else {
        let open: Vec<usize> = (0..k).filter(|&i| open(i)).collect();
        (!open.is_empty()).then(|| open[rng.random_range(0..open.len())])
    }
}

/// Reddi et al.'s Pachinko allocation (see [`PartitionSpec::Pachinko`]): fine label `l` of
/// `labels` belongs to coarse label `coarse_of[l]`; every label is below `coarse_of.len()`.
/// Clients are filled in order, `per_client` samples each.
pub(super) fn pachinko(
    labels: &[u32],
    coarse_of: &[u8],
    clients: usize,
    per_client: usize,
    (alpha, beta): (f64, f64),
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let n = labels.len();
    let needed = clients.saturating_mul(per_client);
    if needed > n {
        return Err(DataError::Partition(format!(
            "pachinko: {clients} clients x samples_per_client {per_client} = {needed} exceeds \
             the {n} samples; lower samples_per_client or the number of clients (without \
             samples_per_client the samples are shared evenly)"
        )));
    }
    let groups = coarse_of
        .iter()
        .map(|&c| usize::from(c) + 1)
        .max()
        .unwrap_or(0);
    let mut fine_of: Vec<Vec<usize>> = vec![Vec::new(); groups];
    for (fine, &coarse) in coarse_of.iter().enumerate() {
        fine_of[usize::from(coarse)].push(fine);
    }
    // Each fine label's samples in random order, handed out from the end: a uniform draw
    // without replacement.
    let mut pool = by_class(labels, coarse_of.len());
    pool.iter_mut().for_each(|p| p.shuffle(rng));
    let mut group_left: Vec<usize> = fine_of
        .iter()
        .map(|fs| fs.iter().map(|&f| pool[f].len()).sum())
        .collect();
    let (coarse_gamma, fine_gamma) = (gamma(alpha)?, gamma(beta)?);
    let mut parts = Vec::with_capacity(clients);
    for client in 0..clients {
        let coarse_p = dirichlet_draw(groups, &coarse_gamma, rng);
        let fine_p: Vec<Vec<f64>> = fine_of
            .iter()
            .map(|fs| {
                if fs.is_empty() {
                    Vec::new()
                } else {
                    dirichlet_draw(fs.len(), &fine_gamma, rng)
                }
            })
            .collect();
        let mut part = Vec::with_capacity(per_client);
        for _ in 0..per_client {
            let drawn =
                draw_open(groups, |g| coarse_p[g], |g| group_left[g] > 0, rng).and_then(|g| {
                    let fs = &fine_of[g];
                    let j =
                        draw_open(fs.len(), |j| fine_p[g][j], |j| !pool[fs[j]].is_empty(), rng)?;
                    Some((g, fs[j]))
                });
            // Cannot fail: no more samples are handed out than there are.
            let Some(sample) = drawn.and_then(|(g, f)| {
                group_left[g] -= 1;
                pool[f].pop()
            }) else {
                return Err(DataError::Partition(format!(
                    "pachinko: no sample left for client {client}"
                )));
            };
            part.push(sample);
        }
        parts.push(part);
    }
    Ok(parts)
}
