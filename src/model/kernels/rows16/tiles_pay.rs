//! Which of a format's two top kernels runs where the tile unit is in use: its AMX kernel or
//! its AVX-512 VNNI kernel, whichever times faster on this CPU.
//!
//! Why a measured choice: both give the same bits (every level does), but on a 2-core Xeon
//! with AMX (Emerald Rapids class, 2026-12-06) the tile kernels of some formats ran slower
//! than VNNI (Q4_0: 184 against 301 GOP/s on one thread; Q5_1 the other way, 263 against
//! 163). Each tile product there costs about the time of a full 16 × 64 × 16 one whatever
//! its shape, and every 32-value block's sums must be stored from the tile to meet their
//! float scales, so a format's tile kernel pays off only where its weights reach the tile
//! cheaply; which formats those are depends on the CPU (and on how busy its tile unit is), so
//! it is timed, like [`super::super::bf16::vdpbf16ps_pays`]. Decided once per format per
//! process, on a small product (a few milliseconds each).

use std::any::TypeId;
use std::sync::Mutex;
use std::time::Duration;

use super::{Format, Rows16Matrix};
use crate::model::kernels::Isa;

/// The level format `F`'s products run at in this process: [`Isa::Amx`] only where the
/// process uses the tile unit and `F`'s tile kernel timed faster than its AVX-512 one.
pub(super) fn level_for<F: Format>() -> Isa {
    let isa = super::super::isa();
    if isa >= Isa::Amx && !tiles_pay::<F>() {
        Isa::Avx512Bf16
    } else {
        isa
    }
}

/// Whether `F`'s tile kernel is faster here (more than 5%; a staged one: not more than 10%
/// slower) than its AVX-512 VNNI kernel.
pub fn tiles_pay<F: Format>() -> bool {
    static DECIDED: Mutex<Vec<(TypeId, bool)>> = Mutex::new(Vec::new());
    let id = TypeId::of::<F>();
    let known = |decided: &[(TypeId, bool)]| decided.iter().find(|d| d.0 == id).map(|d| d.1);
    if let Some(pays) = known(&DECIDED.lock().unwrap_or_else(|e| e.into_inner())) {
        return pays;
    }
    let pays = super::super::isa() >= Isa::Amx && time_levels::<F>();
    let mut decided = DECIDED.lock().unwrap_or_else(|e| e.into_inner());
    // Two threads may have timed it at once: the first answer stands.
    if let Some(first) = known(&decided) {
        return first;
    }
    decided.push((id, pays));
    pays
}

/// Times a 512 × 2048 by 2048 × 512 product (activations quantized beforehand) at [`Isa::Amx`] and [`Isa::Avx512`], five times
/// each, alternating, and compares the best of each. 512 rows, as an evaluation's: the staged tile
/// kernels ([`super::Format::stage`]) spread a group's staging over every panel pair of a
/// thread (at 64 or 256 rows Q4_K's timed slower than VNNI, at 512 faster).
fn time_levels<F: Format>() -> bool {
    let (m, n, k) = (512, 512, 2048);
    // Zero bytes are a valid block of every format (zero scales); the integer work, and so
    // the time, does not depend on the values.
    let bytes = vec![0u8; n * (k / <F::Act as super::Activations>::BLOCK) * F::FILE_BLOCK_BYTES];
    let Some(w) = Rows16Matrix::<F>::from_bytes(&bytes, n, k) else {
        return false;
    };
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 32.0)
        .collect();
    // Quantized once: both levels share the activation quantization, which is not timed.
    let a = <F::Act as super::Activations>::quantize(&x, m, k);
    let time = |isa: Isa| {
        let start = std::time::Instant::now();
        std::hint::black_box(w.matmul_prepared_at(&a, m, isa));
        start.elapsed()
    };
    let (mut tiles, mut vnni) = (Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        tiles = tiles.min(time(Isa::Amx));
        vnni = vnni.min(time(Isa::Avx512));
    }
    // The staged kernels (the K-quants) keep the tiles unless VNNI times more than 10% faster:
    // they measured 1.2–1.75× VNNI on the products of an evaluation (2 threads, 512 rows, the
    // throughput tests), more than on this small product (about 1.1× for Q6_K), whose margin
    // the host's noise flipped between processes (one 1B Q4_K_M run then spent 26% of its
    // time in Q6_K's VNNI kernel, its logits among it, where another spent 14% in Q6_K's tile
    // kernel). The others must time 5% faster.
    let margin = if F::STAGED_BLOCK_BYTES > 0 {
        1.0 / 1.10
    } else {
        1.05
    };
    let pays = tiles.as_secs_f64() * margin < vnni.as_secs_f64();
    tracing::debug!(
        "{}: tiles {tiles:?}, AVX-512 VNNI {vnni:?} per product; tiles used: {pays}",
        F::NAME
    );
    pays
}

/// For `ppl validate` and results.json: the formats whose products use the tile unit here,
/// and those that stay on AVX-512 VNNI (timed faster), e.g. `tiles: Q8_0 Q5_1; VNNI: Q4_0`.
pub fn summary() -> String {
    use super::{iq4xs, q2k, q3k, q4, q4k, q6k, q8_0};
    /// A format's name and its choice.
    type Choice = (&'static str, fn() -> bool);
    let formats: [Choice; 12] = [
        (q8_0::Q8_0::NAME, tiles_pay::<q8_0::Q8_0>),
        (q8_0::Q5_0::NAME, tiles_pay::<q8_0::Q5_0>),
        (q8_0::Q5_1::NAME, tiles_pay::<q8_0::Q5_1>),
        (q4::Q4_0::NAME, tiles_pay::<q4::Q4_0>),
        (q4::Q4_1::NAME, tiles_pay::<q4::Q4_1>),
        (q4::Iq4Nl::NAME, tiles_pay::<q4::Iq4Nl>),
        (q4k::Q4K::NAME, tiles_pay::<q4k::Q4K>),
        (q4k::Q5K::NAME, tiles_pay::<q4k::Q5K>),
        (q6k::Q6K::NAME, tiles_pay::<q6k::Q6K>),
        (q3k::Q3K::NAME, tiles_pay::<q3k::Q3K>),
        (q2k::Q2K::NAME, tiles_pay::<q2k::Q2K>),
        (iq4xs::Iq4Xs::NAME, tiles_pay::<iq4xs::Iq4Xs>),
    ];
    let (tiles, vnni): (Vec<_>, Vec<_>) = formats.iter().partition(|(_, pays)| pays());
    let names = |list: Vec<&Choice>| {
        let names: Vec<&str> = list.iter().map(|(name, _)| *name).collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(" ")
        }
    };
    format!("tiles: {}; VNNI: {}", names(tiles), names(vnni))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_the_tile_level_no_format_uses_the_tiles_and_each_choice_is_made_once() {
        use super::super::{q4::Q4_0, q6k::Q6K, q8_0::Q8_0};
        let first = [tiles_pay::<Q8_0>(), tiles_pay::<Q4_0>(), tiles_pay::<Q6K>()];
        if super::super::super::isa() < Isa::Amx {
            assert_eq!(first, [false; 3]);
            assert_eq!(level_for::<Q8_0>(), super::super::super::isa());
        }
        let again = [tiles_pay::<Q8_0>(), tiles_pay::<Q4_0>(), tiles_pay::<Q6K>()];
        assert_eq!(first, again);
        let expected = if first[0] { Isa::Amx } else { Isa::Avx512Bf16 };
        if super::super::super::isa() >= Isa::Amx {
            assert_eq!(level_for::<Q8_0>(), expected);
            assert!(summary().starts_with("tiles: "), "{}", summary());
        }
    }
}
