//! `fedfuse fuse` on real client models trained on the bundled digits.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use fedfuse_core::{ModelSpec, Params, load_safetensors, save_safetensors};
use fedfuse_data::{PartitionSpec, load_dataset, partition};
use fedfuse_fuse::{PfnmConfig, pfnm_fuse};
use fedfuse_train::{Init, OptimizerConfig, TrainConfig, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn fedfuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fedfuse"))
        .args(args)
        .output()
        .expect("the fedfuse binary runs")
}

/// Three clients on a Dirichlet(0.5) split of digits, each from its own random init.
fn train_clients(dir: &Path) -> (Vec<PathBuf>, Vec<Vec<f64>>, Vec<Params>) {
    let data = load_dataset("digits", None).unwrap();
    let spec = ModelSpec::mlp(64, &[32], 10);
    let trainer = Trainer::new(spec.clone()).unwrap();
    let mut rng = StdRng::seed_from_u64(4);
    let split = PartitionSpec::Dirichlet {
        alpha: 0.5,
        min_partition_size: 50,
        self_balancing: true,
    };
    let parts = partition(&data.train.y, 10, 3, &split, &mut rng).unwrap();
    let cfg = TrainConfig {
        optimizer: OptimizerConfig::Sgd {
            momentum: 0.9,
            weight_decay: 0.0,
        },
        lr: 0.05,
        epochs: 30,
        batch_size: 16,

        dropout: 0.0,
    };
    let (mut files, mut counts, mut models) = (Vec::new(), Vec::new(), Vec::new());
    for (j, idx) in parts.iter().enumerate() {
        let local = data.train.subset(idx);
        let start = init_params(&spec, Init::Default, 100 + j as u64);
        let fitted = trainer
            .fit_with(&start, &local, &cfg, None, j as u64)
            .unwrap();
        let file = dir.join(format!("client{j}.safetensors"));
        save_safetensors(&fitted.params, &file).unwrap();
        files.push(file);
        counts.push(local.class_counts().iter().map(|&c| c as f64).collect());
        models.push(fitted.params);
    }
    (files, counts, models)
}

fn accuracy(params: &Params) -> f64 {
    let data = load_dataset("digits", None).unwrap();
    let hidden: Vec<usize> = params
        .iter()
        .filter(|(n, _)| n.ends_with(".bias"))
        .map(|(_, t)| t.data.len())
        .collect();
    let spec = ModelSpec::mlp(64, &hidden[..hidden.len() - 1], 10);
    Trainer::new(spec)
        .unwrap()
        .evaluate(params, &data.test)
        .unwrap()
        .accuracy
}

#[test]
fn pfnm_fuse_files_round_trip_and_beat_averaging() {
    let dir = tempfile::tempdir().unwrap();
    let (files, counts, models) = train_clients(dir.path());
    let counts_file = dir.path().join("counts.json");
    std::fs::write(&counts_file, serde_json::to_string(&counts).unwrap()).unwrap();
    let out = dir.path().join("fused.safetensors");
    let mut args = vec!["fuse", "--method", "pfnm", "--seed", "3"];
    let file_args: Vec<&str> = files.iter().map(|f| f.to_str().unwrap()).collect();
    args.extend(&file_args);
    args.extend(["--class-counts", counts_file.to_str().unwrap()]);
    args.extend(["--out", out.to_str().unwrap()]);
    let o = fedfuse(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // The file is the in-memory fusion, exactly.
    let loaded = load_safetensors(&out).unwrap();
    let refs: Vec<&Params> = models.iter().collect();
    let mut rng = StdRng::seed_from_u64(3);
    let in_memory = pfnm_fuse(&refs, Some(&counts), &PfnmConfig::default(), &mut rng).unwrap();
    assert_eq!(loaded, in_memory.params);
    // Any matching of three 32-unit clients is 32 to 96 wide: 32 when every unit is merged, 96
    // when none is. The default prior (sigma = sigma0 = gamma = 1) merges every unit here (so
    // does a matcher that always merges; one that never merges gives 96). The run at sigma 0.3
    // below tells PFNM from a matcher that always merges.
    let width = loaded.get("layers.0.bias").unwrap().data.len();
    assert_eq!(width, 32, "global width");

    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("fused.assignments.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(report["fused_widths"], serde_json::json!([64, width, 10]));
    let layer0 = &report["layers"][0]["assignments"];
    assert_eq!(layer0.as_array().unwrap().len(), 3);
    for client in layer0.as_array().unwrap() {
        let units: Vec<u64> = client
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(units.len(), 32);
        let mut dedup = units.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(
            dedup.len(),
            32,
            "a client's units map to distinct global units"
        );
        assert!(units.iter().all(|&g| (g as usize) < width));
    }

    // Matching beats coordinate-wise averaging of separately initialised networks.
    // Into folders that do not exist yet: `fuse` makes them.
    let avg_out = dir.path().join("new/fused/avg.safetensors");
    let mut avg_args = vec!["fuse", "--method", "fedavg"];
    avg_args.extend(&file_args);
    avg_args.extend(["--out", avg_out.to_str().unwrap()]);
    assert!(fedfuse(&avg_args).status.success());
    let (pfnm_acc, avg_acc) = (
        accuracy(&loaded),
        accuracy(&load_safetensors(&avg_out).unwrap()),
    );
    eprintln!("digits test accuracy: PFNM {pfnm_acc:.3} (width {width}), averaging {avg_acc:.3}");
    assert!(
        pfnm_acc > avg_acc + 0.1,
        "PFNM {pfnm_acc} vs averaging {avg_acc}"
    );

    // A tighter prior on the clients' units opens some global units and merges the rest.
    // Measured width per sigma: 0.5 -> 37, 0.3 -> 44, 0.2 -> 52, 0.1 -> 71, 0.02 -> 96; at 0.3
    // accuracy 0.936, where a matcher that always merges gives 32 units and 0.855, one that
    // never merges 96.
    let tight = dir.path().join("tight.safetensors");
    let mut tight_args = vec!["fuse", "--method", "pfnm", "--seed", "3", "--sigma", "0.3"];
    tight_args.extend(&file_args);
    tight_args.extend(["--class-counts", counts_file.to_str().unwrap()]);
    tight_args.extend(["--out", tight.to_str().unwrap()]);
    assert!(fedfuse(&tight_args).status.success());
    let tight = load_safetensors(&tight).unwrap();
    let tight_width = tight.get("layers.0.bias").unwrap().data.len();
    let tight_acc = accuracy(&tight);
    eprintln!("sigma 0.3: width {tight_width}, accuracy {tight_acc:.3}");
    assert!(
        (36..=60).contains(&tight_width),
        "sigma 0.3: global width {tight_width}, expected some but not most units opened"
    );
    assert!(tight_acc > 0.9, "sigma 0.3: accuracy {tight_acc}");
}

#[test]
fn bad_client_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let good = init_params(&ModelSpec::mlp(4, &[3], 2), Init::Default, 0);
    let write = |name: &str, p: &Params| {
        let f = dir.path().join(name);
        save_safetensors(p, &f).unwrap();
        f.to_str().unwrap().to_string()
    };
    let ok = write("ok.safetensors", &good);
    let mut nan = good.clone();
    nan.get_mut("layers.1.weight").unwrap().data[0] = f32::NAN;
    let nan = write("nan.safetensors", &nan);
    let mut no_bias = Params::new();
    for (n, t) in good.iter().filter(|(n, _)| *n != "layers.0.bias") {
        no_bias.push(n, t.shape.clone(), t.data.clone()).unwrap();
    }
    let mut extra = good.clone();
    extra.push("extra", vec![1], vec![0.0]).unwrap();
    let no_bias = write("nobias.safetensors", &no_bias);
    let extra = write("extra.safetensors", &extra);
    let mut conv = Params::new();
    conv.push("layers.0.weight", vec![3, 1, 2, 2], vec![0.0; 12])
        .unwrap();
    conv.push("layers.0.bias", vec![3], vec![0.0; 3]).unwrap();
    let conv = write("conv.safetensors", &conv);
    let wide = write(
        "wide.safetensors",
        &init_params(&ModelSpec::mlp(5, &[3], 2), Init::Default, 0),
    );
    let out = dir.path().join("f.safetensors");
    let out = out.to_str().unwrap();
    for (bad, needles) in [
        (
            &nan,
            vec!["nan.safetensors", "layers.1.weight", "non-finite"],
        ),
        (
            &no_bias,
            vec!["nobias.safetensors", "layers.0.weight", "bias=True"],
        ),
        (&extra, vec!["extra.safetensors", "`extra`", "nn.Linear"]),
        (&conv, vec!["conv.safetensors", "nn.Linear"]),
        (&wide, vec!["wide.safetensors", "[5, 3, 2]"]),
    ] {
        let o = fedfuse(&["fuse", &ok, bad, "--out", out]);
        assert!(!o.status.success());
        let stderr = String::from_utf8_lossy(&o.stderr);
        for n in needles {
            assert!(stderr.contains(n), "`{n}` not in: {stderr}");
        }
    }
    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"not a model").unwrap();
    let o = fedfuse(&["fuse", &ok, garbage.to_str().unwrap(), "--out", out]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("garbage.safetensors"));
}

/// Writes `params` as numpy's `savez` would (stored members `NAME.npy`, '<f4', C order).
fn write_npz(params: &Params, path: &Path) {
    use std::io::Write as _;
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, t) in params.iter() {
        let shape: Vec<String> = t.shape.iter().map(ToString::to_string).collect();
        let shape = if shape.len() == 1 {
            format!("({},)", shape[0])
        } else {
            format!("({})", shape.join(", "))
        };
        let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
        // Magic (6) + version (2) + length (2) + header, padded with spaces to 64 bytes.
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        zip.start_file(format!("{name}.npy"), opts).unwrap();
        zip.write_all(b"\x93NUMPY\x01\x00").unwrap();
        zip.write_all(&(header.len() as u16).to_le_bytes()).unwrap();
        zip.write_all(header.as_bytes()).unwrap();
        for v in &t.data {
            zip.write_all(&v.to_le_bytes()).unwrap();
        }
    }
    zip.finish().unwrap();
}

#[test]
fn gpi_fnm_fuses_npz_files_as_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (_, counts, models) = train_clients(dir.path());
    let files: Vec<String> = models
        .iter()
        .enumerate()
        .map(|(j, m)| {
            let f = dir.path().join(format!("client{j}.npz"));
            write_npz(m, &f);
            f.to_str().unwrap().to_string()
        })
        .collect();
    let counts_file = dir.path().join("counts.json");
    std::fs::write(&counts_file, serde_json::to_string(&counts).unwrap()).unwrap();
    let out = dir.path().join("gpi.safetensors");
    let run = |extra: &[&str]| {
        let mut args = vec!["fuse", "--seed", "3"];
        args.extend(files.iter().map(String::as_str));
        args.extend(["--class-counts", counts_file.to_str().unwrap()]);
        args.extend(["--out", out.to_str().unwrap()]);
        args.extend(extra);
        fedfuse(&args)
    };
    let o = run(&["--method", "gpi-fnm", "--eps", "0.05"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let refs: Vec<&Params> = models.iter().collect();
    let cfg = PfnmConfig {
        eps: 0.05,
        ..PfnmConfig::default()
    };
    let in_memory = pfnm_fuse(&refs, Some(&counts), &cfg, &mut StdRng::seed_from_u64(3)).unwrap();
    assert_eq!(load_safetensors(&out).unwrap(), in_memory.params);
    let report = std::fs::read_to_string(dir.path().join("gpi.assignments.json")).unwrap();
    assert!(report.contains("\"gpi-fnm\""), "{report}");

    // eps belongs to GPI-FNM, and GPI-FNM needs one.
    let o = run(&["--method", "gpi-fnm"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("eps > 0"));
    let o = run(&["--method", "pfnm", "--eps", "0.1"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("gpi-fnm"));
    let pt = dir.path().join("model.pt");
    std::fs::write(&pt, b"x").unwrap();
    let o = fedfuse(&[
        "fuse",
        &files[0],
        pt.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("model.pt") && stderr.contains(".npz"),
        "{stderr}"
    );
}

/// A small ViT on MNIST's side (patch 7, hidden 8, 2 heads, MLP 6) of `blocks` blocks: its
/// list, random weights, and a `--model` file for it in `dir`.
fn small_vit(dir: &Path, blocks: usize) -> (Vec<fedfuse_core::LayerSpec>, Params, String) {
    let shape = fedfuse_core::VitShape {
        patch: 7,
        hidden: 8,
        layers: blocks,
        heads: 2,
        mlp: 6,
        ..fedfuse_core::VitShape::default()
    };
    let layers = shape.layers(10);
    let spec = ModelSpec::sequential(&[1, 28, 28], layers.clone());
    let p = init_params(&spec, Init::Pfnm, 3);
    let model = dir.join("vit.toml");
    std::fs::write(
        &model,
        format!(
            "[model]\nkind = \"vit\"\ninput = [1, 28, 28]\n[model.vit]\npatch = 7\n\
             hidden = 8\nlayers = {blocks}\nheads = 2\nmlp = 6\n"
        ),
    )
    .unwrap();
    (layers, p, model.to_str().unwrap().to_string())
}

/// `params` (list names) saved in `dir` as `file` under torchvision's names.
fn save_torchvision(
    layers: &[fedfuse_core::LayerSpec],
    params: &Params,
    dir: &Path,
    file: &str,
) -> PathBuf {
    let names = fedfuse_core::TorchvisionNames::of(layers);
    let path = dir.join(file);
    let renamed = params.clone().renamed(|n| names.torch_name(n)).unwrap();
    save_safetensors(&renamed, &path).unwrap();
    path
}

/// Two torchvision-named ViT files (random weights, the second a relabelled copy of the
/// first): `fedfuse groups` shows the heads, weight matching and PFNM (at a sharp prior) give
/// the first back under torchvision's names, and the fused file fuses again without `--model`
/// (its metadata keeps the ViT's settings).
#[test]
fn vit_files_fuse_by_weight_matching_under_torchvisions_names() {
    use rand::seq::SliceRandom;
    let dir = tempfile::tempdir().unwrap();
    let (layers, p, model) = small_vit(dir.path(), 1);
    let mut rng = StdRng::seed_from_u64(4);
    let mut shuffled = |n: usize| {
        let mut v: Vec<usize> = (0..n).collect();
        v.shuffle(&mut rng);
        v
    };
    // Stream; the block's query-key and value groups (heads swapped, features within kept);
    // its MLP units.
    let perms = vec![
        shuffled(8),
        vec![4, 5, 6, 7, 0, 1, 2, 3],
        vec![4, 5, 6, 7, 0, 1, 2, 3],
        shuffled(6),
    ];
    let q = fedfuse_fuse::permute_vit(&layers, &p, &perms).unwrap();
    let torch = |params: &Params, file: &str| save_torchvision(&layers, params, dir.path(), file);
    let (a, b) = (torch(&p, "a.safetensors"), torch(&q, "b.safetensors"));
    let names = fedfuse_core::TorchvisionNames::of(&layers);
    let model = model.as_str();
    let out = fedfuse(&["groups", "--model", model]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("4 permutation groups") && text.contains("in 2 heads of 4"),
        "{text}"
    );
    assert!(
        text.contains("encoder.layers.encoder_layer_0.self_attention.in_proj_weight (rows 8:16)")
    );

    let fused = dir.path().join("fused.safetensors");
    let run = |args: &[&str]| {
        let out = fedfuse(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "fuse",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--model",
        model,
        "--method",
        "weight-matching",
        "--out",
        fused.to_str().unwrap(),
    ]);
    let got = load_safetensors(&fused).unwrap();
    let want = p.clone().renamed(|n| names.torch_name(n)).unwrap();
    assert_eq!(got.names(), want.names());
    for (name, t) in want.iter() {
        let g = &got.get(name).unwrap().data;
        let worst = g
            .iter()
            .zip(&t.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-6, "{name}: {worst}");
    }
    // PFNM at a sharp prior pairs the same units: the first network back, at its widths.
    let pfnm = dir.path().join("pfnm.safetensors");
    run(&[
        "fuse",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--model",
        model,
        "--method",
        "pfnm",
        "--sigma",
        "0.0001",
        "--out",
        pfnm.to_str().unwrap(),
    ]);
    let got = load_safetensors(&pfnm).unwrap();
    assert_eq!(got.names(), want.names());
    for (name, t) in want.iter() {
        let g = got.get(name).unwrap();
        assert_eq!(g.shape, t.shape, "{name}");
        let worst = g
            .data
            .iter()
            .zip(&t.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-3, "{name}: {worst}");
    }
    // Without --model: the settings come from the fused file's metadata.
    let again = dir.path().join("again.safetensors");
    run(&[
        "fuse",
        fused.to_str().unwrap(),
        b.to_str().unwrap(),
        "--method",
        "weight-matching",
        "--out",
        again.to_str().unwrap(),
    ]);
}

/// PFNM widens a ViT's MLPs block by block: two torchvision-named files, the second holding
/// block 0's MLP units plus two of its own, fuse to MLP widths [8, 6]; the fused file's
/// metadata says so (`[model.vit] mlps`), so it fuses again without `--model`, and weight
/// matching, which keeps widths, refuses the wider file by name.
#[test]
fn pfnm_widens_a_vit_block_by_block_and_the_file_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (layers, p, model) = small_vit(dir.path(), 2);
    // Block 0's MLP with two more units, far from the others.
    let mut q = Params::new();
    for (name, t) in p.iter() {
        let (shape, data) = match name {
            "1.mlp.0.weight" => {
                let mut d = t.data.clone();
                d.extend((0..16).map(|k| if k % 2 == 0 { 40.0 } else { -40.0 }));
                (vec![8, 8], d)
            }
            "1.mlp.0.bias" => {
                let mut d = t.data.clone();
                d.extend([30.0, 30.0]);
                (vec![8], d)
            }
            "1.mlp.3.weight" => {
                let d = t
                    .data
                    .chunks(6)
                    .flat_map(|row| row.iter().copied().chain([0.5, -0.5]))
                    .collect();
                (vec![8, 8], d)
            }
            _ => (t.shape.clone(), t.data.clone()),
        };
        q.push(name.to_string(), shape, data).unwrap();
    }
    let torch = |params: &Params, file: &str| {
        let path = save_torchvision(&layers, params, dir.path(), file);
        path.to_str().unwrap().to_string()
    };
    let (a, b) = (torch(&p, "a.safetensors"), torch(&q, "b.safetensors"));
    let path = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    let fuse = |args: &[&str]| {
        let out = fedfuse(args);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let fused = path("fused.safetensors");
    let (ok, err) = fuse(&[
        "fuse", &a, &b, "--model", &model, "--method", "pfnm", "--sigma", "0.0001", "--out", &fused,
    ]);
    assert!(ok, "{err}");
    let got = load_safetensors(Path::new(&fused)).unwrap();
    let rows = |p: &Params, name: &str| p.get(name).unwrap().shape.clone();
    assert_eq!(
        rows(&got, "encoder.layers.encoder_layer_0.mlp.0.weight"),
        vec![8, 8]
    );
    assert_eq!(
        rows(&got, "encoder.layers.encoder_layer_1.mlp.3.weight"),
        vec![8, 6]
    );
    let header = std::fs::read(&fused).unwrap();
    let text = String::from_utf8_lossy(&header[..4096.min(header.len())]);
    assert!(
        text.contains("mlps = [8, 6]") && text.contains("kind = \\\"vit\\\""),
        "{text}"
    );
    // Again, the settings from the fused file's metadata.
    let again = path("again.safetensors");
    let (ok, err) = fuse(&[
        "fuse", &fused, &b, "--method", "pfnm", "--sigma", "0.0001", "--out", &again,
    ]);
    assert!(ok, "{err}");
    let back = load_safetensors(Path::new(&again)).unwrap();
    assert_eq!(
        rows(&back, "encoder.layers.encoder_layer_0.mlp.0.weight"),
        vec![8, 8]
    );
    let (ok, err) = fuse(&[
        "fuse",
        &fused,
        &a,
        "--method",
        "weight-matching",
        "--out",
        &again,
    ]);
    assert!(
        !ok && err.contains("mlp.0.weight") && err.contains("widths"),
        "{err}"
    );
}
