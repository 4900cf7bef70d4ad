//! Layer lists: what a list declares, the tensors it implies, the errors that name the layer
//! that does not fit, the groups that sparsity gates, and who holds and reads their units.

use fedfuse_core::layers::{UnitUse, gate_points, unit_uses};
use fedfuse_core::{BlockNorm, GroupLayout, LayerSpec, ModelSpec, ZooModel};

fn from_json(text: &str) -> Result<ModelSpec, String> {
    serde_json::from_str::<ModelSpec>(text).map_err(|e| e.to_string())
}

#[test]
fn a_list_reads_with_pytorch_defaults_and_names() {
    let spec = from_json(
        r#"{"kind": "sequential", "input": [3, 8, 8], "layers": [
            {"type": "conv2d", "out": 4, "kernel": 3, "padding": 1, "bias": false},
            {"type": "batchnorm2d"},
            {"type": "relu"},
            {"type": "maxpool2d", "kernel": 2},
            {"type": "flatten"},
            {"type": "linear", "out": 5}
        ]}"#,
    )
    .unwrap();
    spec.validate().unwrap();
    let shapes: Vec<(String, Vec<usize>)> = spec
        .param_shapes()
        .into_iter()
        .map(|p| (p.name, p.shape))
        .collect();
    let want: Vec<(String, Vec<usize>)> = [
        ("0.weight", vec![4, 3, 3, 3]),
        ("1.weight", vec![4]),
        ("1.bias", vec![4]),
        ("1.running_mean", vec![4]),
        ("1.running_var", vec![4]),
        ("1.num_batches_tracked", vec![]),
        ("5.weight", vec![5, 64]),
        ("5.bias", vec![5]),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s))
    .collect();
    assert_eq!(shapes, want);
    // Parameters only, as PyTorch's `parameters()` counts them: 108 + 8 + 320 + 5.
    assert_eq!(spec.num_params(), 441);
    assert!(spec.has_buffers());
    assert_eq!(spec.classes(), 5);
    assert_eq!(spec.input_len(), 192);
    let LayerSpec::BatchNorm2d { eps, momentum } = spec.layer_list()[1] else {
        panic!()
    };
    assert_eq!((eps, momentum), (1e-5, 0.1));
}

#[test]
fn errors_name_the_layer_and_what_to_do() {
    let cases = [
        (
            r#"[{"type": "conv2d", "out": 4, "kernel": 3}, {"type": "linear", "out": 2}]"#,
            &["model.layers[1] (linear", "flatten"][..],
        ),
        (
            r#"[{"type": "conv2d", "out": 4, "kernel": 9}, {"type": "flatten"}, {"type": "linear", "out": 2}]"#,
            &[
                "model.layers[0] (conv2d",
                "9x9 window does not fit a side of 8",
            ],
        ),
        (
            r#"[{"type": "groupnorm", "groups": 2}, {"type": "flatten"}, {"type": "linear", "out": 2}]"#,
            &["model.layers[0] (groupnorm", "does not divide 3 channels"],
        ),
        (
            r#"[{"type": "flatten"}, {"type": "batchnorm2d"}, {"type": "linear", "out": 2}]"#,
            &["model.layers[1] (batchnorm2d", "flat features"],
        ),
        (
            r#"[{"type": "conv2d", "out": 4, "kernel": 3}]"#,
            &["model.layers[0] (conv2d)", "end with flatten and linear"],
        ),
        (
            r#"[{"type": "dropout", "p": 1.0}, {"type": "flatten"}, {"type": "linear", "out": 2}]"#,
            &["model.layers[0] (dropout", "p = 1"],
        ),
        (r#"[]"#, &["1 to 1000 layers"]),
    ];
    for (layers, words) in cases {
        let spec = from_json(&format!(
            r#"{{"kind": "sequential", "input": [3, 8, 8], "layers": {layers}}}"#
        ))
        .unwrap();
        let err = spec.validate().unwrap_err().to_string();
        for w in words {
            assert!(err.contains(w), "{layers}: {err}");
        }
        assert!(spec.param_shapes().is_empty() || words.iter().any(|w| w.contains("end with")));
    }
    // Unknown keys and types are refused when read.
    let typo = from_json(
        r#"{"kind": "sequential", "input": [4], "layers": [{"type": "linear", "out": 2, "bais": false}]}"#,
    )
    .unwrap_err();
    assert!(typo.contains("bais"), "{typo}");
    let kind = from_json(
        r#"{"kind": "sequential", "input": [4], "layers": [{"type": "conv3d", "out": 2}]}"#,
    )
    .unwrap_err();
    assert!(kind.contains("conv3d"), "{kind}");
}

#[test]
fn zoo_counts_are_the_papers() {
    let leaf = ZooModel::CnnLeaf
        .spec(&[1, 28, 28], 62, BlockNorm::Batch, 16)
        .unwrap();
    assert_eq!(leaf.num_params(), 6_603_710);
    let vgg = ZooModel::Vgg9
        .spec(&[3, 32, 32], 10, BlockNorm::Batch, 16)
        .unwrap();
    assert_eq!(vgg.num_params(), 3_491_530);
    // ResNet-20 with projection shortcuts (option B): 0.27M, as He et al. count it.
    let resnet = ZooModel::Resnet20
        .spec(&[3, 32, 32], 10, BlockNorm::Batch, 16)
        .unwrap();
    assert_eq!(resnet.num_params(), 272_474);
    // A 4x4 image is too small for VGG-9's three pools.
    let err = ZooModel::Vgg9
        .spec(&[3, 4, 4], 10, BlockNorm::Batch, 16)
        .unwrap_err()
        .to_string();
    assert!(err.contains("maxpool2d"), "{err}");
}

#[test]
fn groups_are_filters_and_units_with_the_norm_that_follows() {
    let resnet = ZooModel::Resnet20
        .spec(&[3, 32, 32], 10, BlockNorm::Batch, 16)
        .unwrap();
    let ModelSpec::Sequential { input, layers } = &resnet else {
        panic!()
    };
    let points = gate_points(input, layers).unwrap();
    // The stem's 16 filters, then conv1 of each of the nine blocks.
    assert_eq!(points.len(), 10);
    assert_eq!(points[0].group.weight, "0.weight");
    assert_eq!(points[0].group.per_unit, ["1.weight", "1.bias"]);
    assert_eq!(points[0].layer, 1);
    assert_eq!(points[1].group.weight, "3.conv1.weight");
    assert_eq!(points[1].group.per_unit, ["3.bn1.weight", "3.bn1.bias"]);
    assert_eq!(points[1].group.fan_in, 16 * 9);
    let layout = GroupLayout::of_model(&resnet);
    assert_eq!(layout.num_groups(), 16 + 3 * 16 + 3 * 32 + 3 * 64);
    assert_eq!(layout.layers()[0].size(), 27 + 2);

    let leaf = ZooModel::CnnLeaf
        .spec(&[1, 28, 28], 10, BlockNorm::Batch, 16)
        .unwrap();
    let layout = GroupLayout::of_model(&leaf);
    assert_eq!(layout.num_groups(), 32 + 64 + 2048);
    assert_eq!(layout.layers()[2].per_unit, ["7.bias"]);
    // The classifier is ungated.
    assert!(layout.layers().iter().all(|l| l.weight != "9.weight"));
}

fn used(tensor: &str, axis: usize, block: usize, groups: usize) -> UnitUse {
    UnitUse {
        sections: 1,
        tensor: tensor.into(),
        axis,
        block,
        groups,
    }
}

fn names(uses: &[UnitUse]) -> Vec<&str> {
    uses.iter().map(|u| u.tensor.as_str()).collect()
}

/// Every use of every grouped layer covers its tensor exactly once over the units: the map
/// says where each value of a unit-indexed tensor belongs, and no value twice.
fn check_uses_partition(spec: &ModelSpec) {
    let ModelSpec::Sequential { input, layers } = spec else {
        panic!()
    };
    let shapes = spec.param_shapes();
    let layout = GroupLayout::of_model(spec);
    let uses = unit_uses(input, layers).unwrap();
    assert_eq!(uses.len(), layout.layers().len());
    for (u, g) in uses.iter().zip(layout.layers()) {
        assert_eq!(u.units, g.units);
        // The map's own tensors include the group's: its weight and per-unit tensors.
        let own = names(&u.own);
        assert!(own.contains(&g.weight.as_str()), "{own:?}");
        assert!(
            g.per_unit.iter().all(|p| own.contains(&p.as_str())),
            "{own:?}"
        );
        for use_ in u.all() {
            let shape = &shapes.iter().find(|s| s.name == use_.tensor).unwrap().shape;
            let len: usize = shape.iter().product();
            let mut seen = vec![0u8; len];
            for unit in 0..u.units {
                for r in use_.ranges(shape, unit) {
                    seen[r].iter_mut().for_each(|s| *s += 1);
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "{}", use_.tensor);
        }
    }
}

#[test]
fn units_are_held_and_read_where_the_map_says() {
    // [2, 8, 8] -> conv 4 -> bn -> relu -> pool [4, 4, 4] -> conv 6 in 2 channel groups
    // [6, 4, 4] -> relu -> avgpool [6, 2, 2] -> flatten 24 -> linear 5 -> relu -> linear 3.
    let layers = vec![
        LayerSpec::conv2d(4, 3).with_padding(1),
        LayerSpec::batch_norm2d(),
        LayerSpec::Relu,
        LayerSpec::max_pool(2),
        LayerSpec::Conv2d {
            out: 6,
            kernel: 3,
            stride: 1,
            padding: 1,
            groups: 2,
            bias: true,
        },
        LayerSpec::Relu,
        LayerSpec::AvgPool2d {
            kernel: 2,
            stride: None,
        },
        LayerSpec::Flatten,
        LayerSpec::linear(5),
        LayerSpec::Relu,
        LayerSpec::linear(3),
    ];
    let spec = ModelSpec::sequential(&[2, 8, 8], layers.clone());
    spec.validate().unwrap();
    let uses = unit_uses(&[2, 8, 8], &layers).unwrap();
    assert_eq!(uses.len(), 3);
    let [conv, grouped, dense] = &uses[..] else {
        panic!()
    };
    // The first convolution: its filters, its bias, the norm after it (running statistics
    // too), read by the grouped convolution's input channels.
    assert_eq!((conv.layer, conv.units), (0, 4));
    assert_eq!(
        conv.own,
        [
            used("0.weight", 0, 1, 1),
            used("0.bias", 0, 1, 1),
            used("1.weight", 0, 1, 1),
            used("1.bias", 0, 1, 1),
            used("1.running_mean", 0, 1, 1),
            used("1.running_var", 0, 1, 1),
        ]
    );
    assert_eq!(conv.readers, [used("4.weight", 1, 1, 2)]);
    assert_eq!(conv.between, [1, 2, 3]);
    assert!(!conv.identity);
    // The grouped convolution, read after avgpool and flatten by blocks of 2 * 2 columns.
    assert_eq!((grouped.layer, grouped.units), (4, 6));
    assert_eq!(
        grouped.own,
        [used("4.weight", 0, 1, 1), used("4.bias", 0, 1, 1)]
    );
    assert_eq!(grouped.readers, [used("8.weight", 1, 4, 1)]);
    assert_eq!(grouped.between, [5, 6, 7]);
    assert_eq!(dense.readers, [used("10.weight", 1, 1, 1)]);
    assert_eq!(dense.between, [9]);

    // Filter 1 of `0.weight` [4, 2, 3, 3]: values 18..36.
    assert_eq!(conv.own[0].ranges(&[4, 2, 3, 3], 1), vec![18..36]);
    assert_eq!(conv.own[4].ranges(&[4], 3), vec![3..4]);
    // `4.weight` is [6, 2, 3, 3]: channel group 0 (output rows 0-2) reads units 0 and 1,
    // group 1 (rows 3-5) units 2 and 3. Unit 0 is input 0 of rows 0-2 (row stride 18, 9
    // values per input channel); unit 3 is input 1 of rows 3-5.
    let w4 = [6, 2, 3, 3];
    assert_eq!(conv.readers[0].ranges(&w4, 0), [0..9, 18..27, 36..45]);
    assert_eq!(conv.readers[0].ranges(&w4, 3), [63..72, 81..90, 99..108]);
    // `8.weight` is [5, 24]: channel 2 of the [6, 2, 2] maps is columns 8..12 of every row.
    assert_eq!(
        grouped.readers[0].ranges(&[5, 24], 2),
        [8..12, 32..36, 56..60, 80..84, 104..108]
    );
    check_uses_partition(&spec);
}

#[test]
fn a_residual_blocks_units_are_its_inner_channels_and_identity_paths_are_marked() {
    // [2, 6, 6] -> conv 4 (no bias) -> bn -> relu -> block 4 (identity shortcut) -> block 8,
    // stride 2 (projection) -> global pool -> flatten -> linear 3.
    let layers = vec![
        LayerSpec::conv2d(4, 3).with_padding(1).without_bias(),
        LayerSpec::batch_norm2d(),
        LayerSpec::Relu,
        LayerSpec::residual(4, 1, BlockNorm::Batch),
        LayerSpec::residual(8, 2, BlockNorm::Batch),
        LayerSpec::GlobalAvgpool,
        LayerSpec::Flatten,
        LayerSpec::linear(3),
    ];
    let spec = ModelSpec::sequential(&[2, 6, 6], layers.clone());
    spec.validate().unwrap();
    let uses = unit_uses(&[2, 6, 6], &layers).unwrap();
    assert_eq!(uses.len(), 3);
    // The stem feeds block 3's conv1 and its identity path: the block adds to its channels.
    assert_eq!(
        names(&uses[0].own),
        [
            "0.weight",
            "1.weight",
            "1.bias",
            "1.running_mean",
            "1.running_var"
        ]
    );
    assert_eq!(uses[0].readers, [used("3.conv1.weight", 1, 1, 1)]);
    assert!(uses[0].identity);
    assert_eq!(uses[0].between, [1, 2]);
    // A block's units: conv1's filters and bn1's channels, read by conv2 only.
    for (u, (i, units)) in uses[1..].iter().zip([(3, 4), (4, 8)]) {
        assert_eq!((u.layer, u.units), (i, units));
        assert_eq!(
            names(&u.own),
            [
                format!("{i}.conv1.weight"),
                format!("{i}.bn1.weight"),
                format!("{i}.bn1.bias"),
                format!("{i}.bn1.running_mean"),
                format!("{i}.bn1.running_var"),
            ]
        );
        assert_eq!(u.readers, [used(&format!("{i}.conv2.weight"), 1, 1, 1)]);
        assert!(u.between.is_empty() && !u.identity);
    }
    // `3.conv2.weight` is [4, 4, 3, 3]: unit 2 is input channel 2 of each of the 4 filters.
    assert_eq!(
        uses[1].readers[0].ranges(&[4, 4, 3, 3], 2),
        [18..27, 54..63, 90..99, 126..135]
    );
    check_uses_partition(&spec);

    // Before a projection block a layer's units are read by conv1 and the 1x1 shortcut, and
    // do not go on: no identity path.
    let layers = vec![
        LayerSpec::conv2d(4, 3),
        LayerSpec::Relu,
        LayerSpec::residual(8, 1, BlockNorm::None),
        LayerSpec::GlobalAvgpool,
        LayerSpec::Flatten,
        LayerSpec::linear(3),
    ];
    let uses = unit_uses(&[2, 6, 6], &layers).unwrap();
    assert_eq!(
        uses[0].readers,
        [
            used("2.conv1.weight", 1, 1, 1),
            used("2.shortcut.0.weight", 1, 1, 1)
        ]
    );
    assert!(!uses[0].identity);
    // Without norms the block's units are conv1's filters and biases.
    assert_eq!(names(&uses[1].own), ["2.conv1.weight", "2.conv1.bias"]);
    check_uses_partition(&ModelSpec::sequential(&[2, 6, 6], layers));
}

#[test]
fn the_zoos_unit_maps_cover_every_tensor_they_name_once() {
    for (zoo, input, norm) in [
        (ZooModel::CnnLeaf, [1, 28, 28], BlockNorm::Batch),
        (ZooModel::Vgg9, [3, 32, 32], BlockNorm::Batch),
        (ZooModel::Resnet20, [3, 32, 32], BlockNorm::Batch),
        (ZooModel::Resnet20, [3, 32, 32], BlockNorm::Group),
        (ZooModel::Resnet20, [3, 32, 32], BlockNorm::None),
    ] {
        check_uses_partition(&zoo.spec(&input, 10, norm, 4).unwrap());
    }
    // cnn-leaf's second convolution is read by the dense layer in blocks of 7 * 7 columns.
    let leaf = ZooModel::CnnLeaf
        .spec(&[1, 28, 28], 10, BlockNorm::Batch, 16)
        .unwrap();
    let ModelSpec::Sequential { input, layers } = &leaf else {
        panic!()
    };
    let uses = unit_uses(input, layers).unwrap();
    assert_eq!(uses[1].readers, [used("7.weight", 1, 49, 1)]);
    // A flat list: the norm after the linear layer is the unit's, dropout passes it on.
    let flat = vec![
        LayerSpec::Linear {
            out: 6,
            bias: false,
        },
        LayerSpec::BatchNorm1d {
            eps: 1e-5,
            momentum: 0.1,
        },
        LayerSpec::Relu,
        LayerSpec::Dropout { p: 0.1 },
        LayerSpec::linear(2),
    ];
    let uses = unit_uses(&[5], &flat).unwrap();
    assert_eq!(
        names(&uses[0].own),
        [
            "0.weight",
            "1.weight",
            "1.bias",
            "1.running_mean",
            "1.running_var"
        ]
    );
    assert_eq!(uses[0].readers, [used("4.weight", 1, 1, 1)]);
    check_uses_partition(&ModelSpec::sequential(&[5], flat));
}

/// Issue 49: sizes whose products wrap around `usize` are refused by the list's check, which
/// names the layer, instead of passing the parameter limit as a small count and panicking
/// later; an input too large to flatten is refused too.
#[test]
fn sizes_that_overflow_are_refused_naming_the_layer() {
    let huge_linear = ModelSpec::sequential(
        &[64],
        vec![
            LayerSpec::Linear {
                out: 1 << 58,
                bias: false,
            },
            LayerSpec::Linear {
                out: 64,
                bias: false,
            },
        ],
    );
    let e = huge_linear.validate().unwrap_err().to_string();
    assert!(e.contains("model.layers[0] (linear"), "{e}");

    let huge_conv = ModelSpec::sequential(
        &[1, 28, 28],
        vec![
            LayerSpec::Conv2d {
                out: 1 << 62,
                kernel: 2,
                stride: 1,
                padding: 0,
                groups: 1,
                bias: false,
            },
            LayerSpec::Flatten,
            LayerSpec::linear(10),
        ],
    );
    let e = huge_conv.validate().unwrap_err().to_string();
    assert!(e.contains("model.layers[0] (conv2d"), "{e}");

    // 2^22 x 2^21 x 2^21 flattens to 2^64: zero when wrapped.
    let wide_input = ModelSpec::sequential(
        &[1 << 22, 1 << 21, 1 << 21],
        vec![LayerSpec::Flatten, LayerSpec::linear(10)],
    );
    let e = wide_input.validate().unwrap_err().to_string();
    assert!(e.contains("more than"), "{e}");
    let huge_mlp = ModelSpec::mlp(1 << 40, &[1 << 40], 10);
    assert!(huge_mlp.validate().is_err());
    assert_eq!(huge_mlp.num_params(), usize::MAX, "saturates, never wraps");
}

#[test]
fn layers_without_settings_refuse_any_key_and_the_others_unknown_ones() {
    let read = |text: &str| serde_json::from_str::<LayerSpec>(text);
    assert_eq!(read(r#"{"type": "relu"}"#).unwrap(), LayerSpec::Relu);
    assert_eq!(read(r#"{"type": "flatten"}"#).unwrap(), LayerSpec::Flatten);
    for layer in ["relu", "flatten", "global_avgpool"] {
        let e = read(&format!(r#"{{"type": "{layer}", "p": 0.5}}"#)).unwrap_err();
        assert!(e.to_string().contains("unknown field `p`"), "{layer}: {e}");
    }
    let e = read(r#"{"type": "dropout", "p": 0.5, "q": 1}"#).unwrap_err();
    assert!(e.to_string().contains("unknown field `q`"), "{e}");
    assert_eq!(
        read(r#"{"type": "conv2d", "out": 4, "kernel": 3}"#).unwrap(),
        LayerSpec::conv2d(4, 3)
    );
}

/// `maxpool2d.padding`, the key issue 45 added: more than half the window (PyTorch's rule),
/// `usize::MAX` (no overflow in the window arithmetic) and a negative number in JSON are
/// refused by name; torchvision's padded stem pool is taken.
#[test]
fn maxpool_padding_past_half_the_window_is_refused() {
    let pool = |padding: usize| {
        ModelSpec::sequential(
            &[1, 8, 8],
            vec![
                LayerSpec::MaxPool2d {
                    kernel: 3,
                    stride: Some(2),
                    padding,
                },
                LayerSpec::Flatten,
                LayerSpec::linear(2),
            ],
        )
        .validate()
    };
    pool(1).unwrap();
    for p in [2, usize::MAX] {
        let err = pool(p).unwrap_err().to_string();
        assert!(err.contains("maxpool2d") && err.contains("half"), "{err}");
    }
    let negative: Result<LayerSpec, _> =
        serde_json::from_str(r#"{"type": "maxpool2d", "kernel": 3, "padding": -1}"#);
    assert!(negative.is_err());
}

/// `residual.inner`, the key PFNM's widened blocks write: zero, `usize::MAX` (past the width
/// bound, before anything is sized from it), a group norm it does not divide, and negative,
/// fractional or NaN-like values in JSON are refused by name; a wider inside is taken.
#[test]
fn residual_inner_width_is_checked() {
    let block = |inner: Option<usize>, norm: BlockNorm| {
        ModelSpec::sequential(
            &[2, 6, 6],
            vec![
                LayerSpec::Residual {
                    out: 4,
                    stride: 1,
                    norm,
                    groups: 2,
                    inner,
                    project: false,
                },
                LayerSpec::GlobalAvgpool,
                LayerSpec::Flatten,
                LayerSpec::linear(2),
            ],
        )
        .validate()
    };
    block(Some(6), BlockNorm::Batch).unwrap();
    block(None, BlockNorm::Batch).unwrap();
    for (inner, norm, needle) in [
        (0, BlockNorm::Batch, "inner = 0"),
        (usize::MAX, BlockNorm::Batch, "inner"),
        (5, BlockNorm::Group, "inner"),
    ] {
        let err = block(Some(inner), norm).unwrap_err().to_string();
        assert!(
            err.contains("residual") && err.contains(needle),
            "{inner}: {err}"
        );
    }
    for text in [
        r#"{"type": "residual", "out": 4, "inner": -1}"#,
        r#"{"type": "residual", "out": 4, "inner": 2.5}"#,
        r#"{"type": "residual", "out": 4, "inner": "NaN"}"#,
    ] {
        let parsed: Result<LayerSpec, _> = serde_json::from_str(text);
        assert!(parsed.is_err(), "{text}");
    }
}

/// A bottleneck's widths from a config: zero, huge, a default inside of zero (`out` under 4),
/// a group norm that does not divide them, and values no width can be.
#[test]
fn bottleneck_widths_are_checked() {
    let block = |out: usize, inner: Option<usize>, middle: Option<usize>, norm: BlockNorm| {
        ModelSpec::sequential(
            &[2, 6, 6],
            vec![
                LayerSpec::Bottleneck {
                    out,
                    stride: 2,
                    norm,
                    groups: 2,
                    inner,
                    middle,
                    project: false,
                },
                LayerSpec::GlobalAvgpool,
                LayerSpec::Flatten,
                LayerSpec::linear(2),
            ],
        )
        .validate()
    };
    block(8, None, None, BlockNorm::Batch).unwrap();
    block(8, Some(3), Some(5), BlockNorm::None).unwrap();
    for (out, inner, middle, norm, needle) in [
        (0, None, None, BlockNorm::Batch, "out = 0"),
        (
            3,
            None,
            None,
            BlockNorm::Batch,
            "inner (default out / 4) = 0",
        ),
        (8, Some(0), None, BlockNorm::Batch, "= 0"),
        (8, None, Some(0), BlockNorm::Batch, "middle = 0"),
        (8, Some(usize::MAX), None, BlockNorm::Batch, "inner"),
        (8, None, Some(usize::MAX), BlockNorm::Batch, "middle"),
        (usize::MAX, None, None, BlockNorm::Batch, "bottleneck"),
        (8, Some(3), None, BlockNorm::Group, "groups = 2"),
    ] {
        let err = block(out, inner, middle, norm).unwrap_err().to_string();
        assert!(
            err.contains("bottleneck") && err.contains(needle),
            "{out} {inner:?} {middle:?}: {err}"
        );
    }
    for text in [
        r#"{"type": "bottleneck", "out": 8, "middle": -1}"#,
        r#"{"type": "bottleneck", "out": 8.5}"#,
        r#"{"type": "bottleneck", "out": 8, "inner": "NaN"}"#,
        r#"{"type": "bottleneck", "out": 8, "project": 1}"#,
        r#"{"type": "bottleneck", "out": 8, "widths": 1}"#,
    ] {
        let parsed: Result<LayerSpec, _> = serde_json::from_str(text);
        assert!(parsed.is_err(), "{text}");
    }
}

/// A ViT's groups: per encoder block its heads (a head's q, k and v rows with their biases,
/// read by `out_proj`'s columns) and its MLP units (`mlp.0`'s rows, read by `mlp.3`'s
/// columns); the stream and the classifier are ungated. The unit map and the gate layout
/// agree on every value, and matching's permutation groups leave the blocks to the
/// transformer matcher.
#[test]
fn a_vits_groups_are_its_heads_and_mlp_units() {
    let spec = ModelSpec::Sequential {
        input: vec![1, 8, 8],
        layers: fedfuse_core::VitShape {
            patch: 4,
            hidden: 8,
            layers: 2,
            heads: 2,
            mlp: 6,
            ..Default::default()
        }
        .layers(3),
    };
    spec.validate().unwrap();
    check_uses_partition(&spec);
    let ModelSpec::Sequential { input, layers } = &spec else {
        unreachable!()
    };
    let layout = GroupLayout::of_model(&spec);
    let units: Vec<usize> = layout.layers().iter().map(|g| g.units).collect();
    assert_eq!(units, [2, 6, 2, 6]);
    assert_eq!(layout.layers()[0].weight, "1.self_attention.in_proj_weight");
    assert_eq!(layout.layers()[0].size(), 3 * 4 * (8 + 1));
    assert_eq!(layout.layers()[3].per_unit, ["2.mlp.0.bias"]);
    let uses = unit_uses(input, layers).unwrap();
    // Head 1 of 2 (4 features) owns rows 4..8 of q, k and v: values 32..64, 96..128, 160..192.
    let head = &uses[0].own[0];
    assert_eq!(head.ranges(&[24, 8], 1), [32..64, 96..128, 160..192]);
    assert_eq!(
        uses[0].readers,
        [used("1.self_attention.out_proj.weight", 1, 4, 1)]
    );
    assert_eq!(names(&uses[1].readers), ["1.mlp.3.weight"]);
    // The layout's spans of each grouped tensor are the unit map's ranges.
    let shapes = spec.param_shapes();
    for (t, shape) in shapes.iter().enumerate() {
        let Some(rows) = layout.grouped_rows(t) else {
            continue;
        };
        let (l, u) = (0..layout.layers().len())
            .find_map(|l| {
                uses[l]
                    .own
                    .iter()
                    .find(|o| o.tensor == shape.name)
                    .map(|o| (l, o))
            })
            .unwrap();
        for unit in 0..uses[l].units {
            let mut spans: Vec<_> = rows
                .spans()
                .filter(|(g, _)| *g == layout.layer_groups(l).start + unit)
                .map(|(_, r)| r)
                .collect();
            spans.sort_by_key(|r| r.start);
            assert_eq!(spans, u.ranges(&shape.shape, unit), "{}", shape.name);
        }
    }
    assert!(
        fedfuse_core::layers::permutation_groups(input, layers)
            .unwrap()
            .is_empty()
    );
}
