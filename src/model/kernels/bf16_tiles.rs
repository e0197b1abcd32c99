//! BF16 weights on the AMX tile unit (`tdpbf16ps`), in the BF16 kernel's order ([`super`]),
//! so the tile level gives the same bits as `vdpbf16ps`, the FMA levels and the portable one.
//!
//! The order: per output, eight lane chains, lane `l` adding chunk `c`'s pair of values
//! `16c + 2l` (even) and `16c + 2l + 1` (odd), the odd product first; then ggml's
//! `hsum_float_8` over the lanes; then the `k mod 16` tail products one at a time.
//! `tdpbf16ps` adds, per output, the 32-bit pairs of its K dimension in order, each pair's
//! low-half product first, rounding after each. So one tile product per lane: an A-tile row
//! holds one activation row's pairs of one lane for sixteen consecutive chunks, a B-tile row
//! one chunk's pair of that lane for the group's sixteen weight rows, each pair stored with
//! its odd value in the low half. `C[r][n]` is then lane `l`'s chain for activation row `r`
//! and weight row `n`, chunk after chunk, continued across instructions in the same
//! accumulator tile; the eight lanes' tiles are stored and summed as the other levels sum
//! their lanes.
//!
//! Whether the CPU's `tdpbf16ps` computes as its definition says (the emulator in
//! [`crate::model::kernels::rows16::tiles`]) is checked at start-up on a known-answer
//! program that tells the two orders apart ([`crate::model::kernels::bf16_tiles`]); where it
//! does not, this path is not used.
//!
//! Layouts: weights per group of sixteen rows `[chunk][lane][row]` (a B tile's sixteen rows
//! lie 512 bytes apart), rows past `n` zero; activations per panel `[lane][row][chunk]`, rows
//! past `m` zero; the tails row by row.

use rayon::prelude::*;

use super::{activation_bits, widen, CHUNK};
use crate::model::kernels::half_driver::LANES;
use crate::model::kernels::panel::{self, hsum8, PANEL};
use crate::model::kernels::rows16::tiles::{TileConfig, Tiles};
use crate::model::kernels::rows16::{GroupOut, GROUP};

/// Chunks per full tile product: sixteen pairs, 64 bytes per A-tile row.
const TILE_CHUNKS: usize = 16;

/// A pair as the tiles take it: the odd value in the low half (multiplied first).
fn tile_pair(even: u16, odd: u16) -> u32 {
    odd as u32 | (even as u32) << 16
}

/// A chunk's sixteen values as the tiles take them: lane `l`'s pair `(2l, 2l + 1)`.
fn lane_pairs(chunk: &[u16]) -> [u32; LANES] {
    std::array::from_fn(|l| tile_pair(chunk[2 * l], chunk[2 * l + 1]))
}

/// A BF16 weight matrix `[n, k]` in the tile layout.
pub(super) struct TileWeights {
    n: usize,
    k: usize,
    chunks: usize,
    /// `[group][chunk][lane][row of the group]`.
    pairs: Vec<u32>,
    /// `[row][k mod 16]`, rows padded to whole groups.
    tail: Vec<u16>,
}

impl TileWeights {
    /// From the weights' bits as the BF16 kernel holds them (row-major, flushed).
    pub(super) fn new(bits: &[u16], n: usize, k: usize) -> Self {
        assert_eq!(bits.len(), n * k, "BF16 weight shape");
        let (chunks, tail_len) = (k / CHUNK, k % CHUNK);
        let groups = n.div_ceil(GROUP);
        let per_group = chunks * LANES * GROUP;
        let mut pairs = vec![0u32; groups * per_group];
        pairs
            .par_chunks_mut(per_group.max(1))
            .enumerate()
            .for_each(|(g, dst)| {
                for row in 0..GROUP.min(n - g * GROUP) {
                    let w = &bits[(g * GROUP + row) * k..][..k];
                    for (c, chunk) in w.chunks_exact(CHUNK).enumerate() {
                        for (l, pair) in lane_pairs(chunk).into_iter().enumerate() {
                            dst[(c * LANES + l) * GROUP + row] = pair;
                        }
                    }
                }
            });
        let mut tail = vec![0u16; groups * GROUP * tail_len];
        for (j, t) in tail.chunks_exact_mut(tail_len.max(1)).take(n).enumerate() {
            t.copy_from_slice(&bits[j * k + chunks * CHUNK..][..tail_len]);
        }
        Self {
            n,
            k,
            chunks,
            pairs,
            tail,
        }
    }

    /// Bytes held.
    pub(super) fn storage_bytes(&self) -> usize {
        4 * self.pairs.len() + 2 * self.tail.len()
    }

    /// The bits of weight `e` of row `j`.
    pub(super) fn value(&self, j: usize, e: usize) -> u16 {
        let (c, i) = (e / CHUNK, e % CHUNK);
        if c == self.chunks {
            return self.tail[j * (self.k % CHUNK) + i];
        }
        let (g, row) = (j / GROUP, j % GROUP);
        let pair = self.pairs[((g * self.chunks + c) * LANES + i / 2) * GROUP + row];
        if i % 2 == 1 {
            pair as u16
        } else {
            (pair >> 16) as u16
        }
    }
}

/// Activations rounded as [`activation_bits`], in the tile layout.
struct TilePanels {
    chunks: usize,
    tail_len: usize,
    /// `[panel][lane][row][chunk]`.
    pairs: Vec<u32>,
    /// `[panel][row][k mod 16]`.
    tail: Vec<u16>,
}

impl TilePanels {
    fn pack(x: &[f32], m: usize, k: usize) -> Self {
        let (chunks, tail_len) = (k / CHUNK, k % CHUNK);
        let panels = m.div_ceil(PANEL);
        let per_panel = LANES * PANEL * chunks;
        let mut pairs = vec![0u32; panels * per_panel];
        pairs
            .par_chunks_mut(per_panel.max(1))
            .enumerate()
            .for_each(|(p, dst)| {
                let mut bits = [0u16; CHUNK];
                for r in 0..PANEL.min(m - p * PANEL) {
                    let row = &x[(p * PANEL + r) * k..][..chunks * CHUNK];
                    for (c, values) in row.chunks_exact(CHUNK).enumerate() {
                        for (b, &v) in bits.iter_mut().zip(values) {
                            *b = activation_bits(v);
                        }
                        for (l, pair) in lane_pairs(&bits).into_iter().enumerate() {
                            dst[(l * PANEL + r) * chunks + c] = pair;
                        }
                    }
                }
            });
        // The tails (none where k is a multiple of 16, as in every real model).
        let mut tail = vec![0u16; panels * PANEL * tail_len];
        for (i, t) in tail.chunks_exact_mut(tail_len.max(1)).take(m).enumerate() {
            for (t, &v) in t.iter_mut().zip(&x[i * k + chunks * CHUNK..][..tail_len]) {
                *t = activation_bits(v);
            }
        }
        Self {
            chunks,
            tail_len,
            pairs,
            tail,
        }
    }
}

/// `x [m, k]` times the weights transposed, `[m, n]`, on the tiles `tiles()` gives (one per
/// job: the CPU's, or the emulator in tests).
///
/// # Safety
/// The tiles must be usable for `tdpbf16ps`: the emulator's always are; the CPU's only where
/// [`crate::model::kernels::bf16_tiles`] says so.
pub(super) unsafe fn matmul<T: Tiles>(
    w: &TileWeights,
    x: &[f32],
    m: usize,
    tiles: impl Fn() -> T + Sync,
) -> Vec<f32> {
    assert_eq!(x.len(), m * w.k, "activation shape");
    let a = TilePanels::pack(x, m, w.k);
    panel::drive(m, w.n, GROUP, |p, j, out| {
        // SAFETY: `p < ⌈m/8⌉` and `j < n` (the driver's ranges), so both blocks exist in
        // full (asserted inside); the caller vouches for the tiles.
        let res = unsafe { group(&mut tiles(), w, &a, j / GROUP, p) };
        for (r, row) in res.iter().enumerate().take(out.live()) {
            out.set_row(r, row);
        }
    })
}

/// The outputs of weight group `g` for activation panel `p`.
///
/// # Safety
/// `tiles` must be usable for `tdpbf16ps` (see [`Tiles`]).
unsafe fn group<T: Tiles>(
    tiles: &mut T,
    w: &TileWeights,
    a: &TilePanels,
    g: usize,
    p: usize,
) -> GroupOut {
    let chunks = w.chunks;
    assert!(a.chunks == chunks && a.tail_len == w.k % CHUNK);
    assert!(w.pairs.len() >= (g + 1) * chunks * LANES * GROUP);
    assert!(a.pairs.len() >= (p + 1) * LANES * PANEL * chunks);
    let (full, rem) = (chunks / TILE_CHUNKS * TILE_CHUNKS, chunks % TILE_CHUNKS);
    let rows = PANEL as u8;
    // C in tmm0; A in tmm4 (sixteen chunks) and tmm5 (the rest), B in tmm6 and tmm7.
    let (a_rem, b_rem) = match rem {
        0 => ((0, 0), (0, 0)),
        r => ((rows, 4 * r as u16), (r as u8, 64)),
    };
    let cfg = TileConfig::new([
        (rows, 64),
        (0, 0),
        (0, 0),
        (0, 0),
        (rows, 64),
        a_rem,
        (TILE_CHUNKS as u8, 64),
        b_rem,
    ]);
    let (a_stride, b_stride) = (4 * chunks, 4 * LANES * GROUP);
    let mut lanes = [[[0f32; GROUP]; PANEL]; LANES];
    tiles.configure(&cfg);
    for (l, lane) in lanes.iter_mut().enumerate() {
        // Lane `l`'s rows of the panel, and of the group (a chunk `LANES·GROUP` pairs on).
        let a_lane = a.pairs.as_ptr().add((p * LANES + l) * PANEL * chunks);
        let w_lane = w.pairs.as_ptr().add(g * chunks * LANES * GROUP + l * GROUP);
        tiles.zero(0);
        for c0 in (0..full).step_by(TILE_CHUNKS) {
            tiles.load(4, a_lane.add(c0) as *const u8, a_stride);
            tiles.load(6, w_lane.add(c0 * LANES * GROUP) as *const u8, b_stride);
            tiles.dp_bf16(0, 4, 6);
        }
        if rem > 0 {
            tiles.load(5, a_lane.add(full) as *const u8, a_stride);
            tiles.load(7, w_lane.add(full * LANES * GROUP) as *const u8, b_stride);
            tiles.dp_bf16(0, 5, 7);
        }
        tiles.store(0, lane.as_mut_ptr() as *mut u8, 4 * GROUP);
    }
    tiles.release();
    let tail_len = a.tail_len;
    std::array::from_fn(|r| {
        let x = &a.tail[(p * PANEL + r) * tail_len..][..tail_len];
        std::array::from_fn(|n| {
            let sum = hsum8(&std::array::from_fn(|l| lanes[l][r][n]));
            let wt = &w.tail[(g * GROUP + n) * tail_len..][..tail_len];
            wt.iter()
                .zip(x)
                .fold(sum, |s, (&w, &x)| widen(w).mul_add(widen(x), s))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::rows16::tiles::Emulated;
    use crate::model::kernels::Isa;

    /// Weights and activations of every sign over many binades, with rows, columns and
    /// inner sizes that leave partial panels, groups, tile products and tails.
    fn case(n: usize, k: usize, m: usize, seed: u64) -> (Vec<u16>, Vec<f32>) {
        let mut s = seed;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s
        };
        let w = (0..n * k)
            .map(|_| {
                let r = next();
                let exp = 127 - 12 + (r >> 40) % 16;
                ((r >> 63) as u16) << 15 | (exp as u16) << 7 | (r >> 20) as u16 & 0x7F
            })
            .collect();
        let x = (0..m * k)
            .map(|_| {
                let r = next();
                ((r >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 4.0) as f32
            })
            .collect();
        (w, x)
    }

    /// Where the process multiplies BF16 on the tile unit, whole matrices at the AMX level
    /// (the matrix's own tile layout on the CPU's tiles) give the portable bits; elsewhere the
    /// test says it was skipped, and fails under `PPL_REQUIRE_AMX=1`.
    #[test]
    fn the_hardware_tiles_give_the_same_bits() {
        if !crate::model::kernels::bf16_tiles() {
            let choice = crate::model::kernels::isa_choice();
            if choice.used < Isa::Amx {
                crate::model::kernels::tests::amx_skipped(&choice);
            } else {
                // The designed fallback (the same bits on the AVX-512 path), reported by the
                // start-up check's warning and `ppl validate`; not a failure.
                eprintln!("SKIPPED: AMX in use but its tdpbf16ps did not pass the BF16 check");
            }
            return;
        }
        let (n, k, m) = (45, 16 * 20 + 3, 19);
        let (w, x) = case(n, k, m, 5);
        let bytes: Vec<u8> = w.iter().flat_map(|b| b.to_le_bytes()).collect();
        let matrix = super::super::Bf16Matrix::from_bytes(&bytes, n, k).unwrap();
        assert!(matrix.tiles.is_some());
        let amx = matrix.matmul_at(&x, m, Isa::Amx);
        let portable = matrix.matmul_at(&x, m, Isa::Portable);
        assert!(amx
            .iter()
            .zip(&portable)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    #[test]
    fn the_emulated_tiles_give_every_level_s_bits() {
        // (n, k, m): tails of 0 and 5 values; 16 chunks exactly, 3, and 16 + 7; one row.
        for (i, &(n, k, m)) in [
            (16, 256, 8),
            (37, 48, 13),
            (21, 16 * 23 + 5, 9),
            (5, 7, 3),
            (33, 512, 1),
        ]
        .iter()
        .enumerate()
        {
            let (w, x) = case(n, k, m, 17 + i as u64);
            let bytes: Vec<u8> = w.iter().flat_map(|b| b.to_le_bytes()).collect();
            let matrix = super::super::Bf16Matrix::from_bytes(&bytes, n, k).unwrap();
            let tiles = TileWeights::new(matrix.bits.get(), n, k);
            // SAFETY: the emulator's tiles are always usable.
            let got = unsafe { matmul(&tiles, &x, m, Emulated::default) };
            let want = matrix.matmul_at(&x, m, Isa::Portable);
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "n {n} k {k} m {m}: {got:?} vs {want:?}");
            // And on the CPU's tile unit, where this process multiplies BF16 on it.
            #[cfg(target_arch = "x86_64")]
            if crate::model::kernels::bf16_tiles() {
                use crate::model::kernels::rows16::tiles::Hardware;
                // SAFETY: `bf16_tiles()` checked the CPU's tiles.
                let hw = unsafe { matmul(&tiles, &x, m, || Hardware) };
                assert!(hw
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
            }
            // And the layout gives back every weight.
            for j in 0..n {
                for e in 0..k {
                    assert_eq!(tiles.value(j, e), matrix.bits.get()[j * k + e]);
                }
            }
        }
    }
}
