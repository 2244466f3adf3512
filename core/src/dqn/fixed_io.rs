//! The update's inputs and its TD errors in memory allocated once, on the path a GPU
//! runs (the tensor optimizer): a CUDA graph reads the addresses it recorded, so each
//! batch is copied into the same buffers and the TD errors land in the same tensor,
//! which `Dqn::update` copies out, outside what a graph would capture.
//! The buffers are made at the first update, and again only if the batch's shapes
//! change (a new graph would then be captured).

use tch::Tensor;

use super::Batch;

#[derive(Debug, Default)]
pub(super) struct FixedIo {
    inputs: Option<Batch>,
    td: Option<Tensor>,
}

fn same_shape(a: &Tensor, b: &Tensor) -> bool {
    a.size() == b.size() && a.kind() == b.kind() && a.device() == b.device()
}

impl FixedIo {
    /// `batch` copied into the fixed input buffers, which the returned batch shares.
    pub(super) fn load(&mut self, batch: &Batch) -> Batch {
        let fits = self.inputs.as_ref().is_some_and(|held| {
            same_shape(&held.obs2, &batch.obs2)
                && same_shape(&held.actions, &batch.actions)
                && same_shape(&held.rewards, &batch.rewards)
                && same_shape(&held.discounts, &batch.discounts)
                && match (&held.weights, &batch.weights) {
                    (Some(h), Some(w)) => same_shape(h, w),
                    (None, None) => true,
                    _ => false,
                }
        });
        let held = match &mut self.inputs {
            Some(held) if fits => held,
            slot => slot.insert(Batch {
                obs2: batch.obs2.empty_like(),
                actions: batch.actions.empty_like(),
                rewards: batch.rewards.empty_like(),
                discounts: batch.discounts.empty_like(),
                weights: batch.weights.as_ref().map(Tensor::empty_like),
            }),
        };
        tch::no_grad(|| {
            held.obs2.copy_(&batch.obs2);
            held.actions.copy_(&batch.actions);
            held.rewards.copy_(&batch.rewards);
            held.discounts.copy_(&batch.discounts);
            if let (Some(h), Some(w)) = (&mut held.weights, &batch.weights) {
                h.copy_(w);
            }
        });
        held.shallow_clone()
    }

    /// `td` copied into the fixed output tensor, which the returned tensor shares.
    pub(super) fn store_td(&mut self, td: &Tensor) -> Tensor {
        let out = match &mut self.td {
            Some(out) if same_shape(out, td) => out,
            slot => slot.insert(td.empty_like()),
        };
        tch::no_grad(|| out.copy_(td));
        out.shallow_clone()
    }

    /// The buffers, for [`super::Dqn::storage`].
    pub(super) fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        let inputs = self.inputs.iter().flat_map(|b| {
            [&b.obs2, &b.actions, &b.rewards, &b.discounts]
                .into_iter()
                .chain(b.weights.as_ref())
        });
        inputs.chain(self.td.as_ref())
    }
}
