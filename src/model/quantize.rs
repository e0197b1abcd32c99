//! Weight-only quantization at load (`--quantize`): what a quantized checkpoint would hold,
//! computed from the weights as stored.
//!
//! - `int4` (torchao's `int4_weight_only`): asymmetric per group of `group_size` consecutive
//!   inputs of a row: `scale = (max − min) / 15`, `q = clamp(round((w − min) / scale), 0, 15)`,
//!   `ŵ = min + q · scale`. A group never spans two rows, so a row-sharded (tensor-parallel)
//!   weight quantizes to the same values as the whole one; a column shard must start on a
//!   group boundary (checked where shards are cut).
//! - `int8`: symmetric per output channel (row): `scale = max|w| / 127`, `q = round(w / scale)`.
//!
//! Both return the dequantized values `ŵ` in f32: the model is then evaluated with exactly the
//! weights an int4/int8 weight-only kernel would multiply by (its activations stay f32).

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

/// Quantization schemes `--quantize` offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Scheme {
    /// torchao's int4 weight-only: asymmetric, per group (`--group-size`).
    Int4,
    /// int8 weight-only: symmetric, per output channel.
    Int8,
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q4_1")]
    Q4_1,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q2_k")]
    Q2K,
    #[value(name = "q3_k")]
    Q3K,
    #[value(name = "q4_k")]
    Q4K,
    #[value(name = "q6_k")]
    Q6K,
    /// llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for the output layer and for `attn_v` and
    /// `ffn_down` of the layers its `use_more_bits` rule picks.
    #[value(name = "q4_k_m")]
    Q4KM,
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Scheme::Int4 => "int4",
            Scheme::Int8 => "int8",
            Scheme::Q4_0 => "q4_0",
            Scheme::Q4_1 => "q4_1",
            Scheme::Q8_0 => "q8_0",
            Scheme::Q2K => "q2_k",
            Scheme::Q3K => "q3_k",
            Scheme::Q4K => "q4_k",
            Scheme::Q6K => "q6_k",
            Scheme::Q4KM => "q4_k_m",
        })
    }
}

impl Scheme {
    /// The GGUF type of a GGUF scheme (a mix: its main type).
    pub fn ggml(self) -> Option<GgmlDType> {
        match self {
            Scheme::Int4 | Scheme::Int8 => None,
            Scheme::Q4_0 => Some(GgmlDType::Q4_0),
            Scheme::Q4_1 => Some(GgmlDType::Q4_1),
            Scheme::Q8_0 => Some(GgmlDType::Q8_0),
            Scheme::Q2K => Some(GgmlDType::Q2K),
            Scheme::Q3K => Some(GgmlDType::Q3K),
            Scheme::Q4K => Some(GgmlDType::Q4K),
            Scheme::Q6K => Some(GgmlDType::Q6K),
            Scheme::Q4KM => Some(GgmlDType::Q4K),
        }
    }

    /// Values along a row that must stay together (a block or group): a tensor-parallel
    /// column cut must fall on a multiple of it.
    pub fn block(self, group_size: usize) -> usize {
        match self {
            Scheme::Int4 => group_size,
            Scheme::Int8 => 1,
            s => s.ggml().map_or(1, |d| d.block_size()),
        }
    }
}

/// Which weights are quantized at load, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quantize {
    pub scheme: Scheme,
    /// Values per int4 group along a row.
    pub group_size: usize,
    /// Also the token embedding table (lookups then read quantized rows).
    pub embeddings: bool,
    /// Also the output layer.
    pub output: bool,
}

impl Quantize {
    /// Whether the token embedding table's lookups read quantized rows. A GGUF type treats
    /// a tied table as the one tensor it is in a file: it follows the output layer's choice
    /// (as llama.cpp's quantizer does), so `--quantize q4_0` at load scores exactly what
    /// `ppl quantize --type q4_0` writes. The torchao-style schemes quantize linear layers
    /// only: a tied table's lookups keep the stored values unless `embeddings` is asked for.
    pub fn covers_embeddings(&self, tied: bool) -> bool {
        if tied && self.scheme.ggml().is_some() {
            self.output
        } else {
            self.embeddings
        }
    }
}

/// A weight after quantization: the dequantized values (int4, int8), or a GGUF-typed tensor.
pub enum Quantized {
    Dense(Tensor),
    /// Shared: the model holds it as it comes (candle's CUDA storage makes it large).
    Ggml(std::sync::Arc<QTensor>),
}

/// The GGUF type used for a row of `cols` values: K-quants need rows of multiples of 256;
/// otherwise, as llama.cpp's quantizer does, Q4_K falls back to Q5_0, Q5_K to Q5_1 and Q6_K
/// to Q8_0, and Q2_K and Q3_K to Q4_0 (llama.cpp's `llama_tensor_get_type` as of the llama-cpp-python
/// 0.3.36 sdist; some 2024 releases used IQ4_NL there, which ppl reads but does not write).
pub fn ggml_type_for(dtype: GgmlDType, cols: usize) -> GgmlDType {
    if cols.is_multiple_of(dtype.block_size()) {
        return dtype;
    }
    match dtype {
        GgmlDType::Q2K | GgmlDType::Q3K => GgmlDType::Q4_0,
        GgmlDType::Q4K => GgmlDType::Q5_0,
        GgmlDType::Q5K => GgmlDType::Q5_1,
        GgmlDType::Q6K => GgmlDType::Q8_0,
        d => d,
    }
}

/// Where a weight sits in the model: mixes (`q4_k_m`) choose its type by it.
#[derive(Debug, Clone, Copy)]
pub struct Site<'a> {
    /// GGUF tensor name, e.g. `blk.3.attn_v.weight`.
    pub name: &'a str,
    pub n_layers: usize,
    /// The output layer, or a tied embedding table (which follows the output's type, as in
    /// llama.cpp's quantizer).
    pub output: bool,
}

impl Site<'_> {
    /// The block index in a `blk.N.…` name.
    fn layer(&self) -> Option<usize> {
        self.name
            .strip_prefix("blk.")?
            .split('.')
            .next()?
            .parse()
            .ok()
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third in
/// between.
fn use_more_bits(layer: usize, n_layers: usize) -> bool {
    let (i, n) = (layer as i64, n_layers as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

impl Quantize {
    /// The GGUF type the weight at `site` with rows of `cols` values is quantized to (`None`
    /// for int4/int8).
    pub fn ggml_type(&self, site: &Site, cols: usize) -> Option<GgmlDType> {
        let main = self.scheme.ggml()?;
        let dtype = match self.scheme {
            Scheme::Q4KM => {
                let more_bits = (site.name.contains("attn_v") || site.name.contains("ffn_down"))
                    && site
                        .layer()
                        .is_some_and(|i| use_more_bits(i, site.n_layers));
                if site.output || more_bits {
                    GgmlDType::Q6K
                } else {
                    main
                }
            }
            _ => main,
        };
        Some(ggml_type_for(dtype, cols))
    }
}

/// Quantizes an f32 weight `[rows, cols]` sitting at `site`.
pub fn quantize(q: &Quantize, w: &Tensor, site: &Site) -> candle_core::Result<Quantized> {
    let (rows, cols) = w.dims2()?;
    match q.ggml_type(site, cols) {
        Some(dtype) => Ok(Quantized::Ggml(std::sync::Arc::new(QTensor::quantize(
            w, dtype,
        )?))),
        None => {
            let v = w.flatten_all()?.to_vec1::<f32>()?;
            let out = match q.scheme {
                Scheme::Int4 => int4_groups(&v, cols, q.group_size),
                _ => int8_rows(&v, cols),
            };
            Ok(Quantized::Dense(Tensor::from_vec(
                out,
                (rows, cols),
                &Device::Cpu,
            )?))
        }
    }
}

/// Quantizes and dequantizes `w` (`rows × cols`, row-major) to int4 with groups of
/// `group` values along each row (a row whose length is not a multiple of `group` ends with a
/// shorter group).
pub fn int4_groups(w: &[f32], cols: usize, group: usize) -> Vec<f32> {
    assert!(group > 0 && cols > 0, "empty groups");
    let mut out = Vec::with_capacity(w.len());
    for g in w.chunks(cols).flat_map(|row| row.chunks(group)) {
        let (min, max) = g
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
                (lo.min(v), hi.max(v))
            });
        let scale = (max - min) / 15.0;
        if scale <= 0.0 || !scale.is_finite() {
            out.extend_from_slice(g);
            continue;
        }
        out.extend(g.iter().map(|&v| {
            let q = ((v - min) / scale).round().clamp(0.0, 15.0);
            min + q * scale
        }));
    }
    out
}

/// Quantizes and dequantizes `w` (`rows × cols`) to int8, one symmetric scale per row.
pub fn int8_rows(w: &[f32], cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(w.len());
    for row in w.chunks(cols) {
        let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = max / 127.0;
        if scale <= 0.0 || !scale.is_finite() {
            out.extend_from_slice(row);
            continue;
        }
        out.extend(
            row.iter()
                .map(|&v| (v / scale).round().clamp(-127.0, 127.0) * scale),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        crate::test_util::uniform(seed, n, 0.2)
    }

    #[test]
    fn int4_error_is_at_most_half_a_step_per_group() {
        let (rows, cols) = (7, 256);
        let w = random(rows * cols, 1);
        for group in [32, 64, 128, 256] {
            let q = int4_groups(&w, cols, group);
            for (g, h) in w.chunks(group).zip(q.chunks(group)) {
                let min = g.iter().copied().fold(f32::INFINITY, f32::min);
                let max = g.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let step = (max - min) / 15.0;
                let levels: std::collections::BTreeSet<u32> = h
                    .iter()
                    .map(|v| ((v - min) / step).round() as u32)
                    .collect();
                assert!(levels.len() <= 16);
                for (a, b) in g.iter().zip(h) {
                    assert!(
                        (a - b).abs() <= step * 0.5 + 1e-6,
                        "group {group}: {a} vs {b}"
                    );
                }
            }
        }
        // Smaller groups fit the data better.
        let err = |group| -> f64 {
            let q = int4_groups(&w, cols, group);
            w.iter()
                .zip(&q)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum()
        };
        assert!(err(32) < err(64) && err(64) < err(128) && err(128) < err(256));
        // Rows of 96 with groups of 64: each row ends with a group of 32.
        let short = int4_groups(&w[..2 * 96], 96, 64);
        assert_eq!(&short[..64], &int4_groups(&w[..64], 64, 64)[..]);
        assert_eq!(&short[64..96], &int4_groups(&w[64..96], 32, 32)[..]);
        // A row-sharded weight quantizes to the same values as the whole.
        let whole = int4_groups(&w, cols, 64);
        let top = int4_groups(&w[..3 * cols], cols, 64);
        assert_eq!(&whole[..3 * cols], &top[..]);
    }

    #[test]
    fn int8_error_is_at_most_half_a_step_per_row() {
        let cols = 96;
        let w = random(5 * cols, 2);
        let q = int8_rows(&w, cols);
        for (r, h) in w.chunks(cols).zip(q.chunks(cols)) {
            let step = r.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for (a, b) in r.iter().zip(h) {
                assert!((a - b).abs() <= step * 0.5 + 1e-7);
            }
        }
        // Constant and zero rows survive unchanged.
        assert_eq!(int8_rows(&[0.0; 4], 4), vec![0.0; 4]);
        assert_eq!(int4_groups(&[0.25; 32], 32, 32), vec![0.25; 32]);
    }
}
