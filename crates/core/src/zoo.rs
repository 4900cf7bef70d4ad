//! The model zoo: the networks of this field's papers, as layer lists (see [`crate::layers`]).
//! `scripts/zoo_reference.py` builds the same `nn.Sequential`s in PyTorch; the tests compare
//! names, shapes and logits with the values it wrote.

use serde::{Deserialize, Serialize};

use crate::layers::{BlockNorm, LayerSpec};
use crate::{ModelSpec, Result};

/// A zoo network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ZooModel {
    /// LEAF's FEMNIST CNN (Caldas et al. 2018): two 5x5 convolutions (32 and 64 filters, "same"
    /// padding), each followed by ReLU and 2x2 max-pooling, a 2048-unit dense layer, the
    /// classifier. 6,603,710 parameters on 28x28x1 inputs with 62 classes.
    CnnLeaf,
    /// FedMA's VGG-9 (`ModerateCNN` in its reference code, Wang et al. 2020): six 3x3
    /// convolutions (32, 64, 128, 128, 256, 256), max-pooling after every second, then dense
    /// 512, 512 and the classifier, dropout 0.05 after the fourth convolution's pool and 0.1
    /// around the dense layers (the reference's `Dropout2d(0.05)` drops channels; this one
    /// drops values). 32x32 inputs.
    Vgg9,
    /// The CIFAR ResNet-20 of He et al. (2016, section 4.2): a 3x3 convolution of `width`
    /// filters, three stages of three basic blocks (`width`, `2 width`, `4 width` channels,
    /// strides 1, 2, 2), global average pooling, the classifier. Shortcuts that change width
    /// are 1x1 projections (the paper's option B).
    Resnet20,
    /// torchvision's `resnet18` (He et al. 2016, ImageNet design): a 7x7 convolution with
    /// stride 2, a 3x3 max-pool with stride 2, four stages of two basic blocks (`width` to
    /// `8 width` channels, 64 to 512 in torchvision), global average pooling, the classifier.
    /// Its files carry torchvision's names ([`ZooModel::torchvision_names`]).
    Resnet18,
    /// torchvision's `resnet34`: `resnet18` with 3, 4, 6 and 3 blocks per stage.
    Resnet34,
    /// torchvision's `resnet50`: `resnet34`'s stem and stages of 3, 4, 6 and 3 bottleneck
    /// blocks ([`LayerSpec::Bottleneck`]), `width` to `8 width` channels inside and four times
    /// that out (256 to 2048 in torchvision); 25,557,032 parameters with 1000 classes.
    Resnet50,
}

impl ZooModel {
    /// The zoo's names, as `[model] kind` takes them.
    pub const NAMES: [&'static str; 6] = [
        "cnn-leaf", "vgg9", "resnet20", "resnet18", "resnet34", "resnet50",
    ];

    /// Whether `model.norm` and `model.width` apply (the residual networks).
    pub fn is_resnet(self) -> bool {
        matches!(
            self,
            Self::Resnet20 | Self::Resnet18 | Self::Resnet34 | Self::Resnet50
        )
    }

    /// The first stage's channels when `model.width` is not given: the paper's (16 for
    /// ResNet-20, torchvision's 64 for ResNet-18, 34 and 50, whose bottlenecks put out four
    /// times as many).
    pub fn default_width(self) -> usize {
        match self {
            Self::Resnet18 | Self::Resnet34 | Self::Resnet50 => 64,
            Self::CnnLeaf | Self::Vgg9 | Self::Resnet20 => 16,
        }
    }

    /// The layer list for samples of shape `input` and `classes` classes; `norm` and `width`
    /// are the residual networks' (their first stage's channels, see
    /// [`ZooModel::default_width`]).
    pub fn layers(self, classes: usize, norm: BlockNorm, width: usize) -> Vec<LayerSpec> {
        let conv3 = |out| LayerSpec::conv2d(out, 3).with_padding(1);
        // A residual network's first convolution (biased only without norms) and its norm.
        let stem = |conv: LayerSpec| {
            let mut layers = match norm {
                BlockNorm::None => vec![conv],
                _ => vec![conv.without_bias()],
            };
            match norm {
                BlockNorm::Batch => layers.push(LayerSpec::batch_norm2d()),
                BlockNorm::Group => layers.push(LayerSpec::GroupNorm {
                    groups: 2,
                    eps: 1e-5,
                }),
                BlockNorm::None => {}
            }
            layers.push(LayerSpec::Relu);
            layers
        };
        let head = [
            LayerSpec::GlobalAvgpool,
            LayerSpec::Flatten,
            LayerSpec::linear(classes),
        ];
        match self {
            Self::CnnLeaf => vec![
                LayerSpec::conv2d(32, 5).with_padding(2),
                LayerSpec::Relu,
                LayerSpec::max_pool(2),
                LayerSpec::conv2d(64, 5).with_padding(2),
                LayerSpec::Relu,
                LayerSpec::max_pool(2),
                LayerSpec::Flatten,
                LayerSpec::linear(2048),
                LayerSpec::Relu,
                LayerSpec::linear(classes),
            ],
            Self::Vgg9 => vec![
                conv3(32),
                LayerSpec::Relu,
                conv3(64),
                LayerSpec::Relu,
                LayerSpec::max_pool(2),
                conv3(128),
                LayerSpec::Relu,
                conv3(128),
                LayerSpec::Relu,
                LayerSpec::max_pool(2),
                LayerSpec::Dropout { p: 0.05 },
                conv3(256),
                LayerSpec::Relu,
                conv3(256),
                LayerSpec::Relu,
                LayerSpec::max_pool(2),
                LayerSpec::Flatten,
                LayerSpec::Dropout { p: 0.1 },
                LayerSpec::linear(512),
                LayerSpec::Relu,
                LayerSpec::linear(512),
                LayerSpec::Relu,
                LayerSpec::Dropout { p: 0.1 },
                LayerSpec::linear(classes),
            ],
            Self::Resnet20 => {
                let mut layers = stem(conv3(width));
                for (stage, stride) in [(1, 1), (2, 2), (4, 2)] {
                    for block in 0..3 {
                        let s = if block == 0 { stride } else { 1 };
                        layers.push(LayerSpec::residual(width * stage, s, norm));
                    }
                }
                layers.extend(head);
                layers
            }
            Self::Resnet18 | Self::Resnet34 | Self::Resnet50 => {
                let blocks = match self {
                    Self::Resnet18 => [2, 2, 2, 2],
                    _ => [3, 4, 6, 3],
                };
                let make = |planes: usize, stride| match self {
                    Self::Resnet50 => LayerSpec::bottleneck(planes * 4, stride, norm),
                    _ => LayerSpec::residual(planes, stride, norm),
                };
                let conv7 = LayerSpec::Conv2d {
                    out: width,
                    kernel: 7,
                    stride: 2,
                    padding: 3,
                    groups: 1,
                    bias: true,
                };
                let mut layers = stem(conv7);
                layers.push(LayerSpec::MaxPool2d {
                    kernel: 3,
                    stride: Some(2),
                    padding: 1,
                });
                let stages = [(1, 1), (2, 2), (4, 2), (8, 2)];
                for ((stage, stride), count) in stages.into_iter().zip(blocks) {
                    for block in 0..count {
                        let s = if block == 0 { stride } else { 1 };
                        layers.push(make(width * stage, s));
                    }
                }
                layers.extend(head);
                layers
            }
        }
    }

    /// torchvision's names for this network's tensors (`conv1.weight` for `0.weight`), or
    /// `None` for the networks that keep the list's names.
    pub fn torchvision_names(self, layers: &[LayerSpec]) -> Option<TorchvisionNames> {
        match self {
            Self::Resnet18 | Self::Resnet34 | Self::Resnet50 => Some(TorchvisionNames::of(layers)),
            Self::CnnLeaf | Self::Vgg9 | Self::Resnet20 => None,
        }
    }

    /// The checked spec for samples of shape `input` (`[channels, height, width]`).
    pub fn spec(
        self,
        input: &[usize],
        classes: usize,
        norm: BlockNorm,
        width: usize,
    ) -> Result<ModelSpec> {
        let spec = ModelSpec::sequential(input, self.layers(classes, norm, width));
        spec.validate()?;
        Ok(spec)
    }
}

/// torchvision's module names of a ResNet list: `conv1` and `bn1` for the stem,
/// `layer{s}.{b}` for the blocks (a block's projection `downsample.0/1`), `fc` for the
/// classifier. A stage begins at the first block and at each block that strides or changes
/// width. Of a Vision Transformer list (one with a tokens layer): `class_token`, `conv_proj`
/// and `encoder.pos_embedding` for the tokens layer, `encoder.layers.encoder_layer_{k}` for the
/// encoder blocks, `encoder.ln` for the layer norm after the class token and `heads.head` for
/// the classifier. Tensors of other layers keep the list's names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TorchvisionNames {
    /// Per layer of the list, its module name (empty for the tokens layer, whose tensors sit
    /// at the top and in `encoder`).
    modules: Vec<Option<String>>,
}

impl TorchvisionNames {
    /// The names for `layers`.
    pub fn of(layers: &[LayerSpec]) -> Self {
        if layers.iter().any(|l| matches!(l, LayerSpec::Tokens { .. })) {
            return Self::of_vit(layers);
        }
        let mut modules: Vec<Option<String>> = vec![None; layers.len()];
        let (mut stage, mut block, mut width) = (0, 0, 0);
        let (mut stem_conv, mut stem_norm, mut fc) = (false, false, false);
        for (module, layer) in modules.iter_mut().zip(layers) {
            *module = match *layer {
                LayerSpec::Conv2d { .. } if !stem_conv && stage == 0 => {
                    stem_conv = true;
                    Some("conv1".to_string())
                }
                _ if layer.is_norm() && !stem_norm && stage == 0 => {
                    stem_norm = true;
                    Some("bn1".to_string())
                }
                LayerSpec::Residual { out, stride, .. }
                | LayerSpec::Bottleneck { out, stride, .. } => {
                    if stage == 0 || stride != 1 || out != width {
                        (stage, block) = (stage + 1, 0);
                    }
                    width = out;
                    block += 1;
                    Some(format!("layer{stage}.{}", block - 1))
                }
                LayerSpec::Linear { .. } if !fc && stage > 0 => {
                    fc = true;
                    Some("fc".to_string())
                }
                _ => None,
            };
        }
        Self { modules }
    }

    /// [`Self::of`] for a Vision Transformer list.
    fn of_vit(layers: &[LayerSpec]) -> Self {
        let mut modules: Vec<Option<String>> = vec![None; layers.len()];
        let (mut encoders, mut after_class) = (0, false);
        let (mut ln, mut head) = (false, false);
        for (module, layer) in modules.iter_mut().zip(layers) {
            *module = match *layer {
                LayerSpec::Tokens { .. } => Some(String::new()),
                LayerSpec::Encoder { .. } => {
                    encoders += 1;
                    Some(format!("encoder.layers.encoder_layer_{}", encoders - 1))
                }
                LayerSpec::ClassToken => {
                    after_class = true;
                    None
                }
                LayerSpec::LayerNorm { .. } if after_class && !ln => {
                    ln = true;
                    Some("encoder.ln".to_string())
                }
                LayerSpec::Linear { .. } if after_class && !head => {
                    head = true;
                    Some("heads.head".to_string())
                }
                _ => None,
            };
        }
        Self { modules }
    }

    /// torchvision's name for the list's tensor `name` (`4.shortcut.1.running_mean` ->
    /// `layer2.0.downsample.1.running_mean`), if its layer has one.
    pub fn torch_name(&self, name: &str) -> Option<String> {
        let (index, rest) = name.split_once('.')?;
        let module = self.modules.get(index.parse::<usize>().ok()?)?.as_ref()?;
        if module.is_empty() {
            // The tokens layer: the class token and patch convolution at the top, the
            // positional embedding in the encoder.
            return Some(match rest {
                "pos_embedding" => "encoder.pos_embedding".to_string(),
                _ => rest.to_string(),
            });
        }
        Some(match rest.strip_prefix("shortcut.") {
            Some(r) => format!("{module}.downsample.{r}"),
            None => format!("{module}.{rest}"),
        })
    }
}

/// torchvision's `VisionTransformer(image_size, patch_size, num_layers, num_heads, hidden_dim,
/// mlp_dim, dropout, attention_dropout, num_classes)` as settings (`[model] kind = "vit"`);
/// the default trains on 28x28 and 32x32 images on a CPU in minutes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VitShape {
    /// Side of a patch (`patch_size`).
    pub patch: usize,
    /// Width of a token (`hidden_dim`).
    pub hidden: usize,
    /// Encoder blocks (`num_layers`).
    pub layers: usize,
    /// Attention heads (`num_heads`).
    pub heads: usize,
    /// Hidden units of each block's MLP (`mlp_dim`).
    pub mlp: usize,
    /// Each block's MLP width where they differ (a ViT whose MLPs PFNM widened), one per
    /// block in place of `mlp`; empty: every block has `mlp`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mlps: Vec<usize>,
    /// `dropout`.
    pub dropout: f64,
    /// `attention_dropout`.
    pub attention_dropout: f64,
}

impl Default for VitShape {
    fn default() -> Self {
        Self {
            patch: 4,
            hidden: 128,
            layers: 6,
            heads: 4,
            mlp: 256,
            mlps: Vec::new(),
            dropout: 0.0,
            attention_dropout: 0.0,
        }
    }
}

impl VitShape {
    /// The settings whose [`Self::layers`] are `layers` (for some class count), if any.
    pub fn of_layers(layers: &[LayerSpec]) -> Option<Self> {
        let (
            Some(&LayerSpec::Tokens {
                hidden,
                patch,
                dropout,
            }),
            Some(LayerSpec::Linear { out, .. }),
        ) = (layers.first(), layers.last())
        else {
            return None;
        };
        let (heads, attention_dropout) = match layers.get(1) {
            Some(&LayerSpec::Encoder {
                heads,
                attention_dropout,
                ..
            }) => (heads, attention_dropout),
            _ => (1, 0.0),
        };
        let mlps: Vec<usize> = layers
            .iter()
            .filter_map(|l| match l {
                LayerSpec::Encoder { mlp, .. } => Some(*mlp),
                _ => None,
            })
            .collect();
        let mlp = mlps.first().copied().unwrap_or(1);
        let shape = Self {
            patch,
            hidden,
            layers: layers.len().checked_sub(4)?,
            heads,
            mlp,
            mlps: match mlps.iter().all(|&m| m == mlp) {
                true => Vec::new(),
                false => mlps,
            },
            dropout,
            attention_dropout,
        };
        (shape.layers(*out) == layers).then_some(shape)
    }

    /// The layer list for `classes` classes: tokens, the encoder blocks, the class token, the
    /// final layer norm (`encoder.ln`) and the head (`heads.head`).
    pub fn layers(&self, classes: usize) -> Vec<LayerSpec> {
        let mut list = vec![LayerSpec::Tokens {
            hidden: self.hidden,
            patch: self.patch,
            dropout: self.dropout,
        }];
        list.extend((0..self.layers).map(|b| LayerSpec::Encoder {
            heads: self.heads,
            mlp: self.mlps.get(b).copied().unwrap_or(self.mlp),
            dropout: self.dropout,
            attention_dropout: self.attention_dropout,
            eps: 1e-6,
        }));
        list.extend([
            LayerSpec::ClassToken,
            LayerSpec::LayerNorm { eps: 1e-6 },
            LayerSpec::linear(classes),
        ]);
        list
    }
}
