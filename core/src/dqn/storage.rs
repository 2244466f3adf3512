//! Where the update's persistent tensors keep their data: a CUDA graph reads and writes
//! the addresses it recorded, so none of them may move (`core/tests/update_ops.rs`).

use tch::Tensor;

use super::Dqn;

impl Dqn {
    /// Each persistent tensor the update reads or writes, by name, with the address of
    /// its data (the fixed input and output buffers once an update has made them).
    pub fn storage(&self) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        let mut add = |name: &str, tensors: &mut dyn Iterator<Item = &Tensor>| {
            for (i, t) in tensors.enumerate() {
                out.push((format!("{name}[{i}]"), t.data_ptr() as usize));
            }
        };
        add("online", &mut std::iter::once(&self.online));
        add("online_views", &mut self.online_views.iter());
        add("online_wt", &mut self.online_wt.iter());
        add("grad", &mut std::iter::once(&self.grad));
        add("grad_views", &mut self.grad_views.iter());
        add("online_norm", &mut self.online_norm.iter());
        add("target_norm", &mut self.target_norm.iter());
        add("grad_norm", &mut self.grad_norm.iter());
        add("munchausen", &mut self.munchausen.iter().flatten());
        add("online_iqn", &mut self.online_iqn.iter());
        add("target_iqn", &mut self.target_iqn.iter());
        add("grad_iqn", &mut self.grad_iqn.iter());
        add("target", &mut std::iter::once(&self.target));
        add("target_views", &mut self.target_views.iter());
        add("adam_m", &mut std::iter::once(&self.adam_m));
        add("adam_v", &mut std::iter::once(&self.adam_v));
        if let Some(torso) = &self.torso {
            add("torso_online", &mut torso.online.iter());
            add("torso_target", &mut torso.target.iter());
            add("torso_grad", &mut torso.grad.iter());
        }
        if let Some(half) = &self.half {
            add("half_online", &mut std::iter::once(&half.online));
            add("half_target", &mut std::iter::once(&half.target));
            add("half_online_views", &mut half.online_views.iter());
            add("half_online_wt", &mut half.online_wt.iter());
            add("half_target_views", &mut half.target_views.iter());
            add("half_torso_online", &mut half.torso_online.iter());
            add("half_torso_target", &mut half.torso_target.iter());
        }
        add("detail_sum", &mut std::iter::once(&self.detail_sum));
        add("nonfinite", &mut std::iter::once(&self.nonfinite));
        add(
            "nonfinite_streak",
            &mut std::iter::once(&self.nonfinite_streak),
        );
        add("adam_t", &mut std::iter::once(&self.adam_t));
        add("lr", &mut std::iter::once(&self.agents.lr));
        add(
            "max_grad_norm",
            &mut std::iter::once(&self.agents.max_grad_norm),
        );
        add("tau", &mut self.agents.tau.iter());
        add("fixed_io", &mut self.fixed_io.tensors());
        out
    }
}
