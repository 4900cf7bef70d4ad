//! PyTorch parity of layer lists and the zoo: names, shapes, parameter counts, and logits of
//! fixed weights on fixed inputs in eval and train mode, against the values that
//! `scripts/zoo_reference.py` wrote with PyTorch (tests/fixtures/zoo_reference.json).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use burn::tensor::{Device, Tensor, TensorData};
use fedfuse_core::{BlockNorm, LayerSpec, ModelSpec, Params, TensorRole, ZooModel};
use serde::Deserialize;

use crate::convert;
use crate::net::Net;

/// Deterministic values in [-1, 1) (xorshift), so failures reproduce; shared by the ops' tests.
pub(super) fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 * 2.0 - 1.0
        })
        .collect()
}

#[derive(Deserialize)]
struct Fixture {
    batch: usize,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct TensorInfo {
    name: String,
    shape: Vec<usize>,
    dtype: String,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    zoo: Option<String>,
    input: Vec<usize>,
    classes: usize,
    norm: Option<BlockNorm>,
    tensors: Vec<TensorInfo>,
    num_params: usize,
    eval_logits: Vec<f32>,
    train_logits: Option<Vec<f32>>,
    after_train: Option<std::collections::BTreeMap<String, Vec<f64>>>,
    layers: Option<Vec<LayerSpec>>,
}

fn fixture() -> Fixture {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/zoo_reference.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The script's `wave`: integer hashing, exact in both languages.
fn wave(n: usize, k: u64) -> impl Iterator<Item = f64> {
    (0..n as u64).map(move |j| {
        let h = (j * 2_654_435_761 + 97_531 * k + 12_345) % (1 << 32);
        h as f64 / (1u64 << 32) as f64 * 2.0 - 1.0
    })
}

/// The script's `value`, tensor by tensor.
fn fixed_params(spec: &ModelSpec) -> Params {
    let mut p = Params::new();
    for (k, s) in spec.param_shapes().into_iter().enumerate() {
        let n = s.shape.iter().product::<usize>();
        let last = s.name.rsplit('.').next().unwrap();
        let data: Vec<f32> = match (TensorRole::of(&s.name), last) {
            (TensorRole::Counter, _) => vec![7.0],
            (_, "running_mean") => wave(n, k as u64).map(|v| (0.1 * v) as f32).collect(),
            (_, "running_var") => wave(n, k as u64).map(|v| (1.0 + 0.5 * v) as f32).collect(),
            _ if s.shape.len() >= 2 => {
                let fan_in = s.shape[1..].iter().product::<usize>() as f64;
                let scale = (3.0 / fan_in).sqrt();
                wave(n, k as u64).map(|v| (v * scale) as f32).collect()
            }
            (_, "weight") => wave(n, k as u64).map(|v| (1.0 + 0.2 * v) as f32).collect(),
            _ => wave(n, k as u64).map(|v| (0.1 * v) as f32).collect(),
        };
        p.push(s.name, s.shape, data).unwrap();
    }
    p
}

fn spec_of(case: &Case) -> ModelSpec {
    match case.zoo.as_deref() {
        Some(name) => {
            let zoo: ZooModel = serde_json::from_value(serde_json::json!(name)).unwrap();
            let width = zoo.default_width();
            zoo.spec(
                &case.input,
                case.classes,
                case.norm.unwrap_or_default(),
                width,
            )
            .unwrap()
        }
        None => {
            let spec = ModelSpec::sequential(&case.input, case.layers.clone().unwrap());
            spec.validate().unwrap();
            spec
        }
    }
}

pub(super) fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
        .fold(0f32, f32::max);
    assert!(
        worst <= tol,
        "{what}: largest difference {worst:e} > {tol:e}"
    );
}

#[test]
fn the_zoo_and_layer_lists_match_pytorch() {
    let fx = fixture();
    assert!(fx.cases.len() >= 6);
    let device = Device::flex();
    for case in &fx.cases {
        let spec = spec_of(case);
        let shapes = spec.param_shapes();
        // torchvision's ResNets and Vision Transformers go by torchvision's names.
        let vit = spec
            .layer_list()
            .iter()
            .any(|l| matches!(l, LayerSpec::Tokens { .. }));
        let torch = match case.zoo.as_deref() {
            Some(name) => {
                let zoo: ZooModel = serde_json::from_value(serde_json::json!(name)).unwrap();
                zoo.torchvision_names(spec.layer_list())
            }
            None => vit.then(|| fedfuse_core::TorchvisionNames::of(spec.layer_list())),
        };
        let torch_name = |n: &str| match &torch {
            Some(t) => t.torch_name(n).unwrap(),
            None => n.to_string(),
        };
        let names: Vec<(String, &[usize])> = shapes
            .iter()
            .map(|s| (torch_name(&s.name), &s.shape[..]))
            .collect();
        let want: Vec<(String, &[usize])> = case
            .tensors
            .iter()
            .map(|t| (t.name.clone(), &t.shape[..]))
            .collect();
        assert_eq!(names, want, "{}: state_dict", case.name);
        for t in &case.tensors {
            let int = t.dtype == "int64";
            assert_eq!(int, fedfuse_core::layers::is_counter(&t.name), "{}", t.name);
        }
        assert_eq!(spec.num_params(), case.num_params, "{}", case.name);
        assert_eq!(spec.classes(), case.classes, "{}", case.name);

        let params = fixed_params(&spec);
        let n = spec.input_len() * fx.batch;
        let x: Vec<f32> = wave(n, 1000).map(|v| v as f32).collect();
        let input = || {
            Tensor::<2>::from_data(
                TensorData::new(x.clone(), [fx.batch, n / fx.batch]),
                &device,
            )
        };
        let net = convert::build(&spec, &params, &device).unwrap();
        let logits: Vec<f32> = net.forward(input()).into_data().try_into_vec().unwrap();
        close(
            &format!("{} eval", case.name),
            &logits,
            &case.eval_logits,
            1e-5,
        );

        if let Some(train) = &case.train_logits {
            let Net::Seq(seq) = &net else { panic!() };
            let out: Vec<f32> = seq
                .forward(input(), &[], &[], super::Mode::Train)
                .into_data()
                .try_into_vec()
                .unwrap();
            close(&format!("{} train", case.name), &out, train, 1e-4);
            let after = convert::read(&net, &spec)
                .unwrap()
                .renamed(|n| Some(torch_name(n)))
                .unwrap();
            for (name, want) in case.after_train.as_ref().unwrap() {
                let got = &after.get(name).unwrap().data;
                let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
                close(&format!("{} {name}", case.name), got, &want, 1e-5);
            }
        }
    }
}

/// A ViT's dropouts sit where torchvision's do: with every mask 1 training's forward pass is
/// evaluation's, and zero masks on the attention's and the MLP's outputs make each block the
/// identity, as zero `out_proj` and `mlp.3` tensors do.
#[test]
fn a_vits_dropout_masks_sit_on_its_residual_branches() {
    let layers = fedfuse_core::VitShape {
        patch: 4,
        hidden: 8,
        layers: 2,
        heads: 2,
        mlp: 12,
        mlps: Vec::new(),
        dropout: 0.25,
        attention_dropout: 0.5,
    }
    .layers(3);
    let spec = ModelSpec::sequential(&[1, 8, 8], layers);
    spec.validate().unwrap();
    let device = Device::flex();
    let batch = 3;
    let x: Vec<f32> = wave(batch * 64, 5).map(|v| v as f32).collect();
    let input = || Tensor::<2>::from_data(TensorData::new(x.clone(), [batch, 64]), &device);
    let logits = |net: &Net, masks: Option<&[Tensor<2>]>| -> Vec<f32> {
        let Net::Seq(seq) = net else { panic!() };
        let out = match masks {
            Some(m) => seq.forward(input(), &[], m, super::Mode::Train),
            None => seq.forward(input(), &[], &[], super::Mode::Eval),
        };
        out.into_data().try_into_vec().unwrap()
    };
    // Independent values per tensor (the fixture's waves are near multiples of one another,
    // which a layer norm cannot tell apart).
    let mut params = Params::new();
    for (k, s) in spec.param_shapes().into_iter().enumerate() {
        let n = s.shape.iter().product();
        params
            .push(s.name, s.shape, noise(n, 100 + k as u64))
            .unwrap();
    }
    let net = convert::build(&spec, &params, &device).unwrap();
    let Net::Seq(seq) = &net else { panic!() };
    // seq = 2 * 2 + 1 = 5 tokens: the tokens' dropout, then per block the attention weights
    // (2 heads x 5 x 5), the attention's output, the MLP's hidden units and its output.
    let sites = seq.dropout_layers();
    let per_block = [(50, 0.5), (40, 0.25), (60, 0.25), (40, 0.25)];
    let want: Vec<(usize, f64)> = std::iter::once((40, 0.25))
        .chain(per_block.iter().copied().cycle().take(8))
        .collect();
    assert_eq!(sites, want);

    let mask = |units: usize, v: f32| {
        Tensor::<2>::from_data(
            TensorData::new(vec![v; batch * units], [batch, units]),
            &device,
        )
    };
    let ones: Vec<Tensor<2>> = sites.iter().map(|&(u, _)| mask(u, 1.0)).collect();
    close(
        "all-ones masks",
        &logits(&net, Some(&ones)),
        &logits(&net, None),
        1e-6,
    );

    // Zero masks after the attention and after mlp.3 (sites 2 and 4 of each block).
    let cut: Vec<Tensor<2>> = sites
        .iter()
        .enumerate()
        .map(|(i, &(u, _))| {
            mask(
                u,
                if i > 0 && (i - 1) % 4 % 2 == 1 {
                    0.0
                } else {
                    1.0
                },
            )
        })
        .collect();
    let mut identity = params.clone();
    for (name, t) in identity.iter_mut() {
        if name.contains("out_proj") || name.contains("mlp.3") {
            t.data.iter_mut().for_each(|v| *v = 0.0);
        }
    }
    let identity_net = convert::build(&spec, &identity, &device).unwrap();
    let cut_logits = logits(&net, Some(&cut));
    close(
        "blocks cut",
        &cut_logits,
        &logits(&identity_net, None),
        1e-6,
    );
    assert_ne!(
        cut_logits,
        logits(&net, None),
        "the cut must change the logits"
    );
}
