//! Rotary scaling as a checkpoint's `config.json` states it (`rope_scaling`, or transformers
//! 5's `rope_parameters`), for the kinds that are a fixed divisor per frequency:
//!
//! - `linear` (position interpolation): every frequency divided by `factor`;
//! - `llama3` (Llama 3.1/3.2/3.3): wavelengths shorter than `original / high_freq_factor`
//!   kept, longer than `original / low_freq_factor` divided by `factor`, and between them the
//!   blend `1 / ((1 − s)/factor + s)` with `s = (original/wavelength − low) / (high − low)`.
//!
//! Both are exactly what llama.cpp's converter writes into a GGUF as the `rope_freqs` tensor
//! (one divisor per frequency), so a checkpoint and its conversion rotate alike: the reader
//! records the divisors under [`FREQ_FACTORS_KEY`] and the loader applies them as it applies
//! `rope_freqs`. The kinds that depend on the window (`dynamic`) or scale attention too
//! (`yarn`, `longrope`) are refused with the list of what is read.

use serde_json::Value as Json;

/// ppl's metadata key (under the architecture's prefix) for the per-frequency divisors a
/// checkpoint's scaling implies.
pub const FREQ_FACTORS_KEY: &str = "rope.freq_factors";

#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_context: f64,
    },
}

impl RopeScaling {
    /// The scaling a `rope_scaling` / `rope_parameters` object states (`None`: unscaled).
    pub fn from_config(s: &Json) -> Result<Option<Self>, String> {
        let kind = s
            .get("rope_type")
            .or_else(|| s.get("type"))
            .and_then(Json::as_str)
            .unwrap_or("default");
        let num = |k: &str, default: Option<f64>| -> Result<f64, String> {
            match s.get(k).and_then(Json::as_f64).or(default) {
                Some(v) if v.is_finite() && v > 0.0 => Ok(v),
                Some(v) => Err(format!("rope scaling '{kind}': {k} = {v} must be positive")),
                None => Err(format!("rope scaling '{kind}' without {k}")),
            }
        };
        match kind {
            "default" => Ok(None),
            "linear" => Ok(Some(Self::Linear {
                factor: num("factor", None)?,
            })),
            "llama3" => {
                let s = Self::Llama3 {
                    factor: num("factor", None)?,
                    low_freq_factor: num("low_freq_factor", Some(1.0))?,
                    high_freq_factor: num("high_freq_factor", Some(4.0))?,
                    original_context: num("original_max_position_embeddings", Some(8192.0))?,
                };
                if let Self::Llama3 {
                    low_freq_factor: l,
                    high_freq_factor: h,
                    ..
                } = s
                {
                    if h <= l {
                        return Err(format!("rope scaling 'llama3': high_freq_factor {h} must exceed low_freq_factor {l}"));
                    }
                }
                Ok(Some(s))
            }
            other => Err(format!(
                "rope scaling '{other}' is not supported yet (ppl reads 'linear' and 'llama3' from config.json); convert the model to GGUF with llama.cpp if its conversion expresses the scaling"
            )),
        }
    }

    /// The divisor of each of the `rope_dim / 2` frequencies `theta^(−2i/rope_dim)`.
    pub fn freq_factors(&self, theta: f64, rope_dim: usize) -> Vec<f32> {
        (0..rope_dim / 2)
            .map(|i| {
                let freq = 1.0 / theta.powf(2.0 * i as f64 / rope_dim as f64);
                self.divisor(freq) as f32
            })
            .collect()
    }

    fn divisor(&self, freq: f64) -> f64 {
        match *self {
            Self::Linear { factor } => factor,
            Self::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_context: original,
            } => {
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                if wavelen < original / high {
                    1.0
                } else if wavelen > original / low {
                    factor
                } else {
                    let smooth = (original / wavelen - low) / (high - low);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_keeps_high_frequencies_divides_low_ones_and_blends_between() {
        // Llama 3.1 8B's parameters.
        let s = RopeScaling::from_config(&serde_json::json!({
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
        }))
        .unwrap()
        .unwrap();
        let f = s.freq_factors(500_000.0, 128);
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
        let blended: Vec<&f32> = f.iter().filter(|&&x| x > 1.0 && x < 8.0).collect();
        assert!(!blended.is_empty());
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
        let linear =
            RopeScaling::from_config(&serde_json::json!({"type": "linear", "factor": 2.0}));
        assert_eq!(linear.unwrap().unwrap().freq_factors(1e4, 8), vec![2.0; 4]);
        for (cfg, msg) in [
            (
                serde_json::json!({"rope_type": "yarn", "factor": 4.0}),
                "'yarn' is not supported yet",
            ),
            (serde_json::json!({"rope_type": "linear"}), "without factor"),
            (
                serde_json::json!({"rope_type": "linear", "factor": -1.0}),
                "must be positive",
            ),
        ] {
            let e = RopeScaling::from_config(&cfg).unwrap_err();
            assert!(e.contains(msg), "{e}");
        }
        assert_eq!(
            RopeScaling::from_config(&serde_json::json!({"rope_type": "default"})),
            Ok(None)
        );
    }
}
