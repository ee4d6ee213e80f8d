//! The regular expressions inside a grammar, measured before it compiles. llguidance
//! builds a regex's repetitions out in full when it compiles them: a regex whose every
//! match is a megabyte long (`(a{1000}){1000}`, 20 bytes) took 320 MiB to compile,
//! whether it came as `guided_regex`, as a JSON schema's `pattern` or as a Lark
//! terminal. Every regex a grammar holds therefore has a bound on its shortest match
//! (the engine's `max_regex_match_bytes`, [`DEFAULT_MAX_REGEX_MATCH_BYTES`] unless set):
//! the whole regex of a regex grammar, each `pattern` (and `patternProperties` name) of
//! a JSON schema, and each `/…/` terminal of a Lark grammar (and the schemas of its
//! `%json` blocks).

use serde_json::Value;

/// Longest shortest-match a regex may have by default, in bytes. A regex whose every
/// match is longer (`\u{FFFD}{101695}`: 300 kB) forces that many bytes, and llguidance
/// builds and walks them all to compile it (~0.4 s natively for 300 kB, 320 MiB for
/// 1 MB); no real output format needs this.
pub const DEFAULT_MAX_REGEX_MATCH_BYTES: usize = 1 << 14;

/// One regex (Rust `regex` syntax, as llguidance reads it), whose every match may be no
/// longer than `max` bytes. Text that does not parse is left to llguidance, whose message
/// names the problem.
pub fn check_regex(source: &str, max: usize) -> Result<(), String> {
    let Ok(hir) = regex_syntax::Parser::new().parse(source) else {
        return Ok(());
    };
    match hir.properties().minimum_len() {
        Some(len) if len > max => Err(format!(
            "every match of the regex is at least {len} bytes long; at most {max} are allowed"
        )),
        _ => Ok(()),
    }
}

/// Every `pattern` and `patternProperties` name anywhere in a schema (definitions
/// included: whatever is there may be compiled), each held to `max` as [`check_regex`].
pub(super) fn check_schema(schema: &Value, max: usize) -> Result<(), String> {
    // An explicit stack: a schema may nest as deep as its JSON text goes.
    let mut stack = vec![schema];
    while let Some(node) = stack.pop() {
        match node {
            Value::Object(map) => {
                if let Some(Value::String(pattern)) = map.get("pattern") {
                    check_regex(pattern, max).map_err(|e| format!("`pattern` {pattern:?}: {e}"))?;
                }
                if let Some(Value::Object(named)) = map.get("patternProperties") {
                    for pattern in named.keys() {
                        check_regex(pattern, max)
                            .map_err(|e| format!("`patternProperties` {pattern:?}: {e}"))?;
                    }
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    Ok(())
}

/// Each `/…/` terminal of a Lark grammar (outside strings and `//` comments; the schemas
/// of its `%json` blocks are checked as schemas), each held to `max` as [`check_regex`].
pub(super) fn check_lark(source: &str, max: usize) -> Result<(), String> {
    for line in source.lines() {
        let mut chars = line.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '"' => {
                    // A string literal: skip to its closing quote.
                    while let Some((_, c)) = chars.next() {
                        match c {
                            '\\' => {
                                chars.next();
                            }
                            '"' => break,
                            _ => {}
                        }
                    }
                }
                '/' if chars.peek().is_some_and(|&(_, c)| c == '/') => break,
                '/' => {
                    let start = at + 1;
                    let mut end = None;
                    while let Some((i, c)) = chars.next() {
                        match c {
                            '\\' => {
                                chars.next();
                            }
                            '/' => {
                                end = Some(i);
                                break;
                            }
                            _ => {}
                        }
                    }
                    if let Some(end) = end {
                        let regex = &line[start..end];
                        check_regex(regex, max).map_err(|e| format!("terminal /{regex}/: {e}"))?;
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constrain::parts::PartChecks;
    use crate::constrain::{Grammar, GrammarKind};
    use serde_json::json;

    /// This module's checks alone over a whole grammar (the compiler runs them with the
    /// others, in `parts::check_before_compiling`).
    fn check(grammar: &Grammar) -> Result<(), String> {
        const MAX: usize = DEFAULT_MAX_REGEX_MATCH_BYTES;
        PartChecks {
            regex: |r: &str| check_regex(r, MAX),
            schema: |s: &Value| check_schema(s, MAX),
            lark: |l: &str| check_lark(l, MAX),
        }
        .run(grammar)
    }

    fn grammar(kind: GrammarKind, source: &str) -> Grammar {
        Grammar {
            kind,
            source: source.into(),
        }
    }

    const HUGE: &str = "(a{1000}){1000}";

    #[test]
    fn a_regex_forcing_a_huge_run_is_refused_wherever_it_sits() {
        assert!(check(&grammar(GrammarKind::Regex, HUGE)).is_err());
        let pattern =
            json!({"type": "object", "properties": {"s": {"type": "string", "pattern": HUGE}}});
        let err = check(&grammar(GrammarKind::JsonSchema, &pattern.to_string())).unwrap_err();
        assert!(err.contains("`pattern`"), "{err}");
        let named = json!({"$defs": {"X": {"patternProperties": {HUGE: {}}}}});
        assert!(check(&grammar(GrammarKind::JsonSchema, &named.to_string())).is_err());
        let lark = format!("start: \"x//y\" a // a comment\na: /{HUGE}/\n");
        let err = check(&grammar(GrammarKind::Lark, &lark)).unwrap_err();
        assert!(err.contains("terminal"), "{err}");
        let embedded = format!("start: %json {pattern}\n");
        assert!(check(&grammar(GrammarKind::Lark, &embedded)).is_err());
        let list = json!({"grammars": [{"lark_grammar": lark}]});
        assert!(check(&grammar(GrammarKind::Llguidance, &list.to_string())).is_err());
    }

    #[test]
    fn the_bound_is_the_one_given() {
        assert!(check_regex("a{100}", 100).is_ok());
        let err = check_regex("a{100}", 99).unwrap_err();
        assert!(err.contains("at most 99"), "{err}");
        let schema = json!({"properties": {"s": {"pattern": "b{50}"}}});
        assert!(check_schema(&schema, 50).is_ok());
        assert!(check_schema(&schema, 49).is_err());
        assert!(check_lark("start: /c{10}/\n", 10).is_ok());
        assert!(check_lark("start: /c{10}/\n", 9).is_err());
    }

    #[test]
    fn ordinary_regexes_pass() {
        assert!(check(&grammar(GrammarKind::Regex, "a{16384}")).is_ok());
        assert!(check(&grammar(GrammarKind::Regex, "(a{0,1000}){0,1000}")).is_ok());
        let schema = json!({"type": "string", "pattern": "^[a-z]{1,64}\\d{3}$"});
        assert!(check(&grammar(GrammarKind::JsonSchema, &schema.to_string())).is_ok());
        // A comment or a string holding slashes is not a terminal.
        let lark = "start: \"/(a{1000}){1000}/\" // /(a{1000}){1000}/\n";
        assert!(check(&grammar(GrammarKind::Lark, lark)).is_ok());
        assert!(check(&grammar(GrammarKind::Lark, "start: /[0-9]+/ \"x\"\n")).is_ok());
    }
}
