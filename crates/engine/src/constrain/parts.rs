//! The parts of a grammar that the checks before compiling measure: a regex grammar's
//! regex, a JSON schema, a Lark grammar, the parts of llguidance's JSON list of grammars,
//! and the JSON schemas a Lark grammar embeds in `%json` blocks. Each part is found and
//! parsed once, and every check ([`super::regexes`], [`super::depth`]) runs on it.

use serde_json::Value;

use super::{depth, regexes, Grammar, GrammarKind};

/// What a check does with each kind of part; each returns the refusal, if any.
pub(super) struct PartChecks<R, S, L> {
    /// A whole regex grammar.
    pub regex: R,
    /// A JSON schema (parsed; text that is not JSON is left to llguidance).
    pub schema: S,
    /// A Lark grammar's text (the schemas of its `%json` blocks go to `schema`).
    pub lark: L,
}

impl<R, S, L> PartChecks<R, S, L>
where
    R: Fn(&str) -> Result<(), String>,
    S: Fn(&Value) -> Result<(), String>,
    L: Fn(&str) -> Result<(), String>,
{
    /// Runs the checks over every part of `grammar`.
    pub(super) fn run(&self, grammar: &Grammar) -> Result<(), String> {
        match grammar.kind {
            GrammarKind::Regex => (self.regex)(&grammar.source),
            GrammarKind::JsonSchema => match serde_json::from_str::<Value>(&grammar.source) {
                Ok(schema) => (self.schema)(&schema),
                Err(_) => Ok(()),
            },
            GrammarKind::Lark => self.lark_and_its_schemas(&grammar.source),
            GrammarKind::Llguidance => match serde_json::from_str::<Value>(&grammar.source) {
                // llguidance's JSON form: `{"grammars": [{"json_schema": …} | {"lark_grammar": …}]}`.
                Ok(Value::Object(top)) => {
                    for g in top
                        .get("grammars")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        if let Some(schema) = g.get("json_schema") {
                            (self.schema)(schema)?;
                        }
                        if let Some(Value::String(lark)) = g.get("lark_grammar") {
                            self.lark_and_its_schemas(lark)?;
                        }
                    }
                    Ok(())
                }
                _ => self.lark_and_its_schemas(&grammar.source),
            },
        }
    }

    /// A Lark grammar, then each JSON schema it embeds (`%json { … }`); text after
    /// `%json` that is not JSON is left to llguidance, whose message names the problem.
    fn lark_and_its_schemas(&self, source: &str) -> Result<(), String> {
        (self.lark)(source)?;
        let mut rest = source;
        while let Some(at) = rest.find("%json") {
            let after = rest[at + "%json".len()..].trim_start();
            let mut values = serde_json::Deserializer::from_str(after).into_iter::<Value>();
            match values.next() {
                Some(Ok(schema)) => {
                    (self.schema)(&schema)?;
                    rest = &after[values.byte_offset()..];
                }
                _ => rest = after,
            }
        }
        Ok(())
    }
}

/// Every check a grammar must pass before it compiles: the regexes it holds, whose
/// shortest matches may be `max_regex_match` bytes at most ([`super::regexes`]), and how
/// deep compiling it would recurse ([`super::depth`]).
pub(super) fn check_before_compiling(
    grammar: &Grammar,
    max_regex_match: usize,
) -> Result<(), String> {
    PartChecks {
        regex: |regex: &str| regexes::check_regex(regex, max_regex_match),
        schema: |schema: &Value| {
            regexes::check_schema(schema, max_regex_match)?;
            depth::check_schema(schema)
        },
        lark: |lark: &str| {
            regexes::check_lark(lark, max_regex_match)?;
            depth::check_lark(lark)
        },
    }
    .run(grammar)
}
