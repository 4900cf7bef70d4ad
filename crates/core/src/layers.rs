//! Layer-list models: the layers of `[model] kind = "sequential"`, the shapes they chain, and
//! the tensors they hold, named as PyTorch names the same `nn.Sequential`.
//!
//! Layer `i` of the list is child `i` of an `nn.Sequential`, so its tensors are `{i}.weight`,
//! `{i}.bias`, and for batch norm also the buffers `{i}.running_mean`, `{i}.running_var` and
//! `{i}.num_batches_tracked` (a scalar, I64 in files). Layers without tensors (ReLU, pooling,
//! dropout, flatten) still take their index, as in PyTorch. A [`LayerSpec::Residual`] block is
//! the basic block of He et al. (2016) with children `conv1`, `bn1`, `conv2`, `bn2` and, when
//! the block changes width or stride, a projection `shortcut` (`shortcut.0` the 1x1
//! convolution, `shortcut.1` its norm): the module tree of `scripts/zoo_reference.py`.
//!
//! [`gate_points`] are the layers whose units (filters, linear units, a block's inner channels)
//! methods gate, drop or prune; [`unit_uses`] lists, for each, every tensor entry that holds or
//! reads a unit, so that dropping or permuting units goes through one map.
//!
//! ```
//! use fedfuse_core::{LayerSpec, ModelSpec};
//! let spec = ModelSpec::sequential(
//!     &[1, 28, 28],
//!     vec![
//!         LayerSpec::conv2d(8, 3).with_padding(1),
//!         LayerSpec::Relu,
//!         LayerSpec::max_pool(2),
//!         LayerSpec::Flatten,
//!         LayerSpec::linear(10),
//!     ],
//! );
//! spec.validate()?;
//! let names: Vec<String> = spec.param_shapes().into_iter().map(|p| p.name).collect();
//! assert_eq!(names, ["0.weight", "0.bias", "4.weight", "4.bias"]);
//! assert_eq!(spec.classes(), 10);
//! # Ok::<(), fedfuse_core::CoreError>(())
//! ```

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::{CoreError, GroupedLayer, ParamShape, Result};

/// Most layers one list may hold (a residual block counts once).
pub const MAX_LAYERS: usize = 1000;

/// Largest kernel, stride, padding or group count a layer may declare.
const MAX_WINDOW: usize = 1024;

/// Most values one tensor, or one sample between two layers, may hold (8 GiB of `f32`). Far
/// above any trainable model, and low enough that every product and sum over a layer list's
/// shapes stays inside `usize`: a declared width of 2^62 is refused here instead of wrapping
/// around to a small count that passes the parameter limit.
pub const MAX_VALUES: usize = 1 << 31;

/// The product of `dims`, or `None` when it is above [`MAX_VALUES`] (or wraps).
pub fn bounded_len(dims: &[usize]) -> Option<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= MAX_VALUES)
}

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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// `nn.MaxPool2d(kernel, stride)`; the stride defaults to the kernel.
    #[serde(rename = "maxpool2d")]
    MaxPool2d {
        /// Window side.
        kernel: usize,
        /// Stride.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stride: Option<usize>,
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
    },
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
fn norm_eps() -> f64 {
    1e-5
}
fn bn_momentum() -> f64 {
    0.1
}

/// The shape of one sample between layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeatureShape {
    /// Feature maps `[channels, height, width]`.
    Image {
        /// Channels.
        c: usize,
        /// Height.
        h: usize,
        /// Width.
        w: usize,
    },
    /// A flat vector.
    Flat(usize),
}

impl FeatureShape {
    /// The shape of samples with axes `dims`: `[c, h, w]` images or `[d]` vectors.
    pub fn of(dims: &[usize]) -> Result<Self> {
        match *dims {
            _ if bounded_len(dims).is_none() => Err(CoreError::InvalidSpec(format!(
                "samples of shape {dims:?} hold more than {MAX_VALUES} values"
            ))),
            [c, h, w] if c > 0 && h > 0 && w > 0 => Ok(Self::Image { c, h, w }),
            [d] if d > 0 => Ok(Self::Flat(d)),
            _ => Err(CoreError::InvalidSpec(format!(
                "a layer list takes samples of shape [channels, height, width] or [features], \
                 all positive; got {dims:?}"
            ))),
        }
    }

    /// Values per sample (saturating: shapes that [`chain`] accepted are far below the
    /// bound).
    pub fn len(self) -> usize {
        match self {
            Self::Image { c, h, w } => c.saturating_mul(h).saturating_mul(w),
            Self::Flat(d) => d,
        }
    }

    /// Whether a sample holds no value (never, for a checked shape).
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// The axes, `[c, h, w]` or `[d]`.
    pub fn dims(self) -> Vec<usize> {
        match self {
            Self::Image { c, h, w } => vec![c, h, w],
            Self::Flat(d) => vec![d],
        }
    }

    /// Channels: `c` of an image, the width of a vector.
    pub fn channels(self) -> usize {
        match self {
            Self::Image { c, .. } => c,
            Self::Flat(d) => d,
        }
    }
}

/// What a tensor of a layer list is to training.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorRole {
    /// A parameter: trained, gated, penalised.
    Param,
    /// A running statistic of batch norm (`running_mean`, `running_var`): updated by
    /// training batches, averaged by the server like a parameter, never differentiated.
    Stat,
    /// `num_batches_tracked`: a count, I64 in PyTorch's files.
    Counter,
}

impl TensorRole {
    /// The role of the tensor called `name`, by PyTorch's buffer names.
    pub fn of(name: &str) -> Self {
        let last = name.rsplit('.').next().unwrap_or(name);
        match last {
            "running_mean" | "running_var" => Self::Stat,
            "num_batches_tracked" => Self::Counter,
            _ => Self::Param,
        }
    }
}

/// Whether `name` is batch norm's `num_batches_tracked`, the one I64 tensor of PyTorch's files.
pub fn is_counter(name: &str) -> bool {
    TensorRole::of(name) == TensorRole::Counter
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
        }
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

    /// The shape this layer gives a sample of shape `input`, appending its tensors (named
    /// under `prefix`) to `tensors`; an error says what does not fit, without naming the layer
    /// (the caller does).
    fn chain(
        &self,
        input: FeatureShape,
        prefix: &str,
        tensors: &mut Vec<ParamShape>,
    ) -> std::result::Result<FeatureShape, String> {
        let bounded = |what: &str, v: usize| {
            if v == 0 || v > MAX_WINDOW {
                Err(format!("{what} = {v} is outside 1..={MAX_WINDOW}"))
            } else {
                Ok(())
            }
        };
        let image = || match input {
            FeatureShape::Image { c, h, w } => Ok((c, h, w)),
            FeatureShape::Flat(d) => Err(format!(
                "takes feature maps [channels, height, width] but gets {d} flat features"
            )),
        };
        let window = |side: usize, kernel: usize, stride: usize, pad: usize| {
            let padded = side + 2 * pad;
            if padded < kernel {
                Err(format!(
                    "a {kernel}x{kernel} window does not fit a side of {side} (padding {pad})"
                ))
            } else {
                Ok((padded - kernel) / stride + 1)
            }
        };
        let push = |tensors: &mut Vec<ParamShape>, name: &str, shape: &[usize]| {
            tensors.push(ParamShape {
                name: format!("{prefix}{name}"),
                shape: shape.to_vec(),
            });
        };
        let affine = |tensors: &mut Vec<ParamShape>, shape: &[usize]| {
            push(tensors, "weight", shape);
            push(tensors, "bias", shape);
        };
        let batch_norm = |tensors: &mut Vec<ParamShape>, c: usize, eps: f64, momentum: f64| {
            check_eps(eps)?;
            if !(momentum.is_finite() && (0.0..=1.0).contains(&momentum)) {
                return Err(format!("momentum = {momentum} is outside [0, 1]"));
            }
            affine(tensors, &[c]);
            push(tensors, "running_mean", &[c]);
            push(tensors, "running_var", &[c]);
            push(tensors, "num_batches_tracked", &[]);
            Ok(())
        };
        Ok(match *self {
            Self::Conv2d {
                out,
                kernel,
                stride,
                padding,
                groups,
                bias,
            } => {
                let (c, h, w) = image()?;
                if out == 0 {
                    return Err("out = 0: a layer needs at least one output".into());
                }
                bounded("kernel", kernel)?;
                bounded("stride", stride)?;
                bounded("groups", groups)?;
                if padding > MAX_WINDOW {
                    return Err(format!("padding = {padding} is above {MAX_WINDOW}"));
                }
                if c % groups != 0 || out % groups != 0 {
                    return Err(format!(
                        "groups = {groups} must divide both the {c} input and the {out} output \
                         channels"
                    ));
                }
                let (oh, ow) = (
                    window(h, kernel, stride, padding)?,
                    window(w, kernel, stride, padding)?,
                );
                push(tensors, "weight", &[out, c / groups, kernel, kernel]);
                if bias {
                    push(tensors, "bias", &[out]);
                }
                FeatureShape::Image {
                    c: out,
                    h: oh,
                    w: ow,
                }
            }
            Self::MaxPool2d { kernel, stride } | Self::AvgPool2d { kernel, stride } => {
                let (c, h, w) = image()?;
                let stride = stride.unwrap_or(kernel);
                bounded("kernel", kernel)?;
                bounded("stride", stride)?;
                FeatureShape::Image {
                    c,
                    h: window(h, kernel, stride, 0)?,
                    w: window(w, kernel, stride, 0)?,
                }
            }
            Self::GlobalAvgpool => {
                let (c, ..) = image()?;
                FeatureShape::Image { c, h: 1, w: 1 }
            }
            Self::BatchNorm2d { eps, momentum } => {
                let (c, ..) = image()?;
                batch_norm(tensors, c, eps, momentum)?;
                input
            }
            Self::BatchNorm1d { eps, momentum } => {
                let FeatureShape::Flat(d) = input else {
                    return Err(
                        "takes flat features; use batchnorm2d on feature maps, or flatten first"
                            .into(),
                    );
                };
                batch_norm(tensors, d, eps, momentum)?;
                input
            }
            Self::GroupNorm { groups, eps } => {
                let (c, ..) = image()?;
                check_eps(eps)?;
                bounded("groups", groups)?;
                if c % groups != 0 {
                    return Err(format!("groups = {groups} does not divide {c} channels"));
                }
                affine(tensors, &[c]);
                input
            }
            Self::LayerNorm { eps } => {
                check_eps(eps)?;
                affine(tensors, &input.dims());
                input
            }
            Self::Relu => input,
            Self::Dropout { p } => {
                if !(p.is_finite() && (0.0..1.0).contains(&p)) {
                    return Err(format!("p = {p} is outside [0, 1)"));
                }
                input
            }
            Self::Flatten => FeatureShape::Flat(input.len()),
            Self::Linear { out, bias } => {
                let FeatureShape::Flat(d) = input else {
                    return Err(format!(
                        "takes flat features but gets feature maps {:?}; add {{ type = \
                         \"flatten\" }} before it",
                        input.dims()
                    ));
                };
                if out == 0 {
                    return Err("out = 0: a layer needs at least one output".into());
                }
                push(tensors, "weight", &[out, d]);
                if bias {
                    push(tensors, "bias", &[out]);
                }
                FeatureShape::Flat(out)
            }
            Self::Residual {
                out,
                stride,
                norm,
                groups,
            } => {
                let (c, h, w) = image()?;
                if out == 0 {
                    return Err("out = 0: a block needs at least one channel".into());
                }
                bounded("stride", stride)?;
                if norm == BlockNorm::Group && (groups == 0 || out % groups != 0) {
                    return Err(format!("groups = {groups} does not divide {out} channels"));
                }
                let (oh, ow) = (window(h, 3, stride, 1)?, window(w, 3, stride, 1)?);
                let conv_bias = norm == BlockNorm::None;
                let conv = |tensors: &mut Vec<ParamShape>, name: &str, c_in: usize, k: usize| {
                    push(tensors, &format!("{name}.weight"), &[out, c_in, k, k]);
                    if conv_bias {
                        push(tensors, &format!("{name}.bias"), &[out]);
                    }
                };
                let norm_tensors = |tensors: &mut Vec<ParamShape>, name: &str| {
                    let p = |t: &str| format!("{name}.{t}");
                    if norm != BlockNorm::None {
                        push(tensors, &p("weight"), &[out]);
                        push(tensors, &p("bias"), &[out]);
                    }
                    if norm == BlockNorm::Batch {
                        push(tensors, &p("running_mean"), &[out]);
                        push(tensors, &p("running_var"), &[out]);
                        push(tensors, &p("num_batches_tracked"), &[]);
                    }
                };
                conv(tensors, "conv1", c, 3);
                norm_tensors(tensors, "bn1");
                conv(tensors, "conv2", out, 3);
                norm_tensors(tensors, "bn2");
                if has_projection(c, out, stride) {
                    conv(tensors, "shortcut.0", c, 1);
                    norm_tensors(tensors, "shortcut.1");
                }
                FeatureShape::Image {
                    c: out,
                    h: oh,
                    w: ow,
                }
            }
        })
    }
}

fn check_eps(eps: f64) -> std::result::Result<(), String> {
    if eps.is_finite() && eps > 0.0 {
        Ok(())
    } else {
        Err(format!("eps = {eps} is not a positive number"))
    }
}

/// Whether a residual block of `out` channels and `stride` on `in_channels` inputs has a
/// projection shortcut (else the identity).
pub fn has_projection(in_channels: usize, out: usize, stride: usize) -> bool {
    stride != 1 || in_channels != out
}

/// The shapes after each layer of `layers` on samples of shape `input`, and every tensor, in
/// PyTorch's `state_dict` order; an error names the first layer that does not fit.
pub fn chain(
    input: FeatureShape,
    layers: &[LayerSpec],
) -> Result<(Vec<FeatureShape>, Vec<ParamShape>)> {
    if layers.is_empty() || layers.len() > MAX_LAYERS {
        return Err(CoreError::InvalidSpec(format!(
            "a layer list holds 1 to {MAX_LAYERS} layers; this one has {}",
            layers.len()
        )));
    }
    let mut shapes = Vec::with_capacity(layers.len());
    let mut tensors = Vec::new();
    let mut at = input;
    for (i, layer) in layers.iter().enumerate() {
        let first_new = tensors.len();
        let fail = |why: String| {
            CoreError::InvalidSpec(format!(
                "model.layers[{i}] ({}, input {:?}): {why}",
                layer.type_name(),
                at.dims()
            ))
        };
        let next = layer
            .chain(at, &format!("{i}."), &mut tensors)
            .map_err(fail)?;
        // Every later product over these shapes is then inside `usize`.
        if bounded_len(&next.dims()).is_none() {
            return Err(fail(format!(
                "its output {:?} holds more than {MAX_VALUES} values per sample; lower its \
                 width, padding or kernel",
                next.dims()
            )));
        }
        if let Some(t) = tensors[first_new..]
            .iter()
            .find(|t| bounded_len(&t.shape).is_none())
        {
            return Err(fail(format!(
                "its tensor `{}` of shape {:?} holds more than {MAX_VALUES} values; lower its \
                 width or kernel",
                t.name, t.shape
            )));
        }
        at = next;
        shapes.push(at);
    }
    Ok((shapes, tensors))
}

/// The names of the norms' scales and shifts in a layer list (`{i}.weight`, `{i}.bias` of a
/// norm layer, and `bn1`, `bn2`, `shortcut.1` of residual blocks with norms): PyTorch starts
/// them at 1 and 0, not like a layer's weights.
pub fn norm_affine_names(input: &[usize], layers: &[LayerSpec]) -> Result<Vec<String>> {
    let (shapes, _) = chain(FeatureShape::of(input)?, layers)?;
    let mut out = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let c_in = if i == 0 {
            FeatureShape::of(input)?.channels()
        } else {
            shapes[i - 1].channels()
        };
        let mut norm = |name: String| {
            out.push(format!("{name}.weight"));
            out.push(format!("{name}.bias"));
        };
        match *layer {
            _ if layer.is_norm() => norm(i.to_string()),
            LayerSpec::Residual {
                out: c,
                stride,
                norm: kind,
                ..
            } if kind != BlockNorm::None => {
                norm(format!("{i}.bn1"));
                norm(format!("{i}.bn2"));
                if has_projection(c_in, c, stride) {
                    norm(format!("{i}.shortcut.1"));
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The names of every normalisation layer's tensors in a layer list, in PyTorch's
/// `state_dict` order: the scales and shifts of [`norm_affine_names`] and batch norm's running
/// statistics and counters. What FedBN (`model.local_norm`) keeps on the clients.
pub fn norm_tensor_names(input: &[usize], layers: &[LayerSpec]) -> Result<Vec<String>> {
    let (_, tensors) = chain(FeatureShape::of(input)?, layers)?;
    let affine = norm_affine_names(input, layers)?;
    Ok(tensors
        .into_iter()
        .map(|t| t.name)
        .filter(|n| TensorRole::of(n) != TensorRole::Param || affine.contains(n))
        .collect())
}

/// A grouped layer of a layer list (see [`crate::groups`]) and where its gate acts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatePoint {
    /// The groups: filters or units, with their biases and the per-channel scale and shift of
    /// a batch or group norm that directly follows.
    pub group: GroupedLayer,
    /// The layer whose output the gates multiply: the norm when one follows, else the layer;
    /// for a residual block, the block itself, whose gates act inside it, after `bn1`.
    pub layer: usize,
}

/// The groups of a layer list: every convolution and linear layer but the last (the one that
/// writes the logits), and the inner channels of every residual block (`conv1`'s filters with
/// `bn1`). A block's output channels are not grouped: the identity path carries them on, so
/// zeroing `conv2` or the shortcut would not remove them. A convolution before a block is
/// grouped, but zeroing one of its filters removes only that filter's contribution, for the
/// blocks add to the channel.
pub fn gate_points(input: &[usize], layers: &[LayerSpec]) -> Result<Vec<GatePoint>> {
    Ok(grouped_layers(input, layers)?
        .into_iter()
        .map(|(_, point)| point)
        .collect())
}

/// [`gate_points`], each with the index of the layer whose units it groups (the convolution,
/// linear layer or residual block, not the norm after it).
fn grouped_layers(input: &[usize], layers: &[LayerSpec]) -> Result<Vec<(usize, GatePoint)>> {
    let (shapes, _) = chain(FeatureShape::of(input)?, layers)?;
    let last = layers
        .iter()
        .rposition(|l| matches!(l, LayerSpec::Conv2d { .. } | LayerSpec::Linear { .. }));
    let mut points = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let input = if i == 0 {
            FeatureShape::of(input)?
        } else {
            shapes[i - 1]
        };
        let next_norm = |flat: bool| match layers.get(i + 1) {
            Some(LayerSpec::BatchNorm2d { .. } | LayerSpec::GroupNorm { .. }) if !flat => true,
            Some(LayerSpec::BatchNorm1d { .. }) => flat,
            _ => false,
        };
        let (weight, fan_in, units, bias, flat) = match *layer {
            LayerSpec::Conv2d {
                out,
                kernel,
                groups,
                bias,
                ..
            } => (
                format!("{i}.weight"),
                input.channels() / groups * kernel * kernel,
                out,
                bias,
                false,
            ),
            LayerSpec::Linear { out, bias } => {
                (format!("{i}.weight"), input.len(), out, bias, true)
            }
            LayerSpec::Residual { out, norm, .. } => {
                let mut per_unit = Vec::new();
                match norm {
                    BlockNorm::None => per_unit.push(format!("{i}.conv1.bias")),
                    BlockNorm::Batch | BlockNorm::Group => {
                        per_unit.push(format!("{i}.bn1.weight"));
                        per_unit.push(format!("{i}.bn1.bias"));
                    }
                }
                points.push((
                    i,
                    GatePoint {
                        group: GroupedLayer {
                            weight: format!("{i}.conv1.weight"),
                            per_unit,
                            units: out,
                            fan_in: input.channels() * 9,
                        },
                        layer: i,
                    },
                ));
                continue;
            }
            _ => continue,
        };
        if Some(i) == last {
            continue;
        }
        let mut per_unit = Vec::new();
        if bias {
            per_unit.push(format!("{i}.bias"));
        }
        let mut at = i;
        if next_norm(flat) {
            per_unit.push(format!("{}.weight", i + 1));
            per_unit.push(format!("{}.bias", i + 1));
            at = i + 1;
        }
        points.push((
            i,
            GatePoint {
                group: GroupedLayer {
                    weight,
                    per_unit,
                    units,
                    fan_in,
                },
                layer: at,
            },
        ));
    }
    Ok(points)
}

/// Where the units of a grouped layer sit in one tensor: unit `u` owns `block` consecutive
/// indices of axis `axis`, `p * block .. (p + 1) * block` with `p = u`, and with them every
/// value along the other axes.
///
/// A convolution of `groups > 1` channel groups reading the units splits them (axis 1 of its
/// weight `[out, in / groups, kh, kw]` holds `in / groups` of them): unit `u` is input
/// `p = u % (in / groups)` of channel group `j = u / (in / groups)`, read only by that group's
/// output channels, rows `j * out / groups .. (j + 1) * out / groups` of axis 0. A permutation
/// of the units keeps such a reader's weights right only when it maps every channel group
/// onto itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitUse {
    /// The tensor's name.
    pub tensor: String,
    /// The axis that indexes the units.
    pub axis: usize,
    /// Indices of `axis` per unit: 1, or `h * w` for the columns of a linear layer that reads
    /// flattened `[c, h, w]` feature maps (channel `c`'s block is `c * h * w .. (c + 1) * h * w`).
    pub block: usize,
    /// Channel groups of a reading convolution (1 otherwise); see the type's docs.
    pub groups: usize,
}

impl UnitUse {
    fn new(tensor: String, axis: usize, block: usize) -> Self {
        Self {
            tensor,
            axis,
            block,
            groups: 1,
        }
    }

    /// The values of unit `unit` in a row-major tensor of shape `shape` (this use's tensor),
    /// as ranges of flat indices in increasing order; empty for a unit the tensor does not
    /// hold.
    pub fn ranges(&self, shape: &[usize], unit: usize) -> Vec<Range<usize>> {
        let Some(&len) = shape.get(self.axis) else {
            return Vec::new();
        };
        let per_group = len / self.block.max(1);
        let groups = if self.axis == 0 {
            1
        } else {
            self.groups.max(1)
        };
        if per_group == 0 || unit / per_group >= groups {
            return Vec::new();
        }
        let (part, p) = (unit / per_group, unit % per_group);
        let inner: usize = shape[self.axis + 1..].iter().product();
        let span = self.block * inner;
        // Outer index `o` runs over the axes before `axis`; its axis-0 row is `o / per_row`.
        let outer: usize = shape[..self.axis].iter().product();
        let per_row: usize = shape.get(1..self.axis).map_or(1, |s| s.iter().product());
        let rows_per_part = shape.first().map_or(0, |&r| r / groups);
        (0..outer)
            .filter(|o| groups == 1 || (o / per_row) / rows_per_part.max(1) == part)
            .map(|o| {
                let start = o * len * inner + p * span;
                start..start + span
            })
            .collect()
    }
}

/// Every tensor entry that belongs to the units of one grouped layer of a layer list (one
/// [`GatePoint`], in the same order): what "unit `u` of this layer" means for dropping it
/// (FedDrop zeroes all of it) or for permuting units (every use moves together).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitUses {
    /// The grouped layer's index in the list: a convolution, a linear layer, or a residual
    /// block (whose units are its `conv1`'s channels).
    pub layer: usize,
    /// Its units.
    pub units: usize,
    /// What the layer holds per unit: its weight's rows (axis 0), its bias, and the per-channel
    /// tensors of every norm between it and its readers (scale, shift, batch norm's running
    /// mean and variance; not the scalar counter).
    pub own: Vec<UnitUse>,
    /// The inputs of the layers that read the units: the next convolution's input channels
    /// (axis 1), the next linear layer's input columns (axis 1, blocks of `h * w` after a
    /// flatten), a residual block's `conv1` and projection `shortcut.0` input channels, a
    /// block's `conv2` input channels for its inner units.
    pub readers: Vec<UnitUse>,
    /// The layers between this one and its readers, in order (norms, activations, pooling,
    /// dropout, flatten); empty for a block's inner units (`bn1` and ReLU, inside the block).
    pub between: Vec<usize>,
    /// Whether the units also enter a residual block's identity path: the block adds its own
    /// output to them, so they live on in the block's output channels, which are not grouped.
    /// [`Self::readers`] then holds this layer's readers only (the block's `conv1`); removing
    /// a unit takes out this layer's contribution to the channel, and a permutation would have
    /// to reach every block of the identity path up to its next projection, which this map
    /// does not list.
    pub identity: bool,
}

impl UnitUses {
    /// [`Self::own`], then [`Self::readers`].
    pub fn all(&self) -> impl Iterator<Item = &UnitUse> {
        self.own.iter().chain(&self.readers)
    }
}

/// Who holds and who reads the units of each grouped layer of a layer list: one [`UnitUses`]
/// per [`GatePoint`], in the order of [`gate_points`] and [`crate::GroupLayout::of_model`].
///
/// From a grouped convolution or linear layer the map walks forward through layers that keep
/// the unit axis (activations, pooling, dropout, flatten, norms), and stops at the first layer
/// that mixes units: a convolution, a linear layer or a residual block, whose inputs are the
/// readers.
pub fn unit_uses(input: &[usize], layers: &[LayerSpec]) -> Result<Vec<UnitUses>> {
    let first = FeatureShape::of(input)?;
    let (shapes, _) = chain(first, layers)?;
    let input_of = |i: usize| if i == 0 { first } else { shapes[i - 1] };
    let mut out = Vec::new();
    for (i, point) in grouped_layers(input, layers)? {
        let units = point.group.units;
        let mut uses = UnitUses {
            layer: i,
            units,
            own: vec![UnitUse::new(point.group.weight.clone(), 0, 1)],
            readers: Vec::new(),
            between: Vec::new(),
            identity: false,
        };
        if let LayerSpec::Residual { norm, .. } = layers[i] {
            if norm == BlockNorm::None {
                uses.own.push(UnitUse::new(format!("{i}.conv1.bias"), 0, 1));
            }
            let stats: &[&str] = match norm {
                BlockNorm::Batch => &["weight", "bias", "running_mean", "running_var"],
                BlockNorm::Group => &["weight", "bias"],
                BlockNorm::None => &[],
            };
            for t in stats {
                uses.own.push(UnitUse::new(format!("{i}.bn1.{t}"), 0, 1));
            }
            uses.readers
                .push(UnitUse::new(format!("{i}.conv2.weight"), 1, 1));
            out.push(uses);
            continue;
        }
        if let LayerSpec::Conv2d { bias: true, .. } | LayerSpec::Linear { bias: true, .. } =
            layers[i]
        {
            uses.own.push(UnitUse::new(format!("{i}.bias"), 0, 1));
        }
        // Indices of the unit axis per unit: `h * w` once a flatten has laid the channels out.
        let mut block = 1;
        for (j, layer) in layers.iter().enumerate().skip(i + 1) {
            let at = input_of(j);
            let reader = |name: &str, groups: usize| UnitUse {
                tensor: format!("{j}.{name}"),
                axis: 1,
                block,
                groups,
            };
            match *layer {
                LayerSpec::Conv2d { groups, .. } => {
                    uses.readers.push(reader("weight", groups));
                    break;
                }
                LayerSpec::Linear { .. } => {
                    uses.readers.push(reader("weight", 1));
                    break;
                }
                LayerSpec::Residual { out: c, stride, .. } => {
                    uses.readers.push(reader("conv1.weight", 1));
                    if has_projection(at.channels(), c, stride) {
                        uses.readers.push(reader("shortcut.0.weight", 1));
                    } else {
                        uses.identity = true;
                    }
                    break;
                }
                LayerSpec::Flatten => {
                    if let FeatureShape::Image { h, w, .. } = at {
                        block *= h * w;
                    }
                }
                LayerSpec::BatchNorm2d { .. } | LayerSpec::BatchNorm1d { .. } => {
                    for t in ["weight", "bias", "running_mean", "running_var"] {
                        uses.own.push(UnitUse::new(format!("{j}.{t}"), 0, block));
                    }
                }
                LayerSpec::GroupNorm { .. } | LayerSpec::LayerNorm { .. } => {
                    for t in ["weight", "bias"] {
                        uses.own.push(UnitUse::new(format!("{j}.{t}"), 0, block));
                    }
                }
                LayerSpec::MaxPool2d { .. }
                | LayerSpec::AvgPool2d { .. }
                | LayerSpec::GlobalAvgpool
                | LayerSpec::Relu
                | LayerSpec::Dropout { .. } => {}
            }
            uses.between.push(j);
        }
        out.push(uses);
    }
    Ok(out)
}
