//! lm-evaluation-harness's `wikitext` task, reproduced from its definition:
//!
//! - the documents are the pages of EleutherAI's `wikitext_document_level` dataset, which its
//!   loading script cuts out of the raw split ([`pages`]);
//! - each page is scored after `wikitext_detokenizer` ([`detokenize`]);
//! - words and bytes are counted on the original page ([`crate::data::count_words`], UTF-8
//!   bytes).
//!
//! Strips and counts use Python's notion of whitespace, not Rust's ([`crate::data::words`]).

use std::borrow::Cow;

use crate::data::words::python_strip;

/// Whether a line opens a page, as the dataset script decides: after `"= = ="` → `"==="`
/// and `"= ="` → `"=="`, stripped, it starts with `"= "` and ends with `" ="`. (So
/// ` = = Section = = ` does not, and neither does a line such as ` = 1 rad / s = ` … which
/// does: the rule is textual, and the split has pages that start at such lines.)
fn opens_page(line: &str) -> bool {
    let merged = line.replace("= = =", "===").replace("= =", "==");
    let t = python_strip(&merged);
    t.starts_with("= ") && t.ends_with(" =")
}

/// The pages of a raw WikiText split, as `EleutherAI/wikitext_document_level` yields them:
/// the text split at `"\n"` into lines, a new page at every line that [`opens_page`], each
/// page its lines joined by `"\n"` (so without the newline before the next page's heading).
/// Pages that are only whitespace are dropped, except the last one, which the script always
/// yields. The file is read as Python reads text (universal newlines: `\r\n` and `\r` become
/// `\n`), so borrowed slices unless the text has a carriage return.
pub fn pages(text: &str) -> Vec<Cow<'_, str>> {
    if text.contains('\r') {
        let unified = text.replace("\r\n", "\n").replace('\r', "\n");
        return pages(&unified)
            .into_iter()
            .map(|p| Cow::Owned(p.into_owned()))
            .collect();
    }
    let mut out = Vec::new();
    // Byte offset where the current page starts (it runs to the '\n' before `offset`).
    let mut page_start = 0;
    let mut offset = 0;
    for line in text.split('\n') {
        if offset > page_start && opens_page(line) {
            let page = &text[page_start..offset - 1];
            if !python_strip(page).is_empty() {
                out.push(Cow::Borrowed(page));
            }
            page_start = offset;
        }
        offset += line.len() + 1;
    }
    // The last page: every line since its start (the split's final piece included).
    out.push(Cow::Borrowed(&text[page_start..]));
    out
}

/// `re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", s)` and its kin for `[]`, `{}`, `""` and `''`:
/// each opening character up to the next closing one (none in between, by the class) has the
/// whitespace inside its ends removed. An opening character with no closing one after it
/// ends the matches, as it does for the regex (no later one can have a closing one either).
fn tighten_pairs(s: &str, open: char, close: char) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(open) {
        let after = &rest[i + open.len_utf8()..];
        let Some(j) = after.find(close) else {
            break;
        };
        out.push_str(&rest[..i]);
        out.push(open);
        out.push_str(python_strip(&after[..j]));
        out.push(close);
        rest = &after[j + close.len_utf8()..];
    }
    out.push_str(rest);
    out
}

/// `re.sub(r"/' [0-9]/", r"/'[0-9]/", s)`: lm-eval's contraction rule replaces the matched
/// text with the literal `/'[0-9]/` (the pattern is written as if it were a character class,
/// and is reproduced as it behaves).
fn odd_slash_rule(s: &str) -> Cow<'_, str> {
    const LITERAL: &str = "/'[0-9]/";
    let b = s.as_bytes();
    let matches_at = |i: usize| {
        b.len() >= i + 5 && &b[i..i + 3] == b"/' " && b[i + 3].is_ascii_digit() && b[i + 4] == b'/'
    };
    if !(0..b.len()).any(matches_at) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut copied = 0;
    while i < b.len() {
        if matches_at(i) {
            out.push_str(&s[copied..i]);
            out.push_str(LITERAL);
            i += 5;
            copied = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&s[copied..]);
    Cow::Owned(out)
}

/// lm-eval's `wikitext_detokenizer`, rule for rule and in its order.
pub fn detokenize(page: &str) -> String {
    // contractions
    let mut s = page.replace("s '", "s'");
    s = odd_slash_rule(&s).into_owned();
    // number separators
    for (from, to) in [(" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", ".")] {
        s = s.replace(from, to);
    }
    // punctuation
    for (from, to) in [
        (" : ", ": "),
        (" ; ", "; "),
        (" . ", ". "),
        (" ! ", "! "),
        (" ? ", "? "),
        (" , ", ", "),
    ] {
        s = s.replace(from, to);
    }
    // double brackets
    for (open, close) in [('(', ')'), ('[', ']'), ('{', '}'), ('"', '"'), ('\'', '\'')] {
        s = tighten_pairs(&s, open, close);
    }
    // miscellaneous
    for (from, to) in [
        ("= = = =", "===="),
        ("= = =", "==="),
        ("= =", "=="),
        (" \u{B0} ", "\u{B0}"),
        (" \n", "\n"),
        ("\n ", "\n"),
        (" N ", " 1 "),
        (" 's", "'s"),
    ] {
        s = s.replace(from, to);
    }
    s
}
