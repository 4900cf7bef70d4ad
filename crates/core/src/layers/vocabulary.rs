//! The layers a list may hold, with serde's names and PyTorch's defaults, and their builders.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Normalisation inside a residual block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockNorm {
    /// `nn.BatchNorm2d` after each convolution (He et al.).
    #[default]
    Batch,
    /// `nn.GroupNorm(groups, channels)` after each convolution (Hsieh et al. 2020, the usual
    /// choice under non-IID data).
    Group,
    /// None; the convolutions then carry biases.
    None,
}

/// One entry of a layer list. Widths are outputs; inputs follow from the layer before.
///
/// Read through [`Deserialize`] below, which refuses keys on the layers that take none.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self")]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum LayerSpec {
    /// `nn.Conv2d(in, out, kernel, stride, padding, groups=groups, bias=bias)`, square kernel.
    Conv2d {
        /// Output channels.
        out: usize,
        /// Kernel side.
        kernel: usize,
        /// Stride.
        #[serde(default = "one")]
        stride: usize,
        /// Zero padding on every side.
        #[serde(default)]
        padding: usize,
        /// Channel groups (1: dense; `in`: depthwise).
        #[serde(default = "one")]
        groups: usize,
        /// Whether the layer adds a bias.
        #[serde(default = "yes")]
        bias: bool,
    },
    /// `nn.MaxPool2d(kernel, stride, padding)`; the stride defaults to the kernel, padded
    /// places never win (PyTorch pads with -inf).
    #[serde(rename = "maxpool2d")]
    MaxPool2d {
        /// Window side.
        kernel: usize,
        /// Stride.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stride: Option<usize>,
        /// Padding on every side, at most half the window (PyTorch's rule).
        #[serde(default, skip_serializing_if = "is_zero")]
        padding: usize,
    },
    /// `nn.AvgPool2d(kernel, stride)`; the stride defaults to the kernel.
    #[serde(rename = "avgpool2d")]
    AvgPool2d {
        /// Window side.
        kernel: usize,
        /// Stride.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stride: Option<usize>,
    },
    /// `nn.AdaptiveAvgPool2d(1)`: `[c, h, w]` to `[c, 1, 1]`.
    GlobalAvgpool,
    /// `nn.BatchNorm2d(channels)` (affine, with running statistics).
    #[serde(rename = "batchnorm2d")]
    BatchNorm2d {
        /// Added to the variance.
        #[serde(default = "norm_eps")]
        eps: f64,
        /// Weight of the newest batch in the running statistics.
        #[serde(default = "bn_momentum")]
        momentum: f64,
    },
    /// `nn.BatchNorm1d(features)` on flat features.
    #[serde(rename = "batchnorm1d")]
    BatchNorm1d {
        /// Added to the variance.
        #[serde(default = "norm_eps")]
        eps: f64,
        /// Weight of the newest batch in the running statistics.
        #[serde(default = "bn_momentum")]
        momentum: f64,
    },
    /// `nn.GroupNorm(groups, channels)` (affine).
    #[serde(rename = "groupnorm")]
    GroupNorm {
        /// Channel groups; must divide the channels.
        groups: usize,
        /// Added to the variance.
        #[serde(default = "norm_eps")]
        eps: f64,
    },
    /// `nn.LayerNorm(shape)` over every axis of one sample (affine).
    #[serde(rename = "layernorm")]
    LayerNorm {
        /// Added to the variance.
        #[serde(default = "norm_eps")]
        eps: f64,
    },
    /// `nn.ReLU()`.
    Relu,
    /// `nn.Dropout(p)`: every value dropped with probability `p` in training.
    Dropout {
        /// Drop probability in `[0, 1)`.
        p: f64,
    },
    /// `nn.Flatten()`: `[c, h, w]` to `[c * h * w]`.
    Flatten,
    /// `nn.Linear(in, out, bias=bias)` on flat features.
    Linear {
        /// Output features.
        out: usize,
        /// Whether the layer adds a bias.
        #[serde(default = "yes")]
        bias: bool,
    },
    /// He et al.'s basic block: `relu(norm2(conv2(relu(norm1(conv1(x))))) + shortcut(x))`, 3x3
    /// convolutions, the first with `stride`; the shortcut is the identity, or a 1x1
    /// convolution with `stride` and a norm when the width or the stride changes.
    Residual {
        /// Output channels.
        out: usize,
        /// Stride of the first convolution and of the projection.
        #[serde(default = "one")]
        stride: usize,
        /// Normalisation after each convolution.
        #[serde(default)]
        norm: BlockNorm,
        /// Groups of `norm = "group"`.
        #[serde(default = "two")]
        groups: usize,
        /// Channels between the two convolutions (`conv1`'s outputs, `conv2`'s inputs);
        /// `None` is `out`, as He et al.'s and torchvision's blocks have. Neuron matching
        /// sets it when a block's inner channels fuse to another width than its stream.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        inner: Option<usize>,
        /// A projection shortcut even where the block's widths and stride do not call for one
        /// (neuron matching sets it when fused widths come out equal).
        #[serde(default, skip_serializing_if = "is_false")]
        project: bool,
    },
    /// torchvision's bottleneck block (ResNet-50 and deeper, "ResNet v1.5": the stride sits on
    /// the 3x3 convolution): `relu(norm3(conv3(relu(norm2(conv2(relu(norm1(conv1(x)))))))) +
    /// shortcut(x))`, `conv1` and `conv3` 1x1, `conv2` 3x3 with `stride`; the shortcut as in
    /// [`LayerSpec::Residual`].
    Bottleneck {
        /// Output channels (torchvision's `planes * 4`).
        out: usize,
        /// Stride of `conv2` and of the projection.
        #[serde(default = "one")]
        stride: usize,
        /// Normalisation after each convolution.
        #[serde(default)]
        norm: BlockNorm,
        /// Groups of `norm = "group"`.
        #[serde(default = "two")]
        groups: usize,
        /// `conv1`'s outputs; `None` is `out / 4` (torchvision's `planes`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        inner: Option<usize>,
        /// `conv2`'s outputs; `None` is the inner width. Neuron matching sets it when the two
        /// fuse to different widths.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        middle: Option<usize>,
        /// As [`LayerSpec::Residual`]'s.
        #[serde(default, skip_serializing_if = "is_false")]
        project: bool,
    },
    /// torchvision's Vision Transformer input: `conv_proj` (a `patch x patch` convolution with
    /// stride `patch`, `hidden` filters) cuts the image into patch tokens in row-major order,
    /// `class_token` goes in front of them and `pos_embedding` is added, then dropout:
    /// `[c, h, w]` to `[(h / patch) * (w / patch) + 1, hidden]` tokens.
    Tokens {
        /// Width of a token (torchvision's `hidden_dim`).
        hidden: usize,
        /// Side of a patch; must divide the image's height and width.
        patch: usize,
        /// Dropout after the positional embedding.
        #[serde(default, skip_serializing_if = "is_zero_f64")]
        dropout: f64,
    },
    /// torchvision's pre-norm transformer `EncoderBlock`: `x + attention(ln_1(x))`, then
    /// `y + mlp(ln_2(y))`; `self_attention` is `nn.MultiheadAttention(hidden, heads)` (q, k, v
    /// packed in `in_proj_weight`), `mlp` is Linear, GELU, Dropout, Linear, Dropout (`mlp.0`,
    /// `mlp.3`). Layer norms over each token's `hidden` features.
    Encoder {
        /// Attention heads; must divide the token width.
        heads: usize,
        /// Hidden units of the MLP (torchvision's `mlp_dim`).
        mlp: usize,
        /// Dropout after the attention and in the MLP.
        #[serde(default, skip_serializing_if = "is_zero_f64")]
        dropout: f64,
        /// Dropout of the attention weights.
        #[serde(default, skip_serializing_if = "is_zero_f64")]
        attention_dropout: f64,
        /// Added to the variance in both layer norms (torchvision's 1e-6).
        #[serde(default = "vit_eps")]
        eps: f64,
    },
    /// The class token (token 0) of `[seq, hidden]` tokens: `[hidden]` flat features, what
    /// torchvision's heads read. A layer norm after it is torchvision's `encoder.ln` (each
    /// token is normalised alone, so normalising token 0 after taking it is the same).
    ClassToken,
}

/// One convolution of a residual block's main path: `conv{k}` with its norm `bn{k}`
/// (`k` from 1), reading the convolution before it (the first reads the block's input).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockConv {
    /// Output channels.
    pub rows: usize,
    /// Kernel side (padding `kernel / 2`).
    pub kernel: usize,
    /// Stride.
    pub stride: usize,
}

/// A residual block as every reader of layer lists sees it: its main path's convolutions,
/// the last of which writes `out`, each followed by `norm` (and a ReLU but the last), and a
/// shortcut (a 1x1 projection `shortcut.0` with its norm `shortcut.1`, or the identity). A
/// new block type describes itself here; shapes, training, unit maps and matching follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockShape {
    /// The main path, in order.
    pub convs: Vec<BlockConv>,
    /// Output channels: the last convolution's and the shortcut's.
    pub out: usize,
    /// The block's stride (the projection's).
    pub stride: usize,
    /// The norm after each convolution.
    pub norm: BlockNorm,
    /// Groups of a group norm.
    pub groups: usize,
    /// Whether the block keeps its projection whatever its widths.
    pub project: bool,
}

impl BlockShape {
    /// Whether the block on `in_channels` inputs has a projection shortcut (else the
    /// identity).
    pub fn has_projection(&self, in_channels: usize) -> bool {
        self.project || super::shapes::has_projection(in_channels, self.out, self.stride)
    }

    /// The name of convolution `k` (from 0) of the main path: `conv{k + 1}`.
    pub fn conv_name(k: usize) -> String {
        format!("conv{}", k + 1)
    }

    /// The name of the norm after convolution `k`: `bn{k + 1}`.
    pub fn norm_name(k: usize) -> String {
        format!("bn{}", k + 1)
    }

    /// The main path's inner widths (every convolution's outputs but the last's).
    pub fn inner_widths(&self) -> Vec<usize> {
        let n = self.convs.len();
        self.convs[..n.saturating_sub(1)]
            .iter()
            .map(|c| c.rows)
            .collect()
    }
}

fn is_false(v: &bool) -> bool {
    !*v
}
fn is_zero(v: &usize) -> bool {
    *v == 0
}
fn one() -> usize {
    1
}
fn two() -> usize {
    2
}
fn yes() -> bool {
    true
}
fn is_zero_f64(v: &f64) -> bool {
    *v == 0.0
}

fn vit_eps() -> f64 {
    1e-6
}

fn norm_eps() -> f64 {
    1e-5
}
fn bn_momentum() -> f64 {
    0.1
}

impl LayerSpec {
    /// `nn.Conv2d(_, out, kernel)`: stride 1, no padding, bias.
    pub fn conv2d(out: usize, kernel: usize) -> Self {
        Self::Conv2d {
            out,
            kernel,
            stride: 1,
            padding: 0,
            groups: 1,
            bias: true,
        }
    }

    /// This convolution with `padding` (other layers are returned as they are).
    pub fn with_padding(mut self, p: usize) -> Self {
        if let Self::Conv2d { padding, .. } = &mut self {
            *padding = p;
        }
        self
    }

    /// This convolution without a bias (other layers are returned as they are).
    pub fn without_bias(mut self) -> Self {
        if let Self::Conv2d { bias, .. } | Self::Linear { bias, .. } = &mut self {
            *bias = false;
        }
        self
    }

    /// `nn.MaxPool2d(kernel)`.
    pub fn max_pool(kernel: usize) -> Self {
        Self::MaxPool2d {
            kernel,
            stride: None,
            padding: 0,
        }
    }

    /// `nn.Linear(_, out)` with a bias.
    pub fn linear(out: usize) -> Self {
        Self::Linear { out, bias: true }
    }

    /// `nn.BatchNorm2d` with PyTorch's defaults.
    pub fn batch_norm2d() -> Self {
        Self::BatchNorm2d {
            eps: norm_eps(),
            momentum: bn_momentum(),
        }
    }

    /// A residual block of `out` channels.
    pub fn residual(out: usize, stride: usize, norm: BlockNorm) -> Self {
        Self::Residual {
            out,
            stride,
            norm,
            groups: 2,
            inner: None,
            project: false,
        }
    }

    /// A bottleneck block of `out` channels (`out / 4` inside).
    pub fn bottleneck(out: usize, stride: usize, norm: BlockNorm) -> Self {
        Self::Bottleneck {
            out,
            stride,
            norm,
            groups: 2,
            inner: None,
            middle: None,
            project: false,
        }
    }

    /// The channels (or features) of the layer's output when it sets them: a convolution's,
    /// a linear layer's or a block's `out`; `None` for layers that keep their input's.
    pub fn output_channels(&self) -> Option<usize> {
        match *self {
            Self::Conv2d { out, .. }
            | Self::Linear { out, .. }
            | Self::Residual { out, .. }
            | Self::Bottleneck { out, .. } => Some(out),
            Self::Tokens { hidden, .. } => Some(hidden),
            _ => None,
        }
    }

    /// A residual block's shape; `None` for other layers.
    pub fn block(&self) -> Option<BlockShape> {
        let conv = |rows, kernel, stride| BlockConv {
            rows,
            kernel,
            stride,
        };
        match *self {
            Self::Residual {
                out,
                stride,
                norm,
                groups,
                inner,
                project,
            } => Some(BlockShape {
                convs: vec![conv(inner.unwrap_or(out), 3, stride), conv(out, 3, 1)],
                out,
                stride,
                norm,
                groups,
                project,
            }),
            Self::Bottleneck {
                out,
                stride,
                norm,
                groups,
                inner,
                middle,
                project,
            } => {
                let inner = inner.unwrap_or(out / 4);
                Some(BlockShape {
                    convs: vec![
                        conv(inner, 1, 1),
                        conv(middle.unwrap_or(inner), 3, stride),
                        conv(out, 1, 1),
                    ],
                    out,
                    stride,
                    norm,
                    groups,
                    project,
                })
            }
            _ => None,
        }
    }

    /// The name of this layer's type in a layer list (`conv2d`, `residual`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Conv2d { .. } => "conv2d",
            Self::MaxPool2d { .. } => "maxpool2d",
            Self::AvgPool2d { .. } => "avgpool2d",
            Self::GlobalAvgpool => "global_avgpool",
            Self::BatchNorm2d { .. } => "batchnorm2d",
            Self::BatchNorm1d { .. } => "batchnorm1d",
            Self::GroupNorm { .. } => "groupnorm",
            Self::LayerNorm { .. } => "layernorm",
            Self::Relu => "relu",
            Self::Dropout { .. } => "dropout",
            Self::Flatten => "flatten",
            Self::Linear { .. } => "linear",
            Self::Residual { .. } => "residual",
            Self::Bottleneck { .. } => "bottleneck",
            Self::Tokens { .. } => "tokens",
            Self::Encoder { .. } => "encoder",
            Self::ClassToken => "class_token",
        }
    }

    /// Whether the layer is one of a Vision Transformer's (tokens, encoder, class token).
    pub fn is_transformer(&self) -> bool {
        matches!(
            self,
            Self::Tokens { .. } | Self::Encoder { .. } | Self::ClassToken
        )
    }

    /// Whether the layer is a normalisation whose tensors FedBN keeps on the clients.
    pub fn is_norm(&self) -> bool {
        matches!(
            self,
            Self::BatchNorm2d { .. }
                | Self::BatchNorm1d { .. }
                | Self::GroupNorm { .. }
                | Self::LayerNorm { .. }
        )
    }
}

/// The layers without settings: serde's tagged enums let any key through on a variant without
/// fields, so the reader below refuses them itself.
const WITHOUT_KEYS: [&str; 4] = ["relu", "flatten", "global_avgpool", "class_token"];

impl Serialize for LayerSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        LayerSpec::serialize(self, s)
    }
}

impl<'de> Deserialize<'de> for LayerSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        if let Some(map) = value.as_object()
            && map
                .get("type")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|t| WITHOUT_KEYS.contains(&t))
            && let Some(key) = map.keys().find(|k| *k != "type")
        {
            return Err(D::Error::unknown_field(key, &[]));
        }
        LayerSpec::deserialize(value).map_err(D::Error::custom)
    }
}
