//! Helpers shared by unit tests.

/// `n` reproducible pseudo-random values, uniform in `[-scale/2, scale/2)` (an LCG: the same
/// values on every machine).
pub fn uniform(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        })
        .collect()
}
