//! Output files (`--output`, `--report`, `ppl report -o`): where the bytes go, checked before
//! any work is done, and written without harming what the path names.
//!
//! A regular file (or a new path) is written atomically: a temporary file beside it, renamed
//! into place, so a crash never leaves half a file under the final name. Anything else is
//! not a place to rename onto: `-` is standard output, and character devices, FIFOs and
//! everything under `/dev` or `/proc` (`/dev/stdout`, `/dev/null`, `/dev/full`) are opened and
//! written directly, so a write error such as ENOSPC is reported and the device stays a
//! device. A symbolic link is followed: its target is written, the link stays a link.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Where an output goes, decided by [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `-`: this process's standard output.
    Stdout,
    /// An existing device, FIFO or `/dev`, `/proc` path: opened for writing as it is.
    Direct(PathBuf),
    /// A regular file, existing or not (symbolic links resolved): temporary file + rename.
    Atomic(PathBuf),
}

/// Resolves a chain of symbolic links (also a dangling one: the path it would create).
fn follow_links(path: &Path) -> PathBuf {
    let mut p = path.to_path_buf();
    // A bounded walk: a loop of links ends here and fails later, at open, with ELOOP.
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => match std::fs::read_link(&p) {
                Ok(t) if t.is_absolute() => p = t,
                Ok(t) => p = p.parent().unwrap_or(Path::new("")).join(t),
                Err(_) => return p,
            },
            _ => return p,
        }
    }
    p
}

/// Whether this process may create files in `dir` (`access(W_OK | X_OK)`, which also says
/// no on a read-only file system).
fn writable_dir(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) only reads the NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// The same file (device and inode) as `other`?
fn same_file(a: &std::fs::Metadata, other: &Path) -> bool {
    std::fs::metadata(other).is_ok_and(|b| a.dev() == b.dev() && a.ino() == b.ino())
}

/// Checks an output path before the work that produces it, so a run never ends with nowhere
/// to put its result: not a directory, not one of the `inputs` (`(flag, path)` pairs), in a
/// directory that exists (or can be created) and is writable. `flag` names the option in
/// messages.
pub fn check(path: &Path, flag: &str, inputs: &[(&str, &Path)]) -> Result<Target, String> {
    if path.as_os_str() == "-" {
        return Ok(Target::Stdout);
    }
    if path.as_os_str().is_empty() {
        return Err(format!("{flag} is empty; give a file path"));
    }
    let shown = path.display();
    let resolved = follow_links(path);
    let special = [Path::new("/dev"), Path::new("/proc")]
        .iter()
        .any(|d| path.starts_with(d) || resolved.starts_with(d));
    match std::fs::metadata(&resolved) {
        Ok(m) => {
            if let Some((input_flag, _)) = inputs.iter().find(|(_, p)| same_file(&m, p)) {
                return Err(format!(
                    "{flag} {shown} is the file given to {input_flag}; writing it would destroy the input — choose another output path"
                ));
            }
            let t = m.file_type();
            if t.is_dir() {
                return Err(format!(
                    "{flag} {shown} is a directory; give a file path, e.g. {}",
                    path.join(if flag == "--report" {
                        "report.html"
                    } else {
                        "results.json"
                    })
                    .display()
                ));
            }
            if t.is_socket() {
                return Err(format!(
                    "{flag} {shown} is a socket, which ppl cannot write to; give a file path or - for standard output"
                ));
            }
            if special || t.is_char_device() || t.is_fifo() || t.is_block_device() {
                return Ok(Target::Direct(resolved));
            }
        }
        // ENOTDIR: a parent is a file; named below, with the parent checks.
        Err(e)
            if e.kind() != std::io::ErrorKind::NotFound
                && e.raw_os_error() != Some(libc::ENOTDIR) =>
        {
            return Err(format!("{flag} {shown}: {e}"));
        }
        Err(_) if special => {
            return Err(format!(
                "{flag} {shown} does not exist, and ppl creates no files under /dev or /proc; give a file path"
            ));
        }
        Err(_) => {}
    }
    // A regular file (or a new one): the rename needs a writable directory. Missing parents
    // are created at write time; the nearest existing one must allow that.
    let parent = resolved
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let existing = parent.ancestors().find(|a| a.exists()).unwrap_or(parent);
    if !existing.is_dir() {
        return Err(format!(
            "{flag} {shown}: {} is not a directory; give a path inside a directory",
            existing.display()
        ));
    }
    if !writable_dir(existing) {
        return Err(format!(
            "{flag} {shown}: the directory {} is not writable (permissions or a read-only file system); give a path in a writable directory",
            existing.display()
        ));
    }
    Ok(Target::Atomic(resolved))
}

impl Target {
    /// Writes `bytes` to the target (see the module documentation for how).
    pub fn write(&self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Target::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(bytes)?;
                out.flush()
            }
            Target::Direct(p) => {
                let mut f = std::fs::OpenOptions::new().write(true).open(p)?;
                f.write_all(bytes)?;
                f.flush()
            }
            Target::Atomic(p) => write_atomic(p, bytes),
        }
    }

    /// The path written, for messages (`-` for standard output).
    pub fn display(&self) -> String {
        match self {
            Target::Stdout => "standard output".into(),
            Target::Direct(p) | Target::Atomic(p) => p.display().to_string(),
        }
    }
}

/// A temporary file beside `path`, written in full, then renamed onto it; the temporary file
/// is removed again when anything fails.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(d) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(d)?;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_new_and_linked_paths_are_written_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("r.json");
        assert_eq!(
            check(&file, "--output", &[]),
            Ok(Target::Atomic(file.clone()))
        );
        std::fs::write(&file, "old").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let t = check(&link, "--output", &[]).unwrap();
        assert_eq!(t, Target::Atomic(file.clone()));
        t.write(b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn devices_stdout_directories_and_inputs() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(check(Path::new("-"), "--output", &[]), Ok(Target::Stdout));
        assert_eq!(
            check(Path::new("/dev/null"), "--output", &[]),
            Ok(Target::Direct("/dev/null".into()))
        );
        let e = check(dir.path(), "--output", &[]).unwrap_err();
        assert!(
            e.contains("is a directory") && e.contains("results.json"),
            "{e}"
        );
        let input = dir.path().join("text.txt");
        std::fs::write(&input, "x").unwrap();
        let e = check(&input, "--output", &[("--data", &input)]).unwrap_err();
        assert!(e.contains("is the file given to --data"), "{e}");
        let e = check(Path::new("/dev/ppl-nothing"), "--output", &[]).unwrap_err();
        assert!(e.contains("under /dev"), "{e}");
        let full = Target::Direct("/dev/full".into());
        assert!(full.write(b"x").is_err());
    }
}
