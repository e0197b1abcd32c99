//! The shared half of our quantized matmuls: activations quantized to 8-bit blocks and packed
//! in panels of [`PANEL`] rows, and the cache-blocked driver that hands (panel, group of weight
//! rows) pairs to a format's micro-kernel.
//!
//! Why panels: a micro-kernel that keeps eight output accumulators in registers decodes each
//! weight block once for eight activation rows, and the eight rows' scales of one block are
//! contiguous.
//! The previous per-row kernel spent most of its time on scalar scale products and on
//! accumulators that lived on the stack (profile: 57% of a SmolLM2 Q4_1 evaluation).
//!
//! Exactness: every output element is computed by one call of the micro-kernel on its own
//! activation row, in a fixed order; which panel a row lands in, the zero rows padding the last
//! panel, the cache blocking and the split across threads never change a value.

use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ops::Range;

use half::f16;
use rayon::prelude::*;

use super::half_driver::sub_slices;

/// Values per quantization block (GGUF's 32 for Q4_0/Q4_1/Q5_0/Q8_0/Q8_1).
pub const BLOCK: usize = 32;
/// Activation rows per panel: one micro-kernel call yields this many outputs.
pub const PANEL: usize = 8;
const _: () = assert!(PANEL <= 8, "OutRows::written holds one bit per panel row");
/// Weight rows per cache block: their blocks stay in L2 while every panel of a task passes.
const ROWS_PER_CACHE_BLOCK: usize = 128;

/// Activations quantized as llama.cpp's x86 `quantize_row_q8_1` (and `q8_0`, whose values and
/// scales are the same): per 32-value block `d = amax/127`, `q = round_half_even(x·127/amax)`,
/// `s = d·Σq` (from the unrounded d), d and s rounded to f16 and used as their f32 values;
/// and each block's `Σq`, exact (the integer kernels' offsets), kept from the quantization
/// (a second pass summing the quantized blocks was 1% of a SmolLM2 Q4_0 evaluation).
///
/// Layout: panel `p`, block `b`, row `r` of the panel at index `(p·nb + b)·PANEL + r`.
pub struct Panels {
    rows: usize,
    blocks_per_row: usize,
    qs: Vec<[i8; BLOCK]>,
    d: Vec<f32>,
    s: Vec<f32>,
    sums: Vec<i32>,
}

/// One panel's blocks: `qs[b·PANEL + r]`, `d[b·PANEL + r]`, `s[b·PANEL + r]`.
#[derive(Clone, Copy)]
pub struct PanelRef<'a> {
    pub qs: &'a [[i8; BLOCK]],
    pub d: &'a [f32],
    pub s: &'a [f32],
    /// `Σ q` of the block.
    pub sums: &'a [i32],
}

impl Panels {
    /// Quantizes `x [m, k]` (row-major; `k` a multiple of [`BLOCK`]).
    pub fn quantize(x: &[f32], m: usize, k: usize) -> Self {
        assert!(
            k.is_multiple_of(BLOCK) && x.len() == m * k,
            "activation shape"
        );
        let nb = k / BLOCK;
        let panels = m.div_ceil(PANEL);
        let per_panel = nb * PANEL;
        let mut out = Panels {
            rows: m,
            blocks_per_row: nb,
            qs: vec![[0; BLOCK]; panels * per_panel],
            d: vec![0.0; panels * per_panel],
            s: vec![0.0; panels * per_panel],
            sums: vec![0; panels * per_panel],
        };
        out.qs
            .par_chunks_mut(per_panel)
            .zip(out.d.par_chunks_mut(per_panel))
            .zip(out.s.par_chunks_mut(per_panel))
            .zip(out.sums.par_chunks_mut(per_panel))
            .enumerate()
            .for_each(|(p, (((qs, d), s), sums))| {
                for r in 0..PANEL.min(m - p * PANEL) {
                    let row = &x[(p * PANEL + r) * k..][..k];
                    for (b, block) in row.chunks_exact(BLOCK).enumerate() {
                        let i = b * PANEL + r;
                        (d[i], s[i], sums[i]) = quantize_block(block, &mut qs[i]);
                    }
                }
            });
        out
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn blocks_per_row(&self) -> usize {
        self.blocks_per_row
    }

    pub fn panel(&self, p: usize) -> PanelRef<'_> {
        let span = p * self.blocks_per_row * PANEL..(p + 1) * self.blocks_per_row * PANEL;
        PanelRef {
            qs: &self.qs[span.clone()],
            d: &self.d[span.clone()],
            s: &self.s[span.clone()],
            sums: &self.sums[span],
        }
    }
}

/// One block: its values into `q`, returns `(d, s, Σq)`.
fn quantize_block(x: &[f32], q: &mut [i8; BLOCK]) -> (f32, f32, i32) {
    quantize_block_with(super::isa(), x, q)
}

/// [`quantize_block`] at instruction-set level `isa`, lowered to what this process may use
/// (every level gives the same bits; tests run each).
pub(crate) fn quantize_block_with(
    isa: super::Isa,
    x: &[f32],
    q: &mut [i8; BLOCK],
) -> (f32, f32, i32) {
    #[cfg(target_arch = "x86_64")]
    {
        match isa.min(super::isa()) {
            // SAFETY: AVX-512 F/BW/VL were detected and seen to execute; `x` holds BLOCK
            // values (asserted inside).
            super::Isa::Avx512 | super::Isa::Avx512Bf16 | super::Isa::Amx => {
                return unsafe { avx512::quantize_block(x, q) }
            }
            // SAFETY: AVX2 and FMA were detected and seen to execute.
            super::Isa::Avx2 => return unsafe { avx2::quantize_block(x, q) },
            super::Isa::Portable => {}
        }
    }
    let _ = isa;
    quantize_block_portable(x, q)
}

/// The scalar definition; the AVX2 and AVX-512 versions return the same bits.
pub(crate) fn quantize_block_portable(x: &[f32], q: &mut [i8; BLOCK]) -> (f32, f32, i32) {
    let amax = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = (v * id).round_ties_even() as i8;
        sum += *qi as i32;
    }
    // llama.cpp forms s from the unrounded d.
    (
        f16::from_f32(d).to_f32(),
        f16::from_f32(d * sum as f32).to_f32(),
        sum,
    )
}

/// Where a job's outputs go: the `width` columns from weight row `j` of the `live` output
/// rows of one panel (rows past `m` and columns past `n` do not exist and are not written).
///
/// It holds a raw pointer rather than a slice because [`drive_staged`]'s tasks write disjoint
/// columns of the same rows: their slices would overlap. Every write is bounds-checked
/// against the buffer, and the constructors state who may write where.
pub struct OutRows<'a> {
    out: *mut MaybeUninit<f32>,
    /// Values in the buffer at `out`.
    len: usize,
    /// Index in the buffer of the first row's first column.
    at: usize,
    n: usize,
    live: usize,
    width: usize,
    /// Bit `r` set once row `r` is written: the driver checks every live row was, so that no
    /// uninitialised output is ever read, whatever a kernel does.
    written: u8,
    _buffer: PhantomData<&'a mut [MaybeUninit<f32>]>,
}

/// Where in the output an [`OutRows`] writes: rows of `n` values, the job's first at `at`.
struct Place {
    at: usize,
    n: usize,
    live: usize,
    width: usize,
}

impl<'a> OutRows<'a> {
    /// Rows in a buffer this job alone writes.
    fn in_slice(out: &'a mut [MaybeUninit<f32>], place: Place) -> Self {
        // SAFETY: the exclusive borrow covers the whole buffer for `'a`.
        unsafe { Self::in_shared(out.as_mut_ptr(), out.len(), place) }
    }

    /// Rows in a buffer of `len` values at `out` that other jobs write too.
    ///
    /// # Safety
    /// For `'a`, nothing else reads or writes this job's place (its `live` rows' `width`
    /// columns from `at`), and the buffer is valid for `len` values.
    unsafe fn in_shared(out: *mut MaybeUninit<f32>, len: usize, place: Place) -> Self {
        let Place { at, n, live, width } = place;
        OutRows {
            out,
            len,
            at,
            n,
            live,
            width,
            written: 0,
            _buffer: PhantomData,
        }
    }
}

impl OutRows<'_> {
    /// Output rows of this panel that exist (≤ [`PANEL`]).
    pub fn live(&self) -> usize {
        self.live
    }

    /// Weight rows of this job that exist (≤ the driver's `group`).
    pub fn width(&self) -> usize {
        self.width
    }

    /// Row `r`'s outputs: the first [`Self::width`] of `values`.
    pub fn set_row<const W: usize>(&mut self, r: usize, values: &[f32; W]) {
        assert!(r < self.live, "panel row {r} of {}", self.live);
        assert!(self.width <= W, "{} outputs from {W} values", self.width);
        let start = self.at + r * self.n;
        assert!(
            start + self.width <= self.len,
            "output row {r} past the buffer"
        );
        // SAFETY: in bounds (asserted), and the place is this job's alone (the constructors).
        let row = unsafe { std::slice::from_raw_parts_mut(self.out.add(start), self.width) };
        // A whole group is a fixed-size copy the compiler inlines (a `memcpy` call per row
        // was 3% of a SmolLM2 run).
        match <&mut [MaybeUninit<f32>; W]>::try_from(&mut *row) {
            Ok(full) => *full = values.map(MaybeUninit::new),
            Err(_) => {
                for (o, &v) in row.iter_mut().zip(values) {
                    o.write(v);
                }
            }
        }
        self.written |= 1 << r;
    }

    /// The drivers' check after each job: every live row was written.
    fn assert_all_written(&self) {
        let all = (1u16 << self.live) - 1;
        assert_eq!(self.written as u16, all, "a kernel left output rows out");
    }
}

/// The `[m, n]` outputs of any panel format: `kernel(p, j, out)` writes, through
/// [`OutRows::set_row`], every live row's outputs of weight rows `j .. j + out.width()` (at
/// most `group` of them) for the [`PANEL`] activation rows of panel `p`.
pub fn drive(
    m: usize,
    n: usize,
    group: usize,
    kernel: impl Fn(usize, usize, &mut OutRows<'_>) + Sync,
) -> Vec<f32> {
    let group = group.max(1);
    let panels = m.div_ceil(PANEL);
    let per_task = panels.div_ceil(rayon::current_num_threads().max(1));
    per_task_outputs(m, n, per_task, |t, out| {
        let rows = out.len() / n;
        for j0 in (0..n).step_by(ROWS_PER_CACHE_BLOCK) {
            let js = j0..(j0 + ROWS_PER_CACHE_BLOCK).min(n);
            for p in 0..rows.div_ceil(PANEL) {
                for j in js.clone().step_by(group) {
                    let place = Place {
                        at: p * PANEL * n + j,
                        n,
                        live: PANEL.min(rows - p * PANEL),
                        width: group.min(js.end - j),
                    };
                    let mut rows = OutRows::in_slice(&mut *out, place);
                    kernel(t * per_task + p, j, &mut rows);
                    rows.assert_all_written();
                }
            }
        }
    })
}

/// The `[m, n]` output buffer split into one task per run of `per_task` panels (one task per
/// thread, each a contiguous run of panels, so that each task streams the weights through its
/// cache once per cache block rather than once per panel); `task(t, rows)` must write every
/// value of its rows (which the callers assert per job).
fn per_task_outputs(
    m: usize,
    n: usize,
    per_task: usize,
    task: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync,
) -> Vec<f32> {
    if m == 0 || n == 0 {
        return vec![0f32; m * n];
    }
    // Every output is written exactly once (each live row of each panel, for every weight
    // row), so the buffer starts uninitialised: zeroing it first was a pass over up to
    // 100 MB (the logits) per window.
    let mut out = Vec::with_capacity(m * n);
    out.spare_capacity_mut()[..m * n]
        .par_chunks_mut(per_task.max(1) * PANEL * n)
        .enumerate()
        .for_each(|(t, out)| task(t, out));
    // SAFETY: all `m · n` values were written: every (panel, group) job's live rows, each
    // `width` wide (asserted after each job by `OutRows::assert_all_written`), and the jobs
    // tile the output.
    unsafe { out.set_len(m * n) };
    out
}

/// The walk [`drive_staged`] takes through a product: its shape and how much activation data
/// it keeps in the cache at once.
#[derive(Clone, Copy, Debug)]
pub struct StagedWalk {
    /// Activation rows.
    pub m: usize,
    /// Weight rows (outputs per activation row).
    pub n: usize,
    /// Weight rows per group.
    pub group: usize,
    /// Blocks per row (`k` over the block length).
    pub blocks: usize,
    /// Activation bytes per row of one block.
    pub block_bytes: usize,
    /// Activation bytes of one pass and slice: the panels of a pass and the blocks of a slice
    /// are chosen so that their activations (about this many bytes) stay in the cache while
    /// every group passes.
    pub pass_bytes: usize,
    /// Blocks a slice holds at least (so that a long window is split into passes of panels
    /// rather than into slices of one block; the tests take 1 with `pass_bytes` 0, to run
    /// every block in a slice of its own).
    pub min_slice: usize,
}

/// Which blocks of which panels one call of [`drive_staged`]'s kernel takes.
#[derive(Clone, Debug)]
pub struct StagedRun {
    /// The first panel of the run (the run's panels are consecutive, an even number but
    /// perhaps the last run's last).
    pub first_panel: usize,
    /// Panels of the run.
    pub panels: usize,
    /// The group's first weight row.
    pub row: usize,
    /// The slice of blocks.
    pub blocks: Range<usize>,
}

/// [`drive`] for kernels that meet weights staged per group (decoded once into the layout
/// their instructions read) and take a run of panels per call. The threads split the groups,
/// not the panels: each task takes every panel against its run of groups, so each group is
/// staged once, not once per thread, and each staging serves every panel (split by panels,
/// two threads ran a 512-row Q4_K product at 1.4× one thread; two one-thread processes at
/// 2×). Within a task, for each pass of panels, for each slice of blocks, for each group `j`:
/// `stage(j, blocks, &mut staged)`, then `kernel(&staged, run, accumulators)` carries the
/// run's accumulators (one per panel) over the slice; after a group's last slice,
/// `finish(accumulator, rows)` writes each panel's outputs. A pass holds every panel unless
/// their rows of one block exceed `pass_bytes`, and a slice as many blocks as keep the
/// pass's activations within `pass_bytes`, so the activations every group meets stay in the
/// cache. With several slices every group's accumulators are held between them. Each output
/// is still computed on its own activation row, block after block in order, so the values
/// are [`drive`]'s whatever the walk and the thread count.
pub fn drive_staged<S: Default, A: Default + Clone + Send>(
    walk: StagedWalk,
    stage: impl Fn(usize, Range<usize>, &mut S) + Sync,
    kernel: impl Fn(&S, &StagedRun, &mut [A]) + Sync,
    finish: impl Fn(&A, &mut OutRows<'_>) + Sync,
) -> Vec<f32> {
    let StagedWalk { m, n, blocks, .. } = walk;
    if m == 0 || n == 0 {
        return vec![0f32; m * n];
    }
    let group = walk.group.max(1);
    let (panels, groups) = (m.div_ceil(PANEL), n.div_ceil(group));
    let tasks = rayon::current_num_threads().clamp(1, groups);
    let per_task = groups.div_ceil(tasks);
    let row_block_bytes = PANEL * walk.block_bytes.max(1);
    let min_slice = walk.min_slice.clamp(1, blocks.max(1));
    // As many panels as leave a slice at least `min_slice` blocks; even, so that every run
    // but the last starts and ends on a pair of panels.
    let pass_panels = (walk.pass_bytes / (row_block_bytes * min_slice))
        .max(2)
        .next_multiple_of(2);
    let mut out = Vec::with_capacity(m * n);
    let shared = SharedOut(out.spare_capacity_mut().as_mut_ptr());
    (0..tasks).into_par_iter().for_each(|t| {
        let shared = &shared;
        let task_groups = t * per_task..((t + 1) * per_task).min(groups);
        let mut staged = S::default();
        let mut held_acc = Vec::new();
        for first in (0..panels).step_by(pass_panels) {
            let run_panels = pass_panels.min(panels - first);
            let slice =
                (walk.pass_bytes / (run_panels * row_block_bytes)).clamp(min_slice, blocks.max(1));
            let slices = blocks.div_ceil(slice).max(1);
            // Groups whose accumulators are held at once: every slice of a block of groups
            // runs before the next block's (all of a task's groups at once could be 128 MB
            // for an output matrix of 128256 rows against 512 activation rows; a 2048-token
            // window of a 1B model ran 1.6x faster and 160 MB smaller with the blocks).
            let held = if slices > 1 {
                HELD_GROUPS
            } else {
                FINISH_BATCH
            };
            for block in sub_slices(task_groups.clone(), held) {
                held_acc.resize(block.len() * run_panels, A::default());
                for s in 0..slices {
                    let slice = s * slice..((s + 1) * slice).min(blocks);
                    for (i, g) in block.clone().enumerate() {
                        stage(g * group, slice.clone(), &mut staged);
                        let acc = &mut held_acc[i * run_panels..][..run_panels];
                        if s == 0 {
                            acc.fill(A::default());
                        }
                        let run = StagedRun {
                            first_panel: first,
                            panels: run_panels,
                            row: g * group,
                            blocks: slice.clone(),
                        };
                        kernel(&staged, &run, acc);
                    }
                }
                // The block's outputs, a batch of groups at a time, panel by panel, each
                // row's groups side by side: a group at a time wrote 64 bytes into every
                // row, a cache miss each (a 1B model's logits have rows 500 KB apart; this
                // and the block-major staged activations together took 10% off its
                // evaluation).
                for batch in sub_slices(0..block.len(), FINISH_BATCH) {
                    for q in 0..run_panels {
                        let p = first + q;
                        for i in batch.clone() {
                            let j = (block.start + i) * group;
                            let place = Place {
                                at: p * PANEL * n + j,
                                n,
                                live: PANEL.min(m - p * PANEL),
                                width: group.min(n - j),
                            };
                            // SAFETY: the place (this group's columns of panel `p`'s rows)
                            // is this task's alone: the tasks' groups are disjoint, and this
                            // is the one job of (`p`, group); the buffer holds `m · n` values
                            // and is not otherwise touched until every task is done.
                            let mut out = unsafe { OutRows::in_shared(shared.0, m * n, place) };
                            finish(&held_acc[i * run_panels + q], &mut out);
                            out.assert_all_written();
                        }
                    }
                }
            }
        }
    });
    // SAFETY: every (panel, group) job's live rows were written, `width` wide (asserted after
    // each), and the jobs tile the output: every group in one task, every panel in a pass.
    unsafe { out.set_len(m * n) };
    out
}

/// Groups [`drive_staged`] finishes together, so that each output row gets their values side
/// by side (16 groups: 1 KiB of a row; their accumulators, 1 KiB per panel and group, stay
/// in the cache).
const FINISH_BATCH: usize = 16;

/// Groups whose accumulators [`drive_staged`] holds across slices of blocks (64 panels: 4 MiB
/// per task).
const HELD_GROUPS: usize = 64;

/// The output buffer as [`drive_staged`]'s tasks share it (each writes its own columns).
struct SharedOut(*mut MaybeUninit<f32>);

// SAFETY: the tasks write disjoint places through it (see `drive_staged`), and the buffer
// outlives them.
unsafe impl Sync for SharedOut {}

/// ggml's `hsum_float_8` order for eight lane sums: `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
pub(crate) fn hsum8(acc: &[f32; 8]) -> f32 {
    let r: [f32; 4] = std::array::from_fn(|i| acc[i + 4] + acc[i]);
    (r[0] + r[2]) + (r[1] + r[3])
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::BLOCK;
    use half::f16;
    use std::arch::x86_64::*;

    /// [`super::quantize_block_portable`] in AVX2: the same max, products, rounding (to
    /// nearest even) and integer sum, so the same bits.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn quantize_block(x: &[f32], q: &mut [i8; BLOCK]) -> (f32, f32, i32) {
        assert_eq!(x.len(), BLOCK);
        let p = x.as_ptr();
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for vi in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
        }
        let mut m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let amax = _mm_cvtss_f32(m4);
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let i: [__m256i; 4] = std::array::from_fn(|j| {
            _mm256_cvtps_epi32(_mm256_round_ps::<NEAREST>(_mm256_mul_ps(v[j], id)))
        });
        let total = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        let mut t4 = _mm_add_epi32(
            _mm256_extracti128_si256(total, 1),
            _mm256_castsi256_si128(total),
        );
        t4 = _mm_hadd_epi32(t4, t4);
        t4 = _mm_hadd_epi32(t4, t4);
        let sum = _mm_cvtsi128_si32(t4);
        // Packing interleaves the 128-bit lanes; the permute restores element order.
        let packed = _mm256_packs_epi16(
            _mm256_packs_epi32(i[0], i[1]),
            _mm256_packs_epi32(i[2], i[3]),
        );
        let ordered =
            _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, ordered);
        (
            f16::from_f32(d).to_f32(),
            f16::from_f32(d * sum as f32).to_f32(),
            sum,
        )
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::BLOCK;
    use half::f16;
    use std::arch::x86_64::*;

    /// [`super::quantize_block_portable`] in two zmm registers: the maximum, the rounding
    /// (to nearest even), the saturating narrowing and the integer sum are exact, so any
    /// grouping gives the same bits; the scale arithmetic is the same scalar code.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn quantize_block(x: &[f32], q: &mut [i8; BLOCK]) -> (f32, f32, i32) {
        assert_eq!(x.len(), BLOCK);
        let p = x.as_ptr();
        let (lo, hi) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let qlo = _mm512_cvt_roundps_epi32::<NEAREST>(_mm512_mul_ps(lo, id));
        let qhi = _mm512_cvt_roundps_epi32::<NEAREST>(_mm512_mul_ps(hi, id));
        let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
        let out = q.as_mut_ptr() as *mut __m128i;
        _mm_storeu_si128(out, _mm512_cvtsepi32_epi8(qlo));
        _mm_storeu_si128(out.add(1), _mm512_cvtsepi32_epi8(qhi));
        (
            f16::from_f32(d).to_f32(),
            f16::from_f32(d * sum as f32).to_f32(),
            sum,
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// The instruction-set levels this process may run, each of which a test compares.
    pub(crate) fn available_isas() -> Vec<super::super::Isa> {
        use super::super::Isa;
        let top = super::super::isa();
        [Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Amx]
            .into_iter()
            .filter(|&l| l <= top)
            .collect()
    }

    #[test]
    fn quantization_follows_llama_cpp() {
        let mut x = vec![0f32; 32];
        x[0] = 127.0; // amax: d = 1, id = 1
        x[1] = -2.5; // ties go to even (roundf would give -3)
        x[2] = 3.5;
        x[3] = 0.49;
        let a = Panels::quantize(&x, 1, 32);
        assert_eq!(&a.qs[0][..4], &[127, -2, 4, 0]);
        assert_eq!((a.d[0], a.s[0], a.sums[0]), (1.0, 129.0, 129));
        let zero = Panels::quantize(&[0f32; 32], 1, 32);
        assert_eq!((zero.d[0], zero.s[0], zero.qs[0]), (0.0, 0.0, [0i8; 32]));
    }

    #[test]
    fn every_isa_level_quantizes_as_the_scalar_definition() {
        let mut seed = 11;
        for scale in [1e-6f32, 0.01, 1.0, 300.0, 1e30] {
            for t in 0..200 {
                let mut x: Vec<f32> = (0..32).map(|_| lcg(&mut seed) * scale).collect();
                // Exact ties after scaling: amax 127 makes id 1.
                x[5] = 127.0 * scale.signum();
                x[6] = 2.5;
                x[7] = -3.5;
                if t % 50 == 0 {
                    x.fill(0.0);
                }
                let mut want_q = [0i8; 32];
                let want = quantize_block_portable(&x, &mut want_q);
                for isa in available_isas() {
                    let mut q = [0i8; 32];
                    let got = quantize_block_with(isa, &x, &mut q);
                    assert_eq!(
                        (got.0.to_bits(), got.1.to_bits(), q),
                        (want.0.to_bits(), want.1.to_bits(), want_q),
                        "{isa:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn panels_hold_rows_in_place_and_pad_with_zeros() {
        let mut seed = 5;
        let (m, k) = (11, 64);
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let a = Panels::quantize(&x, m, k);
        assert_eq!(a.qs.len(), 2 * 2 * PANEL);
        for row in 0..m {
            for b in 0..2 {
                let mut q = [0i8; 32];
                let (d, s, sum) = quantize_block_portable(&x[row * k + b * 32..][..32], &mut q);
                let i = ((row / PANEL) * 2 + b) * PANEL + row % PANEL;
                assert_eq!((a.qs[i], a.d[i], a.s[i], a.sums[i]), (q, d, s, sum));
                assert_eq!(sum, q.iter().map(|&v| v as i32).sum::<i32>());
            }
        }
        let pad = a.panel(1);
        assert!(pad.qs[PANEL - 1] == [0; 32] && pad.d[PANEL - 1] == 0.0);
    }
}
