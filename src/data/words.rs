//! Python's notion of whitespace and lm-evaluation-harness's word count, for the word-level
//! perplexity of any text and for the `wikitext` task (`task::wikitext`).
//!
//! Python's whitespace (`str.strip()`, the `\s` of a `str` regex) is not Rust's
//! `char::is_whitespace`: it adds the separators U+001C…U+001F and leaves out nothing Rust
//! has. [`is_python_space`] is Python's set, so that counts and strips agree on any text.

/// Python's `str.isspace()` (and the `\s` of a `str` regex): bidirectional classes WS, B, S
/// and the category Zs.
pub fn is_python_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n'
            | '\u{0B}'
            | '\u{0C}'
            | '\r'
            | '\u{1C}'..='\u{1F}'
            | ' '
            | '\u{85}'
            | '\u{A0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200A}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202F}'
            | '\u{205F}'
            | '\u{3000}'
    )
}

/// Python's `s.strip()`.
pub fn python_strip(s: &str) -> &str {
    s.trim_matches(is_python_space)
}

/// lm-eval's word count, `len(re.split(r"\s+", page))`: one more than the number of
/// whitespace runs, leading and trailing runs included.
pub fn count_words(s: &str) -> u64 {
    let mut runs = 0;
    let mut in_space = false;
    for c in s.chars() {
        let space = is_python_space(c);
        if space && !in_space {
            runs += 1;
        }
        in_space = space;
    }
    runs + 1
}
