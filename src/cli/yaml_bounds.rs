//! Bounds on a YAML document before it is built: nesting depth and the size its aliases
//! expand to.
//!
//! `yaml-rust2` builds a document by copying an anchored node at every alias, so nine levels
//! of ten aliases each ("billion laughs", a few hundred bytes) ask for 10⁹ nodes. This walks
//! the parser's event stream instead, which costs memory in proportion to the text, and adds
//! up what every node would expand to, stopping at the first bound crossed.

use yaml_rust2::parser::{Event, Parser};

/// Deepest nesting of mappings and sequences accepted (a configuration needs 3 or 4).
pub const MAX_DEPTH: usize = 64;
/// Most nodes the document may expand to, aliases included (a configuration has ~100).
pub const MAX_NODES: u64 = 100_000;

/// Checks `text`'s nesting depth and alias expansion; `Err` says which bound it crossed.
/// Text that does not parse passes: the loader reports the syntax error with its position.
pub fn check(text: &str) -> Result<(), String> {
    let mut parser = Parser::new_from_str(text);
    // Expanded size of every anchored node, by anchor id.
    let mut anchored: std::collections::HashMap<usize, u64> = Default::default();
    // Per open collection: its anchor id and the expanded size of its children so far.
    let mut open: Vec<(usize, u64)> = Vec::new();
    let mut total: u64 = 0;
    loop {
        let Ok((event, mark)) = parser.next_token() else {
            return Ok(());
        };
        let finished: Option<(usize, u64)> = match event {
            Event::StreamEnd => return Ok(()),
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                open.push((anchor, 0));
                if open.len() > MAX_DEPTH {
                    return Err(format!(
                        "nested more than {MAX_DEPTH} levels deep (line {}); a configuration needs a handful",
                        mark.line()
                    ));
                }
                None
            }
            Event::SequenceEnd | Event::MappingEnd => open.pop().map(|(a, n)| (a, n + 1)),
            Event::Scalar(_, _, anchor, _) => Some((anchor, 1)),
            Event::Alias(id) => Some((0, anchored.get(&id).copied().unwrap_or(1))),
            _ => None,
        };
        if let Some((anchor, size)) = finished {
            if anchor > 0 {
                anchored.insert(anchor, size);
            }
            match open.last_mut() {
                Some((_, n)) => *n = n.saturating_add(size),
                None => total = total.saturating_add(size),
            }
            let pending: u64 = open.iter().map(|(_, n)| *n).sum();
            if total.saturating_add(pending) > MAX_NODES {
                return Err(format!(
                    "its aliases expand to more than {MAX_NODES} values (line {}); a configuration has about a hundred — write the values out instead of nesting aliases",
                    mark.line()
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `levels` levels of `fanout` aliases each to the level below: fanout^levels values.
    fn laughs(levels: usize, fanout: usize) -> String {
        let mut s = "a0: &a0 [lol]\n".to_string();
        for l in 1..=levels {
            let refs = vec![format!("*a{}", l - 1); fanout].join(", ");
            s += &format!("a{l}: &a{l} [{refs}]\n");
        }
        s
    }

    #[test]
    fn billion_laughs_are_refused_quickly() {
        let t = std::time::Instant::now();
        let e = check(&laughs(9, 10)).unwrap_err();
        assert!(e.contains("aliases expand"), "{e}");
        assert!(t.elapsed().as_secs() < 2);
        // A few small aliases are fine.
        assert_eq!(check(&laughs(2, 3)), Ok(()));
        assert_eq!(
            check("model: {path: m.gguf}\ndata: &d {path: t.txt}\n"),
            Ok(())
        );
    }

    /// Values of a loaded document (collections one plus their contents, keys included).
    fn loaded_size(y: &yaml_rust2::Yaml) -> u64 {
        use yaml_rust2::Yaml;
        1 + match y {
            Yaml::Array(v) => v.iter().map(loaded_size).sum(),
            Yaml::Hash(h) => h.iter().map(|(k, v)| loaded_size(k) + loaded_size(v)).sum(),
            _ => 0,
        }
    }

    #[test]
    fn the_fuzz_seeds_are_refused_or_really_small() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/config_aliases");
        let mut seen = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            match check(&text) {
                Err(e) => assert!(
                    name.starts_with("laughs-9") || name.starts_with("deep"),
                    "{name}: {e}"
                ),
                Ok(()) => {
                    let docs = yaml_rust2::YamlLoader::load_from_str(&text).unwrap();
                    let n: u64 = docs.iter().map(loaded_size).sum();
                    assert!(n <= MAX_NODES, "{name}: {n} values");
                }
            }
            seen += 1;
        }
        assert!(seen >= 5);
    }

    #[test]
    fn deep_nesting_is_refused_and_bad_syntax_left_to_the_loader() {
        // Flow style (the scanner itself stops at 255 levels) and block style (no limit).
        let flow = "[".repeat(100) + &"]".repeat(100);
        assert!(check(&flow).unwrap_err().contains("nested more than"));
        let block = format!("data:\n  {}x\n", "- ".repeat(5000));
        assert!(check(&block).unwrap_err().contains("nested more than"));
        assert_eq!(check("a: [unclosed"), Ok(()));
    }
}
