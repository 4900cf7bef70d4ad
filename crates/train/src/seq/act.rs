//! What flows between the layers of a layer list, and whether a pass trains.

use burn::tensor::Tensor;

/// Activations between layers.
pub(crate) enum Act {
    Img(Tensor<4>),
    Flat(Tensor<2>),
}

impl Act {
    pub(crate) fn flat(self) -> Tensor<2> {
        match self {
            Self::Img(x) => x.flatten(1, 3),
            Self::Flat(x) => x,
        }
    }

    pub(crate) fn img(self) -> Tensor<4> {
        match self {
            Self::Img(x) => x,
            // A checked spec never feeds flat features to an image layer.
            Self::Flat(x) => {
                let [b, d] = x.dims();
                x.reshape([b, d, 1, 1])
            }
        }
    }

    /// Multiplies channel (or unit) `u` by `g[u]`.
    pub(crate) fn scale(self, g: &Tensor<1>) -> Self {
        let [c] = g.dims();
        match self {
            Self::Img(x) => Self::Img(x * g.clone().reshape([1, c, 1, 1])),
            Self::Flat(x) => Self::Flat(x * g.clone().reshape([1, c])),
        }
    }
}

/// Whether a forward pass trains (batch statistics, dropout) or evaluates.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Train,
    Eval,
}
