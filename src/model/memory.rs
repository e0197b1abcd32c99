//! Memory planning: estimate a process's peak memory before any weight is loaded, and compare
//! it with what the machine (or its cgroup) allows.
//!
//! The estimate adds: the weights as this build holds them (quantized as stored, Q4_1 with f32
//! scales, F16/BF16 matrices 16-bit in native precision, or everything dequantized to f32),
//! the activations of one forward pass per rank (hidden states and their temporaries,
//! attention scores, the MLP's intermediate tensors), the logits block of the output layer
//! (twice: the tensor and its copy into the NLL loop), the tokenizer's tables, and a fixed
//! runtime baseline. The constants were calibrated against the
//! measured peak RSS of five SmolLM2 runs (native/f32, batch 1/4, ctx 512/1024, 1/2 ranks):
//! every estimate landed within 6% of the measurement.

use candle_core::quantized::GgmlDType;

use super::gguf::transcode::Transcode;
use serde::{Deserialize, Serialize};
use std::path::Path;

use super::gguf::GgufFile;
use super::{LlamaConfig, Partition, Precision};

/// Rows of hidden states projected onto the vocabulary at once: bounds the logits buffer
/// (64 × 49,152 × 4 bytes ≈ 12.6 MB for SmolLM2, read where the output layer wrote it) whatever
/// the batch size. 256 rows cost 100 MB of peak memory and were no faster.
pub const LOGIT_ROWS: usize = 64;

/// The same bound on a GPU, where a larger block keeps the device busy: 1024 rows of f32
/// logits plus their f64 log-softmax are ~0.6 GB for SmolLM2's vocabulary.
pub const DEVICE_LOGIT_ROWS: usize = 1024;

/// Fixed cost of the process: code, allocator arenas, thread stacks, text and token ids.
const BASELINE: u64 = 26 << 20;
/// Per-rank buffers that do not scale with the batch (scratch, RoPE tables grown to the
/// positions used, …). Re-measured when the tied output layer stopped taking a transient copy
/// of the table: 10 MiB keeps every benchmark cell within 15% (SmolLM2 in four storage types,
/// Gemma 3, the 1B and 8B shapes).
const RANK_BUFFERS: u64 = 10 << 20;

/// An estimate of peak memory, per process.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MemoryEstimate {
    pub weights_bytes: u64,
    /// Activations of one rank's forward pass.
    pub activations_bytes: u64,
    /// Logits block and its copy, per rank.
    pub logits_bytes: u64,
    /// Tokenizer tables and the runtime baseline.
    pub other_bytes: u64,
    /// Ranks sharing this process (the `local` backend); 1 under MPI.
    pub ranks_in_process: usize,
    /// Everything, for the whole process.
    pub total_bytes: u64,
}

/// Bytes of the weights once loaded with `precision`.
pub fn weight_bytes(g: &GgufFile, precision: Precision) -> u64 {
    g.tensors.values().map(|t| tensor_bytes(t, precision)).sum()
}

fn tensor_bytes(t: &super::gguf::TensorInfo, precision: Precision) -> u64 {
    let elems: u64 = t.shape.iter().map(|&d| d as u64).product();
    match precision {
        // Tied embeddings: the embedding and the output layer share one copy.
        Precision::F32 => elems * 4,
        Precision::Bf16 | Precision::F16 => elems * 2,
        // IQ4_NL and IQ4_XS, read as Q8_0 and F32 by candle, stay as stored in our kernels
        // (IQ4_XS with its eight scales unpacked to bytes: 138 bytes a super-block).
        Precision::Native if t.shape.len() == 2 => match t.transcode {
            Some(Transcode::Iq4XsAsF32) => elems / 256 * 138,
            Some(Transcode::Iq4NlAsQ8_0) => t.size,
            None => native_bytes(t, elems),
        },
        Precision::Native => native_bytes(t, elems),
    }
}

/// Bytes of a tensor of a type candle knows in native precision.
fn native_bytes(t: &super::gguf::TensorInfo, elems: u64) -> u64 {
    {
        match t.dtype {
            // Our Q4_1 kernel keeps d and m as f32: 24 bytes per 32 weights.
            GgmlDType::Q4_1 => elems / 32 * 24,
            // Q5_0 and Q8_0 are held as 32 signed bytes and an f16 scale per block.
            GgmlDType::Q5_0 | GgmlDType::Q8_0 => elems / 32 * 34,
            // K-quants (rows of 256 multiples): 6-bit scales and mins unpacked to bytes.
            GgmlDType::Q4K if kquant_rows(t) => elems / 256 * 148,
            GgmlDType::Q5K if kquant_rows(t) => elems / 256 * 180,
            // Q2_K and Q3_K: scales (and Q2_K's mins) unpacked to bytes.
            GgmlDType::Q2K if kquant_rows(t) => elems / 256 * 100,
            GgmlDType::Q3K if kquant_rows(t) => elems / 256 * 114,
            // F16/BF16 matrices stay 16-bit in our kernel; vectors (norms) become f32.
            GgmlDType::F16 | GgmlDType::BF16 => elems * if t.shape.len() == 2 { 2 } else { 4 },
            _ => t.size,
        }
    }
}

/// Whether a K-quant matrix goes to our kernels (rows a multiple of 256 values).
fn kquant_rows(t: &super::gguf::TensorInfo) -> bool {
    t.shape.len() == 2 && t.shape[1] > 0 && t.shape[1].is_multiple_of(256)
}

/// Bytes of the weights a rank holding `part` keeps once loaded with `precision` (an FSDP
/// rank also materialises one whole layer at a time, counted once).
pub fn partition_weight_bytes(g: &GgufFile, precision: Precision, part: &Partition) -> u64 {
    let mut held = 0u64;
    let mut layer_bytes = std::collections::BTreeMap::<usize, u64>::new();
    for (name, t) in &g.tensors {
        let b = tensor_bytes(t, precision);
        let split = |b: u64| {
            if t.shape.len() == 2 {
                b / part.tp as u64
            } else {
                b
            }
        };
        if let Some(rest) = name.strip_prefix("blk.") {
            let Some(i) = rest.split('.').next().and_then(|i| i.parse::<usize>().ok()) else {
                continue;
            };
            if part.layers.contains(&i) {
                *layer_bytes.entry(i).or_default() += split(b);
            }
        } else if name == "token_embd.weight" {
            if part.embed || part.head {
                held += split(b);
            }
        } else if name == "output.weight" {
            if part.head {
                held += split(b);
            }
        } else {
            held += b;
        }
    }
    let layers: u64 = layer_bytes.values().sum();
    if part.fsdp > 1 {
        let largest = layer_bytes.values().copied().max().unwrap_or(0);
        held + layers / part.fsdp as u64 + largest
    } else {
        held + layers
    }
}

/// Peak activation bytes of one forward pass over `batch` windows of `ctx` tokens
/// (`fused_attention`: our f32 kernel, which never holds a `[heads, t, t]` score tensor).
pub fn activation_bytes(mc: &LlamaConfig, batch: usize, ctx: usize, fused_attention: bool) -> u64 {
    let (b, t) = (batch as u64, ctx as u64);
    let d = mc.hidden_size as u64;
    let ff = mc.intermediate_size as u64;
    let h = mc.n_heads as u64;
    let hd = mc.head_dim as u64;
    let kv = mc.n_kv_heads as u64;
    // Attention scores [b, heads, t, t]: one copy at the peak (the others are freed as the
    // next is made).
    let scores = if fused_attention {
        0
    } else {
        b * h * t * t * 4
    };
    // Q, K, V (K and V repeated to every head), their transposed copies and the output.
    let qkv = (2 * h * hd + 2 * kv * hd + 2 * h * hd) * b * t * 4;
    // MLP: two [b, t, ff] tensors alive at once.
    let mlp = 2 * b * t * ff * 4;
    // Residual stream and normalised copies.
    let hidden = 6 * b * t * d * 4;
    scores + mlp + qkv + hidden + RANK_BUFFERS
}

/// The whole estimate for one process (`parts`: the model parts loaded in it; empty for the
/// whole model).
#[allow(clippy::too_many_arguments)]
pub fn estimate(
    g: &GgufFile,
    mc: &LlamaConfig,
    precision: Precision,
    batch: usize,
    ctx: usize,
    ranks_in_process: usize,
    tokenizer_entries: usize,
    parts: &[Partition],
) -> MemoryEstimate {
    let weights = if parts.is_empty() {
        weight_bytes(g, precision)
    } else {
        parts
            .iter()
            .map(|p| partition_weight_bytes(g, precision, p))
            .sum()
    };
    // Native and f32 run our fused attention on the CPU.
    let fused = matches!(precision, Precision::Native | Precision::F32);
    let activations = activation_bytes(mc, batch, ctx, fused);
    let rows = (LOGIT_ROWS as u64).min((batch * ctx) as u64);
    // Native and f32 read a block's f32 logits where the output layer wrote them; candle's
    // reduced-precision output is converted to f32 first (two copies at once).
    let copies = if fused { 1 } else { 2 };
    let logits = copies * rows * mc.vocab_size as u64 * 4;
    // Vocabulary hash maps and merge tables: about 200 bytes per entry.
    let other = BASELINE + tokenizer_entries as u64 * 200;
    let r = ranks_in_process.max(1) as u64;
    MemoryEstimate {
        weights_bytes: weights,
        activations_bytes: activations,
        logits_bytes: logits,
        other_bytes: other,
        ranks_in_process: ranks_in_process.max(1),
        total_bytes: weights + r * (activations + logits) + other,
    }
}

/// Memory this process may use: the smallest of `MemAvailable`, the cgroup limit (v2 or v1)
/// minus current usage, and `PPL_MEMORY_LIMIT` (bytes, or with a K/M/G suffix).
pub fn available_bytes() -> Option<(u64, String)> {
    let mut best: Option<(u64, String)> = None;
    let mut consider = |v: u64, what: String| {
        if best.as_ref().is_none_or(|(b, _)| v < *b) {
            best = Some((v, what));
        }
    };
    if let Some(kb) = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
    }) {
        consider(kb * 1024, "MemAvailable".into());
    }
    if let Some((free, what)) = cgroup_headroom() {
        consider(free, what);
    }
    if let Some(v) = std::env::var("PPL_MEMORY_LIMIT")
        .ok()
        .and_then(|s| parse_size(&s))
    {
        consider(v, "PPL_MEMORY_LIMIT".into());
    }
    best
}

/// The tightest memory cgroup limit over this process's cgroup and its ancestors, minus that
/// cgroup's usage. The cgroup is the one `/proc/self/cgroup` names (a batch system or a
/// container puts each job or host in its own, and without a cgroup namespace the top of
/// `/sys/fs/cgroup` is the machine's, not this process's): v2 `memory.max`, or v1
/// `memory.limit_in_bytes`.
fn cgroup_headroom() -> Option<(u64, String)> {
    let table = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_headroom_in(&table, Path::new("/sys/fs/cgroup"))
}

/// [`cgroup_headroom`] from the contents of `/proc/self/cgroup` and the cgroup mount point.
fn cgroup_headroom_in(table: &str, mount: &Path) -> Option<(u64, String)> {
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    // v1: "4:memory:/path" (the controller may share a line with others); v2: "0::/path".
    let v1 = table.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| (mount.join("memory"), path))
    });
    let v2 = || {
        table
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .map(|path| (mount.to_path_buf(), path))
    };
    let (root, path, limit_file, usage_file) = match v1 {
        Some((root, path)) if root.join("memory.limit_in_bytes").exists() => {
            (root, path, "memory.limit_in_bytes", "memory.usage_in_bytes")
        }
        _ => {
            let (root, path) = v2()?;
            (root, path, "memory.max", "memory.current")
        }
    };
    let mut best: Option<(u64, String)> = None;
    let mut dir = Some(Path::new(path.trim_start_matches('/')));
    while let Some(d) = dir {
        let here = root.join(d);
        // "max" (v2) does not parse; v1 writes a huge number for "no limit".
        if let Some(limit) = read(&here.join(limit_file)).filter(|&l| l < 1 << 60) {
            let free = limit.saturating_sub(read(&here.join(usage_file)).unwrap_or(0));
            if best.as_ref().is_none_or(|(b, _)| free < *b) {
                let name = format!("/{}", d.display());
                best = Some((free, format!("the cgroup limit ({limit_file} of {name})")));
            }
        }
        dir = d.parent();
    }
    best
}

/// "512M", "2G", "123456" → bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 1u64 << 10),
        'M' => (&s[..s.len() - 1], 1 << 20),
        'G' => (&s[..s.len() - 1], 1 << 30),
        'T' => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    num.trim()
        .parse::<f64>()
        .ok()
        .map(|v| (v * mult as f64) as u64)
}

pub fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / 1048576.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup_is_this_processs_and_its_ancestors_limits_bind() {
        let mount = tempfile::tempdir().unwrap();
        let v1 = mount.path().join("memory");
        let host = v1.join("jobs/host2");
        std::fs::create_dir_all(&host).unwrap();
        let write = |d: &Path, f: &str, v: &str| std::fs::write(d.join(f), v).unwrap();
        // The machine: no limit. The job: 4 GiB, 1 GiB used. The host: 600 MiB, 100 MiB used.
        write(&v1, "memory.limit_in_bytes", "9223372036854771712");
        write(
            &v1.join("jobs"),
            "memory.limit_in_bytes",
            &(4u64 << 30).to_string(),
        );
        write(
            &v1.join("jobs"),
            "memory.usage_in_bytes",
            &(1u64 << 30).to_string(),
        );
        write(&host, "memory.limit_in_bytes", &(600u64 << 20).to_string());
        write(&host, "memory.usage_in_bytes", &(100u64 << 20).to_string());
        let table = "9:pids:/\n4:cpu,memory:/jobs/host2\n0::/\n";
        let (free, what) = cgroup_headroom_in(table, mount.path()).unwrap();
        assert_eq!(free, 500 << 20);
        assert!(what.contains("/jobs/host2"), "{what}");
        // v2 only: memory.max of the process's own cgroup; "max" is no limit.
        let v2 = tempfile::tempdir().unwrap();
        let own = v2.path().join("user/job");
        std::fs::create_dir_all(&own).unwrap();
        write(&v2.path().join("user"), "memory.max", "max");
        write(&own, "memory.max", &(2u64 << 30).to_string());
        write(&own, "memory.current", &(512u64 << 20).to_string());
        let (free, _) = cgroup_headroom_in("0::/user/job\n", v2.path()).unwrap();
        assert_eq!(free, (2u64 << 30) - (512 << 20));
        assert!(cgroup_headroom_in("0::/\n", v2.path()).is_none());
    }

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("lots"), None);
    }
}
