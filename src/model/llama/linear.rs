//! A weight matrix and how it is multiplied: one of the own kernels ([`super::super::kernels`]),
//! candle's quantized matmul, or a dense tensor — chosen once, at load, by [`own_kernel`]; and
//! the helpers that place a file's tensors on a device.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Module, Tensor};

use crate::model::gguf::GgufFile;
use crate::model::kernels::{self, OwnMatrix, SharedInput};
use crate::model::quantize::{self, Quantize, Quantized, Site};
use crate::model::shard::RawTensor;
use crate::model::{ModelError, Precision};

use super::*;

/// A weight matrix used as `x @ W^T`: candle's quantized or dense matmul, or one of our
/// kernels where a benchmark showed candle's to be the bottleneck ([`kernels::own_matrix`]
/// picks it).
pub(super) enum Linear {
    Candle(QMatMul),
    Own(Arc<dyn OwnMatrix>),
}

impl Linear {
    /// Builds the matrix from its stored bytes (the one copy out of the map).
    pub(super) fn from_raw(
        raw: &RawTensor<'_>,
        name: &str,
        precision: Precision,
        device: &Device,
        kernels: Kernels,
    ) -> Result<Self> {
        if own_kernels(precision, kernels) {
            if let Some(own) = Self::own(raw, name, precision)? {
                return Ok(own);
            }
        }
        let q = Arc::new(qtensor(raw, name, device)?);
        Self::from_qtensor(q, name, precision, device, kernels)
    }

    /// Our kernel for a stored `[n, k]` matrix in `precision` ([`own_kernels`]): in native
    /// precision the kernel of its type, if one serves it (on the file's map in place where
    /// the kernel can use it so); in f32 the F32 kernel on its dequantized values (an F32
    /// tensor in place).
    pub(super) fn own(
        raw: &RawTensor<'_>,
        name: &str,
        precision: Precision,
    ) -> Result<Option<Self>> {
        let [n, k] = *raw.shape else { return Ok(None) };
        if precision == Precision::F32 && (raw.dtype != GgmlDType::F32 || raw.stored.is_some()) {
            let values = dequantized(&raw.computed(), raw.dtype, n * k, name)?;
            return Self::own_f32(values, &raw.shape, name);
        }
        let own = match (raw.stored, &raw.mapped) {
            // A type read as another (IQ4_NL, IQ4_XS): our kernel of the stored type.
            (Some(stored), _) => kernels::own_stored_matrix(stored, &raw.bytes, n, k),
            (None, Some(mapped)) => kernels::own_matrix_in_place(raw.dtype, mapped, n, k),
            (None, None) => kernels::own_matrix(raw.dtype, &raw.bytes, n, k),
        };
        Self::own_result(own, name)
    }

    /// The F32 kernel on the values of a `[n, k]` matrix (dequantized): `--precision f32` on
    /// our kernels. The values are candle's dequantization, as the dense tensor it multiplied
    /// before; the products are the F32 kernel's, in its one order whatever the level, so a
    /// quantized file in f32 gives the bits of its f32 export (`ppl export --dtype f32`) in
    /// native precision.
    fn own_f32(values: Vec<f32>, shape: &[usize], name: &str) -> Result<Option<Self>> {
        let &[n, k] = shape else {
            return Ok(None);
        };
        let own = kernels::own_f32_matrix(values, n, k)
            .ok_or_else(|| format!("a malformed F32 layout for [{n}, {k}]"));
        Self::own_result(Some(own), name)
    }

    /// [`Self::own`] of bytes held elsewhere (a candle tensor's).
    pub(super) fn own_of(
        dtype: GgmlDType,
        bytes: &[u8],
        shape: &[usize],
        name: &str,
    ) -> Result<Option<Self>> {
        let [n, k] = *shape else { return Ok(None) };
        Self::own_result(kernels::own_matrix(dtype, bytes, n, k), name)
    }

    fn own_result(
        own: Option<std::result::Result<Arc<dyn OwnMatrix>, String>>,
        name: &str,
    ) -> Result<Option<Self>> {
        match own {
            None => Ok(None),
            Some(Ok(m)) => Ok(Some(Linear::Own(m))),
            Some(Err(detail)) => Err(ModelError::Tensor {
                name: name.to_string(),
                detail: format!("has {detail}"),
            }),
        }
    }

    /// A weight quantized at load (`--quantize`): int4/int8 become their dequantized f32
    /// values (a weight-only kernel's exact operands), GGUF types are used as such (our Q4_1
    /// kernel for Q4_1 in native precision).
    pub(super) fn quantized(
        raw: &RawTensor<'_>,
        site: &Site,
        precision: Precision,
        device: &Device,
        kernels: Kernels,
        q: &Quantize,
    ) -> Result<Self> {
        let name = site.name;
        // Quantized on the host (the schemes are CPU code), then placed on `device`.
        let w = qtensor(raw, name, &Device::Cpu)?.dequantize(&Device::Cpu)?;
        let err = |e: candle_core::Error| ModelError::Tensor {
            name: name.to_string(),
            detail: format!("cannot quantize it to {}: {e}", q.scheme),
        };
        match quantize::quantize(q, &w, site).map_err(err)? {
            Quantized::Dense(t) => {
                if own_kernels(precision, kernels) {
                    let values = t.flatten_all()?.to_vec1::<f32>()?;
                    if let Some(own) = Self::own_f32(values, t.dims(), name)? {
                        return Ok(own);
                    }
                }
                Ok(Linear::Candle(QMatMul::Tensor(
                    t.to_dtype(precision.dtype())?.to_device(device)?,
                )))
            }
            Quantized::Ggml(qt) => Self::from_qtensor(qt, name, precision, device, kernels),
        }
    }

    /// A matrix from candle storage (on the host or already on `device`).
    pub(super) fn from_qtensor(
        q: Arc<QTensor>,
        name: &str,
        precision: Precision,
        device: &Device,
        kernels: Kernels,
    ) -> Result<Self> {
        if own_kernels(precision, kernels) {
            let own = match precision {
                Precision::F32 => {
                    let elems = q.shape().elem_count();
                    let values = dequantized(&q.data()?, q.dtype(), elems, name)?;
                    Self::own_f32(values, q.shape().dims(), name)?
                }
                _ => Self::own_of(q.dtype(), &q.data()?, q.shape().dims(), name)?,
            };
            if let Some(own) = own {
                return Ok(own);
            }
        }
        let q = place_qtensor(q, device)?;
        Ok(Linear::Candle(match precision {
            // QMatMul keeps quantized types quantized (on a GPU: candle's CUDA kernels, which
            // quantize the activations to Q8_1 as llama.cpp's do) and dequantizes
            // F32/F16/BF16 to f32.
            Precision::Native => QMatMul::from_arc(q)?,
            p => QMatMul::Tensor(q.dequantize(device)?.to_dtype(p.dtype())?),
        }))
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> u64 {
        (match self {
            Linear::Own(m) => m.storage_bytes(),
            Linear::Candle(QMatMul::QTensor(q)) => q.storage_size_in_bytes(),
            Linear::Candle(QMatMul::Tensor(t)) | Linear::Candle(QMatMul::TensorF16(t)) => {
                t.elem_count() * t.dtype().size_in_bytes()
            }
        }) as u64
    }

    /// The products of `x` through several matrices that multiply it (a layer's Q, K and V;
    /// gate and up) as raw values and dims, when all are ours: `x` is read and its quantized
    /// activations made once for all of them ([`SharedInput`]: the same bits as one
    /// product each). `None` if any is candle's.
    pub(super) fn own_forward_shared(
        linears: &[&Linear],
        x: &Tensor,
    ) -> Result<Option<Vec<RawProduct>>> {
        let owns: Option<Vec<_>> = linears
            .iter()
            .map(|l| match l {
                Linear::Own(w) => Some(w),
                Linear::Candle(_) => None,
            })
            .collect();
        let Some(owns) = owns else {
            return Ok(None);
        };
        let Some(k) = owns.first().map(|w| w.shape().1) else {
            return Ok(Some(Vec::new()));
        };
        if let Some(w) = owns.iter().find(|w| w.shape().1 != k) {
            return Err(ModelError::Tensor {
                name: "projection".to_string(),
                detail: format!(
                    "takes {} inputs where the projections beside it take {k}: the model file's \
                     shapes disagree",
                    w.shape().1
                ),
            });
        }
        let rows = x.elem_count() / k;
        let ys = with_f32(x, |xs| {
            let input = SharedInput::new(xs, rows);
            owns.iter()
                .map(|w| w.matmul_shared(&input))
                .collect::<Vec<_>>()
        })?;
        Ok(Some(
            ys.into_iter()
                .zip(&owns)
                .map(|(y, w)| {
                    let mut dims = x.dims().to_vec();
                    *dims.last_mut().expect("rank >= 1") = w.shape().0;
                    (y, dims)
                })
                .collect(),
        ))
    }

    /// [`Linear::forward`] of each of `linears` on the same `x`, sharing `x`'s quantized
    /// activations where all are ours ([`Linear::own_forward_shared`]).
    pub(super) fn forward_shared(linears: &[&Linear], x: &Tensor) -> Result<Vec<Tensor>> {
        match Self::own_forward_shared(linears, x)? {
            Some(ys) => ys
                .into_iter()
                .map(|(y, dims)| Ok(Tensor::from_vec(y, dims, &Device::Cpu)?))
                .collect(),
            None => linears.iter().map(|l| l.forward(x)).collect(),
        }
    }

    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            // Dense weights set the activations' dtype (f32 rows meet a bf16 output layer
            // when a compare reads stored hidden states).
            Linear::Candle(m @ QMatMul::Tensor(w)) => Ok(m.forward(&x.to_dtype(w.dtype())?)?),
            Linear::Candle(m) => Ok(m.forward(x)?),
            Linear::Own(w) => own_kernel(x, w.shape(), |xs, rows| w.matmul(xs, rows)),
        }
    }
}

/// A product's values and dims, as our kernels return it.
pub(super) type RawProduct = (Vec<f32>, Vec<usize>);

/// Runs `f` on the f32 values of `t` in row-major order, without a copy when `t` is already a
/// contiguous CPU f32 tensor.
pub fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    use candle_core::{CpuStorage, Storage};
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(CpuStorage::F32(v)), Some((start, end))) => Ok(f(&v[start..end])),
        _ => {
            drop(storage);
            Ok(f(&t.flatten_all()?.to_vec1::<f32>()?))
        }
    }
}

/// `x [.., k]` through one of our kernels of shape `(n, k)`: `[.., n]`.
pub(super) fn own_kernel(
    x: &Tensor,
    (n, k): (usize, usize),
    matmul: impl Fn(&[f32], usize) -> Vec<f32>,
) -> Result<Tensor> {
    let mut dims = x.dims().to_vec();
    let rows = x.elem_count() / k;
    let y = with_f32(x, |xs| matmul(xs, rows))?;
    *dims.last_mut().expect("rank >= 1") = n;
    Ok(Tensor::from_vec(y, dims, &Device::Cpu)?)
}

/// Which code computes the forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// Our kernels where a benchmark chose them (quantized matmuls in native precision, f32
    /// attention, SiLU), candle's ops elsewhere: the CPU's default.
    Own,
    /// candle's ops throughout: what runs on a GPU. On the CPU it checks the GPU's path
    /// against ours.
    Candle,
}

impl Kernels {
    /// The default for `device` (our kernels are CPU code).
    pub fn for_device(device: &Device) -> Self {
        if device.is_cpu() {
            Kernels::Own
        } else {
            Kernels::Candle
        }
    }
}

/// How a rank computes: the weights' precision, where, and with which kernels.
#[derive(Clone, Copy)]
pub(super) struct Compute<'a> {
    pub(super) precision: Precision,
    pub(super) device: &'a Device,
    pub(super) kernels: Kernels,
}

/// Whether our matmuls take the weights: in native precision (each stored type's kernel) and
/// in f32 (the F32 kernel on the dequantized values; candle's f32 gemm ran a SmolLM2 window
/// about 1.3× slower, and its order was not the F32 file's).
pub(super) fn own_kernels(precision: Precision, kernels: Kernels) -> bool {
    matches!(precision, Precision::Native | Precision::F32) && kernels == Kernels::Own
}

/// The f32 values of `elems` stored values of type `dtype`, as candle dequantizes them, in one
/// allocation: through a candle tensor they were copied once more, and on SmolLM2 the freed
/// copies raised `--precision f32`'s peak RSS from 583 to 607 MiB.
fn dequantized(bytes: &[u8], dtype: GgmlDType, elems: usize, name: &str) -> Result<Vec<f32>> {
    let err = |detail: String| ModelError::Tensor {
        name: name.to_string(),
        detail,
    };
    let storage = QStorage::from_data(Cow::Borrowed(bytes), &Device::Cpu, dtype)
        .map_err(|e| err(e.to_string()))?;
    let QStorage::Cpu(q) = storage else {
        return Err(err("was not placed on the host".into()));
    };
    match q.dequantize(elems).map_err(|e| err(e.to_string()))? {
        candle_core::CpuStorage::F32(values) => Ok(values),
        _ => Err(err("did not dequantize to f32".into())),
    }
}

/// Candle storage for stored bytes, on `device`.
pub(super) fn qtensor(raw: &RawTensor<'_>, name: &str, device: &Device) -> Result<QTensor> {
    let err = |e: candle_core::Error| ModelError::Tensor {
        name: name.to_string(),
        detail: e.to_string(),
    };
    let storage = QStorage::from_data(raw.computed(), device, raw.dtype).map_err(err)?;
    QTensor::new(storage, raw.shape.as_slice()).map_err(err)
}

/// `q` on `device`: the same quantized bytes, copied once when it lives elsewhere.
pub(super) fn place_qtensor(q: Arc<QTensor>, device: &Device) -> Result<Arc<QTensor>> {
    if q.device().same_device(device) {
        return Ok(q);
    }
    let storage = QStorage::from_data(q.data()?, device, q.dtype())?;
    Ok(Arc::new(QTensor::new(storage, q.shape().clone())?))
}

/// An untied 16-bit (F16/BF16) embedding table held by our kernel in native precision, so it
/// stays 16-bit; `None` for other types or candle's kernels.
pub(super) fn own_table(embd: &QTensor, kernels: Kernels) -> Result<Option<Arc<dyn OwnMatrix>>> {
    if kernels != Kernels::Own || !matches!(embd.dtype(), GgmlDType::F16 | GgmlDType::BF16) {
        return Ok(None);
    }
    let own = Linear::own_of(
        embd.dtype(),
        &embd.data()?,
        embd.shape().dims(),
        "token_embd.weight",
    )?;
    Ok(own.and_then(|l| match l {
        Linear::Own(m) => Some(m),
        Linear::Candle(_) => None,
    }))
}

/// The f32 values of `q` in `precision`'s dtype, on `device`.
pub(super) fn dense(q: &QTensor, precision: Precision, device: &Device) -> Result<Tensor> {
    Ok(q.dequantize(&Device::Cpu)?
        .to_dtype(precision.dtype())?
        .to_device(device)?)
}

/// Drops a tensor's mapped pages once its bytes were copied (see [`GgufFile::release`]);
/// not when a kernel uses them in place.
pub(super) fn release(g: &GgufFile, raw: &RawTensor<'_>, name: &str) {
    if raw.mapped.as_ref().is_some_and(|m| m.is_kept()) {
        return;
    }
    if let Some(info) = g.tensors.get(name) {
        g.release(info);
    }
}
