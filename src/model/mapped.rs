//! A tensor's bytes inside the model file's memory map, shareable by a kernel that multiplies
//! them where they lie instead of copying them out.
//!
//! Why: copying a 2 GB BF16 model into fresh anonymous memory cost more than a one-chunk
//! evaluation's arithmetic (zeroing and faulting in every new page, then the copy), and held
//! the weights in anonymous memory that the kernel only reads. A kernel that keeps a
//! [`MappedBytes`] keeps the file mapped (an `Arc` of the map) for as long as it lives, and
//! marks the bytes as kept so that the loader does not drop the pages it just decided to use
//! (see [`MappedBytes::is_kept`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use memmap2::Mmap;

/// `len` bytes at `start` of a read-only file map.
#[derive(Clone)]
pub struct MappedBytes {
    map: Arc<Mmap>,
    start: usize,
    len: usize,
    /// Set once any holder keeps these bytes beyond loading (shared by the clones).
    kept: Arc<AtomicBool>,
}

impl MappedBytes {
    /// The range `start..start + len` of `map`; `None` when it lies outside the map.
    pub fn new(map: Arc<Mmap>, start: usize, len: usize) -> Option<Self> {
        (start.checked_add(len)? <= map.len()).then(|| Self {
            map,
            start,
            len,
            kept: Arc::new(AtomicBool::new(false)),
        })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }

    /// A handle for a holder that uses the bytes in place from now on.
    pub fn keep(&self) -> Self {
        self.kept.store(true, Ordering::Relaxed);
        self.clone()
    }

    /// Whether a holder uses the bytes in place (so their pages must stay mapped).
    pub fn is_kept(&self) -> bool {
        self.kept.load(Ordering::Relaxed)
    }

    /// The bytes as little-endian `u16` values, borrowed, when their address is 2-aligned
    /// and the target is little-endian (GGUF aligns tensor data to 32 bytes); `None` otherwise.
    pub fn as_u16(&self) -> Option<&[u16]> {
        let bytes = self.bytes();
        if cfg!(target_endian = "big") || !bytes.len().is_multiple_of(2) {
            return None;
        }
        // SAFETY: every bit pattern is a valid u16; `align_to` only yields a middle part that
        // is correctly aligned, and an empty prefix and suffix mean it covers all the bytes.
        let (pre, mid, post) = unsafe { bytes.align_to::<u16>() };
        (pre.is_empty() && post.is_empty()).then_some(mid)
    }

    /// The bytes as little-endian `f32` values, borrowed, when their address is 4-aligned
    /// and the target is little-endian (GGUF aligns tensor data to 32 bytes); `None` otherwise.
    pub fn as_f32(&self) -> Option<&[f32]> {
        let bytes = self.bytes();
        if cfg!(target_endian = "big") || !bytes.len().is_multiple_of(4) {
            return None;
        }
        // SAFETY: every bit pattern is a valid f32; `align_to` only yields a middle part that
        // is correctly aligned, and an empty prefix and suffix mean it covers all the bytes.
        let (pre, mid, post) = unsafe { bytes.align_to::<f32>() };
        (pre.is_empty() && post.is_empty()).then_some(mid)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `bytes` written to a temporary file (removed at once) and mapped.
    pub(crate) fn map_of(bytes: &[u8]) -> Arc<Mmap> {
        use std::sync::atomic::AtomicUsize;
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "ppl-mapped-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, bytes).expect("write");
        let file = std::fs::File::open(&path).expect("open");
        // SAFETY: a private temporary file nobody else writes.
        let map = unsafe { Mmap::map(&file) }.expect("map");
        let _ = std::fs::remove_file(&path);
        Arc::new(map)
    }

    #[test]
    fn ranges_are_checked_values_read_and_keeping_is_shared() {
        let map = map_of(&[1, 0, 2, 0, 3, 0, 4]);
        assert!(MappedBytes::new(map.clone(), 4, 4).is_none());
        let m = MappedBytes::new(map.clone(), 2, 4).expect("inside");
        assert_eq!(m.bytes(), &[2, 0, 3, 0]);
        assert_eq!(m.as_u16(), Some(&[2u16, 3][..]));
        // An odd address or length is not read as u16.
        assert!(MappedBytes::new(map.clone(), 1, 4)
            .expect("inside")
            .as_u16()
            .is_none());
        assert!(MappedBytes::new(map, 0, 3)
            .expect("inside")
            .as_u16()
            .is_none());
        assert!(!m.is_kept());
        let held = m.keep();
        assert!(m.is_kept() && held.is_kept());
    }
}
