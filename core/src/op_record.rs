//! What libtorch operations a piece of code dispatches, through a C++ shim over
//! libtorch's `RecordFunction` callbacks (`op_record.cpp`, built by `build.rs`): the
//! check that an update launches the same work every step, which is what a CUDA graph
//! replays.
//!
//! A recording belongs to the thread that started it: operators other threads dispatch
//! (a prefetcher, the publisher) are not in it. On the CPU autograd runs a backward pass
//! on the calling thread, so the torso's and the IQN head's backward passes (the parts of
//! the update that use autograd) are recorded; on a GPU they run on autograd's device
//! threads and are not: record on the CPU. Each operator is one [`Op`]: its depth
//! (0 for the operators the code called, more for those they called in turn), its name
//! and its arguments, tensors by dtype, shape and device, everything else by value.

use std::ffi::{c_char, CStr};
use std::marker::PhantomData;

extern "C" {
    fn millrace_op_record_start(err: *mut c_char, len: usize) -> i32;
    fn millrace_op_record_stop(out: *mut *mut c_char, err: *mut c_char, len: usize) -> i32;
    fn millrace_op_record_free(text: *mut c_char);
}

/// One dispatched operator.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Op {
    /// 0 for an operator the recorded code called itself; n + 1 for one an operator of
    /// depth n called.
    pub depth: u32,
    /// The operator and its arguments: `aten::add_(T(Float,[4],cpu), T(…), 1)`; a host
    /// number libtorch wrapped as a tensor with its value (`T(Double,[],cpu,wrapped=0.5)`).
    pub call: String,
}

impl Op {
    /// The operator's name (`aten::add_`).
    pub fn name(&self) -> &str {
        self.call.split('(').next().unwrap_or(&self.call)
    }
}

/// Why a recording could not start or stop.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("operation recorder: {0}")]
pub struct OpRecordError(String);

/// Records the operators this thread dispatches until [`OpRecorder::finish`] (dropped,
/// it stops and discards). One at a time per thread.
#[derive(Debug)]
pub struct OpRecorder {
    active: bool,
    /// The callbacks are the starting thread's: stop them there.
    _thread_bound: PhantomData<*const ()>,
}

impl OpRecorder {
    /// Starts recording on this thread.
    pub fn start() -> Result<Self, OpRecordError> {
        // SAFETY: an error buffer of the length given (see `shim::call`).
        crate::shim::call(|err, len| unsafe { millrace_op_record_start(err, len) })
            .map_err(OpRecordError)?;
        Ok(Self {
            active: true,
            _thread_bound: PhantomData,
        })
    }

    /// Stops, and returns the operators recorded in dispatch order.
    pub fn finish(mut self) -> Result<Vec<Op>, OpRecordError> {
        self.active = false;
        let text = stop()?;
        Ok(text.lines().filter_map(parse_line).collect())
    }
}

impl Drop for OpRecorder {
    fn drop(&mut self) {
        if self.active {
            let _ = stop();
        }
    }
}

/// Stops this thread's recording; its text.
fn stop() -> Result<String, OpRecordError> {
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: a valid out-pointer and error buffer; on success the shim hands over a
    // malloc'd NUL-terminated text, freed below by the shim's own `free`.
    crate::shim::call(|err, len| unsafe { millrace_op_record_stop(&mut out, err, len) })
        .map_err(OpRecordError)?;
    // SAFETY: as above; `out` is non-null on success.
    let text = unsafe { CStr::from_ptr(out) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: `out` came from the shim's malloc and is not used again.
    unsafe { millrace_op_record_free(out) };
    Ok(text)
}

/// `"DEPTH CALL"`, one line of the shim's text.
fn parse_line(line: &str) -> Option<Op> {
    let (depth, call) = line.split_once(' ')?;
    Some(Op {
        depth: depth.parse().ok()?,
        call: call.to_string(),
    })
}

/// The operators `ops` holds at depth 0: those the recorded code called itself, each
/// of which libtorch launches from the host.
pub fn top_level(ops: &[Op]) -> usize {
    ops.iter().filter(|op| op.depth == 0).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    #[test]
    fn records_each_operator_with_its_arguments_and_depth() {
        let a = Tensor::ones([4], (Kind::Float, tch::Device::Cpu));
        let rec = OpRecorder::start().unwrap();
        let b = &a * 2.5;
        let _ = b.sum(Kind::Float);
        let ops = rec.finish().unwrap();
        let top: Vec<&Op> = ops.iter().filter(|o| o.depth == 0).collect();
        assert_eq!(top.len(), 2, "{ops:#?}");
        assert_eq!(top[0].name(), "aten::mul");
        assert!(top[0].call.contains("T(Float,[4],cpu)"), "{}", top[0].call);
        assert!(top[0].call.contains("2.5"), "{}", top[0].call);
        assert_eq!(top[1].name(), "aten::sum");
        assert_eq!(top_level(&ops), 2);
    }

    #[test]
    fn a_changed_scalar_records_differently_and_a_repeat_the_same() {
        let a = Tensor::ones([3], (Kind::Float, tch::Device::Cpu));
        let record = |x: f64| {
            let rec = OpRecorder::start().unwrap();
            let _ = &a * x;
            rec.finish().unwrap()
        };
        let once = record(0.999);
        assert_eq!(once, record(0.999));
        assert_ne!(once, record(0.999_000_000_000_1));
        // The scalar reaches the nested operator as a wrapped number, by value too.
        assert!(
            once.iter()
                .any(|op| op.depth == 1 && op.call.contains("wrapped=0.999")),
            "{once:#?}"
        );
    }

    #[test]
    fn only_the_recording_thread_is_recorded_and_one_recording_at_a_time() {
        let rec = OpRecorder::start().unwrap();
        assert!(OpRecorder::start().is_err());
        std::thread::spawn(|| {
            let _ = Tensor::ones([2], (Kind::Float, tch::Device::Cpu)) + 1.0;
        })
        .join()
        .unwrap();
        assert_eq!(rec.finish().unwrap(), []);
        // Dropped without finishing, it stops: the next one starts.
        drop(OpRecorder::start().unwrap());
        assert!(OpRecorder::start().is_ok());
    }
}
