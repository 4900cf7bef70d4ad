//! A Vision Transformer as a layer list: torchvision's `VisionTransformer(image_size=28,
//! patch_size=4, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=10)` on
//! 3-channel images, its tensors in torchvision's order and shapes under torchvision's names
//! (recorded from torchvision 0.29.2: 32 tensors, 20,682 parameters).

use fedfuse_core::layers::{FeatureShape, chain};
use fedfuse_core::zoo::VitShape;
use fedfuse_core::{LayerSpec, TorchvisionNames};

fn vit(layers: usize) -> Vec<LayerSpec> {
    VitShape {
        patch: 4,
        hidden: 32,
        layers,
        heads: 4,
        mlp: 64,
        ..VitShape::default()
    }
    .layers(10)
}

#[test]
fn a_vit_list_has_torchvisions_tensors_in_its_order() {
    let layers = vit(2);
    let input = FeatureShape::of(&[3, 28, 28]).unwrap();
    let (shapes, tensors) = chain(input, &layers).unwrap();
    assert_eq!(
        shapes[0],
        FeatureShape::Tokens {
            seq: 50,
            hidden: 32
        }
    );
    assert_eq!(shapes[3], FeatureShape::Flat(32));
    let names = TorchvisionNames::of(&layers);
    let got: Vec<(String, Vec<usize>)> = tensors
        .iter()
        .map(|t| (names.torch_name(&t.name).unwrap(), t.shape.clone()))
        .collect();
    let mut want: Vec<(String, Vec<usize>)> = vec![
        ("class_token".into(), vec![1, 1, 32]),
        ("conv_proj.weight".into(), vec![32, 3, 4, 4]),
        ("conv_proj.bias".into(), vec![32]),
        ("encoder.pos_embedding".into(), vec![1, 50, 32]),
    ];
    for k in 0..2 {
        let p = format!("encoder.layers.encoder_layer_{k}");
        for (t, s) in [
            ("ln_1.weight", vec![32]),
            ("ln_1.bias", vec![32]),
            ("self_attention.in_proj_weight", vec![96, 32]),
            ("self_attention.in_proj_bias", vec![96]),
            ("self_attention.out_proj.weight", vec![32, 32]),
            ("self_attention.out_proj.bias", vec![32]),
            ("ln_2.weight", vec![32]),
            ("ln_2.bias", vec![32]),
            ("mlp.0.weight", vec![64, 32]),
            ("mlp.0.bias", vec![64]),
            ("mlp.3.weight", vec![32, 64]),
            ("mlp.3.bias", vec![32]),
        ] {
            want.push((format!("{p}.{t}"), s));
        }
    }
    want.extend([
        ("encoder.ln.weight".into(), vec![32]),
        ("encoder.ln.bias".into(), vec![32]),
        ("heads.head.weight".into(), vec![10, 32]),
        ("heads.head.bias".into(), vec![10]),
    ]);
    assert_eq!(got, want);
    let params: usize = tensors
        .iter()
        .map(|t| t.shape.iter().product::<usize>())
        .sum();
    assert_eq!(params, 20_682);
}

#[test]
fn what_a_vit_list_cannot_do_is_refused() {
    let input = FeatureShape::of(&[3, 30, 30]).unwrap();
    let e = chain(input, &vit(1)).unwrap_err().to_string();
    assert!(e.contains("patch = 4 does not divide the 30x30"), "{e}");
    let input = FeatureShape::of(&[3, 28, 28]).unwrap();
    let mut odd = vit(1);
    odd[1] = LayerSpec::Encoder {
        heads: 5,
        mlp: 64,
        dropout: 0.0,
        attention_dropout: 0.0,
        eps: 1e-6,
    };
    let e = chain(input, &odd).unwrap_err().to_string();
    assert!(e.contains("heads = 5 does not divide"), "{e}");
    // An encoder reads tokens, a linear layer does not.
    let e = chain(input, &vit(1)[1..]).unwrap_err().to_string();
    assert!(e.contains("takes tokens"), "{e}");
    let e = chain(input, &[vit(1)[0].clone(), LayerSpec::linear(3)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("class_token"), "{e}");
}

/// A ViT whose blocks' MLPs differ (what PFNM's fusion makes) is still described by its
/// settings: `mlps` gives each block's width, `of_layers` reads them back, and serde keeps them.
#[test]
fn a_vit_with_its_own_mlp_width_per_block_round_trips() {
    let shape = VitShape {
        patch: 4,
        hidden: 32,
        layers: 2,
        heads: 4,
        mlp: 64,
        mlps: vec![70, 59],
        ..VitShape::default()
    };
    let layers = shape.layers(10);
    let widths: Vec<usize> = layers
        .iter()
        .filter_map(|l| match l {
            LayerSpec::Encoder { mlp, .. } => Some(*mlp),
            _ => None,
        })
        .collect();
    assert_eq!(widths, vec![70, 59]);
    let back = VitShape::of_layers(&layers).unwrap();
    assert_eq!(back.mlps, vec![70, 59]);
    assert_eq!(back.layers(10), layers);
    let text = serde_json::to_string(&back).unwrap();
    assert!(text.contains("\"mlps\":[70,59]"), "{text}");
    assert_eq!(serde_json::from_str::<VitShape>(&text).unwrap(), back);
    // Equal widths are said once, as `mlp`.
    let even = VitShape::of_layers(&vit(2)).unwrap();
    assert!(even.mlps.is_empty() && even.mlp == 64);
    assert!(!serde_json::to_string(&even).unwrap().contains("mlps"));
}
