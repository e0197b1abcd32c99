//! The x86 micro-kernels of [`super`]: each performs [`super::accumulate_portable`]'s fused
//! multiply-adds in the same order per lane, only several lanes and outputs at a time. The
//! lane sums of weight row `c` live in `acc[c]` as `[panel row][8 lanes]`, which is also one
//! 512-bit register per pair of panel rows.

use super::{Job, LANES, PANEL};

/// Lane sums of one weight row against the eight panel rows.
type Lanes = [f32; PANEL * LANES];

pub(super) mod avx2 {
    use super::{Job, Lanes, LANES, PANEL};
    use crate::model::kernels::half_driver::sub_slices;
    use crate::model::kernels::half_driver::x86::{store256, sums256};
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// Panel rows per register tile (a panel is two halves).
    const ROWS: usize = 4;

    /// Chunks per sub-slice: 512 values, so that the panel's rows of it (16 KiB) and a tile's
    /// weight rows of it (6 KiB) stay together in a 32 KiB L1.
    const SUB_CHUNKS: usize = 64;

    /// `C` weight rows from row `c0` × panel rows `4h..4h+4` over chunks `chunks`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const C: usize>(
        job: &Job<'_>,
        (c0, h): (usize, usize),
        chunks: Range<usize>,
        acc: &mut [Lanes],
    ) {
        let (k, w) = (job.k, job.w.as_ptr().add(c0 * job.k));
        let x = job.panel.chunks.as_ptr().add(h * ROWS * LANES);
        // A pass over the first chunks starts from zero (the driver leaves `acc` as it was).
        let mut sums = sums256::<ROWS, C>(acc, c0, h * ROWS, chunks.start > 0);
        for ch in chunks {
            let wv: [__m256; C] =
                std::array::from_fn(|i| _mm256_loadu_ps(w.add(i * k + ch * LANES)));
            for (r, sums_r) in sums.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(x.add((ch * PANEL + r) * LANES));
                for (s, v) in sums_r.iter_mut().zip(&wv) {
                    *s = _mm256_fmadd_ps(*v, xv, *s);
                }
            }
        }
        store256(acc, c0, h * ROWS, &sums);
    }

    /// Every weight row of the job, three at a time (12 sums, 3 weights and an activation:
    /// the 16 registers), the panel's live halves one after the other on the same three rows
    /// (their weights read from L2 once per panel, not once per half: on a 2-core EPYC with a
    /// 32 KiB L1 the halves-outer order ran SmolLM2's 576 × 1536 down projection at 110
    /// GFLOP/s), over sub-slices of [`SUB_CHUNKS`] chunks (each lane's additions stay in
    /// chunk order: the sums wait in `acc` between sub-slices).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `acc` holds one entry per weight row and the panel
    /// the job's chunks (checked by the caller).
    #[target_feature(enable = "avx2,fma")]
    pub(in super::super) unsafe fn accumulate(job: &Job<'_>, acc: &mut [Lanes]) {
        let rows = acc.len();
        for chunks in sub_slices(job.chunks.clone(), SUB_CHUNKS) {
            let mut c0 = 0;
            while c0 < rows {
                for h in 0..job.live.div_ceil(ROWS) {
                    let at = (c0, h);
                    match rows - c0 {
                        3.. => tile::<3>(job, at, chunks.clone(), acc),
                        2 => tile::<2>(job, at, chunks.clone(), acc),
                        _ => tile::<1>(job, at, chunks.clone(), acc),
                    }
                }
                c0 += (rows - c0).min(3);
            }
        }
    }
}

pub(super) mod avx512 {
    use super::{Job, Lanes, LANES, PANEL};
    use crate::model::kernels::half_driver::x86::{store512, sums512};
    use std::arch::x86_64::*;

    /// Weight rows per register tile: 24 sums, 6 weights and an activation of the 32
    /// registers.
    const COLS: usize = 6;

    /// Eight weights in both halves of a register (`vbroadcastf64x4`: AVX-512F only).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn weights_x2(p: *const f32) -> __m512 {
        _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))))
    }

    /// `C` weight rows from row `c0` × the eight panel rows over the job's chunks.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn tile<const C: usize>(job: &Job<'_>, c0: usize, acc: &mut [Lanes]) {
        let (k, w) = (job.k, job.w.as_ptr().add(c0 * job.k));
        let x = job.panel.chunks.as_ptr();
        // A pass over the first chunks starts from zero (the driver leaves `acc` as it was).
        let mut sums = sums512::<C>(acc, c0, job.chunks.start > 0);
        // One pointer per weight row and indexed loads from them. Without `black_box` the
        // compiler derived each row's address from the previous one's every chunk (five adds
        // per chunk beside the 24 FMAs; the kernel alone on one core, a job of 96 rows of 512
        // values, measured 1.02× faster without: best of ten alternating runs).
        let rows: [*const f32; C] =
            std::array::from_fn(|i| std::hint::black_box(w.add(i * k + job.chunks.start * LANES)));
        let mut xp = x.add(job.chunks.start * PANEL * LANES);
        for step in 0..job.chunks.len() {
            let wv: [__m512; C] = std::array::from_fn(|i| weights_x2(rows[i].add(step * LANES)));
            for (q, sums_q) in sums.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(xp.add(2 * q * LANES));
                for (s, v) in sums_q.iter_mut().zip(&wv) {
                    *s = _mm512_fmadd_ps(*v, xv, *s);
                }
            }
            xp = xp.add(PANEL * LANES);
        }
        store512(acc, c0, &sums);
    }

    /// Every weight row of the job, [`COLS`] at a time, over the whole panel (rows past the
    /// live ones are zero in the panel and never read back).
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX2 and FMA; `acc` holds one entry per weight row and
    /// the panel the job's chunks (checked by the caller).
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(in super::super) unsafe fn accumulate(job: &Job<'_>, acc: &mut [Lanes]) {
        let rows = acc.len();
        let mut c0 = 0;
        while c0 < rows {
            match rows - c0 {
                COLS.. => tile::<COLS>(job, c0, acc),
                5 => tile::<5>(job, c0, acc),
                4 => tile::<4>(job, c0, acc),
                3 => tile::<3>(job, c0, acc),
                2 => tile::<2>(job, c0, acc),
                _ => tile::<1>(job, c0, acc),
            }
            c0 += (rows - c0).min(COLS);
        }
    }
}
