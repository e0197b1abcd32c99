//! Live progress on stderr: a bar with tokens/s, running PPL and ETA on a terminal; plain
//! periodic lines otherwise (logs, CI); nothing with `--quiet`. `--print-chunks` writes
//! llama.cpp-style running values `[1]12.8585,[2]21.6788,…` to stdout.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::eval::{NllAccumulator, WindowResult};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProgressMode {
    /// A bar on a terminal, lines otherwise.
    Auto,
    Bar,
    Lines,
    None,
}

pub struct Progress {
    bar: Option<ProgressBar>,
    lines: bool,
    print_chunks: bool,
    total_windows: usize,
    total_tokens: usize,
    done_windows: usize,
    done_tokens: usize,
    acc: NllAccumulator,
    /// `--print-chunks` prints windows in index order: those that arrive early (from other
    /// ranks) wait here, and the running value covers windows `1..=i` exactly as llama.cpp's.
    pending: BTreeMap<usize, NllAccumulator>,
    printed: usize,
    printed_acc: NllAccumulator,
    start: Instant,
    last_line: Instant,
    line_every: Duration,
    /// Windows done at the last progress line (a batch that brings none is not news).
    line_windows: usize,
}

impl Progress {
    pub fn new(
        mode: ProgressMode,
        print_chunks: bool,
        total_windows: usize,
        total_tokens: usize,
    ) -> Self {
        let tty = std::io::stderr().is_terminal();
        let (bar, lines) = match mode {
            ProgressMode::Auto if tty => (true, false),
            ProgressMode::Auto => (false, true),
            ProgressMode::Bar => (true, false),
            ProgressMode::Lines => (false, true),
            ProgressMode::None => (false, false),
        };
        let bar = bar.then(|| {
            let b = ProgressBar::new(total_windows as u64);
            // NO_COLOR (https://no-color.org): the bar without its colours.
            let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
            let template = if no_color {
                "{bar:30} {pos}/{len} windows {msg} ETA {eta}"
            } else {
                "{bar:30.cyan/blue} {pos}/{len} windows {msg} ETA {eta}"
            };
            b.set_style(ProgressStyle::with_template(template).expect("valid template"));
            b
        });
        let now = Instant::now();
        Self {
            bar,
            lines,
            print_chunks,
            total_windows,
            total_tokens,
            done_windows: 0,
            done_tokens: 0,
            acc: NllAccumulator::default(),
            pending: BTreeMap::new(),
            printed: 0,
            printed_acc: NllAccumulator::default(),
            start: now,
            last_line: now,
            line_every: Duration::from_secs(10),
            line_windows: 0,
        }
    }

    pub fn update(&mut self, batch: &[WindowResult]) {
        let mut out = std::io::stdout().lock();
        for w in batch {
            self.acc.merge(&w.acc);
            self.done_windows += 1;
            self.done_tokens += w.input_tokens;
            if self.print_chunks {
                self.pending.insert(w.index, w.acc);
            }
        }
        while let Some(acc) = self.pending.remove(&self.printed) {
            self.printed_acc.merge(&acc);
            self.printed += 1;
            let ppl = self.printed_acc.perplexity().unwrap_or(f64::NAN);
            let _ = write!(out, "[{}]{ppl:.4},", self.printed);
        }
        if self.print_chunks {
            let _ = out.flush();
        }
        let elapsed = self.start.elapsed().as_secs_f64().max(1e-9);
        let tps = self.done_tokens as f64 / elapsed;
        let ppl = self.acc.perplexity().unwrap_or(f64::NAN);
        if let Some(b) = &self.bar {
            b.set_position(self.done_windows as u64);
            b.set_message(format!("{tps:.0} tok/s, PPL {ppl:.4}"));
        } else if self.lines
            && self.done_windows != self.line_windows
            && (self.last_line.elapsed() >= self.line_every
                || self.done_windows == self.total_windows)
        {
            self.last_line = Instant::now();
            self.line_windows = self.done_windows;
            let left = self.total_tokens.saturating_sub(self.done_tokens) as f64 / tps.max(1e-9);
            eprintln!(
                "[ppl] {}/{} windows, {tps:.0} tokens/s, running PPL {ppl:.4}, ETA {left:.0} s",
                self.done_windows, self.total_windows
            );
        }
    }

    pub fn finish(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        if self.print_chunks {
            println!();
        }
    }
}
