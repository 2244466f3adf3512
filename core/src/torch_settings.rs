//! What "fp32" means on a GPU, and cuDNN's benchmark mode: libtorch's global settings,
//! which tch does not expose, set and read back through a small C++ shim over
//! `at::globalContext()` (`torch_settings.cpp`, built by `build.rs`).
//!
//! PyTorch's defaults: cuDNN runs fp32 convolutions in TF32 (10-bit mantissa inputs,
//! fp32 accumulation) on Ampere and later; cuBLAS runs fp32 matmuls in full fp32. So a
//! Nature CNN "in fp32" is TF32 in its convolutions unless `--tf32 off`, and a bf16
//! against fp32 comparison is bf16 against that. Benchmark mode lets cuDNN time its
//! algorithms for each new shape once and keep the fastest: the learner's shapes are
//! fixed, so it is on by default (off under `--deterministic`, whose point is
//! reproducibility).

use std::ffi::c_char;

use serde::{Deserialize, Serialize};

extern "C" {
    fn millrace_set_tf32(cudnn: bool, cublas: bool, err: *mut c_char, len: usize) -> i32;
    fn millrace_tf32(cudnn: *mut bool, cublas: *mut bool, err: *mut c_char, len: usize) -> i32;
    fn millrace_set_cudnn_benchmark(on: bool, err: *mut c_char, len: usize) -> i32;
    fn millrace_cudnn_benchmark() -> bool;
}

/// Where fp32 work may run in TF32 (`--tf32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tf32 {
    /// Full fp32 everywhere.
    Off,
    /// cuDNN's convolutions in TF32, cuBLAS's matmuls in fp32 (PyTorch's default).
    Conv,
    /// Convolutions and matmuls in TF32.
    All,
}

impl Tf32 {
    fn flags(self) -> (bool, bool) {
        match self {
            Tf32::Off => (false, false),
            Tf32::Conv => (true, false),
            Tf32::All => (true, true),
        }
    }

    fn of(cudnn: bool, cublas: bool) -> Option<Self> {
        match (cudnn, cublas) {
            (false, false) => Some(Tf32::Off),
            (true, false) => Some(Tf32::Conv),
            (true, true) => Some(Tf32::All),
            (false, true) => None,
        }
    }
}

impl std::fmt::Display for Tf32 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Tf32::Off => "off",
            Tf32::Conv => "conv",
            Tf32::All => "all",
        })
    }
}

/// libtorch's math settings for CUDA devices, as read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuMath {
    /// fp32 convolutions (cuDNN) in TF32.
    pub tf32_conv: bool,
    /// fp32 matmuls (cuBLAS) in TF32.
    pub tf32_matmul: bool,
    pub cudnn_benchmark: bool,
}

impl GpuMath {
    /// What `--tf32` calls this combination, if anything.
    pub fn tf32(&self) -> Option<Tf32> {
        Tf32::of(self.tf32_conv, self.tf32_matmul)
    }
}

impl std::fmt::Display for GpuMath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = |tf32: bool| if tf32 { "TF32" } else { "full fp32" };
        write!(
            f,
            "fp32 convolutions (cuDNN) in {}, fp32 matmuls (cuBLAS) in {}, cuDNN benchmark {}",
            mode(self.tf32_conv),
            mode(self.tf32_matmul),
            if self.cudnn_benchmark { "on" } else { "off" }
        )
    }
}

/// Why libtorch's GPU settings could not be read or set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TorchSettingsError {
    /// libtorch refused (the first line of its message).
    #[error("{0}")]
    Libtorch(String),
    /// libtorch took the settings but reads back others.
    #[error("libtorch reads back {got} after --tf32 {tf32}, --cudnn-benchmark {cudnn_benchmark}")]
    ReadBack {
        got: GpuMath,
        tf32: Tf32,
        cudnn_benchmark: bool,
    },
}

fn call(f: impl FnOnce(*mut c_char, usize) -> i32) -> Result<(), TorchSettingsError> {
    crate::shim::call(f).map_err(TorchSettingsError::Libtorch)
}

/// libtorch's settings now.
pub fn current() -> Result<GpuMath, TorchSettingsError> {
    let (mut conv, mut matmul) = (false, false);
    // SAFETY: valid out-pointers and error buffer (see `call`).
    call(|err, len| unsafe { millrace_tf32(&mut conv, &mut matmul, err, len) })?;
    Ok(GpuMath {
        tf32_conv: conv,
        tf32_matmul: matmul,
        // SAFETY: no arguments; reads a flag.
        cudnn_benchmark: unsafe { millrace_cudnn_benchmark() },
    })
}

/// Sets TF32 and cuDNN's benchmark mode for this process, and returns them as libtorch
/// reads them back.
pub fn apply(tf32: Tf32, cudnn_benchmark: bool) -> Result<GpuMath, TorchSettingsError> {
    let (cudnn, cublas) = tf32.flags();
    // SAFETY: plain flags and an error buffer (see `call`).
    call(|err, len| unsafe { millrace_set_tf32(cudnn, cublas, err, len) })?;
    // SAFETY: as above.
    call(|err, len| unsafe { millrace_set_cudnn_benchmark(cudnn_benchmark, err, len) })?;
    let got = current()?;
    if got.tf32() != Some(tf32) || got.cudnn_benchmark != cudnn_benchmark {
        return Err(TorchSettingsError::ReadBack {
            got,
            tf32,
            cudnn_benchmark,
        });
    }
    Ok(got)
}

/// For a benchmark on `device`: the learner's settings there (`tf32`, benchmark mode
/// on) where it is a CUDA device, as read back; `None` on the CPU.
pub fn for_device(device: tch::Device, tf32: Tf32) -> Result<Option<GpuMath>, TorchSettingsError> {
    match device {
        tch::Device::Cuda(_) => apply(tf32, true).map(Some),
        _ => Ok(None),
    }
}

/// libtorch's math settings a run asks for on CUDA devices (see `torch_settings`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GpuMathConfig {
    pub tf32: Tf32,
    pub cudnn_benchmark: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_set_and_read_back_through_libtorch() {
        // One test owns the process-wide settings (they are global to libtorch).
        let defaults = current().unwrap();
        assert_eq!(
            defaults,
            GpuMath {
                tf32_conv: true,
                tf32_matmul: false,
                cudnn_benchmark: false
            },
            "PyTorch 2.11's defaults"
        );
        assert_eq!(defaults.tf32(), Some(Tf32::Conv));
        for (tf32, bench) in [(Tf32::Off, true), (Tf32::All, false), (Tf32::Conv, true)] {
            let got = apply(tf32, bench).unwrap();
            assert_eq!((got.tf32(), got.cudnn_benchmark), (Some(tf32), bench));
        }
        let text = current().unwrap().to_string();
        assert_eq!(
            text,
            "fp32 convolutions (cuDNN) in TF32, fp32 matmuls (cuBLAS) in full fp32, cuDNN benchmark on"
        );
        apply(Tf32::Conv, false).unwrap();
    }
}
