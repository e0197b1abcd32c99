//! `ppl runs`: the run directories under ppl's state directory, newest first, with how far
//! each got and the command that resumes it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::eval::runs;

#[derive(Debug, Args)]
pub struct RunsArgs {
    /// Where to look [default: the state directory's runs/: $PPL_STATE_DIR, else
    /// $XDG_STATE_HOME/ppl, else ~/.local/state/ppl].
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// At most N runs (the newest).
    #[arg(short = 'n', long, value_name = "N", default_value_t = 20)]
    pub limit: usize,
}

pub fn run(args: RunsArgs) -> anyhow::Result<ExitCode> {
    let root = args.root.unwrap_or_else(runs::runs_root);
    let list = runs::list(&root);
    if list.is_empty() {
        println!("no runs under {}", root.display());
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} run(s) under {}, newest first:",
        list.len(),
        root.display()
    );
    for r in list.iter().take(args.limit) {
        let progress = match r.windows_total {
            Some(t) if r.windows_done >= t => format!("complete ({t} windows)"),
            Some(t) => format!("{}/{t} windows", r.windows_done),
            None => "no window finished".to_string(),
        };
        println!(
            "{}  {}  {progress}  {}",
            runs::utc_stamp(r.modified),
            r.dir.display(),
            r.model.as_deref().unwrap_or("(no saved configuration)")
        );
    }
    if let Some(r) = list
        .iter()
        .find(|r| r.windows_total.is_some_and(|t| r.windows_done < t))
    {
        println!(
            "resume the newest unfinished one: {} --resume {}",
            r.command,
            r.dir.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
