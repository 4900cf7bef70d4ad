//! `fedfuse fuse --model` on convolutional state dicts under PyTorch's names: permuted copies
//! of one network (conv, batch norm, flatten, linear) fuse back to it with PFNM and weight
//! matching; the output keeps the names, stores its widths and layer list, and writes batch
//! norm's counters as I64; files that do not fit are refused by name.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

use fedfuse_core::layers::unit_uses;
use fedfuse_core::{
    BlockNorm, LayerSpec, ModelSpec, Params, ZooModel, params_from_safetensors, save_safetensors,
};
use fedfuse_fuse::permute_units;
use fedfuse_train::{Init, init_params};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

fn fedfuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fedfuse"))
        .args(args)
        .output()
        .expect("the fedfuse binary runs")
}

const INPUT: [usize; 3] = [1, 8, 8];

/// The net of `net.toml`: conv, batch norm, pool, conv, pool, flatten (6 channels of 2x2),
/// linear, linear.
fn layers() -> Vec<LayerSpec> {
    vec![
        LayerSpec::conv2d(4, 3).with_padding(1),
        LayerSpec::batch_norm2d(),
        LayerSpec::Relu,
        LayerSpec::max_pool(2),
        LayerSpec::conv2d(6, 3).with_padding(1),
        LayerSpec::Relu,
        LayerSpec::max_pool(2),
        LayerSpec::Flatten,
        LayerSpec::linear(8),
        LayerSpec::Relu,
        LayerSpec::linear(3),
    ]
}

const NET_TOML: &str = r#"
[model]
kind = "sequential"
input = [1, 8, 8]
layers = [
    { type = "conv2d", out = 4, kernel = 3, padding = 1 },
    { type = "batchnorm2d" },
    { type = "relu" },
    { type = "maxpool2d", kernel = 2 },
    { type = "conv2d", out = 6, kernel = 3, padding = 1 },
    { type = "relu" },
    { type = "maxpool2d", kernel = 2 },
    { type = "flatten" },
    { type = "linear", out = 8 },
    { type = "relu" },
    { type = "linear", out = 3 },
]
"#;

/// Layer index -> the module name a PyTorch class with named layers gives it.
const NAMES: [(&str, &str); 5] = [
    ("0", "conv1"),
    ("1", "bn1"),
    ("4", "conv2"),
    ("8", "fc1"),
    ("10", "fc2"),
];

fn pytorch_name(list_name: &str) -> String {
    let (layer, leaf) = list_name.split_once('.').unwrap();
    let module = NAMES.iter().find(|(i, _)| *i == layer).unwrap().1;
    format!("{module}.{leaf}")
}

/// `p` (list names) under PyTorch's named-module names, in `p`'s order or sorted by name (as
/// `safetensors.torch.save_file` leaves a file that fedfuse did not write).
fn renamed(p: &Params, sorted: bool) -> Params {
    let mut named: Vec<(String, Vec<usize>, Vec<f32>)> = p
        .iter()
        .map(|(n, t)| (pytorch_name(n), t.shape.clone(), t.data.clone()))
        .collect();
    if sorted {
        named.sort_by(|a, b| a.0.cmp(&b.0));
    }
    let mut out = Params::new();
    for (n, shape, data) in named {
        out.push(n, shape, data).unwrap();
    }
    out
}

/// A random net with trained-looking batch norm statistics and counter.
fn net(seed: u64) -> Params {
    let spec = ModelSpec::sequential(&INPUT, layers());
    let mut p = init_params(&spec, Init::Default, seed);
    let mut rng = StdRng::seed_from_u64(seed);
    for (name, t) in p.iter_mut() {
        match name {
            "1.weight" => t
                .data
                .iter_mut()
                .for_each(|v| *v = rng.random_range(0.5..1.5)),
            "1.bias" | "1.running_mean" => t
                .data
                .iter_mut()
                .for_each(|v| *v = rng.random_range(-1.0..1.0)),
            "1.running_var" => t
                .data
                .iter_mut()
                .for_each(|v| *v = rng.random_range(0.5..2.0)),
            "1.num_batches_tracked" => t.data[0] = 1234.0,
            _ => {}
        }
    }
    p
}

/// `p` with every matched layer's units permuted at random, and the permutations.
fn permuted(
    input: &[usize],
    layers: &[LayerSpec],
    p: &Params,
    seed: u64,
) -> (Params, Vec<Vec<usize>>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut q = p.clone();
    let mut perms = Vec::new();
    for uses in unit_uses(input, layers).unwrap() {
        let mut perm: Vec<usize> = (0..uses.units).collect();
        perm.shuffle(&mut rng);
        permute_units(&mut q, &uses, &perm).unwrap();
        perms.push(perm);
    }
    (q, perms)
}

fn write(dir: &Path, name: &str, p: &Params) -> String {
    let f = dir.join(name);
    save_safetensors(p, &f).unwrap();
    f.to_str().unwrap().to_string()
}

/// The fused file's tensors, its metadata, and the dtype of each tensor in its header.
fn read_fused(path: &Path) -> (Params, HashMap<String, String>, HashMap<String, String>) {
    let bytes = std::fs::read(path).unwrap();
    let (p, meta) = params_from_safetensors(&bytes).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    let dtypes = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| (k.clone(), v["dtype"].as_str().unwrap().to_string()))
        .collect();
    (p, meta, dtypes)
}

fn assert_close(got: &Params, want: &Params, tol: f32) {
    let mut names: Vec<&str> = got.names().iter().map(String::as_str).collect();
    let mut wanted: Vec<&str> = want.names().iter().map(String::as_str).collect();
    names.sort_unstable();
    wanted.sort_unstable();
    assert_eq!(names, wanted, "the fused file keeps the input's names");
    for (name, t) in want.iter() {
        let g = got.get(name).unwrap();
        assert_eq!(g.shape, t.shape, "{name}");
        for (a, b) in g.data.iter().zip(&t.data) {
            assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{name}: {a} vs {b}");
        }
    }
}

/// Client `j`'s unit `perms[j][g][u]` is the network's unit `u`: matched to fused unit `u`.
fn assert_recovered(report: &serde_json::Value, perms: &[Vec<Vec<usize>>]) {
    let layers = report["layers"].as_array().unwrap();
    assert_eq!(layers.len(), perms[0].len());
    for (g, layer) in layers.iter().enumerate() {
        for (j, asg) in layer["assignments"].as_array().unwrap().iter().enumerate() {
            for (u, &local) in perms[j][g].iter().enumerate() {
                assert_eq!(
                    asg[local].as_u64().unwrap() as usize,
                    u,
                    "layer {g} client {j}"
                );
            }
        }
    }
}

#[test]
fn permuted_copies_of_a_batch_norm_cnn_fuse_back_under_pytorch_names() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("net.toml");
    std::fs::write(&model, NET_TOML).unwrap();
    let p = net(1);
    let (a, pa) = permuted(&INPUT, &layers(), &p, 2);
    let (b, pb) = permuted(&INPUT, &layers(), &p, 3);
    let ident: Vec<Vec<usize>> = pa.iter().map(|x| (0..x.len()).collect()).collect();
    let perms = vec![ident, pa, pb];
    let files = [
        write(dir.path(), "c0.safetensors", &renamed(&p, false)),
        write(dir.path(), "c1.safetensors", &renamed(&a, false)),
        // Sorted names (`bn1` before `conv1`): each kind of module is taken in its order.
        write(dir.path(), "c2.safetensors", &renamed(&b, true)),
    ];
    let want = renamed(&p, false);
    for (method, extra) in [
        ("pfnm", vec!["--sigma", "1e-4"]),
        ("gpi-fnm", vec!["--sigma", "1e-4", "--eps", "0.5"]),
        ("weight-matching", vec![]),
    ] {
        let out = dir.path().join(format!("{method}.safetensors"));
        let mut args = vec!["fuse", "--method", method, "--seed", "5"];
        args.extend(["--model", model.to_str().unwrap()]);
        args.extend(files.iter().map(String::as_str));
        args.extend(["--out", out.to_str().unwrap()]);
        args.extend(&extra);
        let o = fedfuse(&args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{method}: {stderr}");
        assert!(
            stderr.contains("[1, 4, 6, 8, 3] -> [1, 4, 6, 8, 3]"),
            "{stderr}"
        );
        let (fused, meta, dtypes) = read_fused(&out);
        // PFNM's posterior shrinks toward the prior by a factor near 1 / (1 + sigma / 3).
        assert_close(&fused, &want, 1e-3);
        assert_eq!(fused.get("bn1.num_batches_tracked").unwrap().data, [1234.0]);
        assert_eq!(dtypes["bn1.num_batches_tracked"], "I64");
        assert_eq!(dtypes["conv1.weight"], "F32");
        assert_eq!(meta["fedfuse.widths"], "[1,4,6,8,3]");
        // The stored list is `--model`'s at the fused widths: the same here.
        let stored: toml::Table = toml::from_str(&meta["fedfuse.model"]).unwrap();
        let spec: ModelSpec = stored["model"].clone().try_into().unwrap();
        assert_eq!(spec, ModelSpec::sequential(&INPUT, layers()));
        let report: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.with_extension("assignments.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(report["method"], method);
        assert_eq!(report["layers"][0]["tensor"], "conv1.weight");
        assert_eq!(report["layers"][2]["tensor"], "fc1.weight");
        assert_recovered(&report, &perms);
    }

    // A fused file carries its list: fused again with the originals, no --model needed.
    let again = dir.path().join("again.safetensors");
    let fused = dir.path().join("weight-matching.safetensors");
    let o = fedfuse(&[
        "fuse",
        "--method",
        "fedavg",
        fused.to_str().unwrap(),
        &files[0],
        "--out",
        again.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_close(&read_fused(&again).0, &want, 1e-6);
}

#[test]
fn a_zoo_name_reads_lenet5_files_and_infers_their_input() {
    let dir = tempfile::tempdir().unwrap();
    let lenet = ModelSpec::LeNet5 {
        channels: 1,
        side: 28,
        classes: 10,
    };
    let ModelSpec::Sequential { input, layers } = lenet.as_sequential() else {
        unreachable!()
    };
    // fedfuse's LeNet-5 (`conv1` ... `fc3`), permuted through the list's names.
    let p = init_params(&lenet, Init::Default, 4);
    let as_list = |p: &Params, names: &[String]| {
        let mut out = Params::new();
        for ((_, t), n) in p.iter().zip(names) {
            out.push(n.clone(), t.shape.clone(), t.data.clone())
                .unwrap();
        }
        out
    };
    let list_names: Vec<String> = ModelSpec::sequential(&input, layers.clone())
        .param_shapes()
        .into_iter()
        .map(|s| s.name)
        .collect();
    let (q, perm) = permuted(&input, &layers, &as_list(&p, &list_names), 6);
    let q = as_list(&q, p.names());
    let files = [
        write(dir.path(), "a.safetensors", &p),
        write(dir.path(), "b.safetensors", &q),
    ];
    let out = dir.path().join("fused.safetensors");
    let o = fedfuse(&[
        "fuse",
        "--model",
        "lenet5",
        "--method",
        "weight-matching",
        &files[0],
        &files[1],
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (fused, meta, _) = read_fused(&out);
    assert_close(&fused, &p, 1e-6);
    assert_eq!(meta["fedfuse.widths"], "[1,6,16,120,84,10]");
    assert!(
        meta["fedfuse.model"].contains("input = [1, 28, 28]"),
        "{}",
        meta["fedfuse.model"]
    );
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("fused.assignments.json")).unwrap(),
    )
    .unwrap();
    let ident: Vec<Vec<usize>> = perm.iter().map(|x| (0..x.len()).collect()).collect();
    assert_recovered(&report, &[ident, perm]);
}

#[test]
fn files_that_do_not_fit_the_model_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = d.join("net.toml");
    std::fs::write(&model, NET_TOML).unwrap();
    let model = model.to_str().unwrap().to_string();
    let good = write(d, "good.safetensors", &renamed(&net(1), false));
    let lenet = ModelSpec::LeNet5 {
        channels: 1,
        side: 28,
        classes: 10,
    };
    let lenet_file = write(
        d,
        "lenet.safetensors",
        &init_params(&lenet, Init::Default, 0),
    );
    // Kernel 5 where the list says 3.
    let mut wide_kernel = renamed(&net(1), false);
    let t = wide_kernel.get_mut("conv2.weight").unwrap();
    t.shape = vec![6, 4, 5, 5];
    t.data = vec![0.1; 6 * 4 * 25];
    let wide_kernel = write(d, "kernel5.safetensors", &wide_kernel);
    // Another width of conv1: fine for PFNM, not for weight matching.
    let narrow_layers = {
        let mut l = layers();
        l[0] = LayerSpec::conv2d(3, 3).with_padding(1);
        l
    };
    let narrow = init_params(
        &ModelSpec::sequential(&INPUT, narrow_layers),
        Init::Default,
        2,
    );
    let narrow = write(d, "narrow.safetensors", &renamed(&net_from(&narrow), false));
    let resnet = ZooModel::Resnet20
        .spec(&[3, 32, 32], 10, BlockNorm::Batch, 16)
        .unwrap();
    let resnet = write(
        d,
        "resnet.safetensors",
        &init_params(&resnet, Init::Default, 0),
    );
    let toml_without_input = d.join("noinput.toml");
    std::fs::write(
        &toml_without_input,
        NET_TOML.replace("input = [1, 8, 8]\n", ""),
    )
    .unwrap();
    let out = d.join("f.safetensors");
    let out = out.to_str().unwrap();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        // Conv tensors without a model.
        (
            vec![&good, &good],
            vec!["good.safetensors", "conv1.weight", "--model"],
        ),
        // Another network than the model's.
        (
            vec!["--model", &model, &good, &lenet_file],
            vec!["lenet.safetensors", "net.toml", "running_mean"],
        ),
        (
            vec!["--model", &model, &good, &wide_kernel],
            vec![
                "kernel5.safetensors",
                "`conv2.weight`",
                "[6, 4, 5, 5]",
                "[6, 4, 3, 3]",
            ],
        ),
        (
            vec!["--model", "lenet5", &lenet_file, &good],
            vec!["good.safetensors", "lenet5"],
        ),
        (
            vec![
                "--model",
                &model,
                "--method",
                "weight-matching",
                &good,
                &narrow,
            ],
            vec![
                "narrow.safetensors",
                "weight matching keeps the widths fixed",
            ],
        ),
        (
            vec!["--model", &model, "--method", "fedavg", &good, &narrow],
            vec!["narrow.safetensors", "[1, 3, 6, 8, 3]", "fedavg"],
        ),
        // FedMA-style one-layer matchers aside, PFNM takes residual networks, but not a
        // file of another network.
        (
            vec!["--model", "resnet20", &resnet, &good],
            vec!["good.safetensors", "resnet20"],
        ),
        (
            vec!["--model", "lenet", &good],
            vec!["lenet5", "cnn-leaf", "vgg9"],
        ),
        (
            vec!["--model", toml_without_input.to_str().unwrap(), &good],
            vec!["noinput.toml", "model.input"],
        ),
    ];
    for (args, needles) in cases {
        let mut all = vec!["fuse", "--out", out];
        all.extend(args);
        let o = fedfuse(&all);
        assert!(!o.status.success(), "{all:?} succeeded");
        let stderr = String::from_utf8_lossy(&o.stderr);
        for n in needles {
            assert!(stderr.contains(n), "{all:?}: `{n}` not in: {stderr}");
        }
    }
    // PFNM takes clients of other widths.
    let o = fedfuse(&["fuse", "--model", &model, &good, &narrow, "--out", out]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `p` (an initialised net of other widths) with its batch norm's counter set, as `net` does.
fn net_from(p: &Params) -> Params {
    let mut p = p.clone();
    p.get_mut("1.num_batches_tracked").unwrap().data[0] = 3.0;
    p
}

#[test]
fn weight_matching_reads_mlps_without_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let spec = ModelSpec::mlp(6, &[5, 4], 3);
    let p = init_params(&spec, Init::Default, 8);
    let ModelSpec::Sequential { input, layers } = spec.as_sequential() else {
        unreachable!()
    };
    let list_names: Vec<String> = ModelSpec::sequential(&input, layers.clone())
        .param_shapes()
        .into_iter()
        .map(|s| s.name)
        .collect();
    let rename = |p: &Params, names: &[String]| {
        let mut out = Params::new();
        for ((_, t), n) in p.iter().zip(names) {
            out.push(n.clone(), t.shape.clone(), t.data.clone())
                .unwrap();
        }
        out
    };
    let (q, perm) = permuted(&input, &layers, &rename(&p, &list_names), 1);
    let q = rename(&q, p.names());
    let files = [
        write(dir.path(), "a.safetensors", &p),
        write(dir.path(), "b.safetensors", &q),
    ];
    let out = dir.path().join("wm.safetensors");
    let o = fedfuse(&[
        "fuse",
        "--method",
        "weight-matching",
        &files[0],
        &files[1],
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (fused, meta, _) = read_fused(&out);
    assert_close(&fused, &p, 1e-6);
    assert_eq!(meta["fedfuse.widths"], "[6,5,4,3]");
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.with_extension("assignments.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(report["layers"][1]["tensor"], "layers.1.weight");
    let ident: Vec<Vec<usize>> = perm.iter().map(|x| (0..x.len()).collect()).collect();
    assert_recovered(&report, &[ident, perm]);
    // Fused MLPs still take the MLP way (top-down PFNM) despite their stored list.
    let again = dir.path().join("again.safetensors");
    let o = fedfuse(&[
        "fuse",
        out.to_str().unwrap(),
        &files[0],
        "--out",
        again.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!read_fused(&again).1.contains_key("fedfuse.model"));
}

/// `--reset-bn`: the fused model's batch norm gets statistics of the inputs given (one pass
/// of 4 samples here: their channel means, whatever the clients' were) and one batch counted;
/// a samples file that is not one finite array of the model's inputs, or a batch of 0 or
/// beyond the limit, is refused naming the file or the flag, and writes nothing.
#[test]
fn reset_bn_reestimates_the_fused_batch_norm_and_refuses_bad_samples() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("net.toml");
    std::fs::write(&model, NET_TOML).unwrap();
    let model = model.to_str().unwrap().to_string();
    let (a, b) = (
        write(dir.path(), "a.safetensors", &net(1)),
        write(dir.path(), "b.safetensors", &net(2)),
    );
    let samples = |name: &str, shape: Vec<usize>, data: Vec<f32>| {
        let mut p = Params::new();
        p.push("x", shape, data).unwrap();
        write(dir.path(), name, &p)
    };
    let ok = samples(
        "x.safetensors",
        vec![4, 1, 8, 8],
        (0..256).map(|i| (i % 7) as f32 / 7.0).collect(),
    );
    let out = dir.path().join("fused.safetensors");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "fuse",
            &a,
            &b,
            "--model",
            &model,
            "--method",
            "weight-matching",
        ];
        args.extend_from_slice(&["--out", out.to_str().unwrap()]);
        args.extend_from_slice(extra);
        fedfuse(&args)
    };
    let plain = run(&[]);
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let (before, _, _) = read_fused(&out);
    let reset = run(&["--reset-bn", &ok, "--reset-bn-batch", "4"]);
    assert!(
        reset.status.success(),
        "{}",
        String::from_utf8_lossy(&reset.stderr)
    );
    let (after, _, _) = read_fused(&out);
    assert_eq!(after.get("1.num_batches_tracked").unwrap().data, [1.0]);
    assert_ne!(after.get("1.running_mean"), before.get("1.running_mean"));
    assert_eq!(after.get("0.weight"), before.get("0.weight"));
    std::fs::remove_file(&out).unwrap();
    let two = {
        let mut p = Params::new();
        p.push("x", vec![1, 1, 8, 8], vec![0.0; 64]).unwrap();
        p.push("y", vec![1, 1, 8, 8], vec![0.0; 64]).unwrap();
        write(dir.path(), "two.safetensors", &p)
    };
    let truncated = dir.path().join("cut.safetensors");
    let bytes = std::fs::read(&ok).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--reset-bn".into(),
                samples("nan.safetensors", vec![1, 1, 8, 8], vec![f32::NAN; 64]),
            ],
            "finite",
        ),
        (
            vec![
                "--reset-bn".into(),
                samples("empty.safetensors", vec![0, 1, 8, 8], vec![]),
            ],
            "n >= 1",
        ),
        (
            vec![
                "--reset-bn".into(),
                samples("shape.safetensors", vec![2, 1, 4, 4], vec![0.0; 32]),
            ],
            "[1, 8, 8]",
        ),
        (vec!["--reset-bn".into(), two], "one array"),
        (
            vec!["--reset-bn".into(), truncated.to_str().unwrap().into()],
            "cut.safetensors",
        ),
        (
            vec![
                "--reset-bn".into(),
                ok.clone(),
                "--reset-bn-batch".into(),
                "0".into(),
            ],
            "1 to 65536",
        ),
        (
            vec![
                "--reset-bn".into(),
                ok.clone(),
                "--reset-bn-batch".into(),
                "99999999999".into(),
            ],
            "1 to 65536",
        ),
        (
            vec![
                "--reset-bn".into(),
                ok.clone(),
                "--reset-bn-batch".into(),
                "-3".into(),
            ],
            "unexpected argument '-3'",
        ),
    ];
    for (extra, want) in cases {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let o = run(&extra);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(want),
            "{extra:?}: {err}"
        );
        assert!(!out.exists(), "{extra:?} wrote the fused file");
    }
}

/// Two torchvision ResNet-18 files (width 4), the second a copy with every permutation group
/// shuffled and its names sorted as `safetensors.torch.save_file` writes them: `--model
/// resnet18` reads them by torchvision's names, weight matching undoes the shuffle, and the
/// fused file keeps torchvision's names (so `load_state_dict(strict=True)` takes it) and
/// re-estimates its batch norm from samples. The same for ResNet-50 (width 2).
#[test]
fn torchvision_resnet_files_fuse_by_name() {
    torchvision_files_fuse_by_name(ZooModel::Resnet18, "resnet18", 4);
    // Bottleneck blocks, `layer1.0`'s projection at stride 1 included.
    torchvision_files_fuse_by_name(ZooModel::Resnet50, "resnet50", 2);
}

fn torchvision_files_fuse_by_name(zoo: ZooModel, model: &str, width: usize) {
    let dir = tempfile::tempdir().unwrap();
    let input = [3, 16, 16];
    let spec = zoo.spec(&input, 10, BlockNorm::Batch, width).unwrap();
    let layers = spec.layer_list().to_vec();
    let p = init_params(&spec, Init::Default, 7);
    let mut q = p.clone();
    let mut rng = StdRng::seed_from_u64(8);
    for uses in fedfuse_core::layers::permutation_groups(&input, &layers).unwrap() {
        let mut perm: Vec<usize> = (0..uses.units).collect();
        perm.shuffle(&mut rng);
        permute_units(&mut q, &uses, &perm).unwrap();
    }
    let names = zoo.torchvision_names(&layers).unwrap();
    let torch = |p: &Params, sorted: bool| {
        let p = p.clone().renamed(|n| names.torch_name(n)).unwrap();
        let mut order: Vec<&str> = p.names().iter().map(String::as_str).collect();
        if sorted {
            order.sort_unstable();
        }
        let mut out = Params::new();
        for n in order {
            let t = p.get(n).unwrap();
            out.push(n, t.shape.clone(), t.data.clone()).unwrap();
        }
        out
    };
    let want = torch(&p, false);
    let a = write(dir.path(), "a.safetensors", &want);
    let b = write(dir.path(), "b.safetensors", &torch(&q, true));
    let samples = {
        let mut x = Params::new();
        let data = (0..8 * 3 * 16 * 16).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0);
        x.push("x", vec![8, 3, 16, 16], data.collect()).unwrap();
        write(dir.path(), "x.safetensors", &x)
    };
    let out = dir.path().join("fused.safetensors");
    let fuse = |method: &str, extra: &[&str]| {
        let mut args = vec!["fuse", &a, &b, "--model", model];
        args.extend(["--method", method, "--out", out.to_str().unwrap()]);
        args.extend(extra);
        let o = fedfuse(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        read_fused(&out)
    };
    let (fused, _, dtypes) = fuse("weight-matching", &[]);
    assert_close(&fused, &want, 1e-5);
    for name in want.names() {
        let dtype = if name.ends_with("num_batches_tracked") {
            "I64"
        } else {
            "F32"
        };
        assert_eq!(dtypes[name.as_str()], dtype, "{model} {name}");
    }
    assert!(dtypes.contains_key("layer2.0.downsample.0.weight"));
    // PFNM at a sharp prior matches every group too: the widths stay, the values come back
    // up to the prior's shrinkage.
    let (pfnm, _, _) = fuse("pfnm", &["--sigma", "0.0001"]);
    assert_close(&pfnm, &want, 1e-3);

    // With the statistics re-estimated: the same weights, new running statistics.
    let (reset, _, _) = fuse("weight-matching", &["--reset-bn", &samples]);
    assert_eq!(reset.get("fc.weight"), fused.get("fc.weight"));
    assert_ne!(
        reset.get("layer1.0.bn1.running_mean"),
        fused.get("layer1.0.bn1.running_mean")
    );
}

/// `fedfuse groups` shows what weight matching moves together, under the names the files
/// carry: ResNet-18's 4 stage streams and 8 blocks' inner channels, the first stream held by
/// the stem and both blocks' `conv2` and read by the next stage's projection.
#[test]
fn groups_show_what_moves_together_under_the_files_names() {
    let o = fedfuse(&["groups", "--model", "resnet18", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let groups: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(groups.len(), 12);
    let names = |g: &serde_json::Value, key: &str| -> Vec<String> {
        g[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let stream = &groups[0];
    assert_eq!(stream["units"], 64);
    let holds = names(stream, "holds");
    for t in ["conv1.weight", "bn1.running_var", "layer1.1.conv2.weight"] {
        assert!(holds.contains(&t.to_string()), "{t} in {holds:?}");
    }
    assert!(names(stream, "read_by").contains(&"layer2.0.downsample.0.weight".to_string()));
    assert_eq!(names(&groups[1], "read_by"), ["layer1.0.conv2.weight"]);

    let o = fedfuse(&["groups", "--model", "resnet20", "--input", "1,28,28"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && text.contains("12 permutation groups"),
        "{text}"
    );
    assert!(text.contains("group 0: 16 units"), "{text}");
    // A bad shape, a zero and a side past every bound: refused, naming the input.
    for input in ["3,2", "3,0,32", "3,4294967296,4294967296", "3,-1,4"] {
        let o = fedfuse(&["groups", "--model", "resnet18", "--input", input]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("input"),
            "{input}: {err}"
        );
    }
}
