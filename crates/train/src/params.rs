//! The one place that moves values between [`Params`] (PyTorch layout) and burn's modules.
//!
//! burn's `Linear.weight` is `[d_in, d_out]`, PyTorch's is `[out, in]`: weights are transposed
//! on the way in and out. `Conv2d.weight` is `[c_out, c_in, k1, k2]` in both.

use burn::module::Param;
use burn::nn::conv::Conv2dConfig;
use burn::nn::pool::MaxPool2dConfig;
use burn::nn::{Linear, PaddingConfig2d};
use burn::tensor::{Device, Tensor, TensorData};
use fedfuse_core::{ModelSpec, Params};

use crate::net::{LeNet5, Mlp, Net};
use crate::{Result, TrainError};

/// `data` (`rows x cols`, row-major) transposed. In square blocks, so that reads and writes
/// both stay within a few cache lines: cnn-leaf's 3136x2048 weight is transposed twice per
/// local fit, and element by element the writes missed the cache every time.
pub(crate) fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const BLOCK: usize = 32;
    let mut out = vec![0.0; data.len()];
    for r0 in (0..rows).step_by(BLOCK) {
        for c0 in (0..cols).step_by(BLOCK) {
            for r in r0..(r0 + BLOCK).min(rows) {
                let src = &data[r * cols..][c0..(c0 + BLOCK).min(cols)];
                for (c, &v) in (c0..).zip(src) {
                    out[c * rows + r] = v;
                }
            }
        }
    }
    out
}

fn tensor<const D: usize>(data: Vec<f32>, shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(data, shape), device)
}

fn linear(params: &Params, prefix: &str, device: &Device) -> Result<Linear> {
    let w = params.require(&format!("{prefix}.weight"))?;
    let b = params.require(&format!("{prefix}.bias"))?;
    let (out, inp) = (w.rows(), w.row_len());
    Ok(Linear {
        weight: Param::from_tensor(tensor(transpose(&w.data, out, inp), [inp, out], device)),
        bias: Some(Param::from_tensor(tensor(b.data.clone(), [out], device))),
    })
}

fn conv(
    params: &Params,
    prefix: &str,
    padding: usize,
    device: &Device,
) -> Result<burn::nn::conv::Conv2d> {
    let w = params.require(&format!("{prefix}.weight"))?;
    let b = params.require(&format!("{prefix}.bias"))?;
    let [c_out, c_in, k1, k2] = match w.shape.as_slice() {
        [a, b, c, d] => [*a, *b, *c, *d],
        other => {
            return Err(TrainError::DataMismatch(format!(
                "`{prefix}.weight` has shape {other:?}, a convolution needs 4 axes"
            )));
        }
    };
    let mut layer = Conv2dConfig::new([c_in, c_out], [k1, k2])
        .with_padding(PaddingConfig2d::Explicit(
            padding, padding, padding, padding,
        ))
        .init(device);
    layer.weight = Param::from_tensor(tensor(w.data.clone(), [c_out, c_in, k1, k2], device));
    layer.bias = Some(Param::from_tensor(tensor(b.data.clone(), [c_out], device)));
    Ok(layer)
}

/// Builds the network of `spec` holding `params` (checked against the spec's layout).
pub(crate) fn build(spec: &ModelSpec, params: &Params, device: &Device) -> Result<Net> {
    params.check_layout(&spec.param_shapes())?;
    match spec {
        ModelSpec::Sequential { .. } => Ok(Net::Seq(crate::seq::build(spec, params, device)?)),
        ModelSpec::Mlp { hidden, .. } => {
            let layers = (0..=hidden.len())
                .map(|i| linear(params, &format!("layers.{i}"), device))
                .collect::<Result<Vec<_>>>()?;
            Ok(Net::Mlp(Mlp { layers }))
        }
        ModelSpec::LeNet5 { side, .. } => {
            // 28x28 inputs are padded by 2 so that both sides reach the 5x5x16 = 400 features.
            let pad = if *side == 28 { 2 } else { 0 };
            Ok(Net::LeNet5(LeNet5 {
                conv1: conv(params, "conv1", pad, device)?,
                conv2: conv(params, "conv2", 0, device)?,
                pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
                fc1: linear(params, "fc1", device)?,
                fc2: linear(params, "fc2", device)?,
                fc3: linear(params, "fc3", device)?,
                side: *side,
            }))
        }
    }
}

fn values<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    t.into_data()
        .try_into_vec::<f32>()
        .map_err(|e| TrainError::Backend(format!("{e:?}")))
}

fn push_linear(out: &mut Params, prefix: &str, layer: &Linear) -> Result<()> {
    let [inp, o] = layer.weight.val().dims();
    let w = transpose(&values(layer.weight.val())?, inp, o);
    out.push(format!("{prefix}.weight"), vec![o, inp], w)?;
    let b = match &layer.bias {
        Some(b) => values(b.val())?,
        None => vec![0.0; o],
    };
    out.push(format!("{prefix}.bias"), vec![o], b)?;
    Ok(())
}

fn push_conv(out: &mut Params, prefix: &str, layer: &burn::nn::conv::Conv2d) -> Result<()> {
    let dims = layer.weight.val().dims();
    out.push(
        format!("{prefix}.weight"),
        dims.to_vec(),
        values(layer.weight.val())?,
    )?;
    let b = match &layer.bias {
        Some(b) => values(b.val())?,
        None => vec![0.0; dims[0]],
    };
    out.push(format!("{prefix}.bias"), vec![dims[0]], b)?;
    Ok(())
}

/// Reads the network's parameters back in PyTorch layout (a layer list's names come from
/// `spec`, the spec it was built from).
pub(crate) fn read(net: &Net, spec: &ModelSpec) -> Result<Params> {
    let mut out = Params::new();
    match net {
        Net::Seq(m) => return crate::seq::read(m, spec),
        Net::Mlp(m) => {
            for (i, layer) in m.layers.iter().enumerate() {
                push_linear(&mut out, &format!("layers.{i}"), layer)?;
            }
        }
        Net::LeNet5(m) => {
            push_conv(&mut out, "conv1", &m.conv1)?;
            push_conv(&mut out, "conv2", &m.conv2)?;
            push_linear(&mut out, "fc1", &m.fc1)?;
            push_linear(&mut out, "fc2", &m.fc2)?;
            push_linear(&mut out, "fc3", &m.fc3)?;
        }
    }
    Ok(out)
}

/// Squared distance of the network's parameters to `anchor`'s, as a differentiable scalar.
pub(crate) fn sq_distance(net: &Net, anchor: &Net) -> Tensor<1> {
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
    match (net, anchor) {
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

#[cfg(test)]
mod tests {
    #[test]
    fn transpose_moves_every_element_across_block_edges() {
        for (rows, cols) in [(1, 1), (3, 70), (37, 33), (64, 32)] {
            let data: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let t = super::transpose(&data, rows, cols);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        t[c * rows + r],
                        data[r * cols + c],
                        "{rows}x{cols} at ({r}, {c})"
                    );
                }
            }
        }
    }
}
