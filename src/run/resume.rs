//! The run directory and its ledgers: rank 0 names (or reuses) the directory, reads what a
//! previous attempt recorded when resuming, and tells every rank which windows are left.

use std::path::{Path, PathBuf};

use super::config::{EvalConfig, RunOptions};
use super::error::EvalError;
use super::prepare::RankSetup;
use crate::comm::{json, Communicator};
use crate::eval::{ledger, Record};
use crate::report::progress::ProgressMode;

/// Every rank learns the run directory, the attempt number and the windows left: rank 0 reads
/// what a previous attempt recorded (`--resume`) and broadcasts it. Rank 0 also returns the
/// records it read and the ledgers' notes.
pub(crate) fn agree<R: Record>(
    comm: &dyn Communicator,
    cfg: &EvalConfig,
    setup: &RankSetup,
    binding: &ledger::Binding,
    opts: &RunOptions,
) -> Result<(ResumePlan, Vec<R>, Vec<String>), EvalError> {
    let agreed = if comm.rank() == 0 {
        match plan_resume(cfg, setup, binding, opts) {
            Ok((p, done, notes)) => {
                json::broadcast(comm, 0, Some(&p))?;
                (p, done, notes)
            }
            Err(e) => {
                comm.abort(&e.to_string());
                return Err(e);
            }
        }
    } else {
        (json::broadcast(comm, 0, None)?, Vec::new(), Vec::new())
    };
    note_run_dir(&agreed.0.run_dir, opts.command);
    Ok(agreed)
}

/// Tells every rank's abort path how to go on from the windows finished in `run_dir`.
fn note_run_dir(run_dir: &Path, command: &str) {
    let shown = std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_path_buf());
    crate::comm::set_abort_note(format!(
        "the windows finished so far are kept in {0}: resume with `{command} --resume {0}` \
         (under mpirun or `ppl launch` as before, on any number of ranks)",
        shown.display()
    ));
}

/// What rank 0 tells every rank before scoring: the ledger attempt number and the windows the
/// ledgers already hold.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct ResumePlan {
    /// The run directory rank 0 chose (and created, now that the start-up checks passed).
    pub(crate) run_dir: PathBuf,
    pub(crate) attempt: usize,
    pub(crate) done: Vec<usize>,
}

/// Rank 0: reads the run directory's ledgers (when resuming) and saves the configuration.
fn plan_resume<R: Record>(
    cfg: &EvalConfig,
    setup: &RankSetup,
    binding: &ledger::Binding,
    opts: &RunOptions,
) -> Result<(ResumePlan, Vec<R>, Vec<String>), EvalError> {
    // Named (and, by default, created) only here: a run that fails its start-up checks
    // leaves no empty run directory behind.
    let dir = &match &cfg.run_dir {
        Some(d) => d.clone(),
        None => {
            let root = crate::eval::runs::runs_root();
            crate::eval::runs::claim_new(&root).map_err(|source| EvalError::Io {
                action: "create a run directory under",
                path: root.clone(),
                purpose: "",
                source,
                hint: "; give a writable --run-dir DIR (or set PPL_STATE_DIR)",
            })?
        }
    };
    let (done, notes) = if cfg.resume {
        let (done, notes) = ledger::load::<R>(dir, binding)?;
        let plan = &setup.prepared.plan;
        for r in &done {
            let expected = plan.windows.get(r.index()).map_or(0, |w| w.targets.len());
            ledger::check_record(dir, r, expected)?;
        }
        (done, notes)
    } else {
        (Vec::new(), Vec::new())
    };
    std::fs::create_dir_all(dir).map_err(|source| EvalError::Io {
        action: "create the run directory",
        path: dir.clone(),
        purpose: "",
        source,
        hint: "; give a writable --run-dir",
    })?;
    let config = opts.config_yaml.as_ref().map(|y| ("config.yaml", y));
    for (name, text) in config
        .into_iter()
        .chain(opts.saved_files.iter().map(|(n, t)| (*n, t)))
    {
        let path = dir.join(name);
        if !path.exists() {
            std::fs::write(&path, text).map_err(|source| EvalError::Io {
                action: "write",
                path: path.clone(),
                purpose: "",
                source,
                hint: "",
            })?;
        }
    }
    for n in &notes {
        tracing::warn!("{n}");
    }
    if !matches!(opts.progress, Some(ProgressMode::None)) && !cfg.resume {
        let shown = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
        eprintln!(
            "[ppl] run directory {0} (if stopped: {1} --resume {0})",
            shown.display(),
            opts.command
        );
    }
    Ok((
        ResumePlan {
            run_dir: dir.clone(),
            attempt: ledger::next_attempt(dir),
            done: done.iter().map(R::index).collect(),
        },
        done,
        notes,
    ))
}
