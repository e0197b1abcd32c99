//! [`Results`] assembled on rank 0 from every window's exact record. [`assemble`] reads
//! nothing from the environment (the caller passes the host, clock and memory figures in), so
//! its arithmetic — totals, word and byte perplexity, the window table, throughput of this
//! attempt only, the hardest windows — is unit-tested here.

use std::collections::{BTreeMap, HashSet};

use super::config::EvalConfig;
use super::prepare::RankSetup;
use crate::data::windows::Window;
use crate::eval::{accumulator, stats, NllAccumulator, WindowResult};
use crate::model::{device, gguf, GgufFile};
use crate::parallel::data_parallel::RankStats;
use crate::report::{
    DataInfo, HardWindow, KernelIsa, MeshInfo, ModelInfo, Results, RunInfo, SystemInfo, Timings,
    WindowRecord, WorldInfo, SCHEMA_VERSION,
};
use crate::tokenize::Tokenizer;

/// Windows listed in `results.json` under `hardest`.
const HARDEST: usize = 10;
/// Scored tokens decoded into each excerpt.
const EXCERPT_TOKENS: usize = 40;

/// Where and how the run happened, as rank 0 saw it.
pub(crate) struct Environment {
    pub(crate) host: String,
    pub(crate) backend: String,
    pub(crate) world_size: usize,
    /// The device, in words (`cpu`, `cuda:0`, …).
    pub(crate) device: String,
    pub(crate) peak_rss_bytes: Option<u64>,
    /// Seconds since the run started (setup included).
    pub(crate) total_s: f64,
}

/// Everything [`assemble`] turns into [`Results`].
pub(crate) struct Assembly<'a> {
    pub(crate) cfg: &'a EvalConfig,
    pub(crate) setup: &'a RankSetup,
    /// Every window's record, in window order.
    pub(crate) results: Vec<WindowResult>,
    pub(crate) ranks: Vec<RankStats>,
    pub(crate) mesh: Option<MeshInfo>,
    pub(crate) run: RunInfo,
    /// Windows taken from the ledger of an earlier attempt (no time spent on them here).
    pub(crate) from_ledger: &'a HashSet<usize>,
    pub(crate) model_sha256: String,
    pub(crate) load_s: f64,
    pub(crate) eval_s: f64,
    pub(crate) env: Environment,
}

/// The results of a run from its windows' records.
pub(crate) fn assemble(a: Assembly<'_>) -> Results {
    let (cfg, setup) = (a.cfg, a.setup);
    let plan = &setup.prepared.plan;
    let documents = setup.prepared.documents;
    let totals = Totals::of(&a.results, documents);
    let (input_tokens, scored_tokens) = computed_here(&a.results, a.from_ledger);
    let mc = &setup.mc;
    let tok = &setup.tok;
    let ppl = totals.mean_nll.exp();
    Results {
        schema_version: SCHEMA_VERSION,
        ppl_version: env!("CARGO_PKG_VERSION").to_string(),
        ppl,
        ppl_err: stats::ppl_error(&totals.total),
        ci95: stats::bootstrap_ci95(&totals.blocks, cfg.bootstrap_samples, setup.seed),
        tokens: totals.total.count,
        mean_nll: totals.mean_nll,
        nll_sum: totals.total.nll_sum(),
        accumulator: totals.total,
        word_perplexity: totals.word_perplexity,
        byte_perplexity: totals.byte_perplexity,
        bits_per_byte: totals.bits_per_byte,
        config: serde_json::to_value(EvalConfig {
            seed: setup.seed,
            ..cfg.clone()
        })
        .expect("config serializes"),
        model: ModelInfo {
            path: cfg.model.display().to_string(),
            sha256: a.model_sha256,
            file_bytes: setup.gguf.file_bytes(),
            architecture: mc.arch.to_string(),
            parameters: mc.parameters(),
            vocab_size: mc.vocab_size,
            context_length: mc.context_length,
            layers: mc.n_layers,
            tensor_types: tensor_types(&setup.gguf),
            tokenizer: tok.kind.clone(),
            tokenizer_pre: tok.pre.clone(),
            tokenizer_sha256: tok.fingerprint.clone(),
            add_bos: tok.add_bos,
            hub: crate::hub::HubOrigin::of_path(&cfg.model),
        },
        data: DataInfo {
            path: setup.data_path.display().to_string(),
            sha256: setup.text_sha256.clone(),
            bytes: setup.text_len,
            stream_tokens: plan.stream_tokens as u64,
            whole_text_tokenized: plan.whole_text,
            documents: documents.map(|d| d.0),
            words: documents.map(|d| d.1),
            source: crate::data::named::DataOrigin::of_path(&setup.data_path),
        },
        windows: window_records(&plan.windows, &a.results),
        timings: Timings {
            load_s: a.load_s,
            tokenize_s: setup.tokenize_s,
            eval_s: a.eval_s,
            total_s: a.env.total_s,
            tokens_per_s: input_tokens as f64 / a.eval_s,
            scored_tokens_per_s: scored_tokens as f64 / a.eval_s,
        },
        system: SystemInfo {
            threads: cfg.threads,
            cpu_features: crate::fingerprint::cpu_features()
                .iter()
                .map(|s| s.to_string())
                .collect(),
            peak_rss_bytes: a.env.peak_rss_bytes,
            host: Some(a.env.host),
            kernels: Some(KernelIsa::detect()),
        },
        world: WorldInfo {
            backend: a.env.backend,
            size: a.env.world_size,
            schedule: cfg.schedule,
        },
        hardest: hardest_windows(&plan.windows, &a.results, tok),
        ranks: a.ranks,
        mesh: a.mesh,
        run: Some(a.run),
        memory: None,
        determinism: Some(device::Determinism::for_device(&a.env.device)),
        warnings: crate::report::plausibility(ppl, mc.vocab_size)
            .into_iter()
            .collect(),
    }
}

/// The exact totals and the perplexities that follow from them.
#[derive(Debug)]
struct Totals {
    total: NllAccumulator,
    /// One accumulator per bootstrap group (a window, or a document under `rolling`), in
    /// group order.
    blocks: Vec<NllAccumulator>,
    mean_nll: f64,
    /// lm-eval's metrics, where the text is documents with word and byte counts.
    word_perplexity: Option<f64>,
    byte_perplexity: Option<f64>,
    bits_per_byte: Option<f64>,
}

impl Totals {
    /// `documents`: (documents, words, bytes) of a document-level run.
    fn of(results: &[WindowResult], documents: Option<(u64, u64, u64)>) -> Totals {
        let mut total = NllAccumulator::default();
        let mut groups: BTreeMap<usize, NllAccumulator> = BTreeMap::new();
        for r in results {
            total.merge(&r.acc);
            groups.entry(r.group).or_default().merge(&r.acc);
        }
        let nll_sum = total.nll_sum();
        let (word_perplexity, byte_perplexity, bits_per_byte) = match documents {
            Some((_, words, bytes)) if words > 0 && bytes > 0 => (
                Some((nll_sum / words as f64).exp()),
                Some((nll_sum / bytes as f64).exp()),
                Some(nll_sum / bytes as f64 / std::f64::consts::LN_2),
            ),
            _ => (None, None, None),
        };
        Totals {
            mean_nll: total.mean().unwrap_or(f64::NAN),
            total,
            blocks: groups.into_values().collect(),
            word_perplexity,
            byte_perplexity,
            bits_per_byte,
        }
    }
}

/// The `windows` table of `results.json`.
fn window_records(windows: &[Window], results: &[WindowResult]) -> Vec<WindowRecord> {
    windows
        .iter()
        .zip(results)
        .map(|(w, r)| WindowRecord {
            index: r.index,
            group: r.group,
            start: w.start,
            input_tokens: r.input_tokens,
            tokens: r.acc.count,
            nll_sum: r.acc.nll_sum(),
            nll_sum_sq: accumulator::from_fixed(r.acc.sum_sq),
            rank: r.rank,
            finished_s: r.finished_s,
            nll_sum_fixed: r.acc.sum,
        })
        .collect()
}

/// Input and scored tokens computed in this attempt: windows read from an earlier attempt's
/// ledger took no time here, so they do not count towards throughput.
fn computed_here(results: &[WindowResult], from_ledger: &HashSet<usize>) -> (usize, u64) {
    results
        .iter()
        .filter(|r| !from_ledger.contains(&r.index))
        .fold((0, 0), |(i, s), r| (i + r.input_tokens, s + r.acc.count))
}

/// Indices of the `n` windows with the highest mean NLL (ties: the earlier window first);
/// windows that scored nothing are left out.
fn hardest_order(results: &[WindowResult], n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..results.len())
        .filter(|&i| results[i].acc.count > 0)
        .collect();
    order.sort_by(|&a, &b| {
        let (ma, mb) = (
            results[a].acc.mean().unwrap_or(0.0),
            results[b].acc.mean().unwrap_or(0.0),
        );
        mb.total_cmp(&ma).then(a.cmp(&b))
    });
    order.truncate(n);
    order
}

/// The hardest windows, with the start of the text each one scored.
fn hardest_windows(
    windows: &[Window],
    results: &[WindowResult],
    tok: &Tokenizer,
) -> Vec<HardWindow> {
    hardest_order(results, HARDEST)
        .into_iter()
        .map(|i| {
            let w = &windows[i];
            let ids = &w.targets[..w.targets.len().min(EXCERPT_TOKENS)];
            HardWindow {
                index: i,
                mean_nll: results[i].acc.mean().unwrap_or(f64::NAN),
                excerpt: tok.decode(ids),
            }
        })
        .collect()
}

/// How many tensors of each storage type the model file holds.
fn tensor_types(g: &GgufFile) -> BTreeMap<String, usize> {
    let mut types = BTreeMap::new();
    for t in g.tensors.values() {
        *types.entry(gguf::ggml_type_name(t.type_id)).or_insert(0) += 1;
    }
    types
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(index: usize, group: usize, nlls: &[f64]) -> WindowResult {
        let mut acc = NllAccumulator::default();
        for &x in nlls {
            acc.add(x);
        }
        WindowResult {
            index,
            group,
            input_tokens: nlls.len() + 1,
            acc,
            rank: index % 2,
            finished_s: index as f64,
        }
    }

    #[test]
    fn totals_are_exact_sums_grouped_for_the_bootstrap() {
        let rs = [
            record(0, 0, &[1.0, 2.0]),
            record(1, 0, &[3.0]),
            record(2, 1, &[0.5, 0.5, 2.0]),
        ];
        let t = Totals::of(&rs, None);
        assert_eq!(t.total.count, 6);
        assert_eq!(t.total.nll_sum(), 9.0);
        assert_eq!(t.mean_nll, 1.5);
        assert_eq!(t.blocks.len(), 2, "windows 0 and 1 share group 0");
        assert_eq!(t.blocks[0].nll_sum(), 6.0);
        assert_eq!(t.blocks[1].count, 3);
        assert_eq!(
            (t.word_perplexity, t.byte_perplexity, t.bits_per_byte),
            (None, None, None),
            "no documents, no lm-eval metrics"
        );
    }

    #[test]
    fn word_and_byte_perplexity_divide_the_nll_sum_by_words_and_bytes() {
        let rs = [record(0, 0, &[2.0, 4.0])];
        let t = Totals::of(&rs, Some((1, 3, 12)));
        assert_eq!(t.word_perplexity, Some(2.0f64.exp()));
        assert_eq!(t.byte_perplexity, Some(0.5f64.exp()));
        assert_eq!(t.bits_per_byte, Some(0.5 / std::f64::consts::LN_2));
        // Zero words or bytes: no metric rather than an infinity.
        let t = Totals::of(&rs, Some((1, 0, 12)));
        assert_eq!(t.word_perplexity, None);
    }

    #[test]
    fn throughput_counts_only_windows_computed_in_this_attempt() {
        let rs = [
            record(0, 0, &[1.0, 1.0]),
            record(1, 1, &[1.0]),
            record(2, 2, &[1.0, 1.0, 1.0]),
        ];
        assert_eq!(computed_here(&rs, &HashSet::new()), (3 + 2 + 4, 6));
        assert_eq!(computed_here(&rs, &HashSet::from([0, 2])), (2, 1));
    }

    #[test]
    fn hardest_windows_by_mean_nll_ties_to_the_earlier_one() {
        let rs = [
            record(0, 0, &[1.0]),
            record(1, 1, &[3.0, 3.0]),
            record(2, 2, &[]),
            record(3, 3, &[2.0, 4.0]),
            record(4, 4, &[5.0]),
        ];
        assert_eq!(hardest_order(&rs, 10), vec![4, 1, 3, 0]);
        assert_eq!(hardest_order(&rs, 2), vec![4, 1]);
    }

    #[test]
    fn window_records_keep_the_exact_fixed_point_sum() {
        let w = Window {
            index: 0,
            group: 0,
            start: 7,
            input: vec![1, 2, 3],
            first_scored: 1,
            targets: vec![2, 3],
        };
        let rs = [record(0, 0, &[0.25, 0.5])];
        let recs = window_records(std::slice::from_ref(&w), &rs);
        assert_eq!(recs.len(), 1);
        assert_eq!((recs[0].start, recs[0].tokens), (7, 2));
        assert_eq!(recs[0].nll_sum, 0.75);
        assert_eq!(recs[0].nll_sum_fixed, accumulator::to_fixed(0.75));
        assert_eq!(recs[0].nll_sum_sq, 0.3125);
    }
}
