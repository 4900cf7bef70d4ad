//! Layer lists: what a list declares, the tensors it implies, the errors that name the layer
//! that does not fit, and the groups that sparsity gates.

use fedfuse_core::layers::gate_points;
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
