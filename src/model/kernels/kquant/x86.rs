//! AVX2 and AVX-512 pieces shared by the three formats' SIMD kernels.

use super::super::panel::PANEL;
use super::q8k::{SUB_BLOCK_PAIRS, SUMS};
use std::arch::x86_64::*;

/// Lane `r` of the result is the sum of the eight i32 lanes of `acc[r]` (exact).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn sum_each(acc: &[__m256i; PANEL]) -> __m256i {
    let h01 = _mm256_hadd_epi32(acc[0], acc[1]);
    let h23 = _mm256_hadd_epi32(acc[2], acc[3]);
    let h45 = _mm256_hadd_epi32(acc[4], acc[5]);
    let h67 = _mm256_hadd_epi32(acc[6], acc[7]);
    // Each 128-bit half: rows 0..4 (resp. 4..8), partial sums of that half's lanes.
    let lo = _mm256_hadd_epi32(h01, h23);
    let hi = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(lo, hi),
        _mm256_permute2x128_si256::<0x31>(lo, hi),
    )
}

/// Row `r`'s activation sums of 16 values weighted by `w` (16 i16), `Σ_i w_i·bsums_r[i]`,
/// before the sum over `i`: eight lanes per row.
///
/// Panics unless `bsums` holds [`PANEL`] rows.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn weighted_sums(bsums: &[[i16; SUMS]], w: __m256i) -> [__m256i; PANEL] {
    assert!(bsums.len() >= PANEL);
    // SAFETY: r < PANEL ≤ bsums.len() (asserted above).
    std::array::from_fn(|r| unsafe {
        _mm256_madd_epi16(
            w,
            _mm256_loadu_si256(bsums.as_ptr().add(r) as *const __m256i),
        )
    })
}

/// For the eight rows of a panel: `Σ_s w_s·sub_block_sums_r[s]` over the eight 32-value
/// sub-blocks, `w` their weights (Q4_K/Q5_K's mins) as bytes, `sums` the super-block's four
/// entries of [`super::q8k::Q8KPanel::sub_block_sums`] (exact: |terms| < 2¹⁸).
///
/// Panics unless `sums` holds [`super::q8k::SUB_BLOCK_PAIRS`] entries.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn sub_block_weighted(sums: &[[i16; 2 * PANEL]], w: &[u8; 8]) -> __m256i {
    assert!(sums.len() >= SUB_BLOCK_PAIRS);
    // SAFETY: `w` holds 8 bytes.
    let w16 = unsafe { _mm_cvtepu8_epi16(_mm_loadl_epi64(w.as_ptr() as *const __m128i)) };
    // Pair t of weights (w_{2t}, w_{2t+1}) in every 32-bit lane (the upper half is never read).
    let w16 = _mm256_castsi128_si256(w16);
    let mut total = _mm256_setzero_si256();
    for t in 0..SUB_BLOCK_PAIRS {
        let pair = _mm256_permutevar8x32_epi32(w16, _mm256_set1_epi32(t as i32));
        // SAFETY: t < SUB_BLOCK_PAIRS ≤ sums.len() (asserted above).
        let s = unsafe { _mm256_loadu_si256(sums.as_ptr().add(t) as *const __m256i) };
        total = _mm256_add_epi32(total, _mm256_madd_epi16(pair, s));
    }
    total
}

/// `acc = fma(d_w·d_a, sums, acc)` for the eight rows at once: per lane, the operations of
/// the portable kernels.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn accumulate(acc: __m256, d_w: f32, d_a: __m256, sums: __m256i) -> __m256 {
    _mm256_fmadd_ps(
        _mm256_mul_ps(_mm256_set1_ps(d_w), d_a),
        _mm256_cvtepi32_ps(sums),
        acc,
    )
}

/// Two f16 (low, high half of `bits`) as f32: exact, as `half`'s conversion.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(crate) fn halves(bits: u32) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// `acc[r] += scale·(w·a_r)`, for the eight rows of a panel: `w` 32 unsigned weight values
/// (< 64, so `maddubs` cannot saturate against |a| ≤ 127), `scale` i16 per pair, `a` the
/// first row's 32 activations, the next rows `stride` bytes apart.
///
/// # Safety
/// `a + r·stride .. + 32` must be readable for r < 8.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn rows_dot(
    acc: &mut [__m256i; PANEL],
    w: __m256i,
    scale: __m256i,
    a: *const i8,
    stride: usize,
) {
    for (r, acc_r) in acc.iter_mut().enumerate() {
        // SAFETY: within the caller's promise.
        let qa = unsafe { _mm256_loadu_si256(a.add(r * stride) as *const __m256i) };
        let p = _mm256_madd_epi16(scale, _mm256_maddubs_epi16(w, qa));
        *acc_r = _mm256_add_epi32(*acc_r, p);
    }
}

/// [`rows_dot`] for 128 values per row in AVX-512 VNNI: `w[0]`, `w[1]` the weights of values
/// 0..64 and 64..128 (unsigned, < 64), each multiplied with a row's activations by `vpdpbusd`
/// into sums of four products (|sum| ≤ 4·63·127 < 2¹⁵), the two packed to i16 (no saturation
/// can occur) and multiplied by their scales with `vpdpwssd`: the same exact i32 sums as
/// `maddubs` + `madd`, in three multiplies per 128 values instead of four. `scale` holds, for
/// element `p` of 128-bit lane `L`, the scale of the sub-block of the packed sum there: from
/// `w[0]` lane `L` if `p < 4`, else from `w[1]` lane `L` (see [`spread_scales`]).
///
/// # Safety
/// `a + r·stride .. + 128` must be readable for r < 8; AVX-512 BW and VNNI must be present.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn rows_dot128(
    acc: &mut [__m512i; PANEL],
    w: [__m512i; 2],
    scale: __m512i,
    a: *const i8,
    stride: usize,
) {
    let zero = _mm512_setzero_si512();
    for (r, acc_r) in acc.iter_mut().enumerate() {
        // SAFETY: within the caller's promise.
        let (lo, hi) = unsafe {
            let row = a.add(r * stride);
            (
                _mm512_loadu_si512(row as *const __m512i),
                _mm512_loadu_si512(row.add(64) as *const __m512i),
            )
        };
        let packed = _mm512_packs_epi32(
            _mm512_dpbusd_epi32(zero, w[0], lo),
            _mm512_dpbusd_epi32(zero, w[1], hi),
        );
        *acc_r = _mm512_dpwssd_epi32(*acc_r, scale, packed);
    }
}

/// The scale vector of [`rows_dot128`]: element `e` is `scales[index[e]]` (`scales`: up to
/// 16 i16; `index` entries below 16).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
pub(crate) fn spread_scales(scales: __m256i, index: &[i16; 32]) -> __m512i {
    // SAFETY: `index` holds 32 i16, 64 bytes.
    let index = unsafe { _mm512_loadu_si512(index.as_ptr() as *const __m512i) };
    _mm512_permutexvar_epi16(index, _mm512_castsi256_si512(scales))
}

/// Lane `r` of the result is the sum of the sixteen i32 lanes of `acc[r]` (exact): a
/// transposing tree of unpacks and 128-bit shuffles.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
pub(crate) fn sum_each512(acc: &[__m512i; PANEL]) -> __m256i {
    // Per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] for rows x, y.
    let pairs: [__m512i; 4] = std::array::from_fn(|i| {
        let (x, y) = (acc[2 * i], acc[2 * i + 1]);
        _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y))
    });
    // Per 128-bit lane: one partial sum for each of four rows.
    let quads: [__m512i; 2] = std::array::from_fn(|i| {
        let (x, y) = (pairs[2 * i], pairs[2 * i + 1]);
        _mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y))
    });
    // Lanes: rows 0..4 twice, rows 4..8 twice.
    let halves = _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0x88>(quads[0], quads[1]),
        _mm512_shuffle_i32x4::<0xDD>(quads[0], quads[1]),
    );
    let rows = _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0x08>(halves, halves),
        _mm512_shuffle_i32x4::<0x0D>(halves, halves),
    );
    _mm512_castsi512_si256(rows)
}

/// Two 256-bit halves as one 512-bit register.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
pub(crate) fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// The eight floats of `v`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn lanes(v: __m256) -> [f32; PANEL] {
    let mut out = [0f32; PANEL];
    // SAFETY: `out` holds eight floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
    out
}
