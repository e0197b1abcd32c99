//! Activations on the wire (`--comm-dtype`): pipeline activations and tensor-parallel partial
//! sums can travel as f32 (exact, the default), bf16, f16 or int8 (per-row absmax scale).
//! Every rank decodes its own contribution too, so all ranks of a group still compute the same
//! sum; only the value changes, by the rounding of the chosen type.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CommDtype {
    /// Exact.
    #[default]
    F32,
    Bf16,
    F16,
    /// 8-bit integers with one f32 scale per row (max |x| / 127).
    Int8,
}

impl std::fmt::Display for CommDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CommDtype::F32 => "f32",
            CommDtype::Bf16 => "bf16",
            CommDtype::F16 => "f16",
            CommDtype::Int8 => "int8",
        })
    }
}

/// Encodes `x` (rows of `row` values) as `dtype`.
pub fn encode(x: &[f32], row: usize, dtype: CommDtype) -> Vec<u8> {
    match dtype {
        CommDtype::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        CommDtype::Bf16 => x
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        CommDtype::F16 => x
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        CommDtype::Int8 => {
            let mut out = Vec::with_capacity(x.len() + x.len() / row.max(1) * 4);
            for r in x.chunks(row.max(1)) {
                let max = r.iter().fold(0f32, |m, v| m.max(v.abs()));
                let scale = if max > 0.0 { max / 127.0 } else { 1.0 };
                out.extend_from_slice(&scale.to_le_bytes());
                out.extend(
                    r.iter()
                        .map(|&v| (v / scale).round().clamp(-127.0, 127.0) as i8 as u8),
                );
            }
            out
        }
    }
}

/// Decodes what [`encode`] wrote; `None` when the length does not fit.
pub fn decode(b: &[u8], row: usize, dtype: CommDtype) -> Option<Vec<f32>> {
    let chunks = |n: usize| b.len().is_multiple_of(n).then(|| b.chunks_exact(n));
    Some(match dtype {
        CommDtype::F32 => chunks(4)?
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect(),
        CommDtype::Bf16 => chunks(2)?
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        CommDtype::F16 => chunks(2)?
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        CommDtype::Int8 => {
            let row = row.max(1);
            let mut out = Vec::new();
            for r in chunks(4 + row)? {
                let scale = f32::from_le_bytes(r[..4].try_into().expect("4 bytes"));
                out.extend(r[4..].iter().map(|&q| q as i8 as f32 * scale));
            }
            out
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_is_exact_and_the_others_are_within_their_rounding() {
        let row = 8;
        let x: Vec<f32> = (0..64).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
        let back = decode(&encode(&x, row, CommDtype::F32), row, CommDtype::F32).unwrap();
        assert_eq!(
            back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            x.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        for (dtype, rel) in [
            (CommDtype::Bf16, 1.0 / 128.0),
            (CommDtype::F16, 1.0 / 1024.0),
        ] {
            let back = decode(&encode(&x, row, dtype), row, dtype).unwrap();
            for (a, b) in x.iter().zip(&back) {
                assert!((a - b).abs() <= a.abs() * rel, "{dtype}: {a} vs {b}");
            }
        }
        let enc = encode(&x, row, CommDtype::Int8);
        assert_eq!(enc.len(), 64 + 8 * 4);
        let back = decode(&enc, row, CommDtype::Int8).unwrap();
        for (r, (a, b)) in x.chunks(row).zip(back.chunks(row)).enumerate() {
            let max = a.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (u, v) in a.iter().zip(b) {
                assert!(
                    (u - v).abs() <= max / 127.0 * 0.5 + 1e-6,
                    "row {r}: {u} vs {v}"
                );
            }
        }
        assert!(decode(&[0u8; 5], row, CommDtype::F32).is_none());
    }
}
