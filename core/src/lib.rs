//! The learner's device core: everything that owns or touches the device, and nothing
//! of the application around it (flags, run modes, checkpoints' files, evaluation,
//! reports: `millrace-learner`).
//!
//! - [`dqn`]: the population-stacked Q-network and double-DQN loss ([`dqn::network`]
//!   picks its layout), the fused and host optimizers, per-agent settings
//!   ([`dqn::agents`]), precision, the dueling head, learning-rate schedules.
//! - [`step`]: the learner step every driver runs (update, priorities, publish,
//!   statistics, divergence); [`update_loop`]: the learner thread, with stall
//!   accounting, handing checkpoints over behind [`handoff`].
//! - [`prefetch`]: staging buffers filled from replay by a sampler thread, and
//!   [`population_staging`] a population's stacked batches (both copy to the device
//!   on a side stream with `--copy-stream`, through `device_copy`);
//!   [`priority_feedback`]: TD errors back into replay (applied by `priority_apply`,
//!   off the learner thread by `priority_thread`); [`publisher`]: parameters out to
//!   actors.
//! - [`cuda`]: what tch does not expose of the CUDA runtime; [`torch_settings`]:
//!   libtorch's math settings; [`device`], [`memory`], [`faults`]: where tensors live,
//!   what they cost, and injected failures; [`ceiling`]: the learner's ceiling, for
//!   the benchmarks.

pub mod ceiling;
pub mod cuda;
pub mod device;
mod device_copy;
pub mod dqn;
pub mod faults;
pub mod handoff;
pub mod memory;
pub mod op_record;
pub mod poison;
pub mod population_staging;
pub mod prefetch;
mod priority_apply;
pub mod priority_feedback;
mod priority_thread;
pub mod publisher;
mod shim;
pub mod step;
pub mod torch_settings;
pub mod update_loop;
