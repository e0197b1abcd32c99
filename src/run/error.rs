//! [`EvalError`], and how the errors of many ranks become one: the rank's own failure before
//! the echoes of it.

use crate::comm::agreement::AgreementError;
use crate::comm::CommError;
use crate::data::DataError;
use crate::eval::ledger;
use crate::model::{gguf, ModelError};
use crate::parallel::data_parallel::RunError;
use crate::tokenize::TokenizeError;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Model(ModelError),
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
    #[error(transparent)]
    Data(#[from] DataError),
    /// A configuration this run cannot carry out, with the fix.
    #[error("{0}")]
    Config(String),
    /// The mesh does not fit the world (`--dp-*`, `--tp`, `--pp`, `--cp` against the ranks).
    #[error(transparent)]
    Mesh(#[from] crate::parallel::mesh::MeshError),
    /// A file or directory could not be read, written or created.
    #[error("cannot {action} {}{purpose}: {source}{hint}", path.display())]
    Io {
        /// E.g. `read`, `create the run directory`.
        action: &'static str,
        path: std::path::PathBuf,
        /// Why it was needed, e.g. ` to fingerprint it` (may be empty).
        purpose: &'static str,
        source: std::io::Error,
        /// The fix, e.g. `; give a writable --run-dir` (may be empty).
        hint: &'static str,
    },
    /// Two inputs that do not belong together (a base and a model with other tokens or
    /// shapes, a saved base file and this run), with what differs and the fix.
    #[error("{0}")]
    Incompatible(String),
    /// A state the drivers' own logic rules out (a bug), reported instead of a panic.
    #[error("{0}")]
    Internal(String),
    /// A rank panicked (a bug): reported with the rank instead of tearing the process down.
    #[error("{0}")]
    Panic(String),
    /// The rank's compute threads could not be started.
    #[error("cannot start compute threads: {0}")]
    Threads(String),
    #[error(transparent)]
    Agreement(#[from] AgreementError),
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error("rank {rank} stopped: {source}")]
    Rank { rank: usize, source: Box<EvalError> },
    #[error("{0}")]
    Memory(String),
    #[error(transparent)]
    Device(#[from] crate::model::DeviceError),
    #[error(transparent)]
    Ledger(#[from] ledger::LedgerError),
    #[error(transparent)]
    BaseFile(#[from] crate::eval::base_file::BaseFileError),
}

/// A communication failure inside the forward pass is an [`EvalError::Comm`], as it is
/// outside it: [`first_error`] tells a rank's own failure from the echoes by that variant.
impl From<ModelError> for EvalError {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Comm(c) => EvalError::Comm(c),
            e => EvalError::Model(e),
        }
    }
}

impl From<RunError> for EvalError {
    fn from(e: RunError) -> Self {
        match e {
            RunError::Comm(c) => EvalError::Comm(c),
            RunError::Model(m) => EvalError::from(m),
            RunError::Ledger(l) => EvalError::Ledger(l),
        }
    }
}

/// `r`, after telling every rank of `comm` when it is an error (so that none waits for this
/// one until the communication timeout).
pub(crate) fn abort_on_error<T>(
    comm: &dyn crate::comm::Communicator,
    r: Result<T, EvalError>,
) -> Result<T, EvalError> {
    if let Err(e) = &r {
        comm.abort(&e.to_string());
    }
    r
}

/// A rank thread's result; a panic becomes an error naming the rank instead of tearing down
/// the process.
pub(crate) fn join_rank<T>(
    h: std::thread::ScopedJoinHandle<'_, Result<T, EvalError>>,
) -> Result<T, EvalError> {
    h.join().unwrap_or_else(|payload| {
        Err(EvalError::Panic(format!(
            "a rank thread panicked: {}",
            panic_message(payload.as_ref())
        )))
    })
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// The most informative error among ranks: a rank's own failure before the echoes of it
/// (other ranks report "rank N failed" once it aborts).
pub(crate) fn first_error<T>(all: Vec<Result<T, EvalError>>) -> Result<Vec<T>, EvalError> {
    let mut errors: Vec<(usize, EvalError)> = Vec::new();
    let mut ok = Vec::with_capacity(all.len());
    for (rank, r) in all.into_iter().enumerate() {
        match r {
            Ok(v) => ok.push(v),
            Err(e) => errors.push((rank, e)),
        }
    }
    if errors.is_empty() {
        return Ok(ok);
    }
    let primary = errors
        .iter()
        .position(|(_, e)| !matches!(e, EvalError::Comm(CommError::RankFailed { .. })))
        .unwrap_or(0);
    let (rank, e) = errors.swap_remove(primary);
    Err(match e {
        e @ (EvalError::Agreement(_) | EvalError::Comm(_)) => e,
        e if rank == 0 => e,
        e => EvalError::Rank {
            rank,
            source: Box::new(e),
        },
    })
}
