//! Parameters in the form the actors' forward passes read, packed once per version.
//!
//! A [`PackedNet`] is one agent's weights packed for [`crate::gemm`] (dense layers by
//! columns, convolutions by rows) and its small vectors (biases, LayerNorm gains, the
//! IQN head's embedding of its acting fractions), made from a published [`Params`]
//! snapshot. The actors of one process that read the same parameters share them
//! through a [`PackShelf`]: the first actor to load a version packs it, the others take
//! the same `Arc`, and a packing nobody reads any more is packed over for a later
//! version. In steady state a parameter load allocates nothing and each version is
//! packed once per process, not copied by every actor.

use std::sync::{Arc, Mutex};

use millrace_proto::{NetworkSpec, ParamEntry, ParamLayout, Params, ParamsCell};

use crate::gemm::{PackedCols, PackedRows};
use crate::runner::ParamsSource;

/// One agent's parameters, packed (see the module docs).
#[derive(Debug, Default)]
pub struct PackedNet {
    /// `(version, agent)` of the snapshot packed here, and the network's widths (a
    /// shelf shared by mistake between two networks never mixes them up).
    key: Option<(u64, usize)>,
    widths: Vec<usize>,
    /// Each dense layer's weights `[fan_in, fan_out]`, and its biases.
    pub(crate) dense: Vec<PackedCols>,
    pub(crate) biases: Vec<Vec<f32>>,
    /// With LayerNorm, each hidden layer's gain and bias.
    pub(crate) norms: Vec<Vec<f32>>,
    /// With an IQN head: its embedding of each acting fraction, `[m, H₀]`
    /// (`ReLU(cos(π·i·τ_j) · W + b)`); empty without one.
    pub(crate) iqn_phi: Vec<f32>,
    cosines: Vec<f32>,
    /// Each convolution's filters `[out, in·k·k]`, and its biases.
    pub(crate) filters: Vec<PackedRows>,
    pub(crate) conv_biases: Vec<Vec<f32>>,
}

impl PackedNet {
    /// The version packed here, if any.
    pub fn version(&self) -> Option<u64> {
        self.key.map(|(version, _)| version)
    }

    /// Packs agent `agent` of `params` for `spec` (its `layout` and `widths`, as the
    /// policy keeps them), reusing every buffer: nothing is allocated once this has
    /// held the same network.
    ///
    /// The caller has checked that `params` fits `spec`.
    pub(crate) fn pack(
        &mut self,
        spec: &NetworkSpec,
        layout: &ParamLayout,
        widths: &[usize],
        params: &Params,
        agent: usize,
    ) {
        // Claims no version until packed whole (a panic midway leaves it unclaimed).
        self.key = None;
        copy_into(&mut self.widths, widths);
        let p = params.agent(agent);
        let slice = |e: &ParamEntry| &p[e.offset..e.offset + e.len];
        let layers = layout.num_layers();
        self.dense.resize_with(layers, PackedCols::default);
        self.biases.resize_with(layers, Vec::new);
        for (l, (packed, bias)) in self.dense.iter_mut().zip(&mut self.biases).enumerate() {
            let (w, b) = (&layout.entries[2 * l], &layout.entries[2 * l + 1]);
            packed.pack(slice(w), widths[l], widths[l + 1]);
            copy_into(bias, slice(b));
        }
        self.norms.resize_with(layout.norm.len(), Vec::new);
        for (norm, e) in self.norms.iter_mut().zip(&layout.norm) {
            copy_into(norm, slice(e));
        }
        let convs = layout.conv.len() / 2;
        self.filters.resize_with(convs, PackedRows::default);
        self.conv_biases.resize_with(convs, Vec::new);
        for (i, (filters, bias)) in self
            .filters
            .iter_mut()
            .zip(&mut self.conv_biases)
            .enumerate()
        {
            let (w, b) = (&layout.conv[2 * i], &layout.conv[2 * i + 1]);
            filters.pack(slice(w), b.len, w.len / b.len.max(1));
            copy_into(bias, slice(b));
        }
        self.iqn_phi.clear();
        if let (Some(head), [w, b, ..]) = (spec.iqn, &layout.iqn[..]) {
            let (weight, bias) = (slice(w), slice(b));
            self.cosines.resize(head.embedding, 0.0);
            for tau in head.act_fractions() {
                millrace_proto::IqnHead::cosines(tau, &mut self.cosines);
                let start = self.iqn_phi.len();
                self.iqn_phi.extend_from_slice(bias);
                let row = &mut self.iqn_phi[start..];
                for (c, wrow) in self.cosines.iter().zip(weight.chunks_exact(b.len)) {
                    for (v, w) in row.iter_mut().zip(wrow) {
                        *v += c * w;
                    }
                }
                for v in row {
                    *v = v.max(0.0);
                }
            }
        }
        self.key = Some((params.version, agent));
    }
}

/// `dst` becomes a copy of `src`, in the allocation it has.
fn copy_into<T: Copy>(dst: &mut Vec<T>, src: &[T]) {
    dst.clear();
    dst.extend_from_slice(src);
}

/// Packed versions shared by the actors of one process that read one parameter
/// stream (one network): see the module docs.
#[derive(Debug, Default)]
pub struct PackShelf {
    slots: Mutex<Vec<Arc<PackedNet>>>,
}

impl PackShelf {
    /// Agent `agent` of `params`, packed: the shelf's packing if some actor has packed
    /// this version already, else packed now into a packing nobody reads any more (or
    /// a new one). Drop the packing you held before asking, so that it can be reused.
    pub(crate) fn get(
        &self,
        (spec, layout, widths): (&NetworkSpec, &ParamLayout, &[usize]),
        params: &Params,
        agent: usize,
    ) -> Arc<PackedNet> {
        let key = Some((params.version, agent));
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(packed) = slots.iter().find(|s| s.key == key && s.widths == widths) {
            return Arc::clone(packed);
        }
        // Handed out only under this lock: a count of one means no actor reads it.
        let free = match slots.iter().position(|s| Arc::strong_count(s) == 1) {
            Some(i) => i,
            None => {
                slots.push(Arc::default());
                slots.len() - 1
            }
        };
        let packed = Arc::get_mut(&mut slots[free]).expect("a packing only the shelf holds");
        packed.pack(spec, layout, widths, params, agent);
        Arc::clone(&slots[free])
    }

    /// Packings held (for tests: how many versions were alive at once).
    pub fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A parameter cell read by several actors of this process, which share each
/// version's packing through one [`PackShelf`] (embedded and lock-step actors).
#[derive(Clone, Debug)]
pub struct SharedParams {
    cell: Arc<ParamsCell>,
    shelf: Arc<PackShelf>,
}

impl SharedParams {
    /// Actors given clones of this share one shelf.
    pub fn new(cell: Arc<ParamsCell>) -> Self {
        Self {
            cell,
            shelf: Arc::default(),
        }
    }

    pub fn shelf(&self) -> &Arc<PackShelf> {
        &self.shelf
    }
}

impl ParamsSource for SharedParams {
    fn newer_than(&mut self, have: Option<u64>) -> Option<Arc<Params>> {
        self.cell.newer_than(have)
    }

    fn shelf(&self) -> Option<&PackShelf> {
        Some(&self.shelf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{MlpPolicy, Policy};
    use millrace_proto::{DType, ObsSpec};

    fn spec() -> NetworkSpec {
        let obs = ObsSpec {
            shape: vec![3],
            dtype: DType::F32,
        };
        NetworkSpec::mlp(&obs, &[16, 8], 2, 1).unwrap()
    }

    fn snapshot(spec: &NetworkSpec, version: u64) -> Params {
        let data = (0..spec.layout().len)
            .map(|i| ((i as u64 * 31 + version * 17) % 23) as f32 / 23.0 - 0.5)
            .collect();
        Params {
            version,
            env_steps: 0,
            updates: version,
            population: 1,
            data,
        }
    }

    #[test]
    fn actors_sharing_a_shelf_pack_each_version_once_and_reuse_old_packings() {
        let spec = spec();
        let shelf = PackShelf::default();
        let mut actors: Vec<MlpPolicy> = (0..3)
            .map(|_| MlpPolicy::new(spec.clone(), 0).unwrap())
            .collect();
        let mut alone = MlpPolicy::new(spec.clone(), 0).unwrap();
        let obs = [0.3f32, -0.7, 1.1, 0.0, 0.5, -0.2];
        for version in 1..=20 {
            let params = snapshot(&spec, version);
            for a in &mut actors {
                a.load_shared(&params, &shelf).unwrap();
            }
            alone.load(&params).unwrap();
            let first = actors[0].packed().unwrap();
            assert!(actors
                .iter()
                .all(|a| Arc::ptr_eq(a.packed().unwrap(), first)));
            assert_eq!(actors[0].version(), Some(version));
            // The shared packing computes what a private one does, to the bit.
            let (mut shared, mut own) = ([0.0f32; 4], [0.0f32; 4]);
            actors[2].q_values(&obs, &mut shared);
            alone.q_values(&obs, &mut own);
            assert_eq!(shared.map(f32::to_bits), own.map(f32::to_bits));
        }
        // Versions move on together: at most the old and the new one are alive.
        assert!(shelf.len() <= 2, "{} packings", shelf.len());
    }

    #[test]
    fn a_lagging_actor_keeps_its_version_while_the_others_move_on() {
        let spec = spec();
        let shelf = PackShelf::default();
        let mut slow = MlpPolicy::new(spec.clone(), 0).unwrap();
        let mut fast = MlpPolicy::new(spec.clone(), 0).unwrap();
        slow.load_shared(&snapshot(&spec, 1), &shelf).unwrap();
        let held = Arc::clone(slow.packed().unwrap());
        for version in 1..=5 {
            fast.load_shared(&snapshot(&spec, version), &shelf).unwrap();
        }
        // The slow actor's packing was never packed over.
        assert!(Arc::ptr_eq(slow.packed().unwrap(), &held));
        assert_eq!(slow.version(), Some(1));
        assert_eq!(fast.version(), Some(5));
        assert!(shelf.len() <= 3);
    }
}
