//! Command-line guards: number arguments that name the flag when negative, error chains
//! without repeated OS messages, colour only on a terminal, the standard-input spool that is
//! removed however the run ends, and `eval`'s output paths checked before the evaluation.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::{Backend, Resolved};
use crate::output::{self, Target};
use crate::report::compare::NamedRun;
use crate::report::{self, Format, Results};
use crate::run::EvalConfig;

/// clap value parser for counts: a negative number gets a message naming the problem (clap's
/// default read `--ctx -5` as an unknown flag `-5`).
pub(super) fn whole<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err("negative numbers are not allowed here; give a whole number, e.g. 512".into());
    }
    t.parse()
        .map_err(|_| "not a whole number; give digits only, e.g. 512".to_string())
}

/// An error and its causes, each cause added only when the text so far does not already say
/// it (many messages embed their OS error, which `{:#}` would print a second time).
pub(super) fn error_message(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}

/// Whether diagnostics on stderr may use ANSI colour: only on a terminal, and never when
/// `NO_COLOR` is set to anything non-empty (<https://no-color.org>).
pub(super) fn stderr_colour() -> bool {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

/// The file standard input was kept in (`--data -`), removed when this guard drops: at the
/// end of the run, on an error, and (through [`crate::preflight::remove_spool_on_signal`])
/// on Ctrl-C, SIGHUP or SIGTERM.
#[derive(Debug, Default)]
pub(super) struct StdinSpool(Option<PathBuf>);

impl Drop for StdinSpool {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// `--data -`: standard input is read once, here, into a file named by its content hash in
/// the temporary directory, so that every local rank reads the same bytes. Under MPI only
/// rank 0 would see the input: refused. Empty input is refused as such (not by the name of
/// the temporary file).
pub(super) fn stdin_to_file(cfg: &mut EvalConfig, backend: Backend) -> anyhow::Result<StdinSpool> {
    if cfg.data.as_os_str() != "-" {
        return Ok(StdinSpool::default());
    }
    if backend == Backend::Mpi {
        bail!("--data - (standard input) cannot be used under mpirun: only rank 0 would read it; give a file path every rank can read");
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
        .context("cannot read the data from standard input (--data -)")?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        bail!("standard input (--data -) is empty (or only whitespace): there is nothing to evaluate; pipe the text in, e.g. `cat text.txt | ppl eval --data - …`, or give a file with --data");
    }
    let sha = crate::fingerprint::sha256_bytes(&bytes);
    let path = std::env::temp_dir().join(format!("ppl-stdin-{}.txt", &sha[..16]));
    crate::preflight::remove_spool_on_signal(&path);
    let spool = StdinSpool(Some(path.clone()));
    std::fs::write(&path, &bytes)
        .with_context(|| format!("cannot keep standard input in {}", path.display()))?;
    tracing::info!(
        "standard input ({} bytes) kept in {} until the run ends",
        bytes.len(),
        path.display()
    );
    cfg.data = path;
    Ok(spool)
}

/// Where `ppl eval` writes its results and report, checked before the evaluation starts.
pub(super) struct EvalOutputs {
    results: Option<Target>,
    report: Option<Target>,
    /// The run's name in the report (the results path, or "this run").
    name: String,
}

impl EvalOutputs {
    /// Checks `--output` and `--report` (not a directory, writable, not an input) before any
    /// work, so a finished evaluation always has somewhere to go.
    pub(super) fn plan(
        resolved: &Resolved,
        config: Option<&Path>,
        expect: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let e = &resolved.eval;
        let mut inputs: Vec<(&str, &Path)> = vec![("--model", &e.model)];
        if e.data.as_os_str() != "-" {
            inputs.push(("--data", &e.data));
        }
        inputs.extend(config.map(|c| ("--config", c)));
        inputs.extend(expect.map(|x| ("--expect", x)));
        let results = resolved
            .output
            .as_ref()
            .map(|o| output::check(o, "--output", &inputs))
            .transpose()
            .map_err(anyhow::Error::msg)?;
        let report = match &resolved.report {
            None => None,
            Some(p) => {
                let path = p.clone().unwrap_or_else(|| {
                    // Beside the results file; with none (or `-o -`), report.html here.
                    match &resolved.output {
                        Some(o) if o.as_os_str() != "-" => o.with_extension("html"),
                        _ => PathBuf::from("report.html"),
                    }
                });
                Some(output::check(&path, "--report", &inputs).map_err(anyhow::Error::msg)?)
            }
        };
        if let (Some(Target::Atomic(a)), Some(Target::Atomic(b))) = (&results, &report) {
            if a == b {
                bail!(
                    "--output and --report both name {}; give the report another path",
                    a.display()
                );
            }
        }
        Ok(Self {
            results,
            report,
            name: resolved
                .output
                .as_ref()
                .map_or("this run".to_string(), |o| o.display().to_string()),
        })
    }

    /// Whether the results go to standard output (then the summary goes to stderr).
    pub(super) fn results_on_stdout(&self) -> bool {
        self.results == Some(Target::Stdout)
    }

    /// Writes the results JSON and the HTML report where [`Self::plan`] decided.
    pub(super) fn write(&self, results: &Results) -> anyhow::Result<()> {
        if let Some(t) = &self.results {
            let json = serde_json::to_vec_pretty(results)?;
            t.write(&json)
                .with_context(|| format!("cannot write results to {} (--output)", t.display()))?;
        }
        if let Some(t) = &self.report {
            let html = report::render(
                Format::Html,
                &[NamedRun {
                    name: self.name.clone(),
                    results: results.clone(),
                }],
            );
            t.write(html.as_bytes()).with_context(|| {
                format!("cannot write the report to {} (--report)", t.display())
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_counts_are_named() {
        assert_eq!(whole::<usize>("512"), Ok(512));
        assert!(whole::<usize>("-5").unwrap_err().contains("negative"));
        assert!(whole::<u64>("5x").unwrap_err().contains("whole number"));
    }

    #[test]
    fn os_errors_are_not_repeated() {
        let io = std::io::Error::from_raw_os_error(21);
        let shown = io.to_string();
        let e = anyhow::Error::new(io).context(format!("cannot read x: {shown}"));
        assert_eq!(error_message(&e), format!("cannot read x: {shown}"));
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_message(&e), "outer: inner");
    }
}
