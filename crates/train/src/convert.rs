//! The one place that moves values between [`Params`] (PyTorch layout) and burn's modules:
//! [`build`] a network holding given parameters, [`read`] them back.
//!
//! burn's `Linear.weight` is `[d_in, d_out]`, PyTorch's is `[out, in]`: weights are transposed
//! on the way in and out. `Conv2d.weight` is `[c_out, c_in, k1, k2]` in both. A layer list's
//! batch norms keep their running statistics beside the module (`seq/norm.rs`); they are
//! read in and written out here with the parameters, in `state_dict` order.

use std::sync::{Arc, Mutex};

use burn::module::Param;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{AvgPool2dConfig, MaxPool2dConfig};
use burn::nn::{Linear, PaddingConfig2d};
use burn::tensor::{Device, Tensor, TensorData};
use fedfuse_core::layers::{self, BlockNorm, LayerSpec};
use fedfuse_core::{ModelSpec, Params};

use crate::net::{LeNet5, Mlp, Net};
use crate::seq::kernels::transpose;
use crate::seq::norm::{Norm, NormKind, RunningStats, lock};
use crate::seq::vit::{Encoder, TokenNorm, Tokens};
use crate::seq::{Block, Layer, Op, OpKind, SeqNet};
use crate::{Result, TrainError};

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

fn conv(params: &Params, prefix: &str, padding: usize, device: &Device) -> Result<Conv2d> {
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
        ModelSpec::Sequential { .. } => Ok(Net::Seq(build_seq(spec, params, device)?)),
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

fn push_conv(out: &mut Params, prefix: &str, layer: &Conv2d) -> Result<()> {
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
        Net::Seq(m) => return read_seq(m, spec),
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

// Layer lists: tensors in `state_dict` order, named by the spec.

fn param<const D: usize>(data: Vec<f32>, shape: [usize; D], device: &Device) -> Param<Tensor<D>> {
    Param::from_tensor(tensor(data, shape, device))
}

/// Takes a list's tensors in `state_dict` order.
struct Source<'a> {
    tensors: std::vec::IntoIter<&'a fedfuse_core::Tensor>,
    device: &'a Device,
    stats: Vec<RunningStats>,
}

impl Source<'_> {
    fn next(&mut self) -> Result<Vec<f32>> {
        // The layout was checked against the spec: the tensors are all there, in order.
        self.tensors
            .next()
            .map(|t| t.data.clone())
            .ok_or_else(|| TrainError::DataMismatch("a layer list ran out of tensors".into()))
    }

    fn conv(
        &mut self,
        c: [usize; 2],
        k: usize,
        stride: usize,
        pad: usize,
        groups: usize,
        bias: bool,
    ) -> Result<Conv2d> {
        let [c_in, c_out] = c;
        let mut layer = Conv2dConfig::new([c_in, c_out], [k, k])
            .with_stride([stride, stride])
            .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
            .with_groups(groups)
            .with_bias(bias)
            .init(self.device);
        layer.weight = param(self.next()?, [c_out, c_in / groups, k, k], self.device);
        layer.bias = match bias {
            true => Some(param(self.next()?, [c_out], self.device)),
            false => None,
        };
        Ok(layer)
    }

    fn norm(&mut self, kind: NormKind, c: usize) -> Result<Norm> {
        let weight = param(self.next()?, [c], self.device);
        let bias = param(self.next()?, [c], self.device);
        let kind = match kind {
            NormKind::Batch { eps, momentum, .. } => {
                let mean = self.next()?;
                let var = self.next()?;
                let batches = self.next()?.first().copied().unwrap_or(0.0);
                self.stats.push(RunningStats {
                    mean,
                    var,
                    batches,
                    cumulative: false,
                });
                NormKind::Batch {
                    eps,
                    momentum,
                    slot: self.stats.len() - 1,
                }
            }
            other => other,
        };
        Ok(Norm { weight, bias, kind })
    }

    /// A linear layer of PyTorch's `[out, inp]` weight (and bias) as burn's `[inp, out]`.
    fn linear(&mut self, inp: usize, out: usize) -> Result<Linear> {
        let w = transpose(&self.next()?, out, inp);
        Ok(Linear {
            weight: param(w, [inp, out], self.device),
            bias: Some(param(self.next()?, [out], self.device)),
        })
    }

    fn token_norm(&mut self, hidden: usize, eps: f64) -> Result<TokenNorm> {
        Ok(TokenNorm {
            weight: param(self.next()?, [hidden], self.device),
            bias: param(self.next()?, [hidden], self.device),
            eps,
        })
    }

    fn block_norm(&mut self, norm: BlockNorm, groups: usize, c: usize) -> Result<Option<Norm>> {
        let kind = match norm {
            BlockNorm::None => return Ok(None),
            BlockNorm::Batch => NormKind::Batch {
                eps: 1e-5,
                momentum: 0.1,
                slot: 0,
            },
            BlockNorm::Group => NormKind::Group { groups, eps: 1e-5 },
        };
        Ok(Some(self.norm(kind, c)?))
    }
}

/// The network of the layer list `spec` holding `params` (checked against its layout).
fn build_seq(spec: &ModelSpec, params: &Params, device: &Device) -> Result<SeqNet> {
    let ModelSpec::Sequential { input, layers } = spec else {
        return Err(TrainError::DataMismatch(
            "not a layer list (model.kind = \"sequential\")".into(),
        ));
    };
    let layout = spec.param_shapes();
    params.check_layout(&layout)?;
    let (shapes, _) = layers::chain(fedfuse_core::FeatureShape::of(input)?, layers)?;
    let points = layers::gate_points(input, layers)?;
    let first = fedfuse_core::FeatureShape::of(input)?;
    let ins: Vec<_> = std::iter::once(first)
        .chain(shapes.iter().copied())
        .collect();
    let mut src = Source {
        tensors: params
            .iter()
            .map(|(_, t)| t)
            .collect::<Vec<_>>()
            .into_iter(),
        device,
        stats: Vec::new(),
    };
    let mut built = Vec::with_capacity(layers.len());
    for (i, (layer, at)) in layers.iter().zip(&ins).enumerate() {
        let out_len = shapes.get(i).map_or(0, |s| s.len());
        let c = at.channels();
        let op = |kind| Layer::Op(Op { kind });
        built.push(match *layer {
            LayerSpec::Conv2d {
                out,
                kernel,
                stride,
                padding,
                groups,
                bias,
            } => Layer::Conv(src.conv([c, out], kernel, stride, padding, groups, bias)?),
            LayerSpec::Linear { out, bias } => {
                let inp = at.len();
                let w = transpose(&src.next()?, out, inp);
                Layer::Linear(Linear {
                    weight: param(w, [inp, out], device),
                    bias: match bias {
                        true => Some(param(src.next()?, [out], device)),
                        false => None,
                    },
                })
            }
            LayerSpec::BatchNorm2d { eps, momentum } | LayerSpec::BatchNorm1d { eps, momentum } => {
                Layer::Norm(src.norm(
                    NormKind::Batch {
                        eps,
                        momentum,
                        slot: 0,
                    },
                    c,
                )?)
            }
            LayerSpec::GroupNorm { groups, eps } => {
                Layer::Norm(src.norm(NormKind::Group { groups, eps }, c)?)
            }
            LayerSpec::LayerNorm { eps } => {
                Layer::Norm(src.norm(NormKind::Layer { eps }, at.len())?)
            }
            LayerSpec::MaxPool2d {
                kernel,
                stride,
                padding,
            } => {
                let s = stride.unwrap_or(kernel);
                let config = MaxPool2dConfig::new([kernel, kernel]).with_strides([s, s]);
                Layer::MaxPool(match padding {
                    0 => config.init(),
                    p => config
                        .with_padding(PaddingConfig2d::Explicit(p, p, p, p))
                        .init(),
                })
            }
            LayerSpec::AvgPool2d { kernel, stride } => {
                let s = stride.unwrap_or(kernel);
                Layer::AvgPool(
                    AvgPool2dConfig::new([kernel, kernel])
                        .with_strides([s, s])
                        .init(),
                )
            }
            LayerSpec::Tokens {
                hidden,
                patch,
                dropout,
            } => {
                let seq = out_len / hidden.max(1);
                let class_token = param(src.next()?, [hidden], device);
                let conv_proj = src.conv([c, hidden], patch, patch, 0, 1, true)?;
                let pos_embedding = param(src.next()?, [seq, hidden], device);
                Layer::Tokens(Tokens {
                    class_token,
                    conv_proj,
                    pos_embedding,
                    dropout,
                })
            }
            LayerSpec::Encoder {
                heads,
                mlp,
                eps,
                dropout,
                attention_dropout,
            } => {
                let hidden = c;
                Layer::Encoder(Encoder {
                    ln_1: src.token_norm(hidden, eps)?,
                    in_proj: src.linear(hidden, 3 * hidden)?,
                    out_proj: src.linear(hidden, hidden)?,
                    ln_2: src.token_norm(hidden, eps)?,
                    mlp_0: src.linear(hidden, mlp)?,
                    mlp_3: src.linear(mlp, hidden)?,
                    heads,
                    dropout,
                    attention_dropout,
                })
            }
            LayerSpec::ClassToken => op(OpKind::ClassToken),
            LayerSpec::GlobalAvgpool => op(OpKind::GlobalAvg),
            LayerSpec::Relu => op(OpKind::Relu),
            LayerSpec::Dropout { p } => op(OpKind::Dropout { p }),
            LayerSpec::Flatten => op(OpKind::Flatten),
            LayerSpec::Residual { .. } | LayerSpec::Bottleneck { .. } => {
                let Some(shape) = layer.block() else {
                    return Err(TrainError::DataMismatch(format!(
                        "{} is not a block",
                        layer.type_name()
                    )));
                };
                let bias = shape.norm == BlockNorm::None;
                let (mut convs, mut norms) = (Vec::new(), Vec::new());
                let mut c_in = c;
                for bc in &shape.convs {
                    let pad = bc.kernel / 2;
                    convs.push(src.conv([c_in, bc.rows], bc.kernel, bc.stride, pad, 1, bias)?);
                    norms.push(src.block_norm(shape.norm, shape.groups, bc.rows)?);
                    c_in = bc.rows;
                }
                let out = shape.out;
                let (shortcut, shortcut_norm) = if shape.has_projection(c) {
                    let conv = src.conv([c, out], 1, shape.stride, 0, 1, bias)?;
                    (Some(conv), src.block_norm(shape.norm, shape.groups, out)?)
                } else {
                    (None, None)
                };
                Layer::Block(Block {
                    convs,
                    norms,
                    shortcut,
                    shortcut_norm,
                })
            }
        });
    }
    let mut gate_at = vec![None; layers.len()];
    let mut gate_src = Vec::with_capacity(points.len());
    for (slot, p) in points.iter().enumerate() {
        // A block's gates (one per inner convolution) take consecutive slots from its first.
        let first = *gate_at[p.layer].get_or_insert(slot);
        let norm_follows = matches!(built.get(p.layer), Some(Layer::Norm(_)));
        gate_src.push(if norm_follows {
            (p.layer - 1, 0)
        } else {
            (p.layer, slot - first)
        });
    }
    Ok(SeqNet {
        layers: built,
        input: input.clone(),
        gate_at,
        gate_src,
        widths_in: ins.iter().map(|s| s.len()).collect(),
        stats: Arc::new(Mutex::new(src.stats)),
    })
}

/// Collects a network's tensors in `state_dict` order.
struct Sink<'a> {
    out: Vec<Vec<f32>>,
    stats: &'a [RunningStats],
}

impl Sink<'_> {
    /// burn's `[inp, out]` weight as PyTorch's `[out, inp]`, and the bias.
    fn linear(&mut self, l: &Linear) -> Result<()> {
        let [inp, out] = l.weight.val().dims();
        self.out.push(transpose(&values(l.weight.val())?, inp, out));
        if let Some(b) = &l.bias {
            self.out.push(values(b.val())?);
        }
        Ok(())
    }

    fn conv(&mut self, c: &Conv2d) -> Result<()> {
        self.out.push(values(c.weight.val())?);
        if let Some(b) = &c.bias {
            self.out.push(values(b.val())?);
        }
        Ok(())
    }

    fn norm(&mut self, n: &Norm) -> Result<()> {
        self.out.push(values(n.weight.val())?);
        self.out.push(values(n.bias.val())?);
        if let NormKind::Batch { slot, .. } = n.kind {
            let s = self.stats.get(slot).ok_or_else(|| {
                TrainError::Backend(format!("batch norm {slot} has no running statistics"))
            })?;
            self.out.push(s.mean.clone());
            self.out.push(s.var.clone());
            self.out.push(vec![s.batches]);
        }
        Ok(())
    }
}

/// The network's tensors in `state_dict` order and PyTorch layout, named by `spec`.
fn read_seq(net: &SeqNet, spec: &ModelSpec) -> Result<Params> {
    let stats = lock(&net.stats).clone();
    let mut sink = Sink {
        out: Vec::new(),
        stats: &stats,
    };
    for layer in &net.layers {
        match layer {
            Layer::Conv(c) => sink.conv(c)?,
            Layer::Linear(l) => sink.linear(l)?,
            Layer::Norm(n) => sink.norm(n)?,
            Layer::Block(b) => {
                for (c, n) in b.convs.iter().zip(&b.norms) {
                    sink.conv(c)?;
                    if let Some(n) = n {
                        sink.norm(n)?;
                    }
                }
                if let Some(c) = &b.shortcut {
                    sink.conv(c)?;
                }
                if let Some(n) = &b.shortcut_norm {
                    sink.norm(n)?;
                }
            }
            Layer::Tokens(t) => {
                sink.out.push(values(t.class_token.val())?);
                sink.conv(&t.conv_proj)?;
                sink.out.push(values(t.pos_embedding.val())?);
            }
            Layer::Encoder(e) => {
                sink.out.push(values(e.ln_1.weight.val())?);
                sink.out.push(values(e.ln_1.bias.val())?);
                sink.linear(&e.in_proj)?;
                sink.linear(&e.out_proj)?;
                sink.out.push(values(e.ln_2.weight.val())?);
                sink.out.push(values(e.ln_2.bias.val())?);
                sink.linear(&e.mlp_0)?;
                sink.linear(&e.mlp_3)?;
            }
            Layer::MaxPool(_) | Layer::AvgPool(_) | Layer::Op(_) => {}
        }
    }
    let layout = spec.param_shapes();
    if layout.len() != sink.out.len() {
        return Err(TrainError::Backend(format!(
            "the network holds {} tensors where its spec lists {}",
            sink.out.len(),
            layout.len()
        )));
    }
    let mut params = Params::new();
    for (shape, data) in layout.into_iter().zip(sink.out) {
        params.push(shape.name, shape.shape, data)?;
    }
    Ok(params)
}
