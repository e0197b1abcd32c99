//! Fingerprints (SHA-256) of inputs, recorded in results so a result can be traced to the
//! exact model file and text, and (in distributed runs) compared across ranks.

use sha2::{Digest, Sha256};
use std::path::Path;

/// Hex SHA-256 of a file (or of a Hugging Face checkpoint directory: its JSON and safetensors
/// files, names and contents, in name order), memoised per (path, size, mtime) for the life
/// of the process (ranks of the `local` backend share one computation) and across processes
/// in the cache directory ([`disk_memo`]): hashing a multi-gigabyte model on one core took a
/// third of a short evaluation's start-up, on every run.
pub fn sha256_file_cached(path: &Path) -> std::io::Result<String> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Key = (std::path::PathBuf, u64, Option<std::time::SystemTime>);
    static MEMO: OnceLock<Mutex<HashMap<Key, String>>> = OnceLock::new();
    let meta = std::fs::metadata(path)?;
    let key = if meta.is_dir() {
        let mut len = 0;
        let mut newest = meta.modified().ok();
        for f in crate::model::hf::checkpoint_files(path)? {
            let m = std::fs::metadata(&f)?;
            len += m.len();
            newest = newest.max(m.modified().ok());
        }
        (path.to_path_buf(), len, newest)
    } else {
        (path.to_path_buf(), meta.len(), meta.modified().ok())
    };
    let memo = MEMO.get_or_init(Default::default);
    // Hash under the lock: concurrent ranks wait for one computation instead of repeating it.
    let mut m = memo.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = m.get(&key) {
        return Ok(h.clone());
    }
    let disk = disk_memo(&key);
    if let Some(h) = disk.as_ref().and_then(|d| d.read()) {
        m.insert(key, h.clone());
        return Ok(h);
    }
    let h = sha256_file(path)?;
    if let Some(d) = &disk {
        d.write(&h);
    }
    m.insert(key, h.clone());
    Ok(h)
}

/// A file's hash remembered on disk, under `$PPL_CACHE_DIR` (or `~/.cache/ppl`) `/sha256/`,
/// named by the hash of the file's absolute path, size, modification time (to the
/// nanosecond) and inode: a file rewritten in any way gets a new name, so a stale hash is
/// never read. `PPL_HASH_CACHE=0` turns it off.
pub struct DiskMemo {
    path: std::path::PathBuf,
}

/// The disk memo of a (path, size, mtime) key, or `None` when turned off or the key has no
/// modification time.
pub fn disk_memo(
    key: &(std::path::PathBuf, u64, Option<std::time::SystemTime>),
) -> Option<DiskMemo> {
    if std::env::var("PPL_HASH_CACHE").is_ok_and(|v| v == "0") {
        return None;
    }
    let (path, len, modified) = key;
    let nanos = (*modified)?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    let absolute = std::fs::canonicalize(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&absolute).ok()?);
    #[cfg(not(unix))]
    let inode = 0u64;
    let name = sha256_bytes(format!("{}\0{len}\0{nanos}\0{inode}", absolute.display()).as_bytes());
    Some(DiskMemo {
        path: crate::model::fetch::cache_dir().join("sha256").join(name),
    })
}

impl DiskMemo {
    /// The remembered hash, if any (anything but 64 hex digits is ignored).
    pub fn read(&self) -> Option<String> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        let h = text.trim();
        (h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())).then(|| h.to_string())
    }

    /// Remembers a hash (best effort: a cache that cannot be written is no error).
    pub fn write(&self, hash: &str) {
        let Some(dir) = self.path.parent() else {
            return;
        };
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
        let tmp = self
            .path
            .with_extension(format!("tmp-{}", std::process::id()));
        if std::fs::write(&tmp, hash).is_ok() && std::fs::rename(&tmp, &self.path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

pub use crate::sha256::{hex, of_bytes as sha256_bytes};

/// Hex SHA-256 of a file ([`crate::sha256::of_file`]); for a checkpoint directory, of its
/// files' names and hashes.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    if path.is_dir() {
        let mut h = Sha256::new();
        for f in crate::model::hf::checkpoint_files(path)? {
            let name = f.file_name().map(|n| n.to_string_lossy().into_owned());
            h.update(format!("{}\0{}\0", name.unwrap_or_default(), sha256_file(&f)?).as_bytes());
        }
        return Ok(hex(&h.finalize()));
    }
    crate::sha256::of_file(path)
}

/// Peak resident set size of this process (`VmHWM`), where the OS reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// SIMD features of this CPU that the kernels (candle's and ours) can use.
pub fn cpu_features() -> Vec<&'static str> {
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! check {
            ($($f:tt),*) => {$(if std::arch::is_x86_feature_detected!($f) { v.push($f); })*};
        }
        check!(
            "sse4.2",
            "avx",
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512vnni",
            "avx512bf16",
            "avxvnni"
        );
        // AMX-TILE and AMX-INT8 (CPUID leaf 7; the standard library's detection is unstable).
        if crate::model::kernels::amx_advertised() {
            v.push("amx-int8");
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            v.push("neon");
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_memo_follows_the_file() {
        let dir = std::env::temp_dir().join(format!("ppl-hash-memo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("m.bin");
        std::fs::write(&f, b"first").unwrap();
        let key = |f: &Path| {
            let m = std::fs::metadata(f).unwrap();
            (f.to_path_buf(), m.len(), m.modified().ok())
        };
        let a = disk_memo(&key(&f)).unwrap();
        a.write(&sha256_bytes(b"first"));
        assert_eq!(a.read(), Some(sha256_bytes(b"first")));
        // Rewritten (another size, another time): another name, nothing remembered.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&f, b"second!").unwrap();
        let b = disk_memo(&key(&f)).unwrap();
        assert_ne!(a.path, b.path);
        assert_eq!(b.read(), None);
        let _ = std::fs::remove_file(&a.path);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sha256_of_known_input() {
        assert_eq!(
            super::sha256_bytes(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
