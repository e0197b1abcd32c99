//! The checks made before any weight is loaded: the configuration against the model, the mesh
//! against the model and this build. `ppl validate` runs [`check_plan`] too, so it passes
//! exactly what `eval` runs.

use super::config::{EvalConfig, RunOptions};
use super::error::EvalError;
use crate::comm::TpBackend;
use crate::data::Method;
use crate::model::{shard, GgufFile, LlamaConfig, Precision, Quantize};
use crate::parallel::mesh::ParallelDims;

/// Checks a mesh against the model before any weight is loaded.
pub fn check_mesh(
    dims: &ParallelDims,
    g: &GgufFile,
    mc: &LlamaConfig,
    quantize: Option<&Quantize>,
) -> Result<(), EvalError> {
    if dims.pp > mc.n_layers {
        return Err(EvalError::Config(format!(
            "--pp {} exceeds the model's {} layers: every pipeline stage needs at least one layer; use --pp {} or less",
            dims.pp, mc.n_layers, mc.n_layers
        )));
    }
    shard::check_tensor_parallel(g, mc, dims.tp, quantize)?;
    Ok(())
}

/// Every check of the configuration against the mesh, the model and this build that `eval`
/// makes before loading: `ppl validate` runs the same, so it passes exactly what `eval` runs.
pub fn check_plan(
    cfg: &EvalConfig,
    dims: &ParallelDims,
    g: &GgufFile,
    mc: &LlamaConfig,
) -> Result<(), EvalError> {
    check_mesh(dims, g, mc, cfg.quantize.as_ref())?;
    check_precision(cfg, dims)?;
    check_context_parallel(cfg, dims)?;
    check_device(cfg, dims)
}

/// `--cp`: whole chunks of equal windows (see [`crate::parallel::context_parallel`]).
fn check_context_parallel(cfg: &EvalConfig, dims: &ParallelDims) -> Result<(), EvalError> {
    if dims.cp == 1 {
        return Ok(());
    }
    if cfg.method != Method::Chunks || cfg.task.is_some() {
        return Err(EvalError::Config(format!(
            "--cp {} works with --method chunks only: stride and rolling windows (and --task) differ in length, so they do not cut into 2·cp equal chunks; use --method chunks, or --cp 1",
            dims.cp
        )));
    }
    crate::parallel::context_parallel::check_window(dims.cp, cfg.ctx, "--ctx")
        .map_err(EvalError::Config)
}

/// bf16/f16 activations run on whole models only: the model-parallel paths exchange f32.
pub(crate) fn check_precision(cfg: &EvalConfig, dims: &ParallelDims) -> Result<(), EvalError> {
    if matches!(cfg.precision, Precision::Bf16 | Precision::F16) && dims.splits_model() {
        return Err(EvalError::Config(format!(
            "--precision {} with pipeline, tensor or FSDP parallelism is not supported yet: use --precision f32 or native with --tp/--pp/--dp-shard, or {} with data parallelism only (--ranks N)",
            cfg.precision, cfg.precision
        )));
    }
    Ok(())
}

/// `--device` and `--tp-backend` against the build and the mesh.
pub(crate) fn check_device(cfg: &EvalConfig, dims: &ParallelDims) -> Result<(), EvalError> {
    if !cfg.device.is_cpu() && !cfg!(feature = "cuda") {
        return Err(crate::model::DeviceError::NotBuilt(cfg.device).into());
    }
    if cfg.tp_backend == TpBackend::Nccl {
        if !cfg!(feature = "nccl") {
            return Err(EvalError::Config(
                "--tp-backend nccl: this ppl was built without NCCL support; rebuild it with `cargo build --release --features nccl` (see the README's GPU section), or use --tp-backend host".into(),
            ));
        }
        if cfg.device.is_cpu() {
            return Err(EvalError::Config(
                "--tp-backend nccl sums activations on GPUs: add --device cuda, or use --tp-backend host on the CPU".into(),
            ));
        }
        if dims.tp == 1 {
            return Err(EvalError::Config(
                "--tp-backend nccl has nothing to sum with tp = 1: set --tp N (N GPUs per replica) or drop --tp-backend".into(),
            ));
        }
    }
    Ok(())
}

/// Checks the configuration against the model before anything heavy happens.
pub(crate) fn check_config(cfg: &EvalConfig, mc: &LlamaConfig) -> Result<(), EvalError> {
    if cfg.ctx < 2 {
        return Err(EvalError::Config(format!(
            "--ctx {} is too small: a window needs at least 2 tokens (one to condition on, one to score)",
            cfg.ctx
        )));
    }
    if cfg.ctx > mc.context_length {
        return Err(EvalError::Config(format!(
            "--ctx {} exceeds the model's context length {} ({}.context_length in {}); use --ctx {} or less",
            cfg.ctx,
            mc.context_length,
            mc.arch,
            cfg.model.display(),
            mc.context_length
        )));
    }
    if cfg.method == Method::Stride && (cfg.stride == 0 || cfg.stride > cfg.ctx) {
        return Err(EvalError::Config(format!(
            "--stride {} must be between 1 and --ctx {}",
            cfg.stride, cfg.ctx
        )));
    }
    if cfg.batch_size == 0 {
        return Err(EvalError::Config("--batch-size must be at least 1".into()));
    }
    if cfg.chunks == Some(0) {
        return Err(EvalError::Config("--chunks must be at least 1".into()));
    }
    Ok(())
}

/// Checks made once, before any rank exists: the model against the configuration and the
/// mesh (so `--pp 1000` is refused by the model's layer count, not after building 1000
/// ranks), then the number of local ranks against the machine.
pub(crate) fn check_before_ranks(
    cfg: &EvalConfig,
    n: usize,
    opts: &RunOptions,
) -> Result<(), EvalError> {
    let gguf = GgufFile::open(&cfg.model)?;
    let mc = LlamaConfig::from_gguf(&gguf)?;
    check_config(cfg, &mc)?;
    let dims = cfg.dims(n)?;
    check_mesh(&dims, &gguf, &mc, cfg.quantize.as_ref())?;
    crate::preflight::check_local_ranks(n, opts.oversubscribe).map_err(EvalError::Config)
}
