//! Non-finite weights: a NaN or an infinity among a tensor's stored values.
//!
//! A NaN in one block scale turns every logit it reaches into NaN, and a NaN NLL used to be
//! summed as 0 (PPL 1.0000, exit 0). [`first_non_finite`] finds the first bad value of a
//! tensor's raw bytes cheaply: for block-quantized types only the block scales (an f16 or f32
//! per block, read at a fixed stride), for F32/F16/BF16 every value (a bit test each, no
//! conversion). It runs where tensor bytes are handed out ([`super::GgufFile::tensor_data`]),
//! so every loader (whole model, shards, export) checks exactly the tensors it reads.

use candle_core::quantized::GgmlDType;

/// Where a float sits inside one block of a quantized type.
#[derive(Clone, Copy)]
enum Field {
    /// An IEEE half at this byte offset.
    F16(usize),
    /// An IEEE single at this byte offset.
    F32(usize),
}

/// The scale fields of one block (ggml's block layouts).
fn scale_fields(dtype: GgmlDType) -> &'static [Field] {
    use Field::*;
    match dtype {
        // d
        GgmlDType::Q4_0 | GgmlDType::Q5_0 | GgmlDType::Q8_0 => &[F16(0)],
        // d, m
        GgmlDType::Q4_1 | GgmlDType::Q5_1 | GgmlDType::Q8_1 => &[F16(0), F16(2)],
        // scales[16], qs[64], d, dmin
        GgmlDType::Q2K => &[F16(80), F16(82)],
        // hmask[32], qs[64], scales[12], d
        GgmlDType::Q3K => &[F16(108)],
        // d, dmin, scales[12], (qh[32],) qs[128]
        GgmlDType::Q4K | GgmlDType::Q5K => &[F16(0), F16(2)],
        // ql[128], qh[64], scales[16], d
        GgmlDType::Q6K => &[F16(208)],
        // d (f32), qs[256], bsums[16]
        GgmlDType::Q8K => &[F32(0)],
        _ => &[],
    }
}

fn half_bad(b: &[u8], at: usize) -> bool {
    let h = u16::from_le_bytes([b[at], b[at + 1]]);
    h & 0x7c00 == 0x7c00
}

fn single_bad(b: &[u8], at: usize) -> bool {
    let x = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    x & 0x7f80_0000 == 0x7f80_0000
}

fn value(b: &[u8], at: usize, bytes: usize) -> f32 {
    match bytes {
        4 => f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]),
        _ => half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32(),
    }
}

/// Bytes per parallel span of the dense scan (a multiple of every element width).
const SPAN_BYTES: usize = 1 << 18;

/// Whether any `width`-byte (2 or 4) little-endian element of `span` has every bit of `exp`
/// (its exponent field) set, i.e. is an infinity or a NaN: eight bytes at a time with word
/// arithmetic, no branch per element, so that it vectorises (a per-element test was most of
/// a 2 GB BF16 model's load).
fn span_has_non_finite(span: &[u8], width: usize, exp: u64) -> bool {
    // A lane is bad when `(x & exp) ^ exp` is zero; "some lane of t is zero" is exactly
    // `(t - ones) & !t & highs != 0` (the classic zero-lane test: no lane borrows unless a
    // lower lane is zero, so it never fires without one).
    let (ones, highs) = if width == 2 {
        (0x0001_0001_0001_0001u64, 0x8000_8000_8000_8000u64)
    } else {
        (0x0000_0001_0000_0001u64, 0x8000_0000_8000_0000u64)
    };
    let mask = exp.wrapping_mul(ones);
    let words = span.chunks_exact(8);
    let rest = words.remainder();
    let any = words.fold(false, |any, w| {
        let mut word = [0u8; 8];
        word.copy_from_slice(w);
        let t = (u64::from_le_bytes(word) & mask) ^ mask;
        any | (t.wrapping_sub(ones) & !t & highs != 0)
    });
    any || rest.chunks_exact(width).any(|e| {
        let x = e
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        x & exp == exp
    })
}

/// The index of the first element of `width` bytes whose exponent field `exp` is all ones:
/// the spans are tested in parallel without early exits, then the first bad span element by
/// element.
fn first_bad_element(bytes: &[u8], width: usize, exp: u64) -> Option<usize> {
    use rayon::prelude::*;
    let span = bytes
        .par_chunks(SPAN_BYTES)
        .position_first(|span| span_has_non_finite(span, width, exp))?;
    let base = span * SPAN_BYTES;
    let span = &bytes[base..(base + SPAN_BYTES).min(bytes.len())];
    (0..span.len() / width)
        .find(|&i| span_has_non_finite(&span[width * i..width * (i + 1)], width, exp))
        .map(|i| base / width + i)
}

/// The first non-finite stored value of a tensor of `dtype` held in `bytes`: a description
/// such as `"block 12's scale is NaN"` or `"element 7 is inf"`, or `None` when all are finite.
pub fn first_non_finite(dtype: GgmlDType, bytes: &[u8]) -> Option<String> {
    let describe = |x: f32| if x.is_nan() { "NaN" } else { "infinite" };
    match dtype {
        GgmlDType::F32 => first_bad_element(bytes, 4, 0x7f80_0000)
            .map(|i| format!("element {i} is {}", describe(value(bytes, 4 * i, 4)))),
        GgmlDType::F16 => first_bad_element(bytes, 2, 0x7c00)
            .map(|i| format!("element {i} is {}", describe(value(bytes, 2 * i, 2)))),
        GgmlDType::BF16 => first_bad_element(bytes, 2, 0x7f80).map(|i| {
            let bits = u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]);
            let nan = bits & 0x007f != 0;
            format!("element {i} is {}", if nan { "NaN" } else { "infinite" })
        }),
        other => {
            let fields = scale_fields(other);
            let block = other.type_size();
            if fields.is_empty() || block == 0 {
                return None;
            }
            // Spans of whole blocks are tested in parallel (a scale per block is a read per
            // cache line: memory-bound, a tenth of a second for a 1 GB model on one core),
            // then the first bad span's blocks one by one, for the description.
            use rayon::prelude::*;
            let bad = |b: &[u8]| {
                fields.iter().any(|f| match *f {
                    Field::F16(at) => half_bad(b, at),
                    Field::F32(at) => single_bad(b, at),
                })
            };
            let span_bytes = (SPAN_BYTES / block).max(1) * block;
            let span = bytes
                .par_chunks(span_bytes)
                .position_first(|span| span.chunks_exact(block).any(bad))?;
            let first_block = span * span_bytes / block;
            let span = &bytes[span * span_bytes..(span * span_bytes + span_bytes).min(bytes.len())];
            for (k, b) in span.chunks_exact(block).enumerate() {
                let k = first_block + k;
                for (j, f) in fields.iter().enumerate() {
                    let (bad, at, width) = match *f {
                        Field::F16(at) => (half_bad(b, at), at, 2),
                        Field::F32(at) => (single_bad(b, at), at, 4),
                    };
                    if bad {
                        let which = if j == 0 { "scale" } else { "minimum" };
                        return Some(format!(
                            "block {k}'s {which} is {}",
                            describe(value(b, at, width))
                        ));
                    }
                }
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_types_name_the_first_bad_element() {
        let mut f32s: Vec<u8> = [1.0f32, -2.5, 3.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(first_non_finite(GgmlDType::F32, &f32s), None);
        f32s[4..8].copy_from_slice(&f32::NAN.to_le_bytes());
        assert_eq!(
            first_non_finite(GgmlDType::F32, &f32s).as_deref(),
            Some("element 1 is NaN")
        );
        let f16s: Vec<u8> = [half::f16::ONE, half::f16::NEG_INFINITY]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(
            first_non_finite(GgmlDType::F16, &f16s).as_deref(),
            Some("element 1 is infinite")
        );
        let bf16s: Vec<u8> = [half::bf16::NAN, half::bf16::ONE]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(
            first_non_finite(GgmlDType::BF16, &bf16s).as_deref(),
            Some("element 0 is NaN")
        );
        // The largest finite values are not flagged.
        let max: Vec<u8> = f32::MAX.to_le_bytes().to_vec();
        assert_eq!(first_non_finite(GgmlDType::F32, &max), None);
    }

    #[test]
    fn the_first_bad_element_is_found_across_parallel_spans() {
        // Three spans and a partial one of BF16 ones, two bad values in the third span.
        let n = (3 * SPAN_BYTES + 100) / 2;
        let mut b: Vec<u8> = (0..n).flat_map(|_| 0x3f80u16.to_le_bytes()).collect();
        assert_eq!(first_non_finite(GgmlDType::BF16, &b), None);
        let late = SPAN_BYTES / 2 * 2 + 777;
        b[2 * (late + 5000)..][..2].copy_from_slice(&0x7fc0u16.to_le_bytes());
        b[2 * late..][..2].copy_from_slice(&0xff80u16.to_le_bytes());
        assert_eq!(
            first_non_finite(GgmlDType::BF16, &b),
            Some(format!("element {late} is infinite"))
        );
        // The last (partial) span alone.
        let mut f: Vec<u8> = (0..n / 2).flat_map(|_| 1.0f32.to_le_bytes()).collect();
        let last = n / 2 - 1;
        f[4 * last..].copy_from_slice(&f32::NAN.to_le_bytes());
        assert_eq!(
            first_non_finite(GgmlDType::F32, &f),
            Some(format!("element {last} is NaN"))
        );
    }

    #[test]
    fn the_word_test_agrees_with_the_per_element_definition() {
        // Values around every boundary of the exponent fields, in every lane position and
        // span length (so word and remainder paths both see each).
        let halves = [
            0x0000u16, 0x7f7f, 0x7f80, 0x7fc0, 0xff80, 0x8000, 0x7bff, 0x7c00, 0xfc01, 0x3f80,
            0x0001, 0xffff,
        ];
        let singles = [
            0u32,
            0x7f7f_ffff,
            0x7f80_0000,
            0xff80_0001,
            0x8000_0000,
            0x3f80_0000,
            0xffff_ffff,
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for len in 0..24 {
            for _ in 0..200 {
                for exp in [0x7f80u64, 0x7c00] {
                    let v: Vec<u16> = (0..len).map(|_| halves[next(halves.len())]).collect();
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    let naive = v.iter().any(|&x| u64::from(x) & exp == exp);
                    assert_eq!(span_has_non_finite(&bytes, 2, exp), naive, "{v:x?}");
                }
                let v: Vec<u32> = (0..len).map(|_| singles[next(singles.len())]).collect();
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                let naive = v.iter().any(|&x| x & 0x7f80_0000 == 0x7f80_0000);
                assert_eq!(span_has_non_finite(&bytes, 4, 0x7f80_0000), naive, "{v:x?}");
            }
        }
    }

    #[test]
    fn quantized_blocks_are_checked_by_their_scales() {
        // Two Q4_1 blocks (20 bytes: d, m, 16 bytes of nibbles); nibbles never matter.
        let mut q = vec![0xffu8; 40];
        for b in q.chunks_exact_mut(20) {
            b[0..2].copy_from_slice(&half::f16::ONE.to_le_bytes());
            b[2..4].copy_from_slice(&half::f16::ZERO.to_le_bytes());
        }
        assert_eq!(first_non_finite(GgmlDType::Q4_1, &q), None);
        q[22..24].copy_from_slice(&half::f16::NAN.to_le_bytes());
        assert_eq!(
            first_non_finite(GgmlDType::Q4_1, &q).as_deref(),
            Some("block 1's minimum is NaN")
        );
        // Q6_K keeps its scale last, at byte 208 of 210.
        let mut k = vec![0u8; 210];
        assert_eq!(first_non_finite(GgmlDType::Q6K, &k), None);
        k[208..210].copy_from_slice(&half::f16::INFINITY.to_le_bytes());
        assert_eq!(
            first_non_finite(GgmlDType::Q6K, &k).as_deref(),
            Some("block 0's scale is infinite")
        );
    }

    #[test]
    fn the_first_bad_block_is_found_across_parallel_spans() {
        // 30,000 Q8_0 blocks (34 bytes: d, 32 bytes) span several parallel spans; the first
        // bad block is named, whichever span a later one sits in.
        let mut q = vec![0u8; 30_000 * 34];
        assert_eq!(first_non_finite(GgmlDType::Q8_0, &q), None);
        for (at, value) in [(29_999, half::f16::NAN), (20_000, half::f16::INFINITY)] {
            q[at * 34..at * 34 + 2].copy_from_slice(&value.to_le_bytes());
        }
        assert_eq!(
            first_non_finite(GgmlDType::Q8_0, &q).as_deref(),
            Some("block 20000's scale is infinite")
        );
        q[7 * 34..7 * 34 + 2].copy_from_slice(&half::f16::NAN.to_le_bytes());
        assert_eq!(
            first_non_finite(GgmlDType::Q8_0, &q).as_deref(),
            Some("block 7's scale is NaN")
        );
    }
}
