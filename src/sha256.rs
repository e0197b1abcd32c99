//! SHA-256 in hex, of bytes and of a file's contents: the primitives under the input
//! fingerprints ([`crate::fingerprint`]) and the test models' download check
//! ([`crate::model::fetch`]), with no knowledge of model files.

use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// Hex SHA-256 of bytes.
pub fn of_bytes(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Hex SHA-256 of a file's contents, read in 1 MiB blocks (not mapped: hashing adds nothing
/// to RSS).
pub fn of_file(path: &Path) -> std::io::Result<String> {
    digest_of_file(Sha256::new(), path)
}

/// Hex digest of a file's contents by any hash of the `digest` family, after what `h` has
/// already been fed (the hub's git blob ids hash a header first), read in 1 MiB blocks.
pub fn digest_of_file<D: Digest>(mut h: D, path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// Lower-case hex digits of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_hashes_as_its_bytes() {
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(of_bytes(b"abc"), abc);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(of_file(&path).unwrap(), abc);
        assert_eq!(hex(&[0, 15, 255]), "000fff");
    }
}
