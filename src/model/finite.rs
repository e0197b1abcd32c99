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

fn bf16_bad(b: &[u8], at: usize) -> bool {
    let h = u16::from_le_bytes([b[at], b[at + 1]]);
    h & 0x7f80 == 0x7f80
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

/// The index of the first element of `width` bytes for which `bad` holds: the spans are
/// tested in parallel without early exits (which vectorises; one pass over a 2 GB BF16 model
/// element by element took a tenth of its load), then the first bad span element by element.
fn first_bad_element<F>(bytes: &[u8], width: usize, bad: F) -> Option<usize>
where
    F: Fn(&[u8], usize) -> bool + Sync,
{
    use rayon::prelude::*;
    let span = bytes.par_chunks(SPAN_BYTES).position_first(|span| {
        span.chunks_exact(width)
            .fold(false, |any, value| any | bad(value, 0))
    })?;
    let base = span * SPAN_BYTES;
    let span = &bytes[base..(base + SPAN_BYTES).min(bytes.len())];
    (0..span.len() / width)
        .find(|&i| bad(span, width * i))
        .map(|i| base / width + i)
}

/// The first non-finite stored value of a tensor of `dtype` held in `bytes`: a description
/// such as `"block 12's scale is NaN"` or `"element 7 is inf"`, or `None` when all are finite.
pub fn first_non_finite(dtype: GgmlDType, bytes: &[u8]) -> Option<String> {
    let describe = |x: f32| if x.is_nan() { "NaN" } else { "infinite" };
    match dtype {
        GgmlDType::F32 => first_bad_element(bytes, 4, single_bad)
            .map(|i| format!("element {i} is {}", describe(value(bytes, 4 * i, 4)))),
        GgmlDType::F16 => first_bad_element(bytes, 2, half_bad)
            .map(|i| format!("element {i} is {}", describe(value(bytes, 2 * i, 2)))),
        GgmlDType::BF16 => first_bad_element(bytes, 2, bf16_bad).map(|i| {
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
            for (k, b) in bytes.chunks_exact(block).enumerate() {
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
}
