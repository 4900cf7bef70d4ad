//! What flows between the layers of a layer list, and whether a pass trains.

use burn::tensor::Tensor;

/// Activations between layers.
pub(crate) enum Act {
    Img(Tensor<4>),
    Flat(Tensor<2>),
    /// A transformer's `[n, seq, hidden]` tokens.
    Tokens(Tensor<3>),
}

impl Act {
    pub(crate) fn flat(self) -> Tensor<2> {
        match self {
            Self::Img(x) => x.flatten(1, 3),
            Self::Flat(x) => x,
            Self::Tokens(x) => x.flatten(1, 2),
        }
    }

    pub(crate) fn img(self) -> Tensor<4> {
        match self {
            Self::Img(x) => x,
            // A checked spec never feeds flat features or tokens to an image layer.
            Self::Flat(x) => {
                let [b, d] = x.dims();
                x.reshape([b, d, 1, 1])
            }
            Self::Tokens(x) => {
                let [b, s, d] = x.dims();
                x.reshape([b, s * d, 1, 1])
            }
        }
    }

    /// The tokens `[n, seq, hidden]` (a checked spec feeds tokens layers nothing else).
    pub(crate) fn tokens(self) -> Tensor<3> {
        match self {
            Self::Tokens(x) => x,
            Self::Img(x) => {
                let [b, c, h, w] = x.dims();
                x.reshape([b, c, h * w]).swap_dims(1, 2)
            }
            Self::Flat(x) => {
                let [b, d] = x.dims();
                x.reshape([b, 1, d])
            }
        }
    }

    /// Multiplies channel (or unit) `u` by `g[u]`.
    pub(crate) fn scale(self, g: &Tensor<1>) -> Self {
        let [c] = g.dims();
        match self {
            Self::Img(x) => Self::Img(x * g.clone().reshape([1, c, 1, 1])),
            Self::Flat(x) => Self::Flat(x * g.clone().reshape([1, c])),
            // Gates multiply a token's features.
            Self::Tokens(x) => Self::Tokens(x * g.clone().reshape([1, 1, c])),
        }
    }
}

/// Whether a forward pass trains (batch statistics, dropout) or evaluates.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Train,
    Eval,
}
