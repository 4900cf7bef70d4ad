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
}

impl ZooModel {
    /// The zoo's names, as `[model] kind` takes them.
    pub const NAMES: [&'static str; 3] = ["cnn-leaf", "vgg9", "resnet20"];

    /// The layer list for samples of shape `input` and `classes` classes; `norm` and `width`
    /// are ResNet-20's (its first stage's channels, 16 in the paper).
    pub fn layers(self, classes: usize, norm: BlockNorm, width: usize) -> Vec<LayerSpec> {
        let conv3 = |out| LayerSpec::conv2d(out, 3).with_padding(1);
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
                let stem = match norm {
                    BlockNorm::None => conv3(width),
                    _ => conv3(width).without_bias(),
                };
                let mut layers = vec![stem];
                match norm {
                    BlockNorm::Batch => layers.push(LayerSpec::batch_norm2d()),
                    BlockNorm::Group => layers.push(LayerSpec::GroupNorm {
                        groups: 2,
                        eps: 1e-5,
                    }),
                    BlockNorm::None => {}
                }
                layers.push(LayerSpec::Relu);
                for (stage, stride) in [(1, 1), (2, 2), (4, 2)] {
                    for block in 0..3 {
                        let s = if block == 0 { stride } else { 1 };
                        layers.push(LayerSpec::residual(width * stage, s, norm));
                    }
                }
                layers.extend([
                    LayerSpec::GlobalAvgpool,
                    LayerSpec::Flatten,
                    LayerSpec::linear(classes),
                ]);
                layers
            }
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
