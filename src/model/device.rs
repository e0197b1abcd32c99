//! Where a model runs: the CPU (always) or an NVIDIA GPU through candle's CUDA backend (cargo
//! feature `cuda`).
//!
//! `--device cuda` gives each rank of a machine its own GPU (local rank `r` uses GPU `r`);
//! `--device cuda:N` puts every rank on GPU `N`. On a GPU the weights, the activations and
//! the vocabulary-wide log-softmax stay on the device; only per-token NLLs (8 bytes a token)
//! come back to the host, where the exact integer accumulation happens as on the CPU.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;
use serde::{Deserialize, Serialize};

/// The device a run asked for (`--device`, `evaluation.device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum DeviceSpec {
    #[default]
    Cpu,
    /// A CUDA GPU: a fixed ordinal, or (`None`) the rank's local index.
    Cuda(Option<usize>),
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("unknown device '{0}': use cpu, cuda or cuda:N (N the GPU's index, as nvidia-smi lists them)")]
    Unknown(String),
    #[error("--device {0}: this ppl was built without CUDA support; rebuild it with `cargo build --release --features cuda` (nvcc and the CUDA headers at build time: see the README's GPU section), or run with --device cpu")]
    NotBuilt(DeviceSpec),
    #[error("cannot open CUDA device {ordinal}, no CUDA driver or device: {reason}; check `nvidia-smi`, CUDA_VISIBLE_DEVICES and that the NVIDIA driver is loaded, or run with --device cpu")]
    Open { ordinal: usize, reason: String },
}

impl DeviceSpec {
    pub fn is_cpu(self) -> bool {
        self == DeviceSpec::Cpu
    }

    /// The GPU index local rank `local_rank` uses (`None` on the CPU).
    pub fn ordinal(self, local_rank: usize) -> Option<usize> {
        match self {
            DeviceSpec::Cpu => None,
            DeviceSpec::Cuda(n) => Some(n.unwrap_or(local_rank)),
        }
    }

    /// Opens the device of the rank with index `local_rank` on its machine.
    pub fn open(self, local_rank: usize) -> Result<Device, DeviceError> {
        match self.ordinal(local_rank) {
            None => Ok(Device::Cpu),
            Some(ordinal) => open_cuda(self, ordinal),
        }
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(_spec: DeviceSpec, ordinal: usize) -> Result<Device, DeviceError> {
    Device::new_cuda(ordinal).map_err(|e| DeviceError::Open {
        ordinal,
        reason: e.to_string(),
    })
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(spec: DeviceSpec, _ordinal: usize) -> Result<Device, DeviceError> {
    Err(DeviceError::NotBuilt(spec))
}

/// The name results and logs use for a candle device ("cpu", "cuda:0").
pub fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(None) => f.write_str("cuda"),
            DeviceSpec::Cuda(Some(n)) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let unknown = || DeviceError::Unknown(s.to_string());
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" | "gpu" => Ok(DeviceSpec::Cuda(None)),
            other => {
                let n = other
                    .strip_prefix("cuda:")
                    .or_else(|| other.strip_prefix("gpu:"))
                    .ok_or_else(unknown)?;
                n.parse()
                    .map(|n| DeviceSpec::Cuda(Some(n)))
                    .map_err(|_| unknown())
            }
        }
    }
}

impl From<DeviceSpec> for String {
    fn from(d: DeviceSpec) -> String {
        d.to_string()
    }
}

impl TryFrom<String> for DeviceSpec {
    type Error = DeviceError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// What holds between runs on a device: results.json's `determinism`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Determinism {
    /// The device of the ranks ("cpu", "cuda:0", or a list when ranks differ).
    pub device: String,
    /// Same inputs and batch size give the same bits run after run.
    pub run_to_run: bool,
    /// Changing the batch size, the thread count, the world size or the schedule leaves the
    /// bits unchanged (tensor parallelism excepted: see the README).
    pub batch_and_world_invariant: bool,
    /// Whether the two properties above were measured by this project's tests on such a
    /// device, or follow from the kernels' structure without a measurement yet.
    pub basis: String,
    pub note: String,
}

impl Determinism {
    /// The statement for runs on `device` (a [`device_name`]).
    pub fn for_device(device: &str) -> Self {
        if device == "cpu" {
            Determinism {
                device: device.into(),
                run_to_run: true,
                batch_and_world_invariant: true,
                basis: "tested".into(),
                note: "every row's arithmetic is independent of its batch neighbours and of \
                       the thread split; per-token NLLs are summed as fixed-point integers"
                    .into(),
            }
        } else {
            Determinism {
                device: device.into(),
                run_to_run: true,
                batch_and_world_invariant: false,
                basis: "expected, not yet measured on a GPU by this project".into(),
                note: "candle's CUDA kernels reduce without atomics, so a fixed batch size \
                       repeats bit for bit; cuBLAS and the quantized matmul choose kernels by \
                       shape, so another batch size may move the last bits of a logit. Per-token \
                       NLLs are summed on the host as fixed-point integers, so rank count and \
                       window order never change the total"
                    .into(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_device_names() {
        for (s, d) in [
            ("cpu", DeviceSpec::Cpu),
            ("cuda", DeviceSpec::Cuda(None)),
            ("CUDA:3", DeviceSpec::Cuda(Some(3))),
            ("gpu:1", DeviceSpec::Cuda(Some(1))),
        ] {
            assert_eq!(s.parse::<DeviceSpec>().unwrap(), d, "{s}");
        }
        assert_eq!(DeviceSpec::Cuda(Some(2)).to_string(), "cuda:2");
        for bad in ["tpu", "cuda:", "cuda:x", "cuda:-1", ""] {
            let e = bad.parse::<DeviceSpec>().unwrap_err().to_string();
            assert!(e.contains("use cpu, cuda or cuda:N"), "{bad}: {e}");
        }
    }

    #[test]
    fn ranks_get_their_own_gpu_unless_one_is_named() {
        assert_eq!(DeviceSpec::Cuda(None).ordinal(3), Some(3));
        assert_eq!(DeviceSpec::Cuda(Some(1)).ordinal(3), Some(1));
        assert_eq!(DeviceSpec::Cpu.ordinal(3), None);
        assert!(matches!(DeviceSpec::Cpu.open(5), Ok(Device::Cpu)));
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_names_the_rebuild() {
        let e = DeviceSpec::Cuda(Some(0)).open(0).unwrap_err().to_string();
        assert!(e.contains("--features cuda"), "{e}");
        assert!(e.contains("--device cpu"), "{e}");
    }

    #[test]
    fn serializes_as_its_name() {
        let j = serde_json::to_string(&DeviceSpec::Cuda(Some(0))).unwrap();
        assert_eq!(j, "\"cuda:0\"");
        assert_eq!(
            serde_json::from_str::<DeviceSpec>("\"cpu\"").unwrap(),
            DeviceSpec::Cpu
        );
    }
}
