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
        add("online", &mut std::iter::once(&self.params.online));
        add("online_views", &mut self.params.online_views.iter());
        add("online_wt", &mut self.params.online_wt.iter());
        add("grad", &mut std::iter::once(&self.params.grad));
        add("grad_views", &mut self.params.grad_views.iter());
        add("online_norm", &mut self.params.online_norm.iter());
        add("target_norm", &mut self.params.target_norm.iter());
        add("grad_norm", &mut self.params.grad_norm.iter());
        add("target_rule", &mut self.rule.tensors());
        add("online_iqn", &mut self.params.online_iqn.iter());
        add("target_iqn", &mut self.params.target_iqn.iter());
        add("grad_iqn", &mut self.params.grad_iqn.iter());
        add("target", &mut std::iter::once(&self.params.target));
        add("target_views", &mut self.params.target_views.iter());
        add("adam_m", &mut std::iter::once(&self.adam.m));
        add("adam_v", &mut std::iter::once(&self.adam.v));
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
        add("detail_sum", &mut std::iter::once(&self.stats.detail_sum));
        add("nonfinite", &mut std::iter::once(&self.stats.nonfinite));
        add(
            "nonfinite_streak",
            &mut std::iter::once(&self.stats.nonfinite_streak),
        );
        add("adam_t", &mut std::iter::once(&self.adam.t));
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
