//! The autodiff record shared by the convolution and linear ops: `y = f(x, w) (+ b)` with one
//! backward step, whose parents are `[x, weight]` or `[x, weight, bias]`.

use std::marker::PhantomData;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, BackendTypes, Flex};
use burn::tensor::{DType, TensorData};

/// The float primitive of `Autodiff<Flex>` (burn's `AutodiffTensor<Flex>`, which is not
/// nameable from outside burn-autodiff).
pub(super) type AdTensor = <Autodiff<Flex> as BackendTypes>::FloatTensorPrimitive;

/// The gradients of `[x, weight, bias]`, each present when asked for.
pub(super) type Grads = (Option<FlexTensor>, Option<FlexTensor>, Option<FlexTensor>);

/// What an op keeps for its backward pass, and how it computes the gradients from `dy`.
pub(super) trait AffineState: Clone + Send + std::fmt::Debug + 'static {
    /// The gradients asked for by `need` (`[x, weight, bias]`).
    fn gradients(&self, dy: &FlexTensor, need: [bool; 3]) -> Grads;
}

#[derive(Debug)]
struct NoBias<S>(PhantomData<S>);

#[derive(Debug)]
struct WithBias<S>(PhantomData<S>);

impl<S: AffineState> Backward<Flex, 2> for NoBias<S> {
    type State = S;

    fn backward(self, ops: Ops<S, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<Flex>(&ops.node);
        let (dx, dw, _) = ops
            .state
            .gradients(&dy, [node_x.is_some(), node_w.is_some(), false]);
        for (node, grad) in [(node_x, dx), (node_w, dw)] {
            if let (Some(node), Some(grad)) = (node, grad) {
                grads.register::<Flex>(node.id, grad);
            }
        }
    }
}

impl<S: AffineState> Backward<Flex, 3> for WithBias<S> {
    type State = S;

    fn backward(self, ops: Ops<S, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let dy = grads.consume::<Flex>(&ops.node);
        let need = [node_x.is_some(), node_w.is_some(), node_b.is_some()];
        let (dx, dw, db) = ops.state.gradients(&dy, need);
        for (node, grad) in [(node_x, dx), (node_w, dw), (node_b, db)] {
            if let (Some(node), Some(grad)) = (node, grad) {
                grads.register::<Flex>(node.id, grad);
            }
        }
    }
}

/// A contiguous `f32` copy (or view) of `t`, or `None` for another dtype.
pub(super) fn contiguous_f32(t: &FlexTensor) -> Option<FlexTensor> {
    (t.dtype() == DType::F32).then(|| t.to_contiguous())
}

/// The values of a contiguous `f32` tensor with `len` elements.
pub(super) fn values(t: &FlexTensor, len: usize) -> Option<&[f32]> {
    t.as_slice::<f32>().filter(|s| s.len() == len)
}

pub(super) fn flex(values: Vec<f32>, shape: &[usize]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape.to_vec()))
}

/// The graph nodes of an affine op's inputs, to record its output with.
pub(super) struct Nodes {
    x: NodeGuard,
    w: NodeGuard,
    b: Option<NodeGuard>,
}

/// The inputs `x`, `w` and `b` as contiguous `f32` tensors, and their nodes; `None` for
/// another dtype.
pub(super) fn inputs(
    x: AdTensor,
    w: AdTensor,
    b: Option<AdTensor>,
) -> Option<(FlexTensor, FlexTensor, Option<FlexTensor>, Nodes)> {
    let (x, x_node) = x.into_parts();
    let (w, w_node) = w.into_parts();
    let (b, b_node) = match b.map(AdTensor::into_parts) {
        Some((b, node)) => (Some(contiguous_f32(&b)?), Some(node)),
        None => (None, None),
    };
    let nodes = Nodes {
        x: x_node,
        w: w_node,
        b: b_node,
    };
    Some((contiguous_f32(&x)?, contiguous_f32(&w)?, b, nodes))
}

impl Nodes {
    /// Records `y`, computed from the tensors behind these nodes, with its backward step.
    pub(super) fn record<S: AffineState>(self, state: S, y: FlexTensor) -> AdTensor {
        record(self.x, self.w, self.b, state, y)
    }
}

fn record<S: AffineState>(
    x: NodeGuard,
    w: NodeGuard,
    b: Option<NodeGuard>,
    state: S,
    y: FlexTensor,
) -> AdTensor {
    // `NoCheckpointing` is the strategy of `Device::flex().autodiff()`; the callers' downcast
    // to `Autodiff<Flex>` (whose default strategy it is) already failed on any other.
    match b {
        Some(b) => match WithBias(PhantomData)
            .prepare::<NoCheckpointing>([x, w, b])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(state, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        },
        None => match NoBias(PhantomData)
            .prepare::<NoCheckpointing>([x, w])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(state, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        },
    }
}
