//! The one driver of the float weight kernels ([`super::f32_weights`] for F32,
//! [`super::half`] for F16, [`super::bf16`] for BF16): how the outputs are split over threads
//! (each task writing its block of the output in place), how weight rows and activation panels
//! are blocked for the caches, the activations' packing ([`ChunkPanels`]), the job a
//! micro-kernel takes ([`Job`]), the definition's loop ([`accumulate_lanes`]), the tail, and
//! the tests every kernel passes (`half_driver_tests.rs`). A kernel supplies only its
//! arithmetic ([`PanelKernel`]: its micro-kernels per level and one tail step); neither the
//! split nor the blocking changes any output's order of operations, so results are the same
//! bits for any thread count.

use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ops::Range;

use rayon::prelude::*;

use super::panel::hsum8;
use super::Isa;

#[cfg(target_arch = "x86_64")]
#[path = "half_driver_x86.rs"]
pub(crate) mod x86;

#[cfg(test)]
#[path = "half_driver_tests.rs"]
pub(crate) mod tests;

/// Activation rows per panel (one micro-kernel pass over a weight row yields this many).
pub const PANEL: usize = 8;
/// Lanes of each output's sum.
pub(crate) const LANES: usize = 8;
/// One weight row's lane sums against the eight panel rows: `[panel row][lane]`.
pub(crate) type Lanes = [f32; PANEL * LANES];
/// Bytes of weight rows kept in L2 while every panel of a task passes over them.
const WEIGHT_BLOCK_BYTES: usize = 384 << 10;
/// Below this many panels per thread, the threads split the weight rows rather than the
/// panels (a split of few panels leaves threads idle).
const PANELS_PER_THREAD: usize = 8;
/// Weight rows are blocked in multiples of this (the micro-kernels take two, three, four or
/// six at a time).
pub(crate) const ROW_GROUP: usize = 12;

/// One pass of a block of weight rows over a slice of one panel: what a kernel's
/// micro-kernels take (weights of type `W`: the 16-bit kernels' bits or F32 values;
/// activations of type `X`, packed as [`ChunkPanels`]).
pub(crate) struct Job<'a, W, X> {
    /// The weight rows, back to back (`k` values each).
    pub w: &'a [W],
    pub k: usize,
    /// The panel this pass reads.
    pub panel: ChunkPanel<'a, X>,
    /// The chunks (of [`PanelKernel::CHUNK`] values) this pass adds.
    pub chunks: Range<usize>,
    /// Rows of the panel that hold activations.
    pub live: usize,
}

impl<W, X> Job<'_, W, X> {
    /// Weight rows in the pass.
    pub fn rows(&self) -> usize {
        self.w.len() / self.k.max(1)
    }

    /// Checks what every level's micro-kernel relies on: one lane sum set per weight row in
    /// `acc`, whole weight rows, the pass's chunks (of `chunk` values) inside the panel, at
    /// most [`PANEL`] live rows.
    pub fn check(&self, acc: &[Lanes], chunk: usize) {
        assert!(acc.len() == self.rows() && self.w.len() == self.rows() * self.k);
        assert!(self.panel.chunks.len() >= self.chunks.end * PANEL * chunk);
        assert!(self.live <= PANEL);
    }
}

/// The definition every level of a float kernel follows, one lane at a time: for each weight
/// row, live panel row and chunk of the job, `step(weights, activations, lanes)` adds the
/// chunk's `chunk` products into the eight lanes of that weight row and panel row (a pass over
/// the first chunks starts from zero).
pub(crate) fn accumulate_lanes<W, X>(
    job: &Job<'_, W, X>,
    chunk: usize,
    acc: &mut [Lanes],
    step: impl Fn(&[W], &[X], &mut [f32]),
) {
    for (c, acc_c) in acc.iter_mut().enumerate() {
        let w = &job.w[c * job.k..][..job.k];
        for r in 0..job.live {
            let lanes = &mut acc_c[r * LANES..][..LANES];
            if job.chunks.start == 0 {
                lanes.fill(0.0);
            }
            for ch in job.chunks.clone() {
                let x = &job.panel.chunks[(ch * PANEL + r) * chunk..][..chunk];
                step(&w[ch * chunk..][..chunk], x, lanes);
            }
        }
    }
}

/// `chunks` in consecutive pieces of at most `len` (the last shorter): a kernel that blocks a
/// job's slice more finely for its level's cache takes them in order, the lane sums waiting in
/// `acc` between pieces, so each lane's additions keep their order.
pub(crate) fn sub_slices(chunks: Range<usize>, len: usize) -> impl Iterator<Item = Range<usize>> {
    let end = chunks.end;
    chunks
        .step_by(len.max(1))
        .map(move |start| start..(start + len).min(end))
}

/// Activations packed for a float kernel that takes `chunk` values per lane step, in panels
/// of [`PANEL`] rows: per panel `[chunk][row][chunk values]`, then `[row][k mod chunk]` (the
/// tail); rows past `m` are zero. `T` is what the kernel reads: the rounded values as f32
/// (F16, F32) or their bits (BF16).
pub struct ChunkPanels<T> {
    rows: usize,
    chunk: usize,
    chunks: usize,
    tail: usize,
    data: Vec<T>,
}

/// One panel of [`ChunkPanels`]: `chunks[(c·PANEL + r)·chunk + i]` is row `r`'s value
/// `chunk·c + i`; `tail[r·t + i]` its value `chunk·chunks + i`.
#[derive(Clone, Copy)]
pub struct ChunkPanel<'a, T> {
    pub chunks: &'a [T],
    pub tail: &'a [T],
}

impl<T: Copy + Default + Send + Sync> ChunkPanels<T> {
    /// Packs `x [m, k]` in chunks of `chunk` values: each whole chunk of a row through
    /// `round(src, dst)`, the tail value by value through `one` — the kernel's rounding, which
    /// its SIMD `round` computes with the same bits as `one`.
    pub fn pack(
        x: &[f32],
        (m, k, chunk): (usize, usize, usize),
        round: impl Fn(&[f32], &mut [T]) + Sync,
        one: impl Fn(f32) -> T + Sync,
    ) -> Self {
        assert_eq!(x.len(), m * k, "activation shape");
        assert!(chunk > 0);
        let (chunks, tail) = (k / chunk, k % chunk);
        let per_panel = PANEL * k;
        let mut data = vec![T::default(); m.div_ceil(PANEL) * per_panel];
        data.par_chunks_mut(per_panel)
            .enumerate()
            .for_each(|(p, panel)| {
                let (body, tail_part) = panel.split_at_mut(chunks * PANEL * chunk);
                for r in 0..PANEL.min(m - p * PANEL) {
                    let row = &x[(p * PANEL + r) * k..][..k];
                    for (c, src) in row.chunks_exact(chunk).enumerate() {
                        round(src, &mut body[(c * PANEL + r) * chunk..][..chunk]);
                    }
                    let dst = &mut tail_part[r * tail..][..tail];
                    for (d, &v) in dst.iter_mut().zip(&row[chunks * chunk..]) {
                        *d = one(v);
                    }
                }
            });
        Self {
            rows: m,
            chunk,
            chunks,
            tail,
            data,
        }
    }
}

impl<T> ChunkPanels<T> {
    pub fn panels(&self) -> usize {
        self.rows.div_ceil(PANEL)
    }

    pub fn panel(&self, p: usize) -> ChunkPanel<'_, T> {
        let per_panel = PANEL * (self.chunks * self.chunk + self.tail);
        let (chunks, tail) =
            self.data[p * per_panel..][..per_panel].split_at(self.chunks * PANEL * self.chunk);
        ChunkPanel { chunks, tail }
    }
}

/// The highest level this CPU executes for the float kernels, whatever `PPL_ISA` says (tests
/// ask for each level explicitly; the matrices follow [`super::isa`]): AVX2 with FMA and F16C,
/// then AVX-512 F/BW/VL, then AVX-512 BF16 (used by the BF16 kernel alone; the others cap
/// their level at AVX-512).
pub(crate) fn cpu_level() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        let (avx2, avx512) = super::avx2_and_avx512();
        if avx512 && is_x86_feature_detected!("avx512bf16") {
            Isa::Avx512Bf16
        } else if avx512 {
            Isa::Avx512
        } else if avx2 {
            Isa::Avx2
        } else {
            Isa::Portable
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    Isa::Portable
}

/// What a float weight kernel supplies to [`matmul`].
pub(crate) trait PanelKernel: Sync {
    /// One stored weight (its size sets the cache blocking).
    type Weight: Copy + Sync;
    /// One packed activation.
    type Act: Copy + Sync;
    /// Values each lane step takes per weight row.
    const CHUNK: usize;
    /// Values of a panel's rows kept in L1 while a block of weight rows passes over them.
    const K_SLICE: usize;
    /// `(n, k)`.
    fn shape(&self) -> (usize, usize);
    /// Weight rows `rows`, back to back.
    fn rows(&self, rows: Range<usize>) -> &[Self::Weight];
    /// Adds the job's chunks into `acc[c]` (the job's weight row `c`) at level `isa`; a job
    /// whose chunks start at 0 starts its sums from zero, whatever `acc` holds (the driver
    /// does not clear it between panels).
    fn accumulate(&self, job: &Job<'_, Self::Weight, Self::Act>, isa: Isa, acc: &mut [Lanes]);
    /// `sum` plus the product of a weight and an activation past the last whole chunk (the
    /// `k mod CHUNK` tail, added one at a time after the lanes' sum).
    fn tail_step(&self, w: Self::Weight, x: Self::Act, sum: f32) -> f32;
}

/// The `m` packed activation rows times the kernel's matrix transposed: `[m, n]`.
pub(crate) fn matmul<K: PanelKernel>(
    kernel: &K,
    a: &ChunkPanels<K::Act>,
    m: usize,
    isa: Isa,
) -> Vec<f32> {
    let n = kernel.shape().0;
    assert_eq!(
        a.chunk,
        K::CHUNK,
        "activations packed for another kernel's chunk"
    );
    if m == 0 || n == 0 {
        return vec![0f32; m * n];
    }
    // Every output is written exactly once below (`block` writes each live row of each of
    // its panels for each of its weight rows), so the buffer starts uninitialised: zeroing
    // it first was a pass over up to 100 MB (the logits) per window.
    let mut out = Vec::with_capacity(m * n);
    fill(kernel, a, m, isa, &mut out.spare_capacity_mut()[..m * n]);
    // SAFETY: `fill` initialised all `m · n` values.
    unsafe { out.set_len(m * n) };
    out
}

/// [`matmul`] into `out` (`m · n` values, every one written).
fn fill<K: PanelKernel>(
    kernel: &K,
    a: &ChunkPanels<K::Act>,
    m: usize,
    isa: Isa,
    out: &mut [MaybeUninit<f32>],
) {
    let n = kernel.shape().0;
    let panels = a.panels();
    let threads = rayon::current_num_threads().max(1);
    let whole = OutBlock::of(out, n);
    // Many rows: one contiguous run of panels per thread, each streaming the weights through
    // its cache once per weight block. Few rows: the threads split the weight rows instead
    // (evenly, whatever the number of panels). Either way each task writes its block of the
    // output in place (a part per thread copied in afterwards was a fresh 6 MB per thread per
    // block of SmolLM2's logits, page faults and all, and a second pass over them).
    let tasks: Vec<(Range<usize>, Range<usize>)> = if panels >= PANELS_PER_THREAD * threads {
        let per_task = panels.div_ceil(threads);
        (0..panels)
            .step_by(per_task)
            .map(|p0| (p0..(p0 + per_task).min(panels), 0..n))
            .collect()
    } else {
        let per_task = n.div_ceil(threads).next_multiple_of(ROW_GROUP);
        (0..n)
            .step_by(per_task)
            .map(|j0| (0..panels, j0..(j0 + per_task).min(n)))
            .collect()
    };
    tasks.into_par_iter().for_each(|(ps, cols)| {
        let rows = ps.start * PANEL..(ps.end * PANEL).min(m);
        // SAFETY: the tasks' blocks (their panels' rows × their columns) are disjoint.
        let out = unsafe { whole.part(rows, cols.clone()) };
        block(kernel, a, ps, cols, isa, out);
    });
}

/// Where a task writes its outputs: `rows × width` values from `ptr`, each row `stride`
/// values after the one before — a block of rows and columns of the whole output, beside
/// other tasks' blocks (never overlapping them: see [`Self::part`]).
#[derive(Clone, Copy)]
pub(crate) struct OutBlock<'a> {
    ptr: *mut f32,
    rows: usize,
    width: usize,
    stride: usize,
    /// The output it writes, borrowed for as long as any part of it is in use.
    out: PhantomData<&'a mut [MaybeUninit<f32>]>,
}

// SAFETY: an `OutBlock` is a place to write, as `&mut [f32]` is; the tasks given parts of
// one block write disjoint values (the callers of `part` promise it).
unsafe impl Send for OutBlock<'_> {}
unsafe impl Sync for OutBlock<'_> {}

impl<'a> OutBlock<'a> {
    /// All of `out`, `width` values per row.
    pub(crate) fn of(out: &'a mut [MaybeUninit<f32>], width: usize) -> Self {
        assert!(width > 0 && out.len().is_multiple_of(width));
        Self {
            ptr: out.as_mut_ptr().cast(),
            rows: out.len() / width,
            width,
            stride: width,
            out: PhantomData,
        }
    }

    /// Rows `rows` × columns `cols` of this block.
    ///
    /// # Safety
    /// No two parts in use at once may share a value.
    unsafe fn part(&self, rows: Range<usize>, cols: Range<usize>) -> Self {
        assert!(rows.end <= self.rows && cols.end <= self.width);
        Self {
            // SAFETY: inside the block (asserted above).
            ptr: unsafe { self.ptr.add(rows.start * self.stride + cols.start) },
            rows: rows.len(),
            width: cols.len(),
            stride: self.stride,
            out: PhantomData,
        }
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// Where value (`row`, `col`) lies; the caller keeps `row < rows`, `col < width`.
    pub(crate) fn at(&self, row: usize, col: usize) -> *mut f32 {
        debug_assert!(row < self.rows && col < self.width);
        self.ptr.wrapping_add(row * self.stride + col)
    }

    /// Writes value (`row`, `col`).
    fn write(&self, row: usize, col: usize, value: f32) {
        assert!(row < self.rows && col < self.width);
        // SAFETY: inside the block (asserted), which this task alone writes.
        unsafe { self.at(row, col).write(value) }
    }
}

/// The eight panel rows' sums of their lanes, each in ggml's `hsum_float_8` order.
pub(crate) fn reduce(lanes: &Lanes, isa: Isa) -> [f32; PANEL] {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx2 {
            // SAFETY: AVX2 is present (`isa` is capped by detection).
            return unsafe { x86::reduce(lanes) };
        }
    }
    let _ = isa;
    std::array::from_fn(|r| hsum8(lanes[r * LANES..][..LANES].try_into().expect("8 lanes")))
}

/// Where [`write_sums`] puts its outputs: weight row `c`'s output for panel row `r` is
/// `out`'s value (`row0 + r`, `col0 + c`).
pub(crate) struct SumsOut<'a> {
    pub out: OutBlock<'a>,
    pub row0: usize,
    pub col0: usize,
}

/// Every weight row's sums of lanes (`acc[c]`) for the first `live` panel rows, each in
/// ggml's `hsum_float_8` order ([`reduce`]'s sums), written to `dst`.
pub(crate) fn write_sums(acc: &[Lanes], live: usize, dst: SumsOut<'_>, isa: Isa) {
    assert!(live <= PANEL);
    if acc.is_empty() || live == 0 {
        return;
    }
    assert!(dst.row0 + live <= dst.out.rows() && dst.col0 + acc.len() <= dst.out.width());
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx2 {
            // SAFETY: AVX2 is present (`isa` is capped by detection); the bounds were
            // checked above.
            return unsafe { x86::write_sums(acc, live, dst) };
        }
    }
    let _ = isa;
    for (c, lanes) in acc.iter().enumerate() {
        for r in 0..live {
            let sum = hsum8(lanes[r * LANES..][..LANES].try_into().expect("8 lanes"));
            // SAFETY: inside the block (checked above), which this task alone writes.
            unsafe { dst.out.at(dst.row0 + r, dst.col0 + c).write(sum) };
        }
    }
}

/// The outputs of panels `ps` × weight rows `cols` into `out` (`cols.len()` wide, starting at
/// panel `ps.start`'s first row; rows past the activations absent): every value of `out` is
/// written.
///
/// Blocking: a block of weight rows stays in L2 while each panel passes over it, and within a
/// panel a slice of [`PanelKernel::K_SLICE`] values of its eight rows stays in L1 while every
/// weight row of the block passes; the lane sums wait in `acc` between slices (the order of
/// each lane's additions is unchanged; the first slice starts them from zero).
fn block<K: PanelKernel>(
    kernel: &K,
    a: &ChunkPanels<K::Act>,
    ps: Range<usize>,
    cols: Range<usize>,
    isa: Isa,
    out: OutBlock<'_>,
) {
    let k = kernel.shape().1;
    let chunks = k / K::CHUNK;
    assert_eq!(out.width(), cols.len());
    let rows_here = out.rows();
    // At least eight row groups, so that each slice of a panel serves many weight rows (a
    // block larger than L2 then streams from L3, which keeps up with eight rows' arithmetic
    // per weight).
    let row_bytes = std::mem::size_of::<K::Weight>() * k;
    let per_block = (WEIGHT_BLOCK_BYTES / row_bytes.max(1)).clamp(8 * ROW_GROUP, 16 * ROW_GROUP)
        / ROW_GROUP
        * ROW_GROUP;
    let mut acc = vec![[0f32; PANEL * LANES]; per_block.min(cols.len())];
    // Values past the last whole chunk: none where `k` is a multiple of the chunk, as in
    // every real model, and an output is then its lane sum.
    let tail = k % K::CHUNK;
    for j0 in cols.clone().step_by(per_block) {
        let js = j0..(j0 + per_block).min(cols.end);
        let acc = &mut acc[..js.len()];
        for (i, p) in ps.clone().enumerate() {
            let mut job = Job {
                w: kernel.rows(js.clone()),
                k,
                panel: a.panel(p),
                chunks: 0..0,
                live: PANEL.min(rows_here - i * PANEL),
            };
            for c0 in (0..chunks.max(1)).step_by(K::K_SLICE / K::CHUNK) {
                job.chunks = c0..(c0 + K::K_SLICE / K::CHUNK).min(chunks);
                kernel.accumulate(&job, isa, acc);
            }
            let (row0, col0) = (i * PANEL, js.start - cols.start);
            if tail == 0 {
                let dst = SumsOut { out, row0, col0 };
                write_sums(acc, job.live, dst, isa);
                continue;
            }
            // The tail's products, one at a time after the lanes' sum.
            for (c, lanes) in acc.iter().enumerate() {
                let w = &job.w[c * k + k - tail..][..tail];
                let sums = reduce(lanes, isa);
                for (r, &sum) in sums.iter().enumerate().take(job.live) {
                    let x = &job.panel.tail[r * tail..][..tail];
                    let sum = w
                        .iter()
                        .zip(x)
                        .fold(sum, |s, (&w, &x)| kernel.tail_step(w, x, s));
                    out.write(row0 + r, col0 + c, sum);
                }
            }
        }
    }
}
