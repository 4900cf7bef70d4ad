//! GEMS's use of a little public data: fine-tuning the fused model's output layer, and the
//! fused hidden layers as features.

use fedfuse_core::{ModelSpec, Params};
use fedfuse_data::Dataset;
use fedfuse_fuse::FuseError;
use fedfuse_fuse::gems::dense::{Layer, layers_to_params, mlp_layers};
use fedfuse_train::{OptimizerConfig, TrainConfig, Trainer};

use crate::{FedError, Result};

/// Fine-tunes only the output layer of the MLP `params` on the first `samples` of `public`
/// (the hidden layers stay frozen) with Adam at `lr` for `epochs`, batch 32: GEMS's use of a
/// little public data (the authors' notebooks: 5 epochs, lr 0.01).
pub fn finetune_output_layer(
    params: &Params,
    public: &Dataset,
    samples: usize,
    epochs: usize,
    lr: f64,
    seed: u64,
) -> Result<Params> {
    let mut layers = mlp_layers(params)?;
    let output = layers.pop().ok_or(FuseError::Empty)?;
    let idx: Vec<usize> = (0..samples.min(public.len())).collect();
    if idx.is_empty() || epochs == 0 {
        return Ok(params.clone());
    }
    let features = hidden_features(&layers, &public.subset(&idx))?;
    let trainer = Trainer::new(ModelSpec::mlp(output.inp, &[], output.out))?;
    let start = layers_to_params(std::slice::from_ref(&output))?;
    let cfg = TrainConfig {
        optimizer: OptimizerConfig::adam(),
        lr,
        epochs,
        batch_size: 32,
        dropout: 0.0,
    };
    let fitted = trainer.fit_with(&start, &features, &cfg, None, seed)?;
    layers.push(mlp_layers(&fitted.params)?.remove(0));
    Ok(layers_to_params(&layers)?)
}

/// `data` passed through the fused hidden layers (ReLU after each), as a dataset of features.
pub fn hidden_features(fused: &[Layer], data: &Dataset) -> Result<Dataset> {
    if let Some(first) = fused.first()
        && first.inp != data.dim()
    {
        return Err(FedError::InvalidSetting {
            field: "fused",
            reason: format!(
                "the fused layers read {} inputs but the data has {} features per sample",
                first.inp,
                data.dim()
            ),
        });
    }
    let n = data.len();
    let mut h = data.x.clone();
    for l in fused {
        h = l.forward(&h, n, true);
    }
    let dim = fused.last().map_or(data.dim(), |l| l.out);
    Dataset::new(h, data.y.clone(), vec![dim], data.num_classes).map_err(|e| {
        FedError::InvalidSetting {
            field: "dataset",
            reason: e.to_string(),
        }
    })
}
