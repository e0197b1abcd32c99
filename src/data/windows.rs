//! Windowing: how a token stream becomes the windows a model scores.
//!
//! A [`Window`] is the model's input plus the positions whose next-token predictions count.
//! Every method scores each selected token exactly once; all scored tokens weigh the same.

use serde::Serialize;

/// How the text is cut into windows (`--method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// llama.cpp: non-overlapping chunks of `ctx` tokens, the second half of each scored.
    Chunks,
    /// Hugging Face guide: windows of `ctx` tokens every `stride` tokens, each token scored once.
    Stride,
    /// lm-eval `loglikelihood_rolling`: per document, disjoint windows, BOS-prefixed start.
    Rolling,
    /// The GPTQ reference code: non-overlapping windows of `ctx` tokens, every token after
    /// each window's first scored, the remainder dropped.
    Disjoint,
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Method::Chunks => "chunks",
            Method::Stride => "stride",
            Method::Rolling => "rolling",
            Method::Disjoint => "disjoint",
        })
    }
}

/// One unit of work: a model input and the targets of its scored positions.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// Position of the window in the plan (results are reported in this order).
    pub index: usize,
    /// Resampling group for the bootstrap: the window itself, or its document in `rolling`.
    pub group: usize,
    /// Offset of `input[0]` in the token stream (or in the document, for `rolling`).
    pub start: usize,
    /// Token ids fed to the model.
    pub input: Vec<u32>,
    /// First input position whose prediction is scored.
    pub first_scored: usize,
    /// `targets[j]` is the token predicted at input position `first_scored + j`.
    pub targets: Vec<u32>,
}

/// All windows of a run.
#[derive(Debug, Clone)]
pub struct WindowPlan {
    pub windows: Vec<Window>,
    /// Tokens in the stream the windows were cut from (all documents for `rolling`).
    pub stream_tokens: usize,
    /// The whole text was tokenized; false when `--chunks`/`--max-tokens` needed only a
    /// prefix of it, and `stream_tokens` counts that prefix.
    pub whole_text: bool,
}

impl WindowPlan {
    pub fn scored_tokens(&self) -> usize {
        self.windows.iter().map(|w| w.targets.len()).sum()
    }
}

/// llama.cpp's perplexity chunks: `ctx`-token slices, BOS replacing the first token when the
/// model uses BOS, positions `ctx/2 ..= ctx-2` predicting the following token.
pub fn chunks(
    tokens: &[u32],
    ctx: usize,
    max_chunks: Option<usize>,
    bos: Option<u32>,
) -> Vec<Window> {
    let n = tokens.len() / ctx;
    let n = max_chunks.map_or(n, |m| m.min(n));
    let first = ctx / 2;
    (0..n)
        .map(|i| {
            let mut input = tokens[i * ctx..(i + 1) * ctx].to_vec();
            if let Some(b) = bos {
                input[0] = b;
            }
            let targets = tokens[i * ctx + first + 1..(i + 1) * ctx].to_vec();
            Window {
                index: i,
                group: i,
                start: i * ctx,
                input,
                first_scored: first,
                targets,
            }
        })
        .collect()
}

/// The GPTQ reference code's windows: `tokens[i·ctx .. (i+1)·ctx]` for every whole window,
/// fed as they are (no BOS put in), positions `0 ..= ctx-2` predicting the next token.
pub fn disjoint(tokens: &[u32], ctx: usize, max_windows: Option<usize>) -> Vec<Window> {
    let n = tokens.len() / ctx;
    let n = max_windows.map_or(n, |m| m.min(n));
    (0..n)
        .map(|i| {
            let input = tokens[i * ctx..(i + 1) * ctx].to_vec();
            Window {
                index: i,
                group: i,
                start: i * ctx,
                targets: input[1..].to_vec(),
                first_scored: 0,
                input,
            }
        })
        .collect()
}

/// The Hugging Face perplexity guide's strided loop: windows of up to `ctx` tokens starting
/// every `stride` tokens; each window scores only the tokens after the previous window's end.
pub fn strided(tokens: &[u32], ctx: usize, stride: usize) -> Vec<Window> {
    let mut out = Vec::new();
    let mut prev_end = 0;
    let mut begin = 0;
    while begin < tokens.len() {
        let end = (begin + ctx).min(tokens.len());
        let trg_len = end - prev_end;
        let input = tokens[begin..end].to_vec();
        // Labels before `len - trg_len` are masked; label 0 has no prediction (shift).
        let first_label = (input.len() - trg_len).max(1);
        if first_label < input.len() {
            let index = out.len();
            out.push(Window {
                index,
                group: index,
                start: begin,
                targets: input[first_label..].to_vec(),
                first_scored: first_label - 1,
                input,
            });
        }
        prev_end = end;
        if end == tokens.len() {
            break;
        }
        begin += stride;
    }
    out
}

/// lm-eval's `get_rolling_token_windows(tokens, prefix, ctx, context_len = 1)` made disjoint:
/// the first window is `[prefix] + tokens[..ctx-1]` scoring `tokens[..ctx]`; each next window
/// holds the `ctx` tokens before its end and scores its last `min(ctx, left)` tokens.
pub fn rolling(
    doc_tokens: &[u32],
    ctx: usize,
    prefix: u32,
    group: usize,
    first_index: usize,
) -> Vec<Window> {
    let n = doc_tokens.len();
    let mut out = Vec::new();
    if n == 0 {
        return out;
    }
    let first_len = ctx.min(n);
    let mut input = Vec::with_capacity(first_len);
    input.push(prefix);
    input.extend_from_slice(&doc_tokens[..first_len - 1]);
    out.push(Window {
        index: first_index,
        group,
        start: 0,
        input,
        first_scored: 0,
        targets: doc_tokens[..first_len].to_vec(),
    });
    let mut predicted = first_len;
    while predicted < n {
        let pred_len = (n - predicted).min(ctx);
        let end = predicted + pred_len;
        let start = end - ctx - 1;
        let input = doc_tokens[start..end - 1].to_vec();
        out.push(Window {
            index: first_index + out.len(),
            group,
            start,
            first_scored: input.len() - pred_len,
            targets: doc_tokens[end - pred_len..end].to_vec(),
            input,
        });
        predicted = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scored target must be the token that follows its position in the stream.
    fn check_alignment(tokens: &[u32], w: &Window) {
        for (j, &t) in w.targets.iter().enumerate() {
            let pos = w.first_scored + j;
            assert!(pos < w.input.len());
            assert_eq!(
                t,
                tokens[w.start + pos + 1],
                "window {} target {j}",
                w.index
            );
        }
    }

    #[test]
    fn chunks_score_second_half_like_llama_cpp() {
        let toks: Vec<u32> = (0..2100).collect();
        let w = chunks(&toks, 512, None, None);
        assert_eq!(w.len(), 4);
        assert!(w
            .iter()
            .all(|w| w.targets.len() == 255 && w.first_scored == 256));
        assert_eq!(w[1].targets[0], 512 + 257);
        w.iter().for_each(|w| check_alignment(&toks, w));
        let w = chunks(&toks, 512, Some(2), Some(7));
        assert_eq!(w.len(), 2);
        assert_eq!(w[1].input[0], 7);
        assert_eq!(w[1].input[1], 513);
    }

    #[test]
    fn stride_scores_every_token_but_the_first_once() {
        let toks: Vec<u32> = (0..20480).collect();
        let w = strided(&toks, 512, 256);
        assert_eq!(w.len(), 79);
        let scored: usize = w.iter().map(|w| w.targets.len()).sum();
        assert_eq!(scored, 20479);
        let mut seen = vec![false; toks.len()];
        for win in &w {
            check_alignment(&toks, win);
            for &t in &win.targets {
                assert!(!seen[t as usize]);
                seen[t as usize] = true;
            }
        }
        assert!(!seen[0] && seen[1..].iter().all(|&s| s));
    }

    #[test]
    fn rolling_windows_are_disjoint_and_cover_the_document() {
        let doc: Vec<u32> = (100..1300).collect();
        let w = rolling(&doc, 512, 1, 3, 10);
        assert_eq!(w.len(), 3);
        assert_eq!(w[0].input[0], 1);
        assert_eq!(w[0].input.len(), 512);
        assert_eq!(w[0].targets, doc[..512].to_vec());
        assert_eq!(w[1].targets, doc[512..1024].to_vec());
        assert_eq!(w[2].targets, doc[1024..].to_vec());
        assert_eq!(w[2].input.len(), 512);
        assert_eq!(w[2].index, 12);
        for win in &w[1..] {
            check_alignment(&doc, win);
        }
        let short = rolling(&[5, 6], 512, 1, 0, 0);
        assert_eq!(short[0].input, vec![1, 5]);
        assert_eq!(short[0].targets, vec![5, 6]);
    }
}
