use serde::{Deserialize, Serialize};

use crate::layers::{self, FeatureShape, LayerSpec, TensorRole};
use crate::{CoreError, Params, Result};

/// Hidden-layer activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// max(0, x)
    #[default]
    Relu,
}

/// A network architecture: enough to build it and to know its parameter layout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ModelSpec {
    /// Fully connected network `input -> hidden[0] -> ... -> classes`, ReLU between layers.
    /// Parameters `layers.{i}.weight` `[out, in]` and `layers.{i}.bias` `[out]`.
    Mlp {
        /// Input width (flattened sample).
        input: usize,
        /// Hidden widths, possibly none (logistic regression).
        hidden: Vec<usize>,
        /// Output classes.
        classes: usize,
    },
    /// LeNet-5 (conv 6@5x5, max-pool 2, conv 16@5x5, max-pool 2, 120, 84, classes) for square
    /// 28x28 (first convolution padded by 2) or 32x32 inputs.
    #[serde(rename = "lenet5")]
    LeNet5 {
        /// Input channels (1 for MNIST, 3 for CIFAR-10).
        channels: usize,
        /// Input side in pixels: 28 or 32.
        side: usize,
        /// Output classes.
        classes: usize,
    },
    /// A layer list (see [`crate::layers`]): PyTorch's `nn.Sequential` of the same layers, on
    /// samples of shape `input` (`[channels, height, width]` or `[features]`); the last layer's
    /// flat output is the class logits.
    Sequential {
        /// Shape of one sample.
        input: Vec<usize>,
        /// The layers, in order.
        layers: Vec<LayerSpec>,
    },
}

/// Name and shape of one parameter tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamShape {
    /// PyTorch-style name, e.g. `layers.0.weight`.
    pub name: String,
    /// Shape, PyTorch layout (`[out, in]` for linear weights).
    pub shape: Vec<usize>,
}

impl ParamShape {
    fn new(name: impl Into<String>, shape: &[usize]) -> Self {
        Self {
            name: name.into(),
            shape: shape.to_vec(),
        }
    }
}

impl ModelSpec {
    /// An MLP spec.
    pub fn mlp(input: usize, hidden: &[usize], classes: usize) -> Self {
        Self::Mlp {
            input,
            hidden: hidden.to_vec(),
            classes,
        }
    }

    /// A layer-list spec.
    pub fn sequential(input: &[usize], layers: Vec<LayerSpec>) -> Self {
        Self::Sequential {
            input: input.to_vec(),
            layers,
        }
    }

    /// The shape after each layer and every tensor of a layer list (checked), or `None` for
    /// the named architectures.
    pub fn chain(&self) -> Result<Option<(Vec<FeatureShape>, Vec<ParamShape>)>> {
        match self {
            Self::Sequential { input, layers } => {
                Ok(Some(layers::chain(FeatureShape::of(input)?, layers)?))
            }
            Self::Mlp { .. } | Self::LeNet5 { .. } => Ok(None),
        }
    }

    /// The layers of a layer list (empty for the named architectures).
    pub fn layer_list(&self) -> &[LayerSpec] {
        match self {
            Self::Sequential { layers, .. } => layers,
            Self::Mlp { .. } | Self::LeNet5 { .. } => &[],
        }
    }

    /// The same network as a layer list (`Sequential`): an MLP's linear layers with ReLU
    /// between them, LeNet-5's convolutions, pools and dense layers (the first convolution
    /// padded by 2 on 28x28 inputs), a layer list as it is. The tensors keep their shapes and
    /// forward order; their names become the list's (`{i}.weight` for `layers.{i}` or
    /// `conv1`), which is how layer-list code (matching over channels) reads any of them.
    pub fn as_sequential(&self) -> Self {
        match self {
            Self::Sequential { .. } => self.clone(),
            Self::Mlp { input, .. } => {
                let widths = self.mlp_widths().unwrap_or_default();
                let mut layers = Vec::with_capacity(2 * widths.len());
                for (i, &out) in widths.iter().skip(1).enumerate() {
                    if i > 0 {
                        layers.push(LayerSpec::Relu);
                    }
                    layers.push(LayerSpec::linear(out));
                }
                Self::sequential(&[*input], layers)
            }
            Self::LeNet5 {
                channels,
                side,
                classes,
            } => {
                let pad = if *side == 28 { 2 } else { 0 };
                Self::sequential(
                    &[*channels, *side, *side],
                    vec![
                        LayerSpec::conv2d(6, 5).with_padding(pad),
                        LayerSpec::Relu,
                        LayerSpec::max_pool(2),
                        LayerSpec::conv2d(16, 5),
                        LayerSpec::Relu,
                        LayerSpec::max_pool(2),
                        LayerSpec::Flatten,
                        LayerSpec::linear(120),
                        LayerSpec::Relu,
                        LayerSpec::linear(84),
                        LayerSpec::Relu,
                        LayerSpec::linear(*classes),
                    ],
                )
            }
        }
    }

    /// The MLP whose parameters are `params` (`layers.{i}.weight` `[out, in]` and
    /// `layers.{i}.bias` `[out]`, in order), e.g. a fused model whose widths changed.
    pub fn infer_mlp(params: &Params) -> Result<Self> {
        let bad = |msg: String| Err(CoreError::InvalidSpec(msg));
        if params.is_empty() || !params.len().is_multiple_of(2) {
            return bad(format!(
                "an MLP is pairs of `layers.{{i}}.weight` and `layers.{{i}}.bias`; found {} tensors: {}",
                params.len(),
                params.names().join(", ")
            ));
        }
        let mut widths: Vec<usize> = Vec::with_capacity(params.len() / 2 + 1);
        for i in 0..params.len() / 2 {
            let (wn, bn) = (format!("layers.{i}.weight"), format!("layers.{i}.bias"));
            let w = params.require(&wn)?;
            let b = params.require(&bn)?;
            let [out, inp] = w.shape[..] else {
                return bad(format!(
                    "tensor `{wn}` has shape {:?}; only linear layers ([out, in]) make an MLP",
                    w.shape
                ));
            };
            if b.shape != [out] {
                return bad(format!(
                    "tensor `{bn}` has shape {:?}, expected [{out}]",
                    b.shape
                ));
            }
            match widths.last() {
                None => widths.push(inp),
                Some(&prev) if prev != inp => {
                    return bad(format!(
                        "tensor `{wn}` takes {inp} inputs but the layer before gives {prev}"
                    ));
                }
                Some(_) => {}
            }
            widths.push(out);
        }
        let classes = widths.pop().unwrap_or(0);
        let input = widths.first().copied().unwrap_or(0);
        let spec = Self::mlp(input, &widths[1..], classes);
        params.check_layout(&spec.param_shapes())?;
        Ok(spec)
    }

    /// The architecture `params` are a model of: this one when they fit its layout, else the
    /// same network at the widths they hold (what a matching method's global model becomes
    /// when it opens or merges units). An MLP's tensors stay an MLP ([`Self::infer_mlp`]);
    /// every other model, and an MLP under its layer list's names, becomes a layer list ([`Self::as_sequential`], `{i}.weight` names) with each
    /// convolution's and linear layer's `out` read from its weight's rows. An error when the
    /// tensors still do not fit.
    pub fn with_widths_of(&self, params: &Params) -> Result<Self> {
        if params.check_layout(&self.param_shapes()).is_ok() {
            return Ok(self.clone());
        }
        if let Self::Mlp { .. } = self
            && let Ok(spec) = Self::infer_mlp(params)
        {
            return Ok(spec);
        }
        let Self::Sequential { input, layers } = self.as_sequential() else {
            return Err(CoreError::InvalidSpec("not a layer list".into()));
        };
        let layers = crate::layers::at_widths(&layers, |n| {
            params.get(n).and_then(|t| t.shape.first().copied())
        });
        let spec = Self::sequential(&input, layers);
        spec.validate()?;
        params.check_layout(&spec.param_shapes())?;
        Ok(spec)
    }

    /// Checks widths and sizes; every constructor of a network calls this first.
    pub fn validate(&self) -> Result<()> {
        match self {
            Self::Mlp {
                input,
                hidden,
                classes,
            } => {
                if *input == 0 || *classes == 0 || hidden.contains(&0) {
                    return Err(CoreError::InvalidSpec(format!(
                        "MLP widths must be positive (input {input}, hidden {hidden:?}, classes {classes})"
                    )));
                }
                if let Some(t) = self
                    .param_shapes()
                    .into_iter()
                    .find(|t| layers::bounded_len(&t.shape).is_none())
                {
                    return Err(CoreError::InvalidSpec(format!(
                        "MLP tensor `{}` of shape {:?} holds more than {} values: use smaller \
                         widths",
                        t.name,
                        t.shape,
                        layers::MAX_VALUES
                    )));
                }
            }
            Self::LeNet5 {
                channels,
                side,
                classes,
            } => {
                if *channels == 0 || *classes == 0 || !matches!(side, 28 | 32) {
                    return Err(CoreError::InvalidSpec(format!(
                        "LeNet-5 takes 28x28 or 32x32 inputs with at least one channel \
                         (got {channels} channel(s), side {side}, {classes} classes)"
                    )));
                }
            }
            Self::Sequential { layers, .. } => {
                let Some((shapes, _)) = self.chain()? else {
                    return Ok(());
                };
                match shapes.last() {
                    Some(FeatureShape::Flat(_)) => {}
                    other => {
                        return Err(CoreError::InvalidSpec(format!(
                            "model.layers[{}] ({}) gives feature maps {:?}; the last layer must \
                             give the class logits: end with flatten and linear",
                            layers.len().saturating_sub(1),
                            layers.last().map_or("none", LayerSpec::type_name),
                            other.map(|s| s.dims()).unwrap_or_default()
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// Number of output classes.
    pub fn classes(&self) -> usize {
        match self {
            Self::Mlp { classes, .. } | Self::LeNet5 { classes, .. } => *classes,
            Self::Sequential { .. } => match self.chain() {
                Ok(Some((shapes, _))) => shapes.last().map_or(0, |s| s.len()),
                _ => 0,
            },
        }
    }

    /// Number of input values per sample.
    pub fn input_len(&self) -> usize {
        match self {
            Self::Mlp { input, .. } => *input,
            Self::LeNet5 { channels, side, .. } => channels * side * side,
            Self::Sequential { input, .. } => {
                input.iter().fold(1usize, |n, &d| n.saturating_mul(d))
            }
        }
    }

    /// Widths of the fully connected layers, input first, classes last (MLP only).
    pub fn mlp_widths(&self) -> Option<Vec<usize>> {
        match self {
            Self::Mlp {
                input,
                hidden,
                classes,
            } => {
                let mut w = Vec::with_capacity(hidden.len() + 2);
                w.push(*input);
                w.extend_from_slice(hidden);
                w.push(*classes);
                Some(w)
            }
            Self::LeNet5 { .. } | Self::Sequential { .. } => None,
        }
    }

    /// The tensor layout, in forward order, PyTorch names and shapes: its `state_dict`,
    /// buffers (batch norm's running statistics) included. Empty for a layer list that does
    /// not chain ([`Self::validate`] says why).
    pub fn param_shapes(&self) -> Vec<ParamShape> {
        match self {
            Self::Sequential { .. } => match self.chain() {
                Ok(Some((_, tensors))) => tensors,
                _ => Vec::new(),
            },
            Self::Mlp { .. } => {
                let widths = self.mlp_widths().unwrap_or_default();
                let mut out = Vec::with_capacity(2 * widths.len());
                for (i, pair) in widths.windows(2).enumerate() {
                    out.push(ParamShape::new(
                        format!("layers.{i}.weight"),
                        &[pair[1], pair[0]],
                    ));
                    out.push(ParamShape::new(format!("layers.{i}.bias"), &[pair[1]]));
                }
                out
            }
            Self::LeNet5 {
                channels, classes, ..
            } => vec![
                ParamShape::new("conv1.weight", &[6, *channels, 5, 5]),
                ParamShape::new("conv1.bias", &[6]),
                ParamShape::new("conv2.weight", &[16, 6, 5, 5]),
                ParamShape::new("conv2.bias", &[16]),
                ParamShape::new("fc1.weight", &[120, 16 * 5 * 5]),
                ParamShape::new("fc1.bias", &[120]),
                ParamShape::new("fc2.weight", &[84, 120]),
                ParamShape::new("fc2.bias", &[84]),
                ParamShape::new("fc3.weight", &[*classes, 84]),
                ParamShape::new("fc3.bias", &[*classes]),
            ],
        }
    }

    /// Total number of parameters: what PyTorch's `sum(p.numel() for p in
    /// model.parameters())` counts, buffers left out.
    pub fn num_params(&self) -> usize {
        self.param_shapes()
            .iter()
            .filter(|p| TensorRole::of(&p.name) == TensorRole::Param)
            // Saturating: an unchecked spec (a huge MLP width) must not wrap around to a
            // small count that passes a limit.
            .map(|p| p.shape.iter().fold(1usize, |n, &d| n.saturating_mul(d)))
            .fold(0usize, usize::saturating_add)
    }

    /// The normalisation layers' tensors (scales, shifts, running statistics and counters) in
    /// `state_dict` order: empty for the named architectures, which have none (see
    /// [`layers::norm_tensor_names`]).
    pub fn norm_tensor_names(&self) -> Result<Vec<String>> {
        match self {
            Self::Sequential { input, layers } => layers::norm_tensor_names(input, layers),
            Self::Mlp { .. } | Self::LeNet5 { .. } => Ok(Vec::new()),
        }
    }

    /// Whether any tensor is a buffer (batch norm's running statistics).
    pub fn has_buffers(&self) -> bool {
        self.param_shapes()
            .iter()
            .any(|p| TensorRole::of(&p.name) != TensorRole::Param)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norm_tensors_are_every_norms_scale_shift_and_buffers() {
        use crate::{BlockNorm, ZooModel};
        let spec = ModelSpec::sequential(
            &[8],
            vec![
                LayerSpec::linear(6),
                LayerSpec::BatchNorm1d {
                    eps: 1e-5,
                    momentum: 0.1,
                },
                LayerSpec::Relu,
                LayerSpec::linear(4),
                LayerSpec::LayerNorm { eps: 1e-5 },
                LayerSpec::linear(3),
            ],
        );
        assert_eq!(
            spec.norm_tensor_names().unwrap(),
            [
                "1.weight",
                "1.bias",
                "1.running_mean",
                "1.running_var",
                "1.num_batches_tracked",
                "4.weight",
                "4.bias"
            ]
        );
        // ResNet-20's blocks: bn1, bn2 and a projection's norm, five tensors each.
        let resnet = ZooModel::Resnet20
            .spec(&[3, 32, 32], 10, BlockNorm::Batch, 4)
            .unwrap();
        let names = resnet.norm_tensor_names().unwrap();
        assert!(
            names.contains(&"3.bn1.running_mean".to_string()),
            "{names:?}"
        );
        assert!(names.contains(&"6.shortcut.1.num_batches_tracked".to_string()));
        assert!(!names.iter().any(|n| n.contains("conv")), "{names:?}");
        // 1 stem norm + 9 blocks x 2 + 2 projections, five tensors each.
        assert_eq!(names.len(), (1 + 18 + 2) * 5);
        let none = ZooModel::Resnet20
            .spec(&[3, 32, 32], 10, BlockNorm::None, 4)
            .unwrap();
        assert!(none.norm_tensor_names().unwrap().is_empty());
        assert!(
            ModelSpec::mlp(4, &[3], 2)
                .norm_tensor_names()
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn mlp_layout_is_pytorch() {
        let s = ModelSpec::mlp(784, &[100], 10);
        let shapes = s.param_shapes();
        assert_eq!(shapes[0].name, "layers.0.weight");
        assert_eq!(shapes[0].shape, vec![100, 784]);
        assert_eq!(shapes[3].name, "layers.1.bias");
        assert_eq!(s.num_params(), 784 * 100 + 100 + 100 * 10 + 10);
    }

    #[test]
    fn infer_mlp_reads_widths_and_names_problems() {
        let spec = ModelSpec::mlp(7, &[5, 3], 2);
        let p = Params::zeros(&spec.param_shapes());
        assert_eq!(ModelSpec::infer_mlp(&p).unwrap(), spec);
        let mut chain = p.clone();
        chain.get_mut("layers.1.weight").unwrap().shape = vec![3, 4];
        chain.get_mut("layers.1.weight").unwrap().data = vec![0.0; 12];
        let err = ModelSpec::infer_mlp(&chain).unwrap_err().to_string();
        assert!(
            err.contains("layers.1.weight") && err.contains("gives 5"),
            "{err}"
        );
        let lenet = ModelSpec::LeNet5 {
            channels: 1,
            side: 28,
            classes: 10,
        };
        assert!(ModelSpec::infer_mlp(&Params::zeros(&lenet.param_shapes())).is_err());
    }

    #[test]
    fn lenet_has_61706_params_on_mnist() {
        // The classic count for LeNet-5 with 10 classes on 28x28x1 (padded) inputs.
        let s = ModelSpec::LeNet5 {
            channels: 1,
            side: 28,
            classes: 10,
        };
        assert_eq!(s.num_params(), 61_706);
        assert!(s.validate().is_ok());
        let bad = ModelSpec::LeNet5 {
            channels: 1,
            side: 30,
            classes: 10,
        };
        assert!(bad.validate().is_err());
    }

    /// The layer-list form of an MLP and of LeNet-5 holds the same shapes in the same order
    /// (only the names differ), and validates.
    #[test]
    fn as_sequential_keeps_shapes_and_order() {
        for spec in [
            ModelSpec::mlp(8, &[5, 4], 3),
            ModelSpec::mlp(8, &[], 3),
            ModelSpec::LeNet5 {
                channels: 1,
                side: 28,
                classes: 10,
            },
            ModelSpec::LeNet5 {
                channels: 3,
                side: 32,
                classes: 7,
            },
        ] {
            let list = spec.as_sequential();
            list.validate().unwrap();
            let shapes = |s: &ModelSpec| -> Vec<Vec<usize>> {
                s.param_shapes().into_iter().map(|p| p.shape).collect()
            };
            assert_eq!(shapes(&list), shapes(&spec), "{spec:?}");
            assert_eq!(list.classes(), spec.classes());
            assert_eq!(list.input_len(), spec.input_len());
        }
    }

    /// A global model whose widths changed is read as the same network at its widths: LeNet-5
    /// at 8 and 20 filters becomes its layer list with those widths; a model that fits the
    /// spec keeps it; tensors that fit no widths are refused.
    #[test]
    fn with_widths_of_reads_a_wider_model() {
        let lenet = ModelSpec::LeNet5 {
            channels: 1,
            side: 28,
            classes: 10,
        };
        let same = Params::zeros(&lenet.param_shapes());
        assert_eq!(lenet.with_widths_of(&same).unwrap(), lenet);
        let mut list = lenet.as_sequential();
        if let ModelSpec::Sequential { layers, .. } = &mut list {
            layers[0] = LayerSpec::conv2d(8, 5).with_padding(2);
            layers[3] = LayerSpec::conv2d(20, 5);
        }
        let wider = Params::zeros(&list.param_shapes());
        assert_eq!(lenet.with_widths_of(&wider).unwrap(), list);
        let mut broken = wider.clone();
        broken.remove("3.bias");
        assert!(lenet.with_widths_of(&broken).is_err());
        let mlp = ModelSpec::mlp(4, &[3], 2);
        let grown = ModelSpec::mlp(4, &[6], 2);
        let p = Params::zeros(&grown.param_shapes());
        assert_eq!(mlp.with_widths_of(&p).unwrap(), grown);
    }

    /// A residual network whose stream and one block's inside were widened apart (as PFNM
    /// fuses them) is read back at those widths: the stream from `conv2`, the inside from
    /// `conv1`. Reading the stream from the stem alone once made an identity block look
    /// like a projecting one.
    #[test]
    fn with_widths_of_reads_a_residual_blocks_inside_apart_from_its_stream() {
        let block = |out: usize, stride: usize, inner: Option<usize>| LayerSpec::Residual {
            out,
            stride,
            norm: crate::BlockNorm::Batch,
            groups: 2,
            inner,
            project: false,
        };
        let list = |w: usize, inner: Option<usize>| {
            ModelSpec::sequential(
                &[1, 8, 8],
                vec![
                    LayerSpec::conv2d(w, 3).with_padding(1),
                    LayerSpec::Relu,
                    block(w, 1, inner),
                    block(2 * w, 2, None),
                    LayerSpec::GlobalAvgpool,
                    LayerSpec::Flatten,
                    LayerSpec::linear(3),
                ],
            )
        };
        let wider = list(5, Some(7));
        let p = Params::zeros(&wider.param_shapes());
        let read = list(4, None).with_widths_of(&p).unwrap();
        let ModelSpec::Sequential { layers, .. } = &read else {
            panic!("{read:?}");
        };
        assert_eq!(layers[2], block(5, 1, Some(7)));
        assert_eq!(layers[3], block(10, 2, None));
        assert_eq!(read, wider);
    }

    /// A block that widens at stride 1 (ResNet-50's `layer1.0`) has its projection because
    /// its widths differ; read at fused widths that meet, it keeps the projection its tensors
    /// hold (`project`), and a bottleneck's inner widths are read from `conv1` and `conv2`.
    #[test]
    fn with_widths_of_keeps_a_projection_when_the_widths_meet() {
        let list = |stem: usize, layers: Vec<LayerSpec>| {
            let mut all = vec![LayerSpec::conv2d(stem, 3).with_padding(1), LayerSpec::Relu];
            all.extend(layers);
            all.extend([
                LayerSpec::GlobalAvgpool,
                LayerSpec::Flatten,
                LayerSpec::linear(3),
            ]);
            ModelSpec::sequential(&[1, 6, 6], all)
        };
        let narrow = list(
            4,
            vec![LayerSpec::bottleneck(8, 1, crate::BlockNorm::Batch)],
        );
        assert!(
            narrow
                .param_shapes()
                .iter()
                .any(|s| s.name == "2.shortcut.0.weight")
        );
        // Fused: the stem and the block's output at 12, its inside at 2 and 5.
        let fused = list(
            12,
            vec![LayerSpec::Bottleneck {
                out: 12,
                stride: 1,
                norm: crate::BlockNorm::Batch,
                groups: 2,
                inner: Some(2),
                middle: Some(5),
                project: true,
            }],
        );
        let p = Params::zeros(&fused.param_shapes());
        let read = narrow.with_widths_of(&p).unwrap();
        assert_eq!(read, fused);
        let names: Vec<String> = read.param_shapes().into_iter().map(|s| s.name).collect();
        assert!(
            names.contains(&"2.shortcut.0.weight".to_string()),
            "{names:?}"
        );
    }
}
