//! [`WindowPart`]: one window's comparison as it travels to rank 0 through the data-parallel
//! protocol (a [`Record`]). Its JSON form is exact and compact: each token is the array
//! `[nll_base, nll_model, kld, delta_p, same_top]` (see [`TokenComparison`]), and the base's
//! stored rows (only with `--save-base`) are the base64 of their little-endian f32 bytes, so
//! no float goes through decimal text.
//!
//! Sizes against the raw bytes of the former private codec (33 per token, 4 per stored
//! value): about 2.6× for the token comparisons (≈ 86 bytes a token with real NLL and KLD
//! values, 44 KB for a window of 512 tokens; bounded at 2.5× on the test values below) and
//! 1.33× for stored rows (1.6 MB for 512 tokens of a 576-wide model). Encoding and decoding
//! take well under a millisecond a window, against the hundreds of milliseconds its two
//! forward passes take.
//!
//! A `WindowPart` is also the ledger record of `ppl compare` (`--resume`): the ledger keeps
//! the token comparisons, never the stored rows ([`Record::ledger_json`]).

use serde::{Deserialize, Serialize};

use crate::eval::kld::TokenComparison;
use crate::eval::Record;

/// Per-token comparisons of one window, and the base's rows when they are being saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowPart {
    pub index: usize,
    /// Tokens fed to each model for this window.
    pub input_tokens: usize,
    /// One comparison per scored token, in order.
    pub tokens: Vec<TokenComparison>,
    /// The base's final hidden states at the scored tokens (`--save-base`), `hidden` each.
    #[serde(with = "packed_f32")]
    pub stored: Option<Vec<f32>>,
    /// The rank that compared it.
    pub rank: usize,
    /// Seconds from the start of that rank's scoring to the end of this window's batch.
    pub finished_s: f64,
}

impl Record for WindowPart {
    fn index(&self) -> usize {
        self.index
    }
    fn stamp(&mut self, rank: usize, finished_s: f64) {
        self.rank = rank;
        self.finished_s = finished_s;
    }
    fn scored_tokens(&self) -> u64 {
        self.tokens.len() as u64
    }
    fn input_tokens(&self) -> u64 {
        self.input_tokens as u64
    }
    /// Bit for bit (a NaN equals itself here).
    fn same_values(&self, other: &Self) -> bool {
        let token_bits = |t: &TokenComparison| {
            (
                [t.nll_base, t.nll_model, t.kld, t.delta_p].map(f64::to_bits),
                t.same_top,
            )
        };
        let row_bits = |r: &Option<Vec<f32>>| {
            r.as_ref()
                .map(|r| r.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
        };
        self.index == other.index
            && self.tokens.len() == other.tokens.len()
            && self
                .tokens
                .iter()
                .zip(&other.tokens)
                .all(|(a, b)| token_bits(a) == token_bits(b))
            && row_bits(&self.stored) == row_bits(&other.stored)
    }
    /// As many tokens as the window scores; per token NLLs and a KLD that are not negative
    /// (nor NaN) and a Δp within [-1, 1].
    fn implausibility(&self, expected: usize) -> Option<String> {
        if self.tokens.is_empty() || self.tokens.len() != expected {
            return Some(format!(
                "{} compared tokens where the window scores {expected}",
                self.tokens.len()
            ));
        }
        let plausible = |t: &TokenComparison| {
            t.nll_base >= 0.0
                && t.nll_model >= 0.0
                && t.kld >= 0.0
                && (-1.0..=1.0).contains(&t.delta_p)
        };
        let bad = self.tokens.iter().position(|t| !plausible(t))?;
        Some(format!(
            "token {bad}: a negative or NaN NLL or KLD, or a Δp outside [-1, 1]"
        ))
    }
    /// Without the base's stored rows: a resumed comparison cannot save the base
    /// (`--save-base` is refused with `--resume`), and the rows would make the ledger as large
    /// as the base file.
    fn ledger_json(&self) -> Vec<u8> {
        let without_rows = WindowPart {
            stored: None,
            tokens: self.tokens.clone(),
            ..*self
        };
        serde_json::to_vec(&without_rows).expect("records serialize")
    }
}

/// `Option<Vec<f32>>` as the base64 of the values' little-endian bytes (or `null`).
mod packed_f32 {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<f32>>, s: S) -> Result<S::Ok, S::Error> {
        v.as_ref()
            .map(|v| {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                super::base64::encode(&bytes)
            })
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<f32>>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        let bytes = super::base64::decode(&text)
            .filter(|b| b.len().is_multiple_of(4))
            .ok_or_else(|| D::Error::custom("stored rows are not the base64 of f32 values"))?;
        Ok(Some(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ))
    }
}

/// Standard base64 (RFC 4648, with `=` padding).
mod base64 {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for c in bytes.chunks(3) {
            let at = |i: usize| u32::from(c.get(i).copied().unwrap_or(0));
            let n = at(0) << 16 | at(1) << 8 | at(2);
            for i in 0..4 {
                out.push(if i <= c.len() {
                    char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63])
                } else {
                    '='
                });
            }
        }
        out
    }

    /// `None` unless `text` is well-formed base64.
    pub fn decode(text: &str) -> Option<Vec<u8>> {
        let b = text.as_bytes();
        if !b.len().is_multiple_of(4) {
            return None;
        }
        let value = |c: u8| -> Option<u32> {
            Some(u32::from(match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'+' => 62,
                b'/' => 63,
                _ => return None,
            }))
        };
        let quads = b.len() / 4;
        let mut out = Vec::with_capacity(quads * 3);
        for (k, q) in b.chunks_exact(4).enumerate() {
            let pad = q.iter().rev().take_while(|&&c| c == b'=').count();
            if pad > 2 || (pad > 0 && k + 1 != quads) {
                return None;
            }
            let mut n = 0u32;
            for &c in &q[..4 - pad] {
                n = n << 6 | value(c)?;
            }
            n <<= 6 * pad as u32;
            out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8][..3 - pad]);
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window of `n` tokens with awkward values (subnormals, -0, values with 17
    /// significant digits), and `stored` rows of `hidden` values each when asked.
    fn part(n: usize, hidden: Option<usize>) -> WindowPart {
        let tokens = (0..n)
            .map(|i| {
                let x = i as f64;
                TokenComparison {
                    nll_base: (x + 0.1).sqrt() * std::f64::consts::PI,
                    nll_model: 1.0 / (x + 3.0),
                    kld: if i % 5 == 0 { 5e-324 } else { x.ln_1p() * 1e-7 },
                    delta_p: if i % 7 == 0 { -0.0 } else { (x * 0.37).sin() },
                    same_top: i % 3 != 0,
                }
            })
            .collect();
        let stored = hidden.map(|h| {
            (0..n * h)
                .map(|i| match i % 4 {
                    0 => f32::MIN_POSITIVE / 3.0,
                    1 => -(i as f32).sqrt(),
                    2 => f32::MAX,
                    _ => i as f32 * 1e-3,
                })
                .collect()
        });
        WindowPart {
            index: 3,
            input_tokens: n + 1,
            tokens,
            stored,
            rank: 1,
            finished_s: 0.1 + 0.2,
        }
    }

    fn round_trip(p: &WindowPart) -> (WindowPart, usize) {
        let bytes = serde_json::to_vec(p).unwrap();
        (serde_json::from_slice(&bytes).unwrap(), bytes.len())
    }

    #[test]
    fn a_window_part_survives_the_wire_bit_for_bit() {
        for hidden in [None, Some(5)] {
            let p = part(512, hidden);
            let (back, _) = round_trip(&p);
            assert!(back.same_values(&p));
            assert_eq!(back.finished_s.to_bits(), p.finished_s.to_bits());
            assert_eq!(
                (back.rank, back.input_tokens, back.scored_tokens()),
                (1, 513, 512)
            );
            assert_eq!(back.tokens[7].delta_p.to_bits(), (-0.0f64).to_bits());
            assert_eq!(back.tokens[5].kld.to_bits(), 5e-324f64.to_bits());
        }
        // Any other value of a token is another record.
        let p = part(4, Some(2));
        let mut q = p.clone();
        q.tokens[2].kld = f64::from_bits(q.tokens[2].kld.to_bits() + 1);
        assert!(!p.same_values(&q));
        let mut q = p.clone();
        if let Some(rows) = q.stored.as_mut() {
            rows[3] = f32::from_bits(rows[3].to_bits() ^ 1);
        }
        assert!(!p.same_values(&q));
    }

    #[test]
    fn the_wire_form_stays_close_to_the_raw_bytes() {
        let n = 512;
        let (_, tokens_only) = round_trip(&part(n, None));
        let raw_tokens = 33 * n;
        assert!(tokens_only < raw_tokens * 5 / 2, "{tokens_only} bytes");
        let hidden = 576;
        let (_, with_rows) = round_trip(&part(n, Some(hidden)));
        let raw_rows = 4 * n * hidden;
        let rows_json = with_rows - tokens_only;
        // base64: 4 characters per 3 bytes, plus the quotes.
        assert!(
            rows_json <= raw_rows.div_ceil(3) * 4 + 8,
            "{rows_json} bytes"
        );
    }

    #[test]
    fn window_parts_go_through_the_ledger() {
        use crate::eval::ledger::{self, Binding, LedgerError, LedgerWriter};
        let dir = tempfile::tempdir().unwrap();
        let binding = Binding {
            model_sha256: "m".into(),
            data_sha256: "d".into(),
            tokenizer_sha256: "t".into(),
            config: "{}".into(),
            windows: 5,
            base: Some("sha256 b, precision f32".into()),
        };
        let p = part(64, Some(3));
        let mut w = LedgerWriter::create(dir.path(), 0, 0, binding.clone()).unwrap();
        w.append(std::slice::from_ref(&p)).unwrap();
        w.sync().unwrap();
        let (got, notes) = ledger::load::<WindowPart>(dir.path(), &binding).unwrap();
        assert!(notes.is_empty());
        assert_eq!(got.len(), 1);
        // The ledger keeps the token comparisons bit for bit, never the stored rows.
        let without_rows = WindowPart {
            stored: None,
            ..p.clone()
        };
        assert!(got[0].same_values(&without_rows));
        assert_eq!(got[0].stored, None);
        assert_eq!(ledger::check_record(dir.path(), &got[0], 64).ok(), Some(()));
        assert!(matches!(
            ledger::check_record(dir.path(), &got[0], 63),
            Err(LedgerError::Implausible { index: 3, .. })
        ));
        let mut negative = without_rows.clone();
        negative.tokens[9].nll_model = -1.0;
        assert!(negative.implausibility(64).unwrap().contains("token 9"));
        // Another attempt that recorded other values for the window is refused.
        let mut other = p.clone();
        other.tokens[0].kld += 1.0;
        let mut w = LedgerWriter::create(dir.path(), 1, 1, binding.clone()).unwrap();
        w.append(&[other]).unwrap();
        w.sync().unwrap();
        assert!(matches!(
            ledger::load::<WindowPart>(dir.path(), &binding),
            Err(LedgerError::Conflict { index: 3, .. })
        ));
    }

    #[test]
    fn base64_matches_the_standard_and_refuses_garbage() {
        for (raw, text) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foobar", "Zm9vYmFy"),
            (&[0xff, 0xfe, 0x00, 0x3e, 0x3f], "//4APj8="),
        ] {
            assert_eq!(base64::encode(raw), text);
            assert_eq!(base64::decode(text).as_deref(), Some(raw));
        }
        for bad in ["Zg=", "Zm9v!A==", "Zg==Zg==", "Z==="] {
            assert_eq!(base64::decode(bad), None, "{bad}");
        }
        let bad_rows = br#"{"index":0,"input_tokens":1,"tokens":[],"stored":"Zg==","rank":0,"finished_s":0.0}"#;
        assert!(serde_json::from_slice::<WindowPart>(bad_rows).is_err());
    }
}
