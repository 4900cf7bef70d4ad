//! The networks, as burn modules. Their parameters are read and written in `params.rs` only.

use burn::module::Module;
use burn::nn::Linear;
use burn::nn::conv::Conv2d;
use burn::nn::pool::MaxPool2d;
use burn::tensor::Tensor;
use burn::tensor::activation::relu;

/// Fully connected network, ReLU between layers.
#[derive(Module, Debug)]
pub(crate) struct Mlp {
    pub(crate) layers: Vec<Linear>,
}

impl Mlp {
    pub(crate) fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let last = self.layers.len().saturating_sub(1);
        let mut x = x;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(x);
            if i < last {
                x = relu(x);
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
    /// Logits of flattened images `[batch, channels * side * side]`.
    pub(crate) fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let [batch, _] = x.dims();
        let channels = self.conv1.weight.val().dims()[1];
        let x: Tensor<4> = x.reshape([batch, channels, self.side, self.side]);
        let x = self.pool.forward(relu(self.conv1.forward(x)));
        let x = self.pool.forward(relu(self.conv2.forward(x)));
        let x: Tensor<2> = x.flatten(1, 3);
        let x = relu(self.fc1.forward(x));
        let x = relu(self.fc2.forward(x));
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
}

impl Net {
    pub(crate) fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        match self {
            Self::Mlp(m) => m.forward(x),
            Self::LeNet5(m) => m.forward(x),
        }
    }
}
