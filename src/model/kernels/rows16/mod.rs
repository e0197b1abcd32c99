//! The interleaved-rows kernels, one driver generic over the weight format: Q4_0, Q4_1,
//! IQ4_NL, Q8_0, Q5_0 and Q5_1 × Q8_0 activations, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS
//! × Q8_K activations.
//!
//! Why one design for all of them: a kernel that gives each weight row one 32-bit lane forms
//! every output's integer block sum in its own lane (a broadcast of four activation bytes
//! meets sixteen rows' four weights in one `vpdpbusd`, or a tile of them in one `tdpbssd`),
//! so nothing is ever reduced across lanes; the per-row float work is one conversion and one
//! FMA per block. The weights are repacked once at load into groups of [`GROUP`] rows whose
//! blocks are interleaved (each format's module gives its layout).
//!
//! What a format supplies ([`Format`]): its file block size, the size of one interleaved
//! group block, the repacking of one file block into a lane, the dequantization of a lane,
//! and its micro-kernels per instruction-set level (portable, AVX2, AVX-512 VNNI, AMX tiles).
//! What the driver does: the repacking of whole matrices (threaded), the activation
//! quantization ([`Activations`]), the cache blocking and threading ([`panel::drive`]), the
//! level dispatch with its length checks, and [`OwnMatrix`].
//!
//! The tile level of the K-quants and IQ4_XS is staged ([`Format::stage`],
//! [`panel::drive_staged`]): their integer sub-block scales fold into the values as bytes
//! (Q4_K/Q5_K's scales split in two, the others' value × scale products split where they
//! exceed a byte: `scaled_tiles_x86`), so a whole super-block's scaled sums form inside the
//! tiles, 16 activation rows per product;
//! the driver gives each thread its own groups against every activation row, stages each
//! group's values once per slice of k, and every panel pair reads them from L1 (the float
//! accumulators carried from slice to slice). Per-block float scales (Q8_0, Q4_0, Q4_1, Q5_0) cannot fold, so those
//! formats multiply one job at a time ([`Format::amx`]). The shared tests
//! (`tests.rs`) run every format on every level against an f64 reference.
//!
//! Exactness: the integer sums are exact whichever instructions form them, and every level
//! performs the same float operations per output in the same order, so every level gives the
//! same bits, whatever the thread count, the panel a row lands in or its neighbours.

pub mod iq4xs;
pub mod q2k;
pub mod q3k;
pub mod q4;
pub mod q4k;
pub mod q6k;
pub mod q8_0;
#[cfg(target_arch = "x86_64")]
mod scaled_tiles_x86;
#[cfg(target_arch = "x86_64")]
mod shared_x86;
#[cfg(test)]
pub(crate) mod tests;
pub mod tiles;
pub mod tiles_pay;

use std::marker::PhantomData;
use std::ops::Range;

use rayon::prelude::*;

use super::kquant::q8k::{Q8KPanel, Q8KPanels};
use super::kquant::QK_K;
use super::panel::{self, Panels, BLOCK, PANEL};
use super::{Isa, OwnMatrix, SharedInput};

/// Weight rows interleaved per group: one per 32-bit lane of a 512-bit register, one per
/// 32-bit column of a 64-byte tile row.
pub const GROUP: usize = 16;

/// The outputs of one job: `[panel row][weight row of the group]`, the layout of the
/// kernels' accumulators (one 512-bit register per panel row) and of the output rows, so
/// that neither the kernels nor the driver transpose (they did: 6% of a SmolLM2 Q4_1 run).
pub type GroupOut = [[f32; GROUP]; PANEL];

/// Activations quantized for a format's kernels, in panels of [`PANEL`] rows.
pub trait Activations: Sync + Sized {
    /// One panel's blocks.
    type Panel<'a>: Copy + Sync
    where
        Self: 'a;
    /// Values per block (the weights' blocks have the same size).
    const BLOCK: usize;
    /// `x [m, k]`, row-major (`k` a multiple of [`Self::BLOCK`]).
    fn quantize(x: &[f32], m: usize, k: usize) -> Self;
    /// The input's activations of this type, made once for all the matrices that share it.
    fn shared<'s>(input: &'s SharedInput<'_>, k: usize) -> &'s Self;
    fn panel(&self, p: usize) -> Self::Panel<'_>;
    /// Whether `panel` holds `nb` blocks of each of its rows (the kernels index unchecked).
    fn holds(panel: &Self::Panel<'_>, nb: usize) -> bool;
    /// The activation values of the panel pairs `(2q, 2q + 1)` in the layout the staged tile
    /// kernels ([`Format::amx_staged`]) load into tiles: block after block, in each pair after
    /// pair, each the same size (a missing second panel as zeros), so a kernel, which takes
    /// the pairs of one block one after another, reads them in order. Done once per product;
    /// only the activations of formats with a staged kernel have it.
    #[cfg(target_arch = "x86_64")]
    fn stage_pairs(panels: &[Self::Panel<'_>], nb: usize) -> Vec<u8> {
        let _ = (panels, nb);
        unreachable!("these activations have no staged tile layout")
    }
    /// Value `e` of row `row` as the kernels see it, `d·q`, in f64 (the tests' reference).
    #[cfg(test)]
    fn dequantized(&self, row: usize, e: usize) -> f64;
    /// The sum of block `b` of row `row` as the kernels meet a weight block's minimum (Q8_1's
    /// `s`, rounded): by default the exact sum of its values.
    #[cfg(test)]
    fn block_sum(&self, row: usize, b: usize) -> f64 {
        (b * Self::BLOCK..(b + 1) * Self::BLOCK)
            .map(|e| self.dequantized(row, e))
            .sum()
    }
}

/// Offset of the sixteen f16 minima in a group's block of the formats that have them (Q4_1,
/// Q5_1): right after the sixteen f16 scales.
pub(crate) const MINIMA: usize = 2 * GROUP;

/// Activations in Q8_0 (32-value blocks, llama.cpp's `quantize_row_q8_0`/`q8_1` values and
/// scales, with each block's integer sum: [`panel::Panels`]), for Q4_0, Q4_1, Q8_0 and Q5_0
/// weights.
pub struct Q8Panels {
    panels: Panels,
}

/// One panel of [`Q8Panels`]: entry `b·PANEL + r` is row `r`'s block `b` (its values, `d`,
/// Q8_1's `s = d·Σq_a` rounded to f16, which Q4_1's minima meet, and `Σ q_a`).
pub type Q8Panel<'a> = panel::PanelRef<'a>;

impl Activations for Q8Panels {
    type Panel<'a> = Q8Panel<'a>;
    const BLOCK: usize = BLOCK;

    fn quantize(x: &[f32], m: usize, k: usize) -> Self {
        Self {
            panels: Panels::quantize(x, m, k),
        }
    }

    fn shared<'s>(input: &'s SharedInput<'_>, k: usize) -> &'s Self {
        input.q8(k)
    }

    fn panel(&self, p: usize) -> Q8Panel<'_> {
        self.panels.panel(p)
    }

    fn holds(a: &Q8Panel<'_>, nb: usize) -> bool {
        [a.qs.len(), a.d.len(), a.s.len(), a.sums.len()]
            .iter()
            .all(|&len| len >= nb * PANEL)
    }

    #[cfg(test)]
    fn dequantized(&self, row: usize, e: usize) -> f64 {
        let a = self.panels.panel(row / PANEL);
        let i = (e / BLOCK) * PANEL + row % PANEL;
        a.d[i] as f64 * a.qs[i][e % BLOCK] as f64
    }

    #[cfg(test)]
    fn block_sum(&self, row: usize, b: usize) -> f64 {
        self.panels.panel(row / PANEL).s[b * PANEL + row % PANEL] as f64
    }
}

impl Activations for Q8KPanels {
    type Panel<'a> = Q8KPanel<'a>;
    const BLOCK: usize = QK_K;

    fn quantize(x: &[f32], m: usize, k: usize) -> Self {
        Q8KPanels::quantize(x, m, k)
    }

    fn shared<'s>(input: &'s SharedInput<'_>, k: usize) -> &'s Self {
        input.q8k(k)
    }

    fn panel(&self, p: usize) -> Q8KPanel<'_> {
        Q8KPanels::panel(self, p)
    }

    fn holds(a: &Q8KPanel<'_>, nb: usize) -> bool {
        use super::kquant::q8k::SUB_BLOCK_PAIRS;
        a.qs.len() >= nb * PANEL
            && a.d.len() >= nb * PANEL
            && a.bsums.len() >= nb * PANEL
            && a.sub_block_sums.len() >= nb * SUB_BLOCK_PAIRS
    }

    #[cfg(target_arch = "x86_64")]
    fn stage_pairs(panels: &[Q8KPanel<'_>], nb: usize) -> Vec<u8> {
        shared_x86::stage_pairs(panels, nb)
    }

    #[cfg(test)]
    fn dequantized(&self, row: usize, e: usize) -> f64 {
        let a = Q8KPanels::panel(self, row / PANEL);
        let i = (e / QK_K) * PANEL + row % PANEL;
        a.d[i] as f64 * a.qs[i][e % QK_K] as f64
    }
}

/// One group of weight rows against one panel of activations.
pub struct Job<'a, P> {
    /// The group's interleaved blocks.
    pub group: &'a [u8],
    /// Blocks per row.
    pub nb: usize,
    pub a: P,
}

/// A run of panels against one group whose weights were staged for the tile unit
/// ([`Format::stage`]), over a slice of its blocks: the AMX kernels that take 16 activation
/// rows (two panels) per product and read each staged block once per run from the cache.
pub struct StagedJob<'a, P> {
    /// The group's interleaved blocks (scales, mins), all of them.
    pub group: &'a [u8],
    /// The slice's blocks as [`Format::stage`] wrote them (its first block first).
    pub staged: &'a [u8],
    /// Blocks per row.
    pub nb: usize,
    /// The slice of blocks this job adds to the accumulators.
    pub blocks: Range<usize>,
    /// The run's panels (an even number but perhaps the last run's last).
    pub panels: &'a [P],
    /// The product's activation values as [`Activations::stage_pairs`] wrote them: block after
    /// block, in each every pair of panels.
    pub pairs: &'a [u8],
    /// Pairs of panels in the product (in `pairs` per block).
    pub all_pairs: usize,
    /// The pair of the run's first panel.
    pub first_pair: usize,
}

/// A staged kernel's float accumulators of one panel against one group, carried from one
/// slice of blocks to the next: per panel row, [`GROUP`] lanes (rows `0..PANEL`), and for the
/// formats with minima the minima's (rows `PANEL..`). Kept in memory between slices, so the
/// order of the float steps is the unsliced one.
#[derive(Clone, Copy, Debug, Default)]
pub struct StagedAcc(pub [[f32; GROUP]; 2 * PANEL]);

/// The portable kernels' loop over a group's blocks: each lane's `N` values decoded once per
/// block (`decode(src, lane, values)`, as signed bytes), then `block(b, src, values)` runs the
/// panel's rows through the format's definition, in its float order. (Value by value, per
/// output, the definition took seconds per window: the decoding was repeated for every panel
/// row and nothing vectorised.)
pub(crate) fn decoded_blocks<const N: usize>(
    group: &[u8],
    nb: usize,
    block_bytes: usize,
    decode: impl Fn(&[u8], usize, &mut [i8; N]),
    mut block: impl FnMut(usize, &[u8], &[[i8; N]; GROUP]),
) {
    let mut values = [[0i8; N]; GROUP];
    for b in 0..nb {
        let src = &group[b * block_bytes..][..block_bytes];
        for (lane, v) in values.iter_mut().enumerate() {
            decode(src, lane, v);
        }
        block(b, src, &values);
    }
}

/// `Σ a·b` of two byte vectors, exact (a whole-block dot product the compiler vectorises).
pub(crate) fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    a.iter().zip(b).map(|(&x, &y)| x as i32 * y as i32).sum()
}

/// Lane `lane`'s f16 at `at` (a scale or a minimum) of a group's block.
pub(crate) fn lane_f16(src: &[u8], at: usize, lane: usize) -> f32 {
    half::f16::from_le_bytes([src[at + 2 * lane], src[at + 2 * lane + 1]]).to_f32()
}

/// The portable micro-kernel of the formats on Q8_0/Q8_1 activations (Q4_0, Q4_1, Q8_0, Q5_0,
/// Q5_1), their definition: per block in order, `acc = fma(d_w·d_a, Σ w·q_a − offset·Σq_a,
/// acc)` and, with minima (`MIN`: sixteen f16 at [`MINIMA`]), `acc = fma(m_w, s_a, acc)` —
/// the SIMD kernels' float order. `decode` gives lane `lane`'s 32 weights of a block.
pub(crate) fn portable_q8<const MIN: bool>(
    job: &Job<'_, Q8Panel<'_>>,
    block_bytes: usize,
    offset: i32,
    decode: impl Fn(&[u8], usize, &mut [i8; BLOCK]),
) -> GroupOut {
    let mut out = [[0f32; GROUP]; PANEL];
    decoded_blocks(job.group, job.nb, block_bytes, decode, |b, src, w| {
        for (lane, w) in w.iter().enumerate() {
            let dw = lane_f16(src, 0, lane);
            let mw = if MIN {
                lane_f16(src, MINIMA, lane)
            } else {
                0.0
            };
            for (r, out) in out.iter_mut().enumerate() {
                let acc = &mut out[lane];
                let i = b * PANEL + r;
                let sum = dot_i8(w, &job.a.qs[i]) - offset * job.a.sums[i];
                *acc = (dw * job.a.d[i]).mul_add(sum as f32, *acc);
                if MIN {
                    *acc = mw.mul_add(job.a.s[i], *acc);
                }
            }
        }
    });
    out
}

/// The panel type of format `F`'s activations.
pub type PanelOf<'a, F> = <<F as Format>::Act as Activations>::Panel<'a>;

/// A weight format of the interleaved-rows kernels: its layout and its micro-kernels.
///
/// Each micro-kernel returns the outputs of the group's [`GROUP`] rows for the panel's
/// [`PANEL`] activation rows, and all of them the same bits as [`Format::portable`].
pub trait Format: Sized + Send + Sync + 'static {
    /// The activations' quantization.
    type Act: Activations;
    /// The format's name, as GGUF spells it.
    const NAME: &'static str;
    /// Bytes of one block in a GGUF file.
    const FILE_BLOCK_BYTES: usize;
    /// Bytes of one block of a group of [`GROUP`] rows, interleaved.
    const GROUP_BLOCK_BYTES: usize;

    /// Writes one row's file block into lane `lane` of a group's block.
    fn pack(file: &[u8], dst: &mut [u8], lane: usize);

    /// Lane `lane`'s values of a group's block as f32: the same numbers as ggml's (and
    /// candle's) dequantization.
    fn dequantize(src: &[u8], lane: usize, out: &mut [f32]);

    /// The definition, one output at a time.
    fn portable(job: &Job<'_, PanelOf<'_, Self>>) -> GroupOut;

    /// The AVX2 path.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; the job's lengths were checked.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(job: &Job<'_, PanelOf<'_, Self>>) -> GroupOut;

    /// The AVX-512 VNNI path.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; the job's lengths were
    /// checked.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512(job: &Job<'_, PanelOf<'_, Self>>) -> GroupOut;

    /// The AMX path one job at a time, on `tiles` (the CPU's, or [`tiles::Emulated`] in
    /// tests); `None` where the format has none (the AVX-512 path runs) or has a staged one
    /// instead ([`Format::stage`], which the tile level then uses).
    ///
    /// # Safety
    /// As [`Format::avx512`], and `tiles` must be usable: for [`tiles::Hardware`], AMX-TILE
    /// and AMX-INT8 execute and this process holds the tile-data permission.
    #[cfg(target_arch = "x86_64")]
    unsafe fn amx<T: tiles::Tiles>(
        tiles: &mut T,
        job: &Job<'_, PanelOf<'_, Self>>,
    ) -> Option<GroupOut> {
        let _ = (tiles, job);
        None
    }

    /// Bytes per block of a group staged by [`Format::stage`]; zero where the format has no
    /// staged tile kernel (its tile level is [`Format::amx`], one job at a time).
    const STAGED_BLOCK_BYTES: usize = 0;

    /// Writes the blocks `blocks` of `group` (`nb` per row) into `staged` (`blocks.len() ·`
    /// [`Format::STAGED_BLOCK_BYTES`] bytes) in the layout [`Format::amx_staged`] loads into
    /// tiles: done once per group, pass and slice, and read by every panel pair of the pass.
    ///
    /// # Safety
    /// As [`Format::avx512`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn stage(group: &[u8], nb: usize, blocks: Range<usize>, staged: &mut [u8]) {
        let _ = (group, nb, blocks, staged);
        unreachable!("{} has no staged tile kernel", Self::NAME)
    }

    /// The AMX path on staged weights, for a run of panels and a slice of blocks: adds the
    /// slice's terms to `acc[q]`, panel `q`'s accumulators.
    ///
    /// # Safety
    /// As [`Format::amx`]; `job.staged` and `job.pairs` were written by [`Format::stage`]
    /// and [`Activations::stage_pairs`] for this job; `acc` has a place per panel.
    #[cfg(target_arch = "x86_64")]
    unsafe fn amx_staged<T: tiles::Tiles>(
        tiles: &mut T,
        job: &StagedJob<'_, PanelOf<'_, Self>>,
        acc: &mut [StagedAcc],
    ) {
        let _ = (tiles, job, acc);
        unreachable!("{} has no staged tile kernel", Self::NAME)
    }

    /// A panel's outputs from its accumulators after the last slice.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn staged_outputs(acc: &StagedAcc) -> GroupOut {
        let _ = acc;
        unreachable!("{} has no staged tile kernel", Self::NAME)
    }
}

/// Bytes of one super-block of a group staged for the scaled-products tile kernel
/// (`scaled_tiles_x86`): per 64-value chunk, `parts` tiles of 16 rows of 64 bytes.
pub(crate) const fn scaled_staged_bytes(parts: usize) -> usize {
    crate::model::kernels::kquant::QK_K / 64 * parts * 16 * 64
}

/// How [`Rows16Matrix::matmul_staged`] walks a product (see [`panel::StagedWalk`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct StagedPasses {
    /// Activation bytes a pass and slice keep in the cache beside one staged slice of a
    /// group.
    pub bytes: usize,
    /// Blocks a slice holds at least.
    pub min_slice: usize,
}

/// 1 MiB of activations (a 2 MiB L2 holds them and a staged slice), slices of at least
/// eight super-blocks (2048 values): a 512-row window is one pass.
const STAGED_PASSES: StagedPasses = StagedPasses {
    bytes: 1 << 20,
    min_slice: 8,
};

/// A weight matrix `[n, k]` (n outputs, k inputs) of format `F`, repacked in interleaved
/// groups of [`GROUP`] rows (the last group padded with zero rows).
pub struct Rows16Matrix<F: Format> {
    n: usize,
    k: usize,
    data: Vec<u8>,
    format: PhantomData<F>,
}

impl<F: Format> Rows16Matrix<F> {
    /// From the GGUF bytes of a `[n, k]` tensor; `None` unless `k` is a non-zero multiple of
    /// the block and `bytes` has the size of `n·k/block` blocks.
    pub fn from_bytes(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        let block = F::Act::BLOCK;
        let file_row = (k / block).checked_mul(F::FILE_BLOCK_BYTES)?;
        if k == 0 || !k.is_multiple_of(block) || bytes.len() != n.checked_mul(file_row)? {
            return None;
        }
        let group_len = (k / block) * F::GROUP_BLOCK_BYTES;
        let mut data = vec![0u8; n.div_ceil(GROUP) * group_len];
        data.par_chunks_mut(group_len)
            .enumerate()
            .for_each(|(g, group)| {
                for lane in 0..GROUP.min(n - g * GROUP) {
                    let row = &bytes[(g * GROUP + lane) * file_row..][..file_row];
                    let blocks = row.chunks_exact(F::FILE_BLOCK_BYTES);
                    for (src, dst) in blocks.zip(group.chunks_exact_mut(F::GROUP_BLOCK_BYTES)) {
                        F::pack(src, dst, lane);
                    }
                }
            });
        Some(Self {
            n,
            k,
            data,
            format: PhantomData,
        })
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes held (the last group's padding rows included).
    pub fn storage_bytes(&self) -> usize {
        self.data.len()
    }

    /// `x [m, k]` (row-major) times this matrix transposed: `[m, n]`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_at(x, m, tiles_pay::level_for::<F>())
    }

    /// [`Self::matmul`] at level `isa` (capped to this process's): every level gives the same
    /// bits.
    pub fn matmul_at(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32> {
        assert_eq!(x.len(), m * self.k, "activation shape");
        self.matmul_prepared_at(&F::Act::quantize(x, m, self.k), m, isa)
    }

    /// The product of `m` rows of activations already quantized for `F`, at level `isa`
    /// (capped to this process's): the staged tile kernel where the format has one and the
    /// level is AMX, else one job at a time.
    fn matmul_prepared_at(&self, a: &F::Act, m: usize, isa: Isa) -> Vec<f32> {
        #[cfg(target_arch = "x86_64")]
        if F::STAGED_BLOCK_BYTES > 0 && isa.min(super::isa()) >= Isa::Amx {
            // SAFETY: the process runs at the AMX level (permission held, the tile
            // instructions checked against their definitions at start-up).
            return unsafe { self.matmul_staged(a, m, || tiles::Hardware, STAGED_PASSES) };
        }
        self.matmul_prepared(a, m, kernel_at::<F>(isa))
    }

    /// [`Self::matmul_prepared`] through [`Format::amx_staged`], on the tiles `tiles()` gives
    /// (the CPU's, or emulated ones in the tests), in passes and slices of about
    /// `passes.bytes` of activations (at least two panels, at least `passes.min_slice`
    /// blocks).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C, and the tiles must be
    /// usable (see [`tiles::Tiles`]).
    #[cfg(target_arch = "x86_64")]
    unsafe fn matmul_staged<T: tiles::Tiles>(
        &self,
        a: &F::Act,
        m: usize,
        tiles: impl Fn() -> T + Sync,
        passes: StagedPasses,
    ) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        let nb = k / F::Act::BLOCK;
        let panels = self.panel_views(a, m);
        let pairs = F::Act::stage_pairs(&panels, nb);
        let walk = panel::StagedWalk {
            m,
            n,
            group: GROUP,
            blocks: nb,
            block_bytes: F::Act::BLOCK,
            pass_bytes: passes.bytes,
            min_slice: passes.min_slice,
        };
        let stage = |j: usize, blocks: Range<usize>, staged: &mut Vec<u8>| {
            staged.resize(blocks.len() * F::STAGED_BLOCK_BYTES, 0);
            // SAFETY: the caller vouches for the CPU; `staged` has the size `stage` writes.
            unsafe { F::stage(self.group(j / GROUP), nb, blocks, staged) };
        };
        let kernel = |staged: &Vec<u8>, run: &panel::StagedRun, acc: &mut [StagedAcc]| {
            let p0 = run.first_panel;
            let job = StagedJob {
                group: self.group(run.row / GROUP),
                staged,
                nb,
                blocks: run.blocks.clone(),
                panels: &panels[p0..p0 + run.panels],
                pairs: &pairs,
                all_pairs: panels.len().div_ceil(2),
                first_pair: p0 / 2,
            };
            // SAFETY: as `stage`; the panels' lengths were checked (`panel_views`), the group
            // is whole, `staged` and `pairs` were written for it and them.
            unsafe { F::amx_staged(&mut tiles(), &job, acc) };
        };
        let finish = |acc: &StagedAcc, out: &mut panel::OutRows<'_>| {
            // SAFETY: as `stage`.
            let values = unsafe { F::staged_outputs(acc) };
            for (r, row) in values.iter().enumerate().take(out.live()) {
                out.set_row(r, row);
            }
        };
        panel::drive_staged(walk, stage, kernel, finish)
    }

    /// Each panel's view once (with its length check), not once per job.
    fn panel_views<'a>(&self, a: &'a F::Act, m: usize) -> Vec<PanelOf<'a, F>> {
        let nb = self.k / F::Act::BLOCK;
        (0..m.div_ceil(PANEL))
            .map(|p| {
                let a = a.panel(p);
                assert!(F::Act::holds(&a, nb), "{} activation panel size", F::NAME);
                a
            })
            .collect()
    }

    /// [`Self::matmul`] with `kernel` computing each job (the tests' emulated tiles).
    #[cfg(test)]
    fn matmul_with(
        &self,
        x: &[f32],
        m: usize,
        kernel: impl Fn(&Job<'_, PanelOf<'_, F>>) -> GroupOut + Sync,
    ) -> Vec<f32> {
        assert_eq!(x.len(), m * self.k, "activation shape");
        self.matmul_prepared(&F::Act::quantize(x, m, self.k), m, kernel)
    }

    /// The product of `m` rows of activations already quantized for `F`.
    fn matmul_prepared(
        &self,
        a: &F::Act,
        m: usize,
        kernel: impl Fn(&Job<'_, PanelOf<'_, F>>) -> GroupOut + Sync,
    ) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        let nb = k / F::Act::BLOCK;
        let panels = self.panel_views(a, m);
        panel::drive(m, n, GROUP, |p, j, out| {
            let job = Job {
                group: self.group(j / GROUP),
                nb,
                a: panels[p],
            };
            assert!(
                job.group.len() == nb * F::GROUP_BLOCK_BYTES,
                "{} job sizes",
                F::NAME
            );
            for (r, row) in kernel(&job).iter().enumerate().take(out.live()) {
                out.set_row(r, row);
            }
        })
    }

    /// Row `j` as f32 (ggml's and candle's dequantization), so a tied embedding table can be
    /// looked up from the output layer's copy.
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        let lane = j % GROUP;
        let blocks = self.group(j / GROUP).chunks_exact(F::GROUP_BLOCK_BYTES);
        for (out, src) in out.chunks_exact_mut(F::Act::BLOCK).zip(blocks) {
            F::dequantize(src, lane, out);
        }
    }

    /// Group `g`'s blocks.
    fn group(&self, g: usize) -> &[u8] {
        let len = (self.k / F::Act::BLOCK) * F::GROUP_BLOCK_BYTES;
        &self.data[g * len..][..len]
    }
}

/// A job's kernel.
type Kernel<F> = fn(&Job<'_, PanelOf<'_, F>>) -> GroupOut;

/// Format `F`'s kernel at level `isa`, lowered to this process's level: chosen once per
/// matmul, not per job (a job is small: 18 blocks of 32 values for SmolLM2's rows).
fn kernel_at<F: Format>(isa: Isa) -> Kernel<F> {
    #[cfg(target_arch = "x86_64")]
    {
        let isa = isa.min(super::isa());
        // SAFETY (every closure): this function returns a closure of a level only when `isa`
        // is at most the process's level, whose instructions were seen to execute (and, for
        // `Amx`, the tile-data permission granted and the tile instructions checked against
        // their definition at start-up: `tiles::Hardware`); each level includes the ones
        // below it. The jobs' lengths are checked by the caller (`Rows16Matrix::matmul_prepared`).
        if isa >= Isa::Amx {
            return |job| unsafe {
                F::amx(&mut tiles::Hardware, job).unwrap_or_else(|| F::avx512(job))
            };
        }
        if isa >= Isa::Avx512 {
            return |job| unsafe { F::avx512(job) };
        }
        if isa >= Isa::Avx2 {
            return |job| unsafe { F::avx2(job) };
        }
    }
    let _ = isa;
    F::portable
}

impl<F: Format> OwnMatrix for Rows16Matrix<F> {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    fn storage_bytes(&self) -> usize {
        self.storage_bytes()
    }

    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul(x, m)
    }

    fn matmul_shared(&self, input: &SharedInput<'_>) -> Vec<f32> {
        let a = F::Act::shared(input, self.k);
        self.matmul_prepared_at(a, input.rows(), tiles_pay::level_for::<F>())
    }

    fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        self.dequantize_row(j, out)
    }
}
