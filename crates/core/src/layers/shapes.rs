//! The shapes a layer list chains and the tensors it holds, named and ordered as PyTorch's
//! `state_dict`, with the bounds that keep every product over them inside `usize`.

use super::vocabulary::{BlockNorm, BlockShape, LayerSpec};
use crate::{CoreError, ParamShape, Result};

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
    /// A transformer's tokens, `[seq, hidden]`.
    Tokens {
        /// Tokens (patches and the class token).
        seq: usize,
        /// Features of a token.
        hidden: usize,
    },
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
            Self::Tokens { seq, hidden } => seq.saturating_mul(hidden),
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
            Self::Tokens { seq, hidden } => vec![seq, hidden],
        }
    }

    /// Channels: `c` of an image, the width of a vector, a token's features.
    pub fn channels(self) -> usize {
        match self {
            Self::Image { c, .. } => c,
            Self::Flat(d) => d,
            Self::Tokens { hidden, .. } => hidden,
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
            FeatureShape::Tokens { seq, hidden } => Err(format!(
                "takes feature maps [channels, height, width] but gets {seq} tokens of {hidden}"
            )),
        };
        let tokens = || match input {
            FeatureShape::Tokens { seq, hidden } => Ok((seq, hidden)),
            other => Err(format!(
                "takes tokens [seq, hidden] but gets {:?}; put a tokens layer before it",
                other.dims()
            )),
        };
        let probability = |what: &str, p: f64| {
            if p.is_finite() && (0.0..1.0).contains(&p) {
                Ok(())
            } else {
                Err(format!("{what} = {p} is outside [0, 1)"))
            }
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
            Self::MaxPool2d {
                kernel,
                stride,
                padding,
            } => {
                let (c, h, w) = image()?;
                let stride = stride.unwrap_or(kernel);
                bounded("kernel", kernel)?;
                bounded("stride", stride)?;
                // Every window then holds at least one real value.
                if padding > kernel / 2 {
                    return Err(format!(
                        "padding = {padding} is more than half the {kernel}x{kernel} window"
                    ));
                }
                FeatureShape::Image {
                    c,
                    h: window(h, kernel, stride, padding)?,
                    w: window(w, kernel, stride, padding)?,
                }
            }
            Self::AvgPool2d { kernel, stride } => {
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
                probability("p", p)?;
                input
            }
            Self::Flatten => FeatureShape::Flat(input.len()),
            Self::Linear { out, bias } => {
                let FeatureShape::Flat(d) = input else {
                    return Err(format!(
                        "takes flat features but gets {:?}; add {{ type = \"flatten\" }} (or \
                         {{ type = \"class_token\" }} after tokens) before it",
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
            Self::Residual { .. } | Self::Bottleneck { .. } => {
                let Some(block) = self.block() else {
                    return Err("not a block".into());
                };
                let (c, mut h, mut w) = image()?;
                let out = block.out;
                if out == 0 {
                    return Err("out = 0: a block needs at least one channel".into());
                }
                bounded("stride", block.stride)?;
                let inner_keys = match self {
                    Self::Bottleneck { .. } => ["inner (default out / 4)", "middle"].as_slice(),
                    _ => ["inner"].as_slice(),
                };
                for (&key, width) in inner_keys.iter().zip(block.inner_widths()) {
                    if width == 0 {
                        return Err(format!(
                            "{key} = 0: a block needs at least one inner channel"
                        ));
                    }
                    bounded(key, width)?;
                }
                let norm = block.norm;
                let groups = block.groups;
                for (key, width) in inner_keys
                    .iter()
                    .copied()
                    .zip(block.inner_widths())
                    .chain([("out", out)])
                {
                    if norm == BlockNorm::Group && (groups == 0 || width % groups != 0) {
                        return Err(format!(
                            "groups = {groups} does not divide the {width} channels of {key}"
                        ));
                    }
                }
                let conv_bias = norm == BlockNorm::None;
                let conv = |tensors: &mut Vec<ParamShape>,
                            name: &str,
                            rows: usize,
                            c_in: usize,
                            k: usize| {
                    push(tensors, &format!("{name}.weight"), &[rows, c_in, k, k]);
                    if conv_bias {
                        push(tensors, &format!("{name}.bias"), &[rows]);
                    }
                };
                let norm_tensors = |tensors: &mut Vec<ParamShape>, name: &str, width: usize| {
                    let p = |t: &str| format!("{name}.{t}");
                    if norm != BlockNorm::None {
                        push(tensors, &p("weight"), &[width]);
                        push(tensors, &p("bias"), &[width]);
                    }
                    if norm == BlockNorm::Batch {
                        push(tensors, &p("running_mean"), &[width]);
                        push(tensors, &p("running_var"), &[width]);
                        push(tensors, &p("num_batches_tracked"), &[]);
                    }
                };
                let mut c_in = c;
                for (k, bc) in block.convs.iter().enumerate() {
                    (h, w) = (
                        window(h, bc.kernel, bc.stride, bc.kernel / 2)?,
                        window(w, bc.kernel, bc.stride, bc.kernel / 2)?,
                    );
                    conv(tensors, &BlockShape::conv_name(k), bc.rows, c_in, bc.kernel);
                    norm_tensors(tensors, &BlockShape::norm_name(k), bc.rows);
                    c_in = bc.rows;
                }
                if block.has_projection(c) {
                    conv(tensors, "shortcut.0", out, c, 1);
                    norm_tensors(tensors, "shortcut.1", out);
                }
                FeatureShape::Image { c: out, h, w }
            }
            Self::Tokens {
                hidden,
                patch,
                dropout,
            } => {
                let (c, h, w) = image()?;
                if hidden == 0 {
                    return Err("hidden = 0: a token needs at least one feature".into());
                }
                bounded("patch", patch)?;
                probability("dropout", dropout)?;
                if h % patch != 0 || w % patch != 0 {
                    return Err(format!(
                        "patch = {patch} does not divide the {h}x{w} image (torchvision's \
                         VisionTransformer takes whole patches only)"
                    ));
                }
                let seq = (h / patch) * (w / patch) + 1;
                push(tensors, "class_token", &[1, 1, hidden]);
                push(tensors, "conv_proj.weight", &[hidden, c, patch, patch]);
                push(tensors, "conv_proj.bias", &[hidden]);
                push(tensors, "pos_embedding", &[1, seq, hidden]);
                FeatureShape::Tokens { seq, hidden }
            }
            Self::Encoder {
                heads,
                mlp,
                dropout,
                attention_dropout,
                eps,
            } => {
                let (_, hidden) = tokens()?;
                if heads == 0 || hidden % heads != 0 {
                    return Err(format!(
                        "heads = {heads} does not divide the tokens' {hidden} features"
                    ));
                }
                if mlp == 0 {
                    return Err("mlp = 0: the MLP needs at least one hidden unit".into());
                }
                probability("dropout", dropout)?;
                probability("attention_dropout", attention_dropout)?;
                check_eps(eps)?;
                push(tensors, "ln_1.weight", &[hidden]);
                push(tensors, "ln_1.bias", &[hidden]);
                push(
                    tensors,
                    "self_attention.in_proj_weight",
                    &[3 * hidden, hidden],
                );
                push(tensors, "self_attention.in_proj_bias", &[3 * hidden]);
                push(tensors, "self_attention.out_proj.weight", &[hidden, hidden]);
                push(tensors, "self_attention.out_proj.bias", &[hidden]);
                push(tensors, "ln_2.weight", &[hidden]);
                push(tensors, "ln_2.bias", &[hidden]);
                push(tensors, "mlp.0.weight", &[mlp, hidden]);
                push(tensors, "mlp.0.bias", &[mlp]);
                push(tensors, "mlp.3.weight", &[hidden, mlp]);
                push(tensors, "mlp.3.bias", &[hidden]);
                input
            }
            Self::ClassToken => {
                let (_, hidden) = tokens()?;
                FeatureShape::Flat(hidden)
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

/// `layers` at the widths a model's tensors hold: `rows(name)` is the first dimension of the
/// tensor the list names `name` (`None` when the model lacks it: the list's width stays).
/// Every convolution's and linear layer's `out` is its weight's rows; a residual block's `out`
/// is its last convolution's, and its inner widths its other convolutions' (`None` where they
/// are the default). A block whose model holds a projection keeps it (`project`) where the new
/// widths alone would not call for one. A transformer encoder's `mlp` is its `mlp.0` rows.
pub fn at_widths(layers: &[LayerSpec], rows: impl Fn(&str) -> Option<usize>) -> Vec<LayerSpec> {
    let mut own = layers.to_vec();
    // The channels entering each layer, as far as the list says (a list that starts with a
    // block leaves its input unknown here).
    let mut channels: Option<usize> = None;
    for (i, layer) in own.iter_mut().enumerate() {
        let of = |name: &str| rows(&format!("{i}.{name}"));
        let conv_rows = |k: usize| of(&format!("{}.weight", BlockShape::conv_name(k)));
        let keep_projection = |out: usize, stride: usize, project: &mut bool| {
            if of("shortcut.0.weight").is_some()
                && !channels.is_some_and(|c| has_projection(c, out, stride))
            {
                *project = true;
            }
        };
        match layer {
            LayerSpec::Conv2d { out, .. } | LayerSpec::Linear { out, .. } => {
                if let Some(r) = of("weight") {
                    *out = r;
                }
            }
            LayerSpec::Residual {
                out,
                inner,
                stride,
                project,
                ..
            } => {
                let mid = conv_rows(0).or(*inner).unwrap_or(*out);
                if let Some(r) = conv_rows(1) {
                    *out = r;
                }
                *inner = (mid != *out).then_some(mid);
                keep_projection(*out, *stride, project);
            }
            LayerSpec::Bottleneck {
                out,
                inner,
                middle,
                stride,
                project,
                ..
            } => {
                let first = conv_rows(0).or(*inner).unwrap_or(*out / 4);
                let second = conv_rows(1).or(*middle).unwrap_or(first);
                if let Some(r) = conv_rows(2) {
                    *out = r;
                }
                *inner = (first != *out / 4).then_some(first);
                *middle = (second != first).then_some(second);
                keep_projection(*out, *stride, project);
            }
            LayerSpec::Encoder { mlp, .. } => {
                if let Some(r) = of("mlp.0.weight") {
                    *mlp = r;
                }
            }
            _ => {}
        }
        if let Some(c) = layer.output_channels() {
            channels = Some(c);
        }
    }
    own
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
            LayerSpec::Encoder { .. } => {
                norm(format!("{i}.ln_1"));
                norm(format!("{i}.ln_2"));
            }
            _ => {
                if let Some(block) = layer.block()
                    && block.norm != BlockNorm::None
                {
                    for k in 0..block.convs.len() {
                        norm(format!("{i}.{}", BlockShape::norm_name(k)));
                    }
                    if block.has_projection(c_in) {
                        norm(format!("{i}.shortcut.1"));
                    }
                }
            }
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
