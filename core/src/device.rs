//! Where the learner's tensors live: the CPU or one CUDA device, as the flags name it.

use serde::{Serialize, Serializer};

/// Where the learner's tensors live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    Cpu,
    Cuda(usize),
}

impl DeviceChoice {
    pub fn device(self) -> tch::Device {
        match self {
            DeviceChoice::Cpu => tch::Device::Cpu,
            DeviceChoice::Cuda(i) => tch::Device::Cuda(i),
        }
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceChoice::Cpu => write!(f, "cpu"),
            DeviceChoice::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl Serialize for DeviceChoice {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
