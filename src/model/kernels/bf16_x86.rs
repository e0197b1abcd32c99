//! The x86 micro-kernels of [`super`]: each performs [`super::accumulate_portable`]'s
//! operations in the same order per lane (the odd value's product, then the even one's, per
//! chunk), only several lanes and outputs at a time. The lane sums of weight row `c` live in
//! `acc[c]` as `[panel row][8 lanes]`, which is also one 512-bit register per pair of panel
//! rows. A pair of BF16 values is one 32-bit word: the even value in the low half, the odd
//! one in the high half, so `word & 0xffff0000` is the odd value as f32 and `word << 16` the
//! even one.

use super::{Job, CHUNK, LANES, PANEL};

/// Lane sums of one weight row against the eight panel rows.
type Lanes = [f32; PANEL * LANES];

pub(super) mod avx2 {
    use super::{Job, Lanes, CHUNK, PANEL};
    use crate::model::kernels::half_driver::x86::{store256, sums256};
    use crate::model::kernels::half_driver::{sub_slices, LANES};
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// Panel rows per register tile (a panel is two halves).
    const ROWS: usize = 4;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn odd(p: *const u16) -> __m256 {
        let v = _mm256_loadu_si256(p as *const __m256i);
        _mm256_castsi256_ps(_mm256_and_si256(
            v,
            _mm256_set1_epi32(0xffff_0000u32 as i32),
        ))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn even(p: *const u16) -> __m256 {
        let v = _mm256_loadu_si256(p as *const __m256i);
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v))
    }

    /// Chunks of activations widened at a time: a [`super::super::PanelKernel::K_SLICE`] of
    /// 1024 values, 16 KiB of f32 for half a panel (L1).
    const WIDE_CHUNKS: usize = 64;

    /// Half a panel's chunks widened to f32: per chunk and panel row its eight odd values,
    /// then its eight even ones (`[chunk][row][odd 8, even 8]`).
    type Wide = [f32; WIDE_CHUNKS * ROWS * CHUNK];

    /// Widens chunks `chunks` of panel rows `4h..4h+4` into `wide` (chunk `chunks.start` first).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn widen(job: &Job<'_>, chunks: Range<usize>, h: usize, wide: &mut Wide) {
        debug_assert!(chunks.len() <= WIDE_CHUNKS);
        let x = job.panel.chunks.as_ptr().add(h * ROWS * CHUNK);
        for (i, ch) in chunks.enumerate() {
            for r in 0..ROWS {
                let src = x.add((ch * PANEL + r) * CHUNK);
                let dst = wide.as_mut_ptr().add((i * ROWS + r) * CHUNK);
                _mm256_storeu_ps(dst, odd(src));
                _mm256_storeu_ps(dst.add(LANES), even(src));
            }
        }
    }

    /// `C` weight rows from row `c0` × panel rows `4h..4h+4` over chunks `chunks` (widened in
    /// `wide`): per chunk first every odd product, then every even one.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const C: usize>(
        job: &Job<'_>,
        (c0, h): (usize, usize),
        chunks: Range<usize>,
        wide: &Wide,
        acc: &mut [Lanes],
    ) {
        let (k, w) = (job.k, job.w.as_ptr().add(c0 * job.k));
        // A pass over the first chunks starts from zero (the driver leaves `acc` as it was).
        let mut sums = sums256::<ROWS, C>(acc, c0, h * ROWS, chunks.start > 0);
        for (i, ch) in chunks.enumerate() {
            let x = wide.as_ptr().add(i * ROWS * CHUNK);
            let wo: [__m256; C] = std::array::from_fn(|c| odd(w.add(c * k + ch * CHUNK)));
            for (r, sums_r) in sums.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(x.add(r * CHUNK));
                for (s, v) in sums_r.iter_mut().zip(&wo) {
                    *s = _mm256_fmadd_ps(*v, xv, *s);
                }
            }
            let we: [__m256; C] = std::array::from_fn(|c| even(w.add(c * k + ch * CHUNK)));
            for (r, sums_r) in sums.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(x.add(r * CHUNK + LANES));
                for (s, v) in sums_r.iter_mut().zip(&we) {
                    *s = _mm256_fmadd_ps(*v, xv, *s);
                }
            }
        }
        store256(acc, c0, h * ROWS, &sums);
    }

    /// Every weight row of the job, two at a time (three spilled a sum: a store and a reload
    /// in every chunk's chain, 0.6× the speed), over the panel's live halves, each half's
    /// activations widened to f32 once for all the job's weight rows (widened in every tile,
    /// they were two conversions for every four FMAs). Also tried on a 2-core EPYC (AVX2, 32
    /// KiB L1) and slower: the halves inner on the same weight rows (level), and one weight
    /// row against all eight panel rows (0.7×).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `acc` holds one entry per weight row and the panel
    /// the job's chunks (checked by the caller).
    #[target_feature(enable = "avx2,fma")]
    pub(in super::super) unsafe fn accumulate(job: &Job<'_>, acc: &mut [Lanes]) {
        let rows = acc.len();
        let mut wide: Wide = [0.0; WIDE_CHUNKS * ROWS * CHUNK];
        for chunks in sub_slices(job.chunks.clone(), WIDE_CHUNKS) {
            for h in 0..job.live.div_ceil(ROWS) {
                widen(job, chunks.clone(), h, &mut wide);
                let mut c0 = 0;
                while c0 < rows {
                    let at = (c0, h);
                    match rows - c0 {
                        2.. => tile::<2>(job, at, chunks.clone(), &wide, acc),
                        _ => tile::<1>(job, at, chunks.clone(), &wide, acc),
                    }
                    c0 += (rows - c0).min(2);
                }
            }
        }
    }

    /// Sixteen activations as [`super::super::activation_bits`]: rounded to BF16 (nearest
    /// even, NaNs made quiet), magnitudes below `2^(min_exp − 127)` made zero.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2,fma")]
    pub(in super::super) unsafe fn round16(src: &[f32], dst: &mut [u16], min_exp: u16) {
        assert!(src.len() == CHUNK && dst.len() == CHUNK);
        for half in 0..2 {
            let v = _mm256_loadu_ps(src.as_ptr().add(8 * half));
            let u = _mm256_castps_si256(v);
            let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(u), _mm256_set1_epi32(1));
            let bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd);
            let high = _mm256_set1_epi32(0xffff_0000u32 as i32);
            let rounded = _mm256_and_si256(_mm256_add_epi32(u, bias), high);
            let quiet = _mm256_or_si256(_mm256_and_si256(u, high), _mm256_set1_epi32(0x0040_0000));
            let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            let r = _mm256_blendv_epi8(rounded, quiet, nan);
            let exp = _mm256_and_si256(_mm256_srli_epi32::<23>(r), _mm256_set1_epi32(0xff));
            let tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(min_exp as i32), exp);
            let sign = _mm256_and_si256(r, _mm256_set1_epi32(0x8000_0000u32 as i32));
            let kept = _mm256_srli_epi32::<16>(_mm256_blendv_epi8(r, sign, tiny));
            let packed = _mm_packus_epi32(
                _mm256_castsi256_si128(kept),
                _mm256_extracti128_si256::<1>(kept),
            );
            _mm_storeu_si128(dst.as_mut_ptr().add(8 * half) as *mut __m128i, packed);
        }
    }
}

pub(super) mod avx512 {
    use super::{Job, Lanes, CHUNK, PANEL};
    use crate::model::kernels::half_driver::sub_slices;
    use crate::model::kernels::half_driver::x86::{store512, sums512};
    use std::arch::x86_64::*;

    /// A chunk of one weight row in both halves of a register.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn weights_x2(p: *const u16) -> __m512i {
        _mm512_broadcast_i64x4(_mm256_loadu_si256(p as *const __m256i))
    }

    /// Pairs of panel rows (one 512-bit register of lanes each).
    const PAIRS: usize = PANEL / 2;

    /// Chunks of activations widened at a time: a [`super::super::PanelKernel::K_SLICE`] of
    /// 1024 values, 32 KiB of f32 for the panel (L1).
    const WIDE_CHUNKS: usize = 64;

    /// The panel's chunks widened to f32 as the tile's registers take them: per chunk and
    /// pair of panel rows, the sixteen odd values, then the sixteen even ones
    /// (`[chunk][pair][odd 16, even 16]`).
    type Wide = [f32; WIDE_CHUNKS * PAIRS * 2 * CHUNK];

    /// Widens chunks `chunks` of the panel into `wide` (chunk `chunks.start` first): the same
    /// bits the tile formed from the BF16 words itself, once per job rather than once per
    /// four weight rows (they were half the vector work beside its FMAs).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn widen(job: &Job<'_>, chunks: std::ops::Range<usize>, wide: &mut Wide) {
        debug_assert!(chunks.len() <= WIDE_CHUNKS);
        let x = job.panel.chunks.as_ptr();
        let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
        for (i, ch) in chunks.enumerate() {
            for q in 0..PAIRS {
                let xr = _mm512_loadu_si512(x.add((ch * PANEL + 2 * q) * CHUNK) as *const _);
                let dst = wide.as_mut_ptr().add((i * PAIRS + q) * 2 * CHUNK);
                _mm512_storeu_ps(dst, _mm512_castsi512_ps(_mm512_and_si512(xr, high)));
                _mm512_storeu_ps(
                    dst.add(CHUNK),
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(xr)),
                );
            }
        }
    }

    /// `C` weight rows from row `c0` × the eight panel rows over chunks `chunks` (widened in
    /// `wide`, `chunks.start` first).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn tile<const C: usize>(
        job: &Job<'_>,
        (c0, chunks): (usize, std::ops::Range<usize>),
        wide: &Wide,
        acc: &mut [Lanes],
    ) {
        let (k, w) = (job.k, job.w.as_ptr().add(c0 * job.k));
        let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
        // A pass over the first chunks starts from zero (the driver leaves `acc` as it was).
        let mut sums = sums512::<C>(acc, c0, chunks.start > 0);
        for (i, ch) in chunks.enumerate() {
            let wr: [__m512i; C] = std::array::from_fn(|i| weights_x2(w.add(i * k + ch * CHUNK)));
            let wo = wr.map(|v| _mm512_castsi512_ps(_mm512_and_si512(v, high)));
            let we = wr.map(|v| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v)));
            for (q, sums_q) in sums.iter_mut().enumerate() {
                let x = wide.as_ptr().add((i * PAIRS + q) * 2 * CHUNK);
                let (xo, xe) = (_mm512_loadu_ps(x), _mm512_loadu_ps(x.add(CHUNK)));
                for ((s, o), e) in sums_q.iter_mut().zip(&wo).zip(&we) {
                    *s = _mm512_fmadd_ps(*o, xo, *s);
                    *s = _mm512_fmadd_ps(*e, xe, *s);
                }
            }
        }
        store512(acc, c0, &sums);
    }

    /// Every weight row of the job, four at a time, over the whole panel, its activations
    /// widened once per slice of chunks.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL, AVX2 and FMA; `acc` holds one entry per weight
    /// row and the panel the job's chunks (checked by the caller).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(in super::super) unsafe fn accumulate(job: &Job<'_>, acc: &mut [Lanes]) {
        let rows = acc.len();
        let mut wide: Wide = [0.0; WIDE_CHUNKS * PAIRS * 2 * CHUNK];
        for chunks in sub_slices(job.chunks.clone(), WIDE_CHUNKS) {
            widen(job, chunks.clone(), &mut wide);
            let mut c0 = 0;
            while c0 < rows {
                let at = (c0, chunks.clone());
                match rows - c0 {
                    4.. => tile::<4>(job, at, &wide, acc),
                    3 => tile::<3>(job, at, &wide, acc),
                    2 => tile::<2>(job, at, &wide, acc),
                    _ => tile::<1>(job, at, &wide, acc),
                }
                c0 += (rows - c0).min(4);
            }
        }
    }
}

pub(super) mod avx512bf16 {
    use super::avx512::weights_x2;
    use super::{Job, Lanes, CHUNK, PANEL};
    use crate::model::kernels::half_driver::x86::{store512, sums512};
    use std::arch::x86_64::*;

    /// `C` weight rows from row `c0` × the eight panel rows over the job's chunks: one
    /// `vdpbf16ps` per weight row and pair of panel rows per chunk.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
    unsafe fn tile<const C: usize>(job: &Job<'_>, c0: usize, acc: &mut [Lanes]) {
        let (k, w) = (job.k, job.w.as_ptr().add(c0 * job.k));
        let x = job.panel.chunks.as_ptr();
        // A pass over the first chunks starts from zero (the driver leaves `acc` as it was).
        let mut sums = sums512::<C>(acc, c0, job.chunks.start > 0);
        for ch in job.chunks.clone() {
            // SAFETY (the transmutes): 512-bit vectors of the same size; the bits are BF16
            // pairs.
            let wr: [__m512bh; C] = std::array::from_fn(|i| {
                std::mem::transmute::<__m512i, __m512bh>(weights_x2(w.add(i * k + ch * CHUNK)))
            });
            for (q, sums_q) in sums.iter_mut().enumerate() {
                let xr = _mm512_loadu_si512(x.add((ch * PANEL + 2 * q) * CHUNK) as *const _);
                let xr = std::mem::transmute::<__m512i, __m512bh>(xr);
                for (s, v) in sums_q.iter_mut().zip(&wr) {
                    *s = _mm512_dpbf16_ps(*s, *v, xr);
                }
            }
        }
        store512(acc, c0, &sums);
    }

    /// Every weight row of the job, four at a time, over the whole panel.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL/BF16, AVX2 and FMA; `acc` holds one entry per
    /// weight row and the panel the job's chunks (checked by the caller).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
    pub(in super::super) unsafe fn accumulate(job: &Job<'_>, acc: &mut [Lanes]) {
        let rows = acc.len();
        let mut c0 = 0;
        while c0 < rows {
            match rows - c0 {
                4.. => tile::<4>(job, c0, acc),
                3 => tile::<3>(job, c0, acc),
                2 => tile::<2>(job, c0, acc),
                _ => tile::<1>(job, c0, acc),
            }
            c0 += (rows - c0).min(4);
        }
    }

    /// `vdpbf16ps` on one register: `acc` plus the products of the BF16 pairs of `a` and `b`
    /// (tests compare it with the portable definition).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BF16.
    #[cfg(test)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(in super::super) unsafe fn dot_pairs(
        acc: &[f32; 16],
        a: &[u16; 32],
        b: &[u16; 32],
    ) -> [f32; 16] {
        let av = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(a.as_ptr() as _));
        let bv = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(b.as_ptr() as _));
        let r = _mm512_dpbf16_ps(_mm512_loadu_ps(acc.as_ptr()), av, bv);
        let mut out = [0f32; 16];
        _mm512_storeu_ps(out.as_mut_ptr(), r);
        out
    }
}
