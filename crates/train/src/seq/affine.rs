//! The autodiff record shared by the convolution and linear ops: `y = f(x, w) (+ b)` with one
//! backward step, whose parents are `[x, weight]` or `[x, weight, bias]`.

use std::marker::PhantomData;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, BackendTypes, Flex};

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

/// Records `y`, computed from the tensors behind `x`, `w` and `b`, with its backward step.
pub(super) fn record<S: AffineState>(
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
