//! Vision Transformers under weight matching and PFNM: permuting the stream, whole heads (with
//! their query-key and value features within each head) and each block's MLP units keeps every
//! logit, a permutation that splits a head is refused, weight matching finds planted
//! permutations again, noise added or not, and so do PFNM and GPI-FNM at a sharp prior, which
//! keep the stream's and the heads' widths and grow an MLP by the units only one client has.

use fedfuse_core::layers::LayerSpec;
use fedfuse_core::{Params, VitShape};
use fedfuse_fuse::{
    MatchPrior, PfnmConfig, WeightMatchingConfig, permute_vit, pfnm_fuse_layers,
    random_vit_permutations, vit_part, weight_matching_fuse,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::channels::{assert_close, assert_recovered, f64s, random_params};

const INPUT: [usize; 3] = [2, 8, 8];

/// Patch 4 (four patch tokens and the class token), width 8 in 2 heads, MLP 6, 3 classes.
fn vit(blocks: usize) -> Vec<LayerSpec> {
    VitShape {
        patch: 4,
        hidden: 8,
        layers: blocks,
        heads: 2,
        mlp: 6,
        mlps: Vec::new(),
        dropout: 0.0,
        attention_dropout: 0.0,
    }
    .layers(3)
}

/// Per-token layer norm of `x` (`[tokens, e]`).
fn layer_norm(x: &[f64], e: usize, w: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
    x.chunks(e)
        .flat_map(|t| {
            let mean = t.iter().sum::<f64>() / e as f64;
            let var = t.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / e as f64;
            let s = 1.0 / (var + eps).sqrt();
            t.iter()
                .zip(w.iter().zip(b))
                .map(move |(v, (w, b))| (v - mean) * s * w + b)
        })
        .collect()
}

/// `x W^T + b` on every row of `x` (`[rows, in]`), `W` `[out, in]`.
fn linear(x: &[f64], w: &[f64], b: &[f64], inputs: usize) -> Vec<f64> {
    let out = b.len();
    x.chunks(inputs)
        .flat_map(|r| {
            (0..out).map(move |o| {
                b[o] + r
                    .iter()
                    .zip(&w[o * inputs..(o + 1) * inputs])
                    .map(|(a, c)| a * c)
                    .sum::<f64>()
            })
        })
        .collect()
}

/// The ViT's logits for one image, in f64: patch tokens, class token and positional
/// embedding, pre-norm blocks with softmax attention, the class token's layer norm and the
/// head. GELU's tanh form stands in for its erf form (std has no erf): any elementwise
/// activation keeps the invariance under test.
fn forward(layers: &[LayerSpec], p: &Params, x: &[f64]) -> Vec<f64> {
    let t = |name: String| f64s(&p.get(&name).unwrap_or_else(|| panic!("{name}")).data);
    let [c, h, w] = INPUT;
    let LayerSpec::Tokens {
        hidden: e, patch, ..
    } = layers[0]
    else {
        panic!()
    };
    let (gh, gw) = (h / patch, w / patch);
    let seq = gh * gw + 1;
    let (conv, bias) = (t("0.conv_proj.weight".into()), t("0.conv_proj.bias".into()));
    let mut xs = t("0.class_token".into());
    for i in 0..gh {
        for j in 0..gw {
            for f in 0..e {
                let mut v = bias[f];
                for ch in 0..c {
                    for ky in 0..patch {
                        for kx in 0..patch {
                            v += conv[((f * c + ch) * patch + ky) * patch + kx]
                                * x[(ch * h + i * patch + ky) * w + j * patch + kx];
                        }
                    }
                }
                xs.push(v);
            }
        }
    }
    for (v, p) in xs.iter_mut().zip(t("0.pos_embedding".into())) {
        *v += p;
    }
    let mut k = 1;
    while let LayerSpec::Encoder {
        heads, mlp, eps, ..
    } = layers[k]
    {
        let n = |s: &str| t(format!("{k}.{s}"));
        let a = layer_norm(&xs, e, &n("ln_1.weight"), &n("ln_1.bias"), eps);
        let qkv = linear(
            &a,
            &n("self_attention.in_proj_weight"),
            &n("self_attention.in_proj_bias"),
            e,
        );
        let hd = e / heads;
        let mut att = vec![0.0; seq * e];
        for head in 0..heads {
            let at = |s: usize, part: usize, d: usize| qkv[s * 3 * e + part * e + head * hd + d];
            for s in 0..seq {
                let scores: Vec<f64> = (0..seq)
                    .map(|r| (0..hd).map(|d| at(s, 0, d) * at(r, 1, d)).sum::<f64>())
                    .map(|v| v / (hd as f64).sqrt())
                    .collect();
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let exp: Vec<f64> = scores.iter().map(|v| (v - max).exp()).collect();
                let sum: f64 = exp.iter().sum();
                for d in 0..hd {
                    att[s * e + head * hd + d] =
                        (0..seq).map(|r| exp[r] / sum * at(r, 2, d)).sum::<f64>();
                }
            }
        }
        let out = linear(
            &att,
            &n("self_attention.out_proj.weight"),
            &n("self_attention.out_proj.bias"),
            e,
        );
        xs.iter_mut().zip(&out).for_each(|(v, o)| *v += o);
        let y = layer_norm(&xs, e, &n("ln_2.weight"), &n("ln_2.bias"), eps);
        let hidden: Vec<f64> = linear(&y, &n("mlp.0.weight"), &n("mlp.0.bias"), e)
            .into_iter()
            .map(|v| 0.5 * v * (1.0 + (0.797_884_560_8 * (v + 0.044_715 * v.powi(3))).tanh()))
            .collect();
        let out = linear(&hidden, &n("mlp.3.weight"), &n("mlp.3.bias"), mlp);
        xs.iter_mut().zip(&out).for_each(|(v, o)| *v += o);
        k += 1;
    }
    assert_eq!(layers[k], LayerSpec::ClassToken);
    let LayerSpec::LayerNorm { eps } = layers[k + 1] else {
        panic!()
    };
    let class = layer_norm(
        &xs[..e],
        e,
        &t(format!("{}.weight", k + 1)),
        &t(format!("{}.bias", k + 1)),
        eps,
    );
    linear(
        &class,
        &t(format!("{}.weight", k + 2)),
        &t(format!("{}.bias", k + 2)),
        e,
    )
}

fn logits(layers: &[LayerSpec], p: &Params, xs: &[Vec<f64>]) -> Vec<f64> {
    xs.iter().flat_map(|x| forward(layers, p, x)).collect()
}

fn images(n: usize, rng: &mut StdRng) -> Vec<Vec<f64>> {
    let len: usize = INPUT.iter().product();
    (0..n)
        .map(|_| (0..len).map(|_| rng.random_range(-1.0..1.0)).collect())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Every group permuted keeps every logit; weight matching of the network and its
    /// permuted copy (noise added or not) finds the planted permutations and gives the
    /// network back.
    #[test]
    fn weight_matching_recovers_planted_permutations_of_a_vit(
        seed in 0u64..1000,
        blocks in 1usize..3,
        noisy in any::<bool>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let layers = vit(blocks);
        let p = random_params(&INPUT, &layers, &mut rng);
        let perms = random_vit_permutations(&layers, &mut rng).unwrap();
        let q = permute_vit(&layers, &p, &perms).unwrap();
        let xs = images(3, &mut rng);
        assert_close(&logits(&layers, &q, &xs), &logits(&layers, &p, &xs), 1e-5, "permuted");
        prop_assert_ne!(&q, &p);

        let mut copy = q.clone();
        if noisy {
            for (_, t) in copy.iter_mut() {
                t.data.iter_mut().for_each(|v| *v += rng.random_range(-0.01..0.01f32));
            }
        }
        let fused = weight_matching_fuse(
            &INPUT,
            &layers,
            &[&p, &copy],
            None,
            &WeightMatchingConfig::default(),
            &mut rng,
        )
        .unwrap();
        // The copy's unit `perms[g][u]` was the network's unit `u`.
        let identity: Vec<Vec<usize>> = perms.iter().map(|g| (0..g.len()).collect()).collect();
        assert_recovered(&fused.assignments, &[identity, perms.clone()]);
        let tol = if noisy { 2e-2 } else { 1e-6 };
        for (name, t) in p.iter() {
            assert_close(&f64s(&fused.params.get(name).unwrap().data), &f64s(&t.data), tol, name);
        }
    }
}

/// PFNM (GPI-FNM with `eps` > 0) at a sharp prior.
fn sharp(eps: f64) -> PfnmConfig {
    PfnmConfig {
        prior: MatchPrior {
            sigma: 1e-4,
            ..MatchPrior::default()
        },
        eps,
        ..PfnmConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// A network and two copies with every group permuted: PFNM and GPI-FNM at a sharp prior
    /// pair every unit with its copies (heads whole), keep every width and give the network
    /// back, logits included (up to the prior's shrinkage, about sigma / 3).
    #[test]
    fn pfnm_recovers_planted_permutations_of_a_vit(
        seed in 0u64..1000,
        blocks in 1usize..3,
        eps in prop_oneof![Just(0.0), Just(0.5)],
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let layers = vit(blocks);
        let p = random_params(&INPUT, &layers, &mut rng);
        let perms: Vec<Vec<Vec<usize>>> = (0..2)
            .map(|_| random_vit_permutations(&layers, &mut rng).unwrap())
            .collect();
        let copies: Vec<Params> =
            perms.iter().map(|q| permute_vit(&layers, &p, q).unwrap()).collect();
        let counts = vec![vec![5.0, 1.0, 2.0], vec![1.0, 4.0, 0.0], vec![3.0, 3.0, 3.0]];
        let fused = pfnm_fuse_layers(
            &INPUT,
            &layers,
            &[&p, &copies[0], &copies[1]],
            Some(&counts),
            &sharp(eps),
            &mut rng,
        )
        .unwrap();
        prop_assert_eq!(&fused.layers, &layers);
        let identity: Vec<Vec<usize>> = perms[0].iter().map(|g| (0..g.len()).collect()).collect();
        assert_recovered(
            &fused.assignments,
            &[identity, perms[0].clone(), perms[1].clone()],
        );
        for (name, t) in p.iter() {
            assert_close(&f64s(&fused.params.get(name).unwrap().data), &f64s(&t.data), 1e-3, name);
        }
        let xs = images(2, &mut rng);
        assert_close(
            &logits(&layers, &fused.params, &xs),
            &logits(&layers, &p, &xs),
            1e-3,
            "logits",
        );
    }
}

/// Block 0's MLP of `p` with `extra` units appended: rows of `mlp.0` far from every other
/// unit, with their biases and `mlp.3` columns.
fn with_extra_units(layers: &[LayerSpec], p: &Params, extra: usize) -> (Vec<LayerSpec>, Params) {
    let mut wider = layers.to_vec();
    let LayerSpec::Encoder { mlp, .. } = &mut wider[1] else {
        panic!("block 0 is layer 1")
    };
    let m = *mlp;
    *mlp += extra;
    let mut out = Params::new();
    for (name, t) in p.iter() {
        let (shape, data) = match name {
            "1.mlp.0.weight" => {
                let e = t.shape[1];
                let mut d = t.data.clone();
                d.extend((0..extra * e).map(|k| if k % 2 == 0 { 40.0 } else { -40.0 }));
                (vec![m + extra, e], d)
            }
            "1.mlp.0.bias" => {
                let mut d = t.data.clone();
                d.extend(std::iter::repeat_n(30.0, extra));
                (vec![m + extra], d)
            }
            "1.mlp.3.weight" => {
                let e = t.shape[0];
                let d = (0..e)
                    .flat_map(|r| {
                        let row = &t.data[r * m..(r + 1) * m];
                        row.iter()
                            .copied()
                            .chain((0..extra).map(move |k| (r + k) as f32 * 0.1))
                    })
                    .collect();
                (vec![e, m + extra], d)
            }
            _ => (t.shape.clone(), t.data.clone()),
        };
        out.push(name.to_string(), shape, data).unwrap();
    }
    (wider, out)
}

/// Units only one client has open fused units of their own: block 0's MLP grows from 6 to 8,
/// the shared units keep their values, the new ones take the one client's rows (its
/// incoming side) and half its outgoing weights (the other client's absent units are
/// observed zeros), and the clients' parts of the fused model are their own networks back.
#[test]
fn pfnm_grows_a_vit_mlp_by_the_units_one_client_has() {
    let mut rng = StdRng::seed_from_u64(11);
    let layers = vit(2);
    let p = random_params(&INPUT, &layers, &mut rng);
    let (wider, q) = with_extra_units(&layers, &p, 2);
    let fused = pfnm_fuse_layers(&INPUT, &layers, &[&p, &q], None, &sharp(0.0), &mut rng).unwrap();
    assert_eq!(fused.layers, wider, "block 0 grows by 2, block 1 keeps 6");
    let asg = &fused.assignments[3];
    assert_eq!(asg[0], (0..6).collect::<Vec<_>>());
    assert_eq!(&asg[1][..6], &asg[0][..]);
    let mut new = asg[1][6..].to_vec();
    new.sort_unstable();
    assert_eq!(new, vec![6, 7]);
    let f = |name: &str| f64s(&fused.params.get(name).unwrap().data);
    let (w0, wq) = (
        f("1.mlp.0.weight"),
        f64s(&q.get("1.mlp.0.weight").unwrap().data),
    );
    let e = 8;
    for (u, &to) in asg[1].iter().enumerate() {
        assert_close(
            &w0[to * e..(to + 1) * e],
            &wq[u * e..(u + 1) * e],
            1e-3,
            "mlp.0 rows",
        );
    }
    let (w3, q3) = (
        f("1.mlp.3.weight"),
        f64s(&q.get("1.mlp.3.weight").unwrap().data),
    );
    for r in 0..e {
        for (u, &to) in asg[1].iter().enumerate().skip(6) {
            let want = q3[r * 8 + u] / 2.0;
            assert!(
                (w3[r * 8 + to] - want).abs() < 1e-3,
                "mlp.3[{r}, {to}]: {}",
                w3[r * 8 + to]
            );
        }
    }
    // Each client's part: its own widths and order, its own units' fused values.
    let picks: Vec<Vec<usize>> = fused.assignments.iter().map(|g| g[1].clone()).collect();
    let part = vit_part(&fused.layers, &fused.params, &picks).unwrap();
    assert_eq!(part.get("1.mlp.0.weight").unwrap().shape, vec![8, 8]);
    assert_close(
        &f64s(&part.get("1.mlp.0.weight").unwrap().data),
        &wq,
        1e-3,
        "part",
    );
    let picks: Vec<Vec<usize>> = fused.assignments.iter().map(|g| g[0].clone()).collect();
    let part = vit_part(&fused.layers, &fused.params, &picks).unwrap();
    assert_eq!(part.get("1.mlp.3.weight").unwrap().shape, vec![8, 6]);
    let bad: Vec<Vec<usize>> = picks.iter().map(|g| vec![0; g.len()]).collect();
    assert!(vit_part(&fused.layers, &fused.params, &bad).is_err());
}

/// A query-key permutation that moves a feature to another head changes what the heads
/// compute: it is refused, as is a value permutation that sends a head elsewhere than its
/// query-key features.
#[test]
fn a_permutation_that_splits_a_head_is_refused() {
    let mut rng = StdRng::seed_from_u64(3);
    let layers = vit(1);
    let p = random_params(&INPUT, &layers, &mut rng);
    let identity = |n: usize| (0..n).collect::<Vec<usize>>();
    let mut perms = vec![identity(8), identity(8), identity(8), identity(6)];
    perms[1].swap(3, 4);
    let e = permute_vit(&layers, &p, &perms).unwrap_err().to_string();
    assert!(e.contains("whole heads"), "{e}");
    // Heads swapped for the queries and keys only.
    perms[1] = vec![4, 5, 6, 7, 0, 1, 2, 3];
    assert!(permute_vit(&layers, &p, &perms).is_err());
    perms[2] = perms[1].clone();
    permute_vit(&layers, &p, &perms).unwrap();
}

/// A list that is not torchvision's ViT shape is refused, naming the layer.
#[test]
fn weight_matching_refuses_a_transformer_list_it_cannot_follow() {
    let mut layers = vit(1);
    layers.insert(2, LayerSpec::Relu);
    let mut rng = StdRng::seed_from_u64(1);
    let p = random_params(&INPUT, &layers, &mut rng);
    let err = weight_matching_fuse(
        &INPUT,
        &layers,
        &[&p, &p],
        None,
        &WeightMatchingConfig::default(),
        &mut rng,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("model.layers[2] (relu)") && err.contains("class_token"),
        "{err}"
    );
}
