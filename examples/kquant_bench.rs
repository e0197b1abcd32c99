//! Throughput of our K-quant kernels against candle's `QMatMul` on one weight matrix.
//!
//! `cargo run --release --example kquant_bench -- [n] [k] [m] [reps]` (default: a
//! `[2048, 8192]` matrix, 512 activation rows, 5 repetitions), threads from
//! `RAYON_NUM_THREADS` (both libraries read it). Weights are random values quantized by
//! candle's own quantizer; `PPL_ISA` caps our kernels' instruction set. Prints the median
//! GFLOP/s (2·m·n·k per product) of each kernel and type, per wall-clock second (median
//! run) and per second of CPU time of the whole process (mean over the runs; steadier on a
//! machine shared with other work; with t threads busy, t CPU-seconds pass per wall-clock
//! second).

use std::time::Instant;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use ppl::model::kernels::{self, own_matrix};

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// CPU seconds (user + system) this process has used, from `/proc/self/stat`.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the command name (which ends with the last ')'): state, ..., utime, stime are the
    // 12th and 13th fields, in ticks of 10 ms.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let field = |i| {
        rest.split_whitespace()
            .nth(i)
            .and_then(|f: &str| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field(11) + field(12)) / 100.0
}

/// Median wall-clock seconds and mean CPU seconds (their total over all runs, so that the
/// 10 ms ticks matter less) of `reps` runs of `f`, after one warm-up run.
fn median_seconds(reps: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let reps = reps.max(1);
    let cpu_start = cpu_seconds();
    let mut wall: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    let cpu = (cpu_seconds() - cpu_start) / reps as f64;
    wall.sort_by(f64::total_cmp);
    (wall[wall.len() / 2], cpu)
}

fn main() -> anyhow::Result<()> {
    let (n, k, m, reps) = (arg(1, 2048), arg(2, 8192), arg(3, 512), arg(4, 5));
    let dev = Device::Cpu;
    let flop = 2.0 * (m * n * k) as f64;
    let threads = rayon::current_num_threads();
    println!(
        "[{n} x {k}] weights, {m} rows, {threads} thread(s), our ISA {}",
        kernels::isa().name()
    );
    let w = (Tensor::randn(0f32, 1.0, (n, k), &dev)? * 0.02)?;
    let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
    let xs: Vec<f32> = x.flatten_all()?.to_vec1()?;
    for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
        let q = QTensor::quantize(&w, dtype)?;
        let bytes = q.data()?.into_owned();
        let ours = match own_matrix(dtype, &bytes, n, k) {
            Some(Ok(ours)) => ours,
            _ => anyhow::bail!("no own kernel for {dtype:?} [{n}, {k}]"),
        };
        let theirs = QMatMul::from_qtensor(q)?;
        let (mut a, mut b): (Vec<f32>, Vec<f32>) = (Vec::new(), Vec::new());
        let t_ours = median_seconds(reps, || a = ours.matmul(&xs, m));
        let t_candle = median_seconds(reps, || {
            b = theirs
                .forward(&x)
                .and_then(|t| t.flatten_all()?.to_vec1())
                .expect("candle matmul");
        });
        let scale = b.iter().fold(0f32, |s, v| s.max(v.abs()));
        let diff = a
            .iter()
            .zip(&b)
            .fold(0f32, |s, (x, y)| s.max((x - y).abs()));
        println!(
            "{dtype:?}: ours {:.1} GFLOP/s ({:.1} per CPU-s), candle {:.1} ({:.1} per CPU-s); \
             ours/candle {:.2}x wall, {:.2}x CPU; max |ours - candle| {:.2e} of max |out| {:.2e}",
            flop / t_ours.0 / 1e9,
            flop / t_ours.1 / 1e9,
            flop / t_candle.0 / 1e9,
            flop / t_candle.1 / 1e9,
            t_candle.0 / t_ours.0,
            t_candle.1 / t_ours.1,
            diff,
            scale
        );
    }
    Ok(())
}
