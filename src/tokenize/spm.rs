//! SentencePiece vocabularies as llama.cpp tokenizes them (`llm_tokenizer_spm`): the text's
//! spaces become `▁`, every UTF-8 character starts as a symbol, and the adjacent pair whose
//! concatenation is the highest-scoring vocabulary entry is merged until none is left
//! (ties: leftmost first). Symbols that are not tokens fall back to `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

pub struct SpmModel {
    token_to_id: HashMap<String, u32>,
    id_to_token: Vec<String>,
    scores: Vec<f32>,
    byte_tokens: [Option<u32>; 256],
    unk: Option<u32>,
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: isize,
    next: isize,
}

struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Highest score first; on equal scores the leftmost pair first.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl SpmModel {
    pub fn new(tokens: &[&str], scores: &[f64], _types: &[u32], unk: Option<u32>) -> Self {
        let mut token_to_id = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            // Later duplicates win, as in llama.cpp's map construction.
            token_to_id.insert(t.to_string(), i as u32);
        }
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            *slot = token_to_id
                .get(&format!("<0x{b:02X}>"))
                .copied()
                .or_else(|| {
                    let c = [b as u8];
                    std::str::from_utf8(&c)
                        .ok()
                        .and_then(|s| token_to_id.get(s).copied())
                });
        }
        Self {
            token_to_id,
            id_to_token: tokens.iter().map(|t| t.to_string()).collect(),
            scores: scores.iter().map(|&s| s as f32).collect(),
            byte_tokens,
            unk,
        }
    }

    /// The text of `ids`: pieces joined, `▁` as space, `<0xXX>` tokens as raw bytes.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            let Some(t) = self.id_to_token.get(id as usize) else {
                continue;
            };
            match t.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
                Some(hex) if hex.len() == 2 => {
                    bytes.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'))
                }
                _ => bytes.extend_from_slice(t.replace('\u{2581}', " ").as_bytes()),
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Appends the ids of `text` to `out`.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let text = text.replace(' ', "\u{2581}");
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            let len = c.len_utf8();
            symbols.push(Symbol {
                start,
                len,
                prev: i as isize - 1,
                next: if start + len == text.len() {
                    -1
                } else {
                    i as isize + 1
                },
            });
        }
        let mut queue = BinaryHeap::new();
        let mut rev_merge: HashMap<&str, (usize, usize)> = HashMap::new();
        for i in 1..symbols.len() {
            self.try_add(
                i as isize - 1,
                i as isize,
                &symbols,
                &mut queue,
                &mut rev_merge,
                &text,
            );
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue;
            }
            symbols[b.left].len += r.len;
            symbols[b.right].len = 0;
            symbols[b.left].next = r.next;
            if r.next >= 0 {
                symbols[r.next as usize].prev = b.left as isize;
            }
            let prev = symbols[b.left].prev;
            let next = symbols[b.left].next;
            self.try_add(
                prev,
                b.left as isize,
                &symbols,
                &mut queue,
                &mut rev_merge,
                &text,
            );
            self.try_add(
                b.left as isize,
                next,
                &symbols,
                &mut queue,
                &mut rev_merge,
                &text,
            );
        }
        let mut i: isize = 0;
        while i != -1 {
            self.resegment(&symbols, i as usize, &rev_merge, &text, out);
            i = symbols[i as usize].next;
        }
    }

    /// Queues the merge of two adjacent symbols when their concatenation is a token.
    fn try_add<'t>(
        &self,
        left: isize,
        right: isize,
        symbols: &[Symbol],
        queue: &mut BinaryHeap<Bigram>,
        rev_merge: &mut HashMap<&'t str, (usize, usize)>,
        text: &'t str,
    ) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (symbols[left as usize], symbols[right as usize]);
        let piece = &text[l.start..l.start + l.len + r.len];
        if let Some(&id) = self.token_to_id.get(piece) {
            queue.push(Bigram {
                left: left as usize,
                right: right as usize,
                score: self.scores[id as usize],
                size: piece.len(),
            });
            rev_merge.insert(piece, (left as usize, right as usize));
        }
    }

    fn resegment(
        &self,
        symbols: &[Symbol],
        idx: usize,
        rev_merge: &HashMap<&str, (usize, usize)>,
        text: &str,
        out: &mut Vec<u32>,
    ) {
        let s = symbols[idx];
        let piece = &text[s.start..s.start + s.len];
        if let Some(&id) = self.token_to_id.get(piece) {
            out.push(id);
            return;
        }
        match rev_merge.get(piece) {
            Some(&(l, r)) => {
                self.resegment(symbols, l, rev_merge, text, out);
                self.resegment(symbols, r, rev_merge, text, out);
            }
            None => {
                for &b in piece.as_bytes() {
                    if let Some(id) = self.byte_tokens[b as usize].or(self.unk) {
                        out.push(id);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_by_score_and_falls_back_to_bytes() {
        let tokens = [
            "<unk>",
            "\u{2581}",
            "a",
            "b",
            "ab",
            "\u{2581}ab",
            "<0x63>",
            "bb",
        ];
        let scores = [0.0, -1.0, -2.0, -2.0, -0.5, -0.1, 0.0, -0.2];
        let m = SpmModel::new(&tokens, &scores, &[1; 8], Some(0));
        let mut out = Vec::new();
        m.encode(" ab", &mut out);
        assert_eq!(out, vec![5]);
        out.clear();
        // "abb": "ab" (-0.5) vs "bb" (-0.2): bb wins, then a + bb has no token.
        m.encode("abb", &mut out);
        assert_eq!(out, vec![2, 7]);
        out.clear();
        m.encode("c", &mut out);
        assert_eq!(out, vec![6]);
    }
}
