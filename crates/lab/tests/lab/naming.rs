//! `fedfuse fuse` / `fedfuse.fuse` read the layer chain from the names PyTorch produces and
//! give the fused model the first client's names.

use fedfuse_core::Params;
use fedfuse_fuse::PfnmConfig;
use fedfuse_lab::fusion::{FuseMethod, fuse};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// An MLP of `widths` under `names[i] = (weight, bias)`, tensors in the order of `order`.
fn mlp(widths: &[usize], names: &[(&str, &str)], order: &[usize], seed: u64) -> Params {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut layers: Vec<_> = widths
        .windows(2)
        .zip(names)
        .map(|(w, (wn, bn))| {
            let weight: Vec<f32> = (0..w[0] * w[1])
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let bias: Vec<f32> = (0..w[1]).map(|_| rng.random_range(-1.0..1.0)).collect();
            (
                wn.to_string(),
                vec![w[1], w[0]],
                weight,
                bn.to_string(),
                bias,
            )
        })
        .map(Some)
        .collect();
    let mut p = Params::new();
    for &i in order {
        let (wn, ws, w, bn, b) = layers[i].take().unwrap();
        let bl = vec![b.len()];
        p.push(wn, ws, w).unwrap();
        p.push(bn, bl, b).unwrap();
    }
    p
}

const WIDTHS: [usize; 4] = [6, 9, 7, 3];
const CANONICAL: [(&str, &str); 3] = [
    ("layers.0.weight", "layers.0.bias"),
    ("layers.1.weight", "layers.1.bias"),
    ("layers.2.weight", "layers.2.bias"),
];

fn fused(models: Vec<Params>, method: FuseMethod) -> Params {
    let models: Vec<(String, Params)> = models
        .into_iter()
        .enumerate()
        .map(|(i, p)| (format!("client {i}"), p))
        .collect();
    fuse(models, method, None, &PfnmConfig::default(), 7)
        .unwrap()
        .params
}

#[test]
fn every_pytorch_naming_fuses_as_the_canonical_one_and_keeps_its_names() {
    let styles: [[(&str, &str); 3]; 3] = [
        [
            ("0.weight", "0.bias"),
            ("2.weight", "2.bias"),
            ("4.weight", "4.bias"),
        ],
        [
            ("fc1.weight", "fc1.bias"),
            ("fc2.weight", "fc2.bias"),
            ("out.weight", "out.bias"),
        ],
        [
            ("net.0.weight", "net.0.bias"),
            ("net.2.weight", "net.2.bias"),
            ("classifier.weight", "classifier.bias"),
        ],
    ];
    for method in [FuseMethod::FedAvg, FuseMethod::Pfnm] {
        let want = fused(
            (0..3)
                .map(|s| mlp(&WIDTHS, &CANONICAL, &[0, 1, 2], s))
                .collect(),
            method,
        );
        for names in &styles {
            // As a state_dict gives them, and (nested) as safetensors sorts them by name.
            for order in [[0, 1, 2], [2, 0, 1]] {
                let got = fused(
                    (0..3).map(|s| mlp(&WIDTHS, names, &order, s)).collect(),
                    method,
                );
                let own: Vec<&str> = names.iter().flat_map(|(w, b)| [*w, *b]).collect();
                assert_eq!(got.names(), own, "{method:?} {order:?}");
                for (i, (w, b)) in names.iter().enumerate() {
                    for (mine, canon) in [(w, CANONICAL[i].0), (b, CANONICAL[i].1)] {
                        assert_eq!(got.get(mine), want.get(canon), "{method:?} {mine}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_bare_linear_layer_keeps_its_names() {
    let models = (0..2)
        .map(|s| mlp(&[6, 3], &[("weight", "bias")], &[0], s))
        .collect();
    let got = fused(models, FuseMethod::FedAvg);
    assert_eq!(got.names(), ["weight", "bias"]);
    assert_eq!(got.get("weight").unwrap().shape, [3, 6]);
}

fn refusal(p: Params) -> String {
    fuse(
        vec![("a.safetensors".into(), p)],
        FuseMethod::FedAvg,
        None,
        &PfnmConfig::default(),
        0,
    )
    .unwrap_err()
    .to_string()
}

#[test]
fn what_is_not_a_chain_of_linear_layers_is_refused_naming_the_tensor() {
    let mut bn = mlp(&WIDTHS, &CANONICAL, &[0, 1, 2], 0);
    bn.push("bn.running_mean", vec![9], vec![0.0; 9]).unwrap();
    let e = refusal(bn);
    assert!(
        e.contains("a.safetensors") && e.contains("bn.running_mean"),
        "{e}"
    );

    let mut conv = Params::new();
    conv.push("conv.weight", vec![4, 1, 3, 3], vec![0.0; 36])
        .unwrap();
    conv.push("conv.bias", vec![4], vec![0.0; 4]).unwrap();
    let e = refusal(conv);
    assert!(
        e.contains("conv.weight") && e.contains("[4, 1, 3, 3]"),
        "{e}"
    );

    let mut no_bias = mlp(&WIDTHS, &CANONICAL, &[0, 1, 2], 0);
    no_bias.remove("layers.1.bias");
    let e = refusal(no_bias);
    assert!(e.contains("layers.1") && e.contains("bias=True"), "{e}");

    // Equal widths: no order can be told from shapes when the names' order does not chain.
    let square = mlp(&[5, 5, 5, 5], &CANONICAL, &[0, 1, 2], 0);
    let mut broken = Params::new();
    for (n, t) in square.iter() {
        let shape = if n == "layers.1.weight" {
            vec![5, 4]
        } else {
            t.shape.clone()
        };
        let len = shape.iter().product();
        broken.push(n, shape, vec![0.0; len]).unwrap();
    }
    let e = refusal(broken);
    assert!(
        e.contains("not one chain") && e.contains("layers.1.weight"),
        "{e}"
    );
}
