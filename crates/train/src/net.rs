//! The networks, as burn modules. Their parameters are read and written in `convert.rs` only.

use burn::module::{Module, ParamId};
use burn::nn::Linear;
use burn::nn::conv::Conv2d;
use burn::nn::pool::MaxPool2d;
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};

use crate::seq::{self, Mode, SeqNet};

/// Fully connected network, ReLU between layers.
#[derive(Module, Debug)]
pub(crate) struct Mlp {
    pub(crate) layers: Vec<Linear>,
}

/// Multiplies `[batch, units]` activations by per-unit gates, when there are gates.
fn gate2(x: Tensor<2>, gate: Option<&Tensor<1>>) -> Tensor<2> {
    match gate {
        Some(z) => x * z.clone().unsqueeze_dim::<2>(0),
        None => x,
    }
}

/// Multiplies `[batch, channels, h, w]` feature maps by per-filter gates, when there are gates.
fn gate4(x: Tensor<4>, gate: Option<&Tensor<1>>) -> Tensor<4> {
    match gate {
        Some(z) => {
            let [c] = z.dims();
            x * z.clone().reshape([1, c, 1, 1])
        }
        None => x,
    }
}

/// A layer's groups as a matrix `[units, fan_in]` plus the bias `[units]` (tracked tensors).
fn linear_units(layer: &Linear) -> (Tensor<2>, Tensor<1>) {
    let w = layer.weight.val();
    let [_, out] = w.dims();
    let b = match &layer.bias {
        Some(b) => b.val(),
        None => Tensor::zeros([out], &w.device()),
    };
    (w.transpose(), b)
}

fn conv_units(layer: &Conv2d) -> (Tensor<2>, Tensor<1>) {
    let w = layer.weight.val();
    let [out, c, k1, k2] = w.dims();
    let b = match &layer.bias {
        Some(b) => b.val(),
        None => Tensor::zeros([out], &w.device()),
    };
    (w.reshape([out, c * k1 * k2]), b)
}

/// Multiplies `[batch, units]` activations by a per-sample dropout mask, when there is one.
fn drop2(x: Tensor<2>, mask: Option<&Tensor<2>>) -> Tensor<2> {
    match mask {
        Some(m) => x * m.clone(),
        None => x,
    }
}

impl Mlp {
    /// Logits; `gates[i]`, where present, multiplies the outputs of layer `i` (before the
    /// ReLU, which is the same as after it for gates in [0, 1]), and `drop[i]` the activations
    /// of hidden layer `i` sample by sample.
    fn forward_train(&self, x: Tensor<2>, gates: &[Tensor<1>], drop: &[Tensor<2>]) -> Tensor<2> {
        let last = self.layers.len().saturating_sub(1);
        let mut x = x;
        for (i, layer) in self.layers.iter().enumerate() {
            x = gate2(layer.forward(x), gates.get(i));
            if i < last {
                x = drop2(relu(x), drop.get(i));
            }
        }
        x
    }
}

/// LeNet-5: conv(6@5x5) - pool - conv(16@5x5) - pool - 120 - 84 - classes, ReLU.
#[derive(Module, Debug)]
pub(crate) struct LeNet5 {
    pub(crate) conv1: Conv2d,
    pub(crate) conv2: Conv2d,
    pub(crate) pool: MaxPool2d,
    pub(crate) fc1: Linear,
    pub(crate) fc2: Linear,
    pub(crate) fc3: Linear,
    /// Input image side (28 or 32); the channel count is conv1's.
    #[module(skip)]
    pub(crate) side: usize,
}

impl LeNet5 {
    /// Logits of flattened images `[batch, channels * side * side]`; `gates`, where present,
    /// multiply conv1's and conv2's filters and fc1's and fc2's units, in that order (gates in
    /// [0, 1] commute with ReLU and max-pooling).
    /// `drop[0]` and `drop[1]`, where present, multiply fc1's and fc2's activations sample
    /// by sample (dropout acts on the fully connected layers only, as usual for LeNet-5).
    fn forward_train(&self, x: Tensor<2>, gates: &[Tensor<1>], drop: &[Tensor<2>]) -> Tensor<2> {
        let [batch, _] = x.dims();
        let channels = self.conv1.weight.val().dims()[1];
        let x: Tensor<4> = x.reshape([batch, channels, self.side, self.side]);
        // The layer lists' own convolution and max-pool ops (seq/), burn's where they do not
        // apply.
        let conv = |c: &Conv2d, x, g| relu(gate4(seq::conv::forward(c, x), g));
        let x = seq::pool::forward(&self.pool, conv(&self.conv1, x, gates.first()));
        let x = seq::pool::forward(&self.pool, conv(&self.conv2, x, gates.get(1)));
        let x: Tensor<2> = x.flatten(1, 3);
        let x = drop2(relu(gate2(self.fc1.forward(x), gates.get(2))), drop.first());
        let x = drop2(relu(gate2(self.fc2.forward(x), gates.get(3))), drop.get(1));
        self.fc3.forward(x)
    }
}

/// Either network; both take flattened samples `[batch, input_len]`.
// One `Net` lives per training call, so its size does not matter; burn's `Module` derive does
// not accept a boxed variant.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub(crate) enum Net {
    Mlp(Mlp),
    LeNet5(LeNet5),
    Seq(SeqNet),
}

impl Net {
    pub(crate) fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward_gated(x, &[])
    }

    /// Logits with the units of the grouped layers (see [`fedfuse_core::GroupLayout`])
    /// multiplied by `gates`, one tensor per grouped layer; missing entries leave their layers
    /// ungated.
    pub(crate) fn forward_gated(&self, x: Tensor<2>, gates: &[Tensor<1>]) -> Tensor<2> {
        match self {
            Self::Seq(m) => m.forward(x, gates, &[], Mode::Eval),
            _ => self.forward_train(x, gates, &[]),
        }
    }

    /// [`Self::forward_gated`] in training: the activations of the layers of
    /// [`Self::dropout_layers`] multiplied by per-sample masks `[batch, units]`, one per layer,
    /// and batch norm on the batch's statistics (updating the running ones).
    pub(crate) fn forward_train(
        &self,
        x: Tensor<2>,
        gates: &[Tensor<1>],
        drop: &[Tensor<2>],
    ) -> Tensor<2> {
        match self {
            Self::Mlp(m) => m.forward_train(x, gates, drop),
            Self::LeNet5(m) => m.forward_train(x, gates, drop),
            Self::Seq(m) => m.forward(x, gates, drop, Mode::Train),
        }
    }

    /// The ids of the trainable tensors, in `state_dict` order without the buffers.
    pub(crate) fn param_ids(&self) -> Vec<ParamId> {
        fn linear(out: &mut Vec<ParamId>, l: &Linear) {
            out.push(l.weight.id);
            out.extend(l.bias.as_ref().map(|b| b.id));
        }
        fn conv(out: &mut Vec<ParamId>, c: &Conv2d) {
            out.push(c.weight.id);
            out.extend(c.bias.as_ref().map(|b| b.id));
        }
        let mut out = Vec::new();
        match self {
            Self::Mlp(m) => m.layers.iter().for_each(|l| linear(&mut out, l)),
            Self::LeNet5(m) => {
                conv(&mut out, &m.conv1);
                conv(&mut out, &m.conv2);
                for l in [&m.fc1, &m.fc2, &m.fc3] {
                    linear(&mut out, l);
                }
            }
            Self::Seq(m) => return m.param_ids(),
        }
        out
    }

    /// `(width, p)` of the layers that dropout acts on: every hidden layer of an MLP, fc1 and
    /// fc2 of LeNet-5, all with the training setting `p`; a layer list's dropout layers with
    /// their own `p` (the setting does not apply). Layers with `p = 0` are left out.
    pub(crate) fn dropout_layers(&self, p: f64) -> Vec<(usize, f64)> {
        let out = |l: &Linear| (l.weight.val().dims()[1], p);
        let named = match self {
            Self::Mlp(m) => {
                let hidden = m.layers.len().saturating_sub(1);
                m.layers.iter().take(hidden).map(out).collect()
            }
            Self::LeNet5(m) => vec![out(&m.fc1), out(&m.fc2)],
            Self::Seq(m) => return m.dropout_layers(),
        };
        if p > 0.0 { named } else { Vec::new() }
    }

    /// Weights `[units, fan_in]` and biases `[units]` of the grouped layers, in the order of
    /// [`fedfuse_core::GroupLayout::of_model`] (every layer but the output layer), still
    /// tracked by autodiff.
    pub(crate) fn group_units(&self) -> Vec<(Tensor<2>, Tensor<1>)> {
        match self {
            Self::Mlp(m) => {
                let gated = m.layers.len().saturating_sub(1);
                m.layers.iter().take(gated).map(linear_units).collect()
            }
            Self::LeNet5(m) => vec![
                conv_units(&m.conv1),
                conv_units(&m.conv2),
                linear_units(&m.fc1),
                linear_units(&m.fc2),
            ],
            Self::Seq(m) => m.group_units(),
        }
    }
}

impl Net {
    /// Squared distance of the network's parameters to `anchor`'s, as a differentiable scalar.
    pub(crate) fn sq_distance(&self, anchor: &Net) -> Tensor<1> {
        fn lin(a: &Linear, b: &Linear) -> Tensor<1> {
            let mut s = (a.weight.val() - b.weight.val()).square().sum();
            if let (Some(x), Some(y)) = (&a.bias, &b.bias) {
                s = s + (x.val() - y.val()).square().sum();
            }
            s
        }
        fn cv(a: &burn::nn::conv::Conv2d, b: &burn::nn::conv::Conv2d) -> Tensor<1> {
            let mut s = (a.weight.val() - b.weight.val()).square().sum();
            if let (Some(x), Some(y)) = (&a.bias, &b.bias) {
                s = s + (x.val() - y.val()).square().sum();
            }
            s
        }
        match (self, anchor) {
            (Net::Mlp(a), Net::Mlp(b)) => a
                .layers
                .iter()
                .zip(&b.layers)
                .map(|(x, y)| lin(x, y))
                .reduce(|s, t| s + t)
                .unwrap_or_else(|| Tensor::zeros([1], &Device::flex())),
            (Net::LeNet5(a), Net::LeNet5(b)) => {
                cv(&a.conv1, &b.conv1)
                    + cv(&a.conv2, &b.conv2)
                    + lin(&a.fc1, &b.fc1)
                    + lin(&a.fc2, &b.fc2)
                    + lin(&a.fc3, &b.fc3)
            }
            (Net::Seq(a), Net::Seq(b)) => a
                .flat_params()
                .into_iter()
                .zip(b.flat_params())
                .map(|(x, y)| (x - y).square().sum())
                .reduce(|s, t| s + t)
                .unwrap_or_else(|| Tensor::zeros([1], &Device::flex())),
            // Both come from the same spec; a mix cannot be built.
            _ => Tensor::zeros([1], &Device::flex()),
        }
    }
}
