//! NCCL between the GPUs of a tensor-parallel group (cargo feature `nccl`).
//!
//! Only the float traffic of the forward pass moves over NCCL: the sum of the row-parallel
//! projections' partial outputs, GPU to GPU, without a trip through host memory. The control
//! plane (steps, window records, the exact integer NLL reduction) stays on the host
//! [`Communicator`], which also carries NCCL's unique id from the group's rank 0 to the
//! others: the MPI backend across processes, the local backend between threads of one
//! process, so no id file is needed in either case.
//!
//! Exactness: NCCL sums in its own order (ring or tree, chosen by size), so activations under
//! `tp > 1` agree with the host path to float rounding, as the host path agrees with `tp = 1`
//! (see [`crate::parallel::model_parallel`]). Data parallelism needs no float collective at all.

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::{CudaStorage, DType, Device, Layout, Shape, Tensor};
use cudarc::nccl::{Comm, Id, ReduceOp};

use super::{CommError, Communicator};

/// One rank's NCCL communicator for its tensor-parallel group.
pub struct NcclGroup {
    comm: Mutex<SendComm>,
}

/// `Comm` holds a raw NCCL handle and is therefore neither `Send` nor `Sync`. NCCL allows a
/// communicator to be used from any thread as long as calls on it do not overlap; the mutex
/// in [`NcclGroup`] serialises them, and the communicator is destroyed by whichever thread
/// drops it last, which NCCL also allows.
struct SendComm(Comm);
// SAFETY: see the type's comment: every use goes through `NcclGroup::comm`'s mutex.
unsafe impl Send for SendComm {}

impl NcclGroup {
    /// Joins the group `group` (this rank's tensor-parallel peers, on the host communicator)
    /// on `device`, which must be this rank's GPU. Collective: every member calls it.
    pub fn new(group: &dyn Communicator, device: &Device) -> Result<Self, CommError> {
        let Device::Cuda(cuda) = device else {
            return Err(CommError::Transport(
                "the nccl tensor-parallel backend needs the model on a GPU (--device cuda)".into(),
            ));
        };
        let nccl = |what: &str, e: cudarc::nccl::result::NcclError| {
            CommError::Transport(format!(
                "NCCL {what} failed on rank {}: {e:?}; check that libnccl2 is installed and \
                 that NCCL_DEBUG=INFO shows the GPUs of the group",
                group.rank()
            ))
        };
        let id = if group.rank() == 0 {
            let id = Id::new().map_err(|e| nccl("unique id", e))?;
            let bytes: Vec<u8> = id.internal().iter().map(|&c| c as u8).collect();
            group.broadcast(0, bytes)?;
            id
        } else {
            let bytes = group.broadcast(0, Vec::new())?;
            if bytes.len() != 128 {
                return Err(CommError::Protocol {
                    from: 0,
                    detail: format!("an NCCL unique id of {} bytes (expected 128)", bytes.len()),
                });
            }
            Id::uninit(std::array::from_fn(|i| bytes[i] as std::ffi::c_char))
        };
        let comm = Comm::from_rank(cuda.cuda_stream(), group.rank(), group.size(), id)
            .map_err(|e| nccl("communicator init", e))?;
        Ok(NcclGroup {
            comm: Mutex::new(SendComm(comm)),
        })
    }

    /// The element-wise sum of `x` over the group, on every member (f32, bf16 or f16). A
    /// failure (NCCL's, or a tensor it cannot take) is a [`CommError`], so it leaves the
    /// forward pass as `ModelError::Comm` like a host backend's.
    pub fn all_reduce_sum(&self, x: &Tensor) -> Result<Tensor, CommError> {
        x.contiguous()
            .and_then(|x| x.apply_op1_no_bwd(&AllReduceSum(self)))
            .map_err(|e| CommError::Transport(format!("NCCL tensor-parallel all-reduce: {e}")))
    }
}

/// candle's hook into device storage for the all-reduce.
struct AllReduceSum<'a>(&'a NcclGroup);

impl candle_core::CustomOp1 for AllReduceSum<'_> {
    fn name(&self) -> &'static str {
        "nccl-all-reduce-sum"
    }

    fn cpu_fwd(
        &self,
        _storage: &candle_core::CpuStorage,
        _layout: &Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, Shape)> {
        candle_core::bail!("the NCCL all-reduce runs on GPU tensors only")
    }

    fn cuda_fwd(
        &self,
        storage: &CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("the NCCL all-reduce needs a contiguous tensor")
        };
        let comm = self.0.comm.lock().unwrap_or_else(|p| p.into_inner());
        let device = storage.device().clone();
        let n = end - start;
        macro_rules! reduce {
            ($t:ty) => {{
                let src = storage.as_cuda_slice::<$t>()?.slice(start..end);
                // SAFETY: every element is written by the all-reduce before it is read.
                let mut dst = unsafe { device.alloc::<$t>(n) }?;
                comm.0
                    .all_reduce(&src, &mut dst, &ReduceOp::Sum)
                    .map_err(|e| candle_core::Error::Msg(format!("NCCL all-reduce: {e:?}")))?;
                CudaStorage::wrap_cuda_slice(dst, device)
            }};
        }
        let out = match storage.dtype() {
            DType::F32 => reduce!(f32),
            DType::BF16 => reduce!(half::bf16),
            DType::F16 => reduce!(half::f16),
            d => candle_core::bail!("the NCCL all-reduce does not take {d:?} tensors"),
        };
        Ok((out, layout.shape().clone()))
    }
}
