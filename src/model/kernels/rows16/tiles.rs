//! AMX tiles: the instructions the interleaved-rows kernels use, behind one small trait with
//! two implementations — [`Hardware`], the CPU's tile unit through `asm!` (stable Rust has no
//! AMX intrinsics), and [`Emulated`], the instructions' definitions from Intel's SDM in plain
//! Rust, so the AMX kernels' layouts, tiling and arithmetic are tested on every machine and
//! the CPU's tile unit is checked against the same definitions at start-up
//! ([`hardware_matches_definition`]) before any kernel uses it.
//!
//! Register roles (so that each `asm!` names its registers literally): accumulators `C` in
//! `tmm0`–`tmm3`, activations `A` in `tmm4`–`tmm5`, weights `B` in `tmm6`–`tmm7`; a kernel
//! with fewer accumulators may take `tmm2`–`tmm3` as more `B`.
//!
//! Safety argument for [`Hardware`]: the compiler never allocates tile registers (no AMX
//! target feature is enabled), so state carried between `asm!` blocks is ours alone; a kernel
//! loads its configuration first, on the thread it runs on (tile state is per thread), and
//! every tile it reads it zeroed or loaded itself; [`Hardware`] skips the `ldtilecfg` when the
//! thread holds that configuration already (it costs about 70 ns, a third of a SmolLM2 job),
//! and the kernels leave the tiles configured for the thread's next job instead of releasing
//! them (`tilerelease` forgets the configuration); loads and stores touch exactly `rows × colsb` bytes per
//! tile at `base + row·stride`, which the callers bound; the instructions execute only after
//! the process was granted the tile-data permission (`arch_prctl(ARCH_REQ_XCOMP_PERM, 18)`)
//! and a child process ran them cleanly (`kernels::probe`).

use super::super::panel::PANEL;

/// A tile configuration (palette 1): rows and bytes per row of each of the eight tiles.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileConfig {
    bytes: [u8; 64],
}

impl TileConfig {
    /// From `(rows, bytes per row)` of tiles 0..8 (unused tiles `(0, 0)`).
    pub const fn new(shapes: [(u8, u16); 8]) -> Self {
        let mut bytes = [0u8; 64];
        bytes[0] = 1; // palette 1
        let mut t = 0;
        while t < 8 {
            let (rows, colsb) = shapes[t];
            bytes[16 + 2 * t] = colsb as u8;
            bytes[17 + 2 * t] = (colsb >> 8) as u8;
            bytes[48 + t] = rows;
            t += 1;
        }
        Self { bytes }
    }

    /// `(rows, bytes per row)` of tile `t`.
    pub fn shape(&self, t: usize) -> (usize, usize) {
        let colsb = u16::from_le_bytes([self.bytes[16 + 2 * t], self.bytes[17 + 2 * t]]);
        (self.bytes[48 + t] as usize, colsb as usize)
    }
}

/// C (tmm0), A (tmm4) and B (tmm6) of one 4-byte row each: one i32 or f32 sum of one pair
/// (the probe's and the tests' smallest programs).
pub const ONE_WORD: TileConfig = TileConfig::new([
    (1, 4),
    (0, 0),
    (0, 0),
    (0, 0),
    (1, 4),
    (0, 0),
    (1, 4),
    (0, 0),
]);

/// Steps of [`pipelined`] from a unit's product to its store, and to its sums' use (1 and 2,
/// or 1 and 3, were 5–15% slower on a 2-core Xeon with AMX).
const STORE_LAG: usize = 2;
const CONSUME_LAG: usize = 3;

/// The i32 sums of one panel's accumulator tile as [`pipelined`] stores them: a row per panel
/// row, a column per weight row of the group.
pub type PanelSums = [[i32; 16]; PANEL];

/// Which tiles a unit of [`pipelined`] multiplies: accumulator `c` (tmm0–tmm3) from the
/// activations in `a` (tmm4–tmm5) and the weights in `b` (tmm6–tmm7).
#[derive(Clone, Copy, Debug)]
pub struct Roles {
    pub c: u8,
    pub a: u8,
    pub b: u8,
}

/// A configuration for [`pipelined`]: the four accumulators `PANEL × 64` bytes (16 i32), the
/// two activation tiles `PANEL × a_bytes`, the two weight tiles `a_bytes / 4` rows of 64.
pub const fn pipelined_config(a_bytes: u16) -> TileConfig {
    let (c, a, b) = (
        (PANEL as u8, 64),
        (PANEL as u8, a_bytes),
        ((a_bytes / 4) as u8, 64),
    );
    TileConfig::new([c, c, c, c, a, a, b, b])
}

/// Runs `units` tile products so that the tile unit works ahead of the vector code reading
/// their sums: unit `u` is multiplied at step `u` (`product(tiles, u, roles)`: zero `roles.c`,
/// load `roles.a` and `roles.b`, multiply), its sums stored at step `u + 2` and handed to
/// `consume(u, sums)` at step `u + 3`, in order. One accumulator zeroed, multiplied, stored and
/// read back unit after unit serialised the tile unit and the vector units (the AMX kernels ran
/// at 3–6% of the tile peak, no faster than VNNI). `consume` sees the units in order, so the
/// float operations, and the bits, are the serial loop's. The configuration loaded must be a
/// [`pipelined_config`]. The loop is unrolled by the four accumulators so that every tile index
/// is a constant.
///
/// # Safety
/// As [`Tiles`]; `product` must only touch the tiles it is given.
#[inline(always)]
pub unsafe fn pipelined<T: Tiles>(
    tiles: &mut T,
    units: usize,
    mut product: impl FnMut(&mut T, usize, Roles),
    mut consume: impl FnMut(usize, &PanelSums),
) {
    let mut sums = [[[0i32; 16]; PANEL]; 4];
    let mut base = 0;
    while base < units + CONSUME_LAG {
        pipeline_step::<0, T>(tiles, base, units, &mut product, &mut consume, &mut sums);
        pipeline_step::<1, T>(tiles, base, units, &mut product, &mut consume, &mut sums);
        pipeline_step::<2, T>(tiles, base, units, &mut product, &mut consume, &mut sums);
        pipeline_step::<3, T>(tiles, base, units, &mut product, &mut consume, &mut sums);
        base += 4;
    }
}

/// Step `base + S` of [`pipelined`] (`base` a multiple of 4, so accumulator `S` takes this
/// step's unit).
#[inline(always)]
unsafe fn pipeline_step<const S: usize, T: Tiles>(
    tiles: &mut T,
    base: usize,
    units: usize,
    product: &mut impl FnMut(&mut T, usize, Roles),
    consume: &mut impl FnMut(usize, &PanelSums),
    sums: &mut [PanelSums; 4],
) {
    let step = base + S;
    if step < units {
        let pair = (S % 2) as u8;
        let roles = Roles {
            c: S as u8,
            a: 4 + pair,
            b: 6 + pair,
        };
        product(tiles, step, roles);
    }
    let stored = (S + 4 - STORE_LAG) % 4;
    if step >= STORE_LAG && step - STORE_LAG < units {
        tiles.store(stored as u8, sums[stored].as_mut_ptr() as *mut u8, 64);
    }
    let consumed = (S + 4 - CONSUME_LAG) % 4;
    if step >= CONSUME_LAG && step - CONSUME_LAG < units {
        consume(step - CONSUME_LAG, &sums[consumed]);
    }
}

/// The tile instructions the kernels use. Tile indices follow the roles above.
///
/// # Safety
/// Every method is unsafe: [`Hardware`]'s execute tile instructions (see the module's safety
/// argument), and pointers must cover `rows × colsb` bytes at `base + row·stride`.
pub trait Tiles {
    /// `ldtilecfg`.
    ///
    /// # Safety
    /// See the trait's.
    unsafe fn configure(&mut self, cfg: &TileConfig);
    /// `tilezero`.
    ///
    /// # Safety
    /// See the trait's.
    unsafe fn zero(&mut self, t: u8);
    /// `tileloadd`: tile `t`'s rows from `base + row·stride`.
    ///
    /// # Safety
    /// See the trait's.
    unsafe fn load(&mut self, t: u8, base: *const u8, stride: usize);
    /// `tilestored`.
    ///
    /// # Safety
    /// See the trait's.
    unsafe fn store(&mut self, t: u8, base: *mut u8, stride: usize);
    /// `tdpbssd`: `C[m][n] += Σ_k A[m][4k..4k+4] · B[k][4n..4n+4]`, signed bytes both, in i32.
    ///
    /// # Safety
    /// See the trait's.
    unsafe fn dp_ss(&mut self, c: u8, a: u8, b: u8);
    /// `tdpbsud`: as [`Tiles::dp_ss`] with `A` signed and `B` unsigned bytes.
    ///
    /// # Safety
    /// See the trait's.
    unsafe fn dp_su(&mut self, c: u8, a: u8, b: u8);
    /// `tdpbf16ps`: per 32-bit pair `k` of `A`'s row `m` and `B`'s row `k`, `C[m][n] +=
    /// A[m].bf16[2k]·B[k].bf16[2n]`, then `+= A[m].bf16[2k+1]·B[k].bf16[2n+1]`, each an f32
    /// fused multiply-add rounded to nearest even, denormal inputs read as zero and denormal
    /// results flushed to zero (AMX-BF16).
    ///
    /// # Safety
    /// See the trait's; the CPU must also have AMX-BF16.
    unsafe fn dp_bf16(&mut self, c: u8, a: u8, b: u8);
    /// `tilerelease`.
    ///
    /// # Safety
    /// See the trait's.
    unsafe fn release(&mut self);
}

/// The CPU's tile unit.
pub struct Hardware;

#[cfg(target_arch = "x86_64")]
mod hardware {
    use super::{Hardware, TileConfig, Tiles};
    use std::arch::asm;
    use std::cell::Cell;

    thread_local! {
        /// The configuration this thread's tile unit holds (`None` before the first
        /// `ldtilecfg` and after `tilerelease`).
        static LOADED: Cell<Option<TileConfig>> = const { Cell::new(None) };
    }

    /// One `asm!` per register of a role: the index must name the register literally.
    macro_rules! each_tile {
        ($t:expr, $pre:literal, $post:literal, $($operands:tt)*) => {
            match $t {
                0 => asm!(concat!($pre, "0", $post), $($operands)*),
                1 => asm!(concat!($pre, "1", $post), $($operands)*),
                2 => asm!(concat!($pre, "2", $post), $($operands)*),
                3 => asm!(concat!($pre, "3", $post), $($operands)*),
                4 => asm!(concat!($pre, "4", $post), $($operands)*),
                5 => asm!(concat!($pre, "5", $post), $($operands)*),
                6 => asm!(concat!($pre, "6", $post), $($operands)*),
                7 => asm!(concat!($pre, "7", $post), $($operands)*),
                _ => unreachable!("tile {}", $t),
            }
        };
    }

    /// A dot-product instruction on `(C, A, B)` within the roles (C 0–3, A 4–5, B 6–7), or
    /// with `B` in tmm2–tmm3 where a kernel keeps fewer accumulators.
    macro_rules! dot {
        ($insn:literal, $c:expr, $a:expr, $b:expr) => {
            match ($c, $a, $b) {
                (0, 4, 6) => asm!(concat!($insn, " tmm0, tmm4, tmm6"), options(nostack, nomem)),
                (0, 4, 7) => asm!(concat!($insn, " tmm0, tmm4, tmm7"), options(nostack, nomem)),
                (0, 5, 6) => asm!(concat!($insn, " tmm0, tmm5, tmm6"), options(nostack, nomem)),
                (0, 5, 7) => asm!(concat!($insn, " tmm0, tmm5, tmm7"), options(nostack, nomem)),
                (1, 4, 6) => asm!(concat!($insn, " tmm1, tmm4, tmm6"), options(nostack, nomem)),
                (1, 4, 7) => asm!(concat!($insn, " tmm1, tmm4, tmm7"), options(nostack, nomem)),
                (1, 5, 6) => asm!(concat!($insn, " tmm1, tmm5, tmm6"), options(nostack, nomem)),
                (1, 5, 7) => asm!(concat!($insn, " tmm1, tmm5, tmm7"), options(nostack, nomem)),
                (2, 4, 6) => asm!(concat!($insn, " tmm2, tmm4, tmm6"), options(nostack, nomem)),
                (2, 4, 7) => asm!(concat!($insn, " tmm2, tmm4, tmm7"), options(nostack, nomem)),
                (2, 5, 6) => asm!(concat!($insn, " tmm2, tmm5, tmm6"), options(nostack, nomem)),
                (2, 5, 7) => asm!(concat!($insn, " tmm2, tmm5, tmm7"), options(nostack, nomem)),
                (3, 4, 6) => asm!(concat!($insn, " tmm3, tmm4, tmm6"), options(nostack, nomem)),
                (3, 4, 7) => asm!(concat!($insn, " tmm3, tmm4, tmm7"), options(nostack, nomem)),
                (3, 5, 6) => asm!(concat!($insn, " tmm3, tmm5, tmm6"), options(nostack, nomem)),
                (3, 5, 7) => asm!(concat!($insn, " tmm3, tmm5, tmm7"), options(nostack, nomem)),
                // Kernels with fewer than four accumulators take tmm2–tmm3 as more B tiles.
                (0, 4, 2) => asm!(concat!($insn, " tmm0, tmm4, tmm2"), options(nostack, nomem)),
                (0, 4, 3) => asm!(concat!($insn, " tmm0, tmm4, tmm3"), options(nostack, nomem)),
                (0, 5, 2) => asm!(concat!($insn, " tmm0, tmm5, tmm2"), options(nostack, nomem)),
                (0, 5, 3) => asm!(concat!($insn, " tmm0, tmm5, tmm3"), options(nostack, nomem)),
                (1, 4, 2) => asm!(concat!($insn, " tmm1, tmm4, tmm2"), options(nostack, nomem)),
                (1, 4, 3) => asm!(concat!($insn, " tmm1, tmm4, tmm3"), options(nostack, nomem)),
                (1, 5, 2) => asm!(concat!($insn, " tmm1, tmm5, tmm2"), options(nostack, nomem)),
                (1, 5, 3) => asm!(concat!($insn, " tmm1, tmm5, tmm3"), options(nostack, nomem)),
                (2, 4, 3) => asm!(concat!($insn, " tmm2, tmm4, tmm3"), options(nostack, nomem)),
                (2, 5, 3) => asm!(concat!($insn, " tmm2, tmm5, tmm3"), options(nostack, nomem)),
                (3, 4, 2) => asm!(concat!($insn, " tmm3, tmm4, tmm2"), options(nostack, nomem)),
                (3, 5, 2) => asm!(concat!($insn, " tmm3, tmm5, tmm2"), options(nostack, nomem)),
                other => unreachable!("tiles {other:?} outside the kernels' roles"),
            }
        };
    }

    impl Tiles for Hardware {
        #[inline(always)]
        unsafe fn configure(&mut self, cfg: &TileConfig) {
            if LOADED.get() != Some(*cfg) {
                asm!("ldtilecfg [{0}]", in(reg) cfg as *const TileConfig, options(nostack, readonly));
                LOADED.set(Some(*cfg));
            }
        }

        #[inline(always)]
        unsafe fn zero(&mut self, t: u8) {
            each_tile!(t, "tilezero tmm", "", options(nostack, nomem));
        }

        #[inline(always)]
        unsafe fn load(&mut self, t: u8, base: *const u8, stride: usize) {
            each_tile!(
                t,
                "tileloadd tmm",
                ", [{base} + {stride}*1]",
                base = in(reg) base,
                stride = in(reg) stride,
                options(nostack, readonly)
            );
        }

        #[inline(always)]
        unsafe fn store(&mut self, t: u8, base: *mut u8, stride: usize) {
            each_tile!(
                t,
                "tilestored [{base} + {stride}*1], tmm",
                "",
                base = in(reg) base,
                stride = in(reg) stride,
                options(nostack)
            );
        }

        #[inline(always)]
        unsafe fn dp_ss(&mut self, c: u8, a: u8, b: u8) {
            dot!("tdpbssd", c, a, b);
        }

        #[inline(always)]
        unsafe fn dp_su(&mut self, c: u8, a: u8, b: u8) {
            dot!("tdpbsud", c, a, b);
        }

        #[inline(always)]
        unsafe fn dp_bf16(&mut self, c: u8, a: u8, b: u8) {
            dot!("tdpbf16ps", c, a, b);
        }

        #[inline(always)]
        unsafe fn release(&mut self) {
            asm!("tilerelease", options(nostack, nomem));
            LOADED.set(None);
        }
    }
}

/// The tile instructions by their definitions (Intel SDM, "TDPBSSD/TDPBSUD/…", "TILELOADD",
/// "TILESTORED", "TILEZERO"), with the shape checks whose failure raises #UD on a CPU.
pub struct Emulated {
    cfg: Option<TileConfig>,
    data: [[u8; 1024]; 8],
}

impl Default for Emulated {
    fn default() -> Self {
        Self {
            cfg: None,
            data: [[0; 1024]; 8],
        }
    }
}

impl Emulated {
    fn shape(&self, t: u8) -> (usize, usize) {
        let cfg = self
            .cfg
            .as_ref()
            .expect("tile instruction before ldtilecfg (#UD)");
        let (rows, colsb) = cfg.shape(t as usize);
        assert!(
            rows > 0 && rows <= 16 && colsb > 0 && colsb <= 64,
            "tile {t} is not configured (#UD)"
        );
        (rows, colsb)
    }

    /// The shapes of a dot product's tiles, `(C rows, C bytes per row, A bytes per row)`,
    /// checked as the CPU checks them.
    fn dot_shapes(&self, (c, a, b): (u8, u8, u8)) -> (usize, usize, usize) {
        let ((rc, cc), (ra, ca), (rb, cb)) = (self.shape(c), self.shape(a), self.shape(b));
        assert!(
            cc == cb && rc == ra && ca / 4 == rb && ca % 4 == 0 && cc % 4 == 0,
            "tile shapes C {rc}×{cc}, A {ra}×{ca}, B {rb}×{cb} do not fit (#UD)"
        );
        (rc, cc, ca)
    }

    /// The rows past `rows` and the bytes past `colsb` of each row of tile `t`, zeroed (as
    /// every instruction that writes a tile leaves them).
    fn zero_outside(&mut self, t: u8, rows: usize, colsb: usize) {
        let tile = &mut self.data[t as usize];
        for m in 0..rows {
            tile[64 * m + colsb..64 * (m + 1)].fill(0);
        }
        tile[64 * rows..].fill(0);
    }

    fn dot_bf16(&mut self, (c, a, b): (u8, u8, u8)) {
        let (rc, cc, ca) = self.dot_shapes((c, a, b));
        // Denormals read as zero and results flushed to zero, signs kept.
        let flush = |x: f32| {
            if x.is_subnormal() {
                0f32.copysign(x)
            } else {
                x
            }
        };
        let bf16 = |t: &[u8; 1024], at: usize| {
            flush(f32::from_bits(
                (u16::from_le_bytes([t[at], t[at + 1]]) as u32) << 16,
            ))
        };
        let (ta, tb) = (self.data[a as usize], self.data[b as usize]);
        let tc = &mut self.data[c as usize];
        for m in 0..rc {
            for n in 0..cc / 4 {
                let at = 64 * m + 4 * n;
                let mut acc = f32::from_le_bytes(tc[at..at + 4].try_into().unwrap());
                for k in 0..ca / 4 {
                    for i in 0..2 {
                        let x = bf16(&ta, 64 * m + 4 * k + 2 * i);
                        let y = bf16(&tb, 64 * k + 4 * n + 2 * i);
                        acc = flush(x.mul_add(y, flush(acc)));
                    }
                }
                tc[at..at + 4].copy_from_slice(&acc.to_le_bytes());
            }
        }
        self.zero_outside(c, rc, cc);
    }

    fn dot(&mut self, (c, a, b): (u8, u8, u8), a_signed: bool, b_signed: bool) {
        let (rc, cc, ca) = self.dot_shapes((c, a, b));
        let byte = |v: u8, signed: bool| if signed { v as i8 as i32 } else { v as i32 };
        let (ta, tb) = (self.data[a as usize], self.data[b as usize]);
        let tc = &mut self.data[c as usize];
        for m in 0..rc {
            for n in 0..cc / 4 {
                let at = 64 * m + 4 * n;
                let mut acc = i32::from_le_bytes(tc[at..at + 4].try_into().unwrap());
                for k in 0..ca / 4 {
                    for i in 0..4 {
                        let x = byte(ta[64 * m + 4 * k + i], a_signed);
                        let y = byte(tb[64 * k + 4 * n + i], b_signed);
                        acc = acc.wrapping_add(x * y);
                    }
                }
                tc[at..at + 4].copy_from_slice(&acc.to_le_bytes());
            }
        }
        self.zero_outside(c, rc, cc);
    }
}

impl Tiles for Emulated {
    unsafe fn configure(&mut self, cfg: &TileConfig) {
        self.cfg = Some(*cfg);
        self.data = [[0; 1024]; 8];
    }

    unsafe fn zero(&mut self, t: u8) {
        self.shape(t);
        self.data[t as usize] = [0; 1024];
    }

    unsafe fn load(&mut self, t: u8, base: *const u8, stride: usize) {
        let (rows, colsb) = self.shape(t);
        let tile = &mut self.data[t as usize];
        *tile = [0; 1024];
        for r in 0..rows {
            let src = std::slice::from_raw_parts(base.add(r * stride), colsb);
            tile[64 * r..64 * r + colsb].copy_from_slice(src);
        }
    }

    unsafe fn store(&mut self, t: u8, base: *mut u8, stride: usize) {
        let (rows, colsb) = self.shape(t);
        for r in 0..rows {
            let dst = std::slice::from_raw_parts_mut(base.add(r * stride), colsb);
            dst.copy_from_slice(&self.data[t as usize][64 * r..64 * r + colsb]);
        }
    }

    unsafe fn dp_ss(&mut self, c: u8, a: u8, b: u8) {
        self.dot((c, a, b), true, true);
    }

    unsafe fn dp_su(&mut self, c: u8, a: u8, b: u8) {
        self.dot((c, a, b), true, false);
    }

    unsafe fn dp_bf16(&mut self, c: u8, a: u8, b: u8) {
        self.dot_bf16((c, a, b));
    }

    unsafe fn release(&mut self) {
        self.cfg = None;
    }
}

/// Runs the same tile program on `tiles` and returns what it stored: every shape the kernels
/// configure (K = 16, 32 and 64 bytes; 8 and 16 rows), both dot products, accumulation onto a
/// loaded tile and onto a zeroed one, strides other than the row length, extreme bytes.
pub fn known_answer_program<T: Tiles>(tiles: &mut T) -> Vec<u8> {
    const SHAPES: [(u8, u16, u8); 4] = [(8, 32, 8), (8, 16, 4), (16, 64, 16), (8, 64, 16)];
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let v = (seed >> 56) as u8;
        // A fifth of the bytes at the extremes (0x80, 0x7F, 0xFF, 0x00).
        match (seed >> 32) % 20 {
            0 => 0x80,
            1 => 0x7F,
            2 => 0xFF,
            3 => 0x00,
            _ => v,
        }
    };
    let a: Vec<u8> = (0..16 * 96).map(|_| next()).collect();
    let b: Vec<u8> = (0..16 * 80).map(|_| next()).collect();
    let c0: Vec<u8> = (0..16 * 64).map(|_| next()).collect();
    let program = |tiles: &mut T| {
        // SAFETY: the buffers cover every tile's rows at the strides used (A: 16 rows of 96
        // bytes, B: 16 of 80, C: 16 of 64); the caller vouches for `tiles`.
        unsafe {
            tiles.load(0, c0.as_ptr(), 64);
            tiles.zero(1);
            tiles.load(4, a.as_ptr().add(3), 96);
            tiles.load(6, b.as_ptr(), 80);
            tiles.load(7, b.as_ptr().add(16), 80);
            tiles.dp_ss(0, 4, 6);
            tiles.dp_su(1, 4, 7);
            tiles.dp_su(0, 4, 7);
        }
    };
    run_per_shape(tiles, &SHAPES, program)
}

/// Runs `program` under each shape's configuration — `(rows, A's bytes per row, B's rows)`:
/// C in tmm0 and tmm1 (`rows` × 64 bytes), A in tmm4, B in tmm6 and tmm7 (× 64 bytes) — and
/// returns the two C tiles it leaves, shape after shape.
fn run_per_shape<T: Tiles>(
    tiles: &mut T,
    shapes: &[(u8, u16, u8)],
    program: impl Fn(&mut T),
) -> Vec<u8> {
    let mut out = Vec::new();
    for &(rows, k_bytes, b_rows) in shapes {
        let cfg = TileConfig::new([
            (rows, 64),
            (rows, 64),
            (0, 0),
            (0, 0),
            (rows, k_bytes),
            (0, 0),
            (b_rows, 64),
            (b_rows, 64),
        ]);
        let mut stored = vec![0u8; 2 * rows as usize * 64];
        // SAFETY: `stored` holds both C tiles' rows of 64 bytes; the caller of the program's
        // runner vouches for `tiles`.
        unsafe {
            tiles.configure(&cfg);
            program(tiles);
            tiles.store(0, stored.as_mut_ptr(), 64);
            tiles.store(1, stored.as_mut_ptr().add(rows as usize * 64), 64);
            tiles.release();
        }
        out.extend_from_slice(&stored);
    }
    out
}

/// [`known_answer_program`] for `tdpbf16ps`: every shape the BF16 kernel configures (8 rows
/// by K = 16 pairs, and a remainder of 3 pairs; 16 rows), accumulation onto loaded and zeroed
/// tiles, values of both signs over forty binades, and one pair whose result tells the order of
/// the two products and the rounding after each: onto 1.0, the even product
/// `(1 + 2⁻⁷)·2⁻²⁴` then the odd `−2⁻²³` gives 1.0, the other order (or one rounding of
/// both) `1 − 2⁻²⁴`.
pub fn bf16_known_answer_program<T: Tiles>(tiles: &mut T) -> Vec<u8> {
    const SHAPES: [(u8, u16, u8); 3] = [(8, 64, 16), (8, 12, 3), (16, 64, 16)];
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Sign, a biased exponent in 127 ± 20, seven random mantissa bits.
        let (sign, exp, man) = ((seed >> 63) as u16, (seed >> 40) % 41, (seed >> 20) as u16);
        (sign << 15) | ((107 + exp as u16) << 7) | (man & 0x7F)
    };
    let words = |n: usize, next: &mut dyn FnMut() -> u16| -> Vec<u8> {
        (0..n).flat_map(|_| next().to_le_bytes()).collect()
    };
    let mut a = words(16 * 32, &mut next);
    let mut b = words(16 * 32, &mut next);
    let mut c0: Vec<u8> = (0..16 * 16)
        .flat_map(|i| (i as f32 * 0.37 - 40.0).to_le_bytes())
        .collect();
    // The order pair, in A's row 0 pair 0 and B's row 0 column 0, other pairs of that output
    // zero; the C row 0 column 0 it lands on starts at 1.0 (the loaded C).
    let bf = |x: f32| (x.to_bits() >> 16) as u16;
    for k in 0..16 {
        a[4 * k..4 * k + 4].fill(0);
        b[64 * k..64 * k + 4].fill(0);
    }
    a[0..2].copy_from_slice(&bf(1.0 + 1.0 / 128.0).to_le_bytes());
    a[2..4].copy_from_slice(&bf(-1.0).to_le_bytes());
    b[0..2].copy_from_slice(&bf(2f32.powi(-24)).to_le_bytes());
    b[2..4].copy_from_slice(&bf(2f32.powi(-23)).to_le_bytes());
    c0[0..4].copy_from_slice(&1f32.to_le_bytes());
    let program = |tiles: &mut T| {
        // SAFETY: the buffers cover every tile's rows at the strides used (A, B, C: 16 rows
        // of 64 bytes); the caller vouches for `tiles`.
        unsafe {
            tiles.load(0, c0.as_ptr(), 64);
            tiles.zero(1);
            tiles.load(4, a.as_ptr(), 64);
            tiles.load(6, b.as_ptr(), 64);
            tiles.dp_bf16(0, 4, 6);
            tiles.dp_bf16(1, 4, 6);
            tiles.dp_bf16(1, 4, 6);
        }
    };
    run_per_shape(tiles, &SHAPES, program)
}

/// Whether this CPU's tile unit computes [`bf16_known_answer_program`] as the definition
/// does. Only called once the tile-data permission is held and a probe child ran `tdpbf16ps`.
#[cfg(target_arch = "x86_64")]
pub(crate) fn hardware_bf16_matches_definition() -> bool {
    bf16_known_answer_program(&mut Hardware) == bf16_known_answer_program(&mut Emulated::default())
}

/// Whether this CPU's tile unit computes [`known_answer_program`] as the definitions do. Only
/// called once the tile-data permission is held and a probe child ran the instructions.
#[cfg(target_arch = "x86_64")]
pub(crate) fn hardware_matches_definition() -> bool {
    known_answer_program(&mut Hardware) == known_answer_program(&mut Emulated::default())
}

/// The tile unit's int8 peak on this thread, in GOP/s (two operations per multiply-add),
/// measured as Intel's figure is: four independent 16 × 16 accumulators, each `tdpbssd` of a
/// 16 × 64-byte `A` by a 16 × 64-byte `B` (32,768 operations). `None` where this process does
/// not use AMX.
pub fn peak_gops() -> Option<f64> {
    if crate::model::kernels::isa() < crate::model::kernels::Isa::Amx {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        const ROUNDS: usize = 200_000;
        let cfg = TileConfig::new([
            (16, 64),
            (16, 64),
            (16, 64),
            (16, 64),
            (16, 64),
            (0, 0),
            (16, 64),
            (0, 0),
        ]);
        let data = [1u8; 1024];
        let mut t = Hardware;
        // SAFETY: AMX is in use by this process (checked above: permission held, probe and
        // known-answer check passed); `data` covers 16 rows of 64 bytes.
        let elapsed = unsafe {
            t.configure(&cfg);
            for c in 0..4 {
                t.zero(c);
            }
            t.load(4, data.as_ptr(), 64);
            t.load(6, data.as_ptr(), 64);
            let start = std::time::Instant::now();
            for _ in 0..ROUNDS {
                t.dp_ss(0, 4, 6);
                t.dp_ss(1, 4, 6);
                t.dp_ss(2, 4, 6);
                t.dp_ss(3, 4, 6);
            }
            let elapsed = start.elapsed();
            t.release();
            elapsed
        };
        Some((ROUNDS * 4 * 32_768) as f64 / elapsed.as_secs_f64() / 1e9)
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

#[cfg(test)]
#[path = "tiles_tests.rs"]
mod tests;
