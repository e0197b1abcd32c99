//! Which base `ppl compare` compares with: `--base` or `--base-logits` when given, else (with
//! `--resume DIR`) the base the run in DIR was started with, saved there as
//! [`crate::compare::SAVED_BASE`].

use anyhow::bail;

use super::CompareArgs;
use crate::compare::{BaseSource, SAVED_BASE};

/// The base of this comparison, from its flags or from the resumed run directory.
pub(super) fn compare_base(args: &CompareArgs) -> anyhow::Result<BaseSource> {
    match (&args.base, &args.base_logits, &args.eval.resume) {
        (gguf, Some(f), _) => Ok(BaseSource::File {
            path: f.clone(),
            gguf: gguf.clone(),
        }),
        (Some(b), None, _) => Ok(BaseSource::Model {
            path: crate::hub::local_model(b)?,
            precision: args.base_precision,
        }),
        (None, None, Some(dir)) => {
            let path = dir.join(SAVED_BASE);
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
                    "--resume {}: no {SAVED_BASE} there, so it is not the run directory of a `ppl compare`; give the base again (--base BASE.gguf or --base-logits FILE), or resume an evaluation with `ppl eval --resume {}`",
                    dir.display(),
                    dir.display()
                ),
                Err(e) => bail!("cannot read {} (--resume): {e}", path.display()),
            };
            serde_json::from_str(&text).map_err(|e| {
                anyhow::anyhow!(
                    "{}: not the base of a comparison ({e}); give the base again with --base BASE.gguf or --base-logits FILE",
                    path.display()
                )
            })
        }
        (None, None, None) => bail!("give the base with --base BASE.gguf or --base-logits FILE"),
    }
}
