//! How deep compiling a grammar may recurse. llguidance compiles a JSON schema's `$ref`s
//! and a Lark grammar's rule references depth-first, one stack frame group per link: a
//! chain of 400 `$ref`s, or of 700 rules each naming the next, overflows a 2 MiB thread
//! stack and aborts the process (a stack overflow cannot be caught). Both fit in a few
//! hundred bytes of request, so every grammar is measured here before it is compiled, and
//! compiled on a thread whose stack holds many times the deepest one allowed
//! ([`COMPILE_STACK_BYTES`]).
//!
//! Measured on llguidance 1.9.1 (x86-64, release): about 1.3 KiB of stack per level of a
//! schema followed through its references (JSON nesting and `$ref` links alike), and
//! about 3 KiB per rule of a chain of Lark rules.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

/// Deepest a JSON schema may go, counting each object or array level and following each
/// local `$ref` to its target (a reference back into one being followed adds nothing:
/// llguidance ties such cycles lazily). About 2.6 MiB of stack at the limit.
pub const MAX_SCHEMA_DEPTH: usize = 2000;

/// Most lines a Lark grammar may have. Every rule or token is defined on a line of its
/// own, so a chain of rules is at most this long: about 6 MiB of stack at the limit.
pub const MAX_LARK_LINES: usize = 2000;

/// The stack of the thread a grammar compiles on: many times what the limits above allow,
/// reserved but only touched as deep as a grammar goes.
pub const COMPILE_STACK_BYTES: usize = 64 << 20;

/// Refuses a schema that, followed through its local references, nests deeper than
/// [`MAX_SCHEMA_DEPTH`].
pub(super) fn check_schema(schema: &Value) -> Result<(), String> {
    let mut walk = Walk {
        root: schema,
        done: HashMap::new(),
        following: HashSet::new(),
    };
    walk.depth(schema, 0).map(|_| ()).map_err(|()| {
        format!(
            "the JSON schema is too deep: followed through its $refs it nests more than {MAX_SCHEMA_DEPTH} levels"
        )
    })
}

/// A Lark grammar's lines (the schemas of its `%json` blocks are measured as schemas).
pub(super) fn check_lark(source: &str) -> Result<(), String> {
    let lines = source.lines().filter(|l| !l.trim().is_empty()).count();
    if lines > MAX_LARK_LINES {
        return Err(format!(
            "the grammar has {lines} lines; at most {MAX_LARK_LINES} are allowed"
        ));
    }
    Ok(())
}

/// One depth-first walk of a schema through its local references.
struct Walk<'a> {
    root: &'a Value,
    /// Depth below each reference target already walked.
    done: HashMap<String, usize>,
    /// The references being walked (a cycle back into one adds nothing).
    following: HashSet<String>,
}

impl Walk<'_> {
    /// How deep `node` goes below itself; `Err` past the limit (its own recursion stops
    /// there too, so it never goes deeper than the limit).
    fn depth(&mut self, node: &Value, level: usize) -> Result<usize, ()> {
        if level > MAX_SCHEMA_DEPTH {
            return Err(());
        }
        let mut deepest = 0;
        match node {
            Value::Object(map) => {
                if let Some(Value::String(reference)) = map.get("$ref") {
                    deepest = self.follow(reference, level)?;
                }
                for (key, value) in map {
                    // Definitions count where they are referenced.
                    if key != "$defs" && key != "definitions" {
                        deepest = deepest.max(1 + self.depth(value, level + 1)?);
                    }
                }
            }
            Value::Array(items) => {
                for item in items {
                    deepest = deepest.max(1 + self.depth(item, level + 1)?);
                }
            }
            _ => {}
        }
        if level + deepest > MAX_SCHEMA_DEPTH {
            return Err(());
        }
        Ok(deepest)
    }

    /// The depth below a local reference's target (`#/…`); other references count
    /// nothing (llguidance does not fetch them).
    fn follow(&mut self, reference: &str, level: usize) -> Result<usize, ()> {
        let Some(pointer) = reference.strip_prefix('#') else {
            return Ok(0);
        };
        if let Some(&known) = self.done.get(pointer) {
            return if level + known > MAX_SCHEMA_DEPTH {
                Err(())
            } else {
                Ok(known)
            };
        }
        if !self.following.insert(pointer.to_string()) {
            return Ok(0);
        }
        let root = self.root;
        let below = match root.pointer(pointer) {
            Some(target) => self.depth(target, level + 1)? + 1,
            None => 0,
        };
        self.following.remove(pointer);
        self.done.insert(pointer.to_string(), below);
        Ok(below)
    }
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
        PartChecks {
            regex: |_: &str| Ok(()),
            schema: check_schema,
            lark: check_lark,
        }
        .run(grammar)
    }

    fn chain(links: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..links {
            defs.insert(
                format!("A{i}"),
                json!({"type": "object", "properties": {"a": {"$ref": format!("#/$defs/A{}", i + 1)}}}),
            );
        }
        defs.insert(format!("A{links}"), json!({"type": "string"}));
        json!({"$ref": "#/$defs/A0", "$defs": defs})
    }

    fn schema(value: &Value) -> Grammar {
        Grammar {
            kind: GrammarKind::JsonSchema,
            source: value.to_string(),
        }
    }

    #[test]
    fn a_long_chain_of_refs_is_refused_and_a_short_one_is_not() {
        assert!(check(&schema(&chain(50))).is_ok());
        let err = check(&schema(&chain(1000))).unwrap_err();
        assert!(err.contains("too deep"), "{err}");
    }

    #[test]
    fn cycles_and_shared_definitions_cost_once() {
        // A tree: a node refers to itself.
        let tree = json!({"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}}});
        assert!(check(&schema(&tree)).is_ok());
        // Each level refers to the next twice: 2^40 paths, walked once each.
        let mut defs = serde_json::Map::new();
        for i in 0..40 {
            let next = json!({"$ref": format!("#/$defs/D{}", i + 1)});
            defs.insert(format!("D{i}"), json!({"anyOf": [next.clone(), next]}));
        }
        defs.insert("D40".into(), json!({"type": "integer"}));
        let started = std::time::Instant::now();
        assert!(check(&schema(&json!({"$ref": "#/$defs/D0", "$defs": defs}))).is_ok());
        assert!(started.elapsed().as_secs() < 1);
    }

    #[test]
    fn lark_lines_and_embedded_schemas_are_measured() {
        let rules = |n: usize| {
            let mut s = String::from("start: r0\n");
            for i in 0..n {
                s += &format!("r{i}: \"a\" r{}\n", i + 1);
            }
            s + &format!("r{n}: \"b\"\n")
        };
        let lark = |source: String| Grammar {
            kind: GrammarKind::Lark,
            source,
        };
        assert!(check(&lark(rules(100))).is_ok());
        assert!(check(&lark(rules(MAX_LARK_LINES))).is_err());
        let embedded = format!("start: \"x\" %json{}\n", chain(1000));
        assert!(check(&lark(embedded)).unwrap_err().contains("too deep"));
        let fine = format!("start: \"x\" %json {} \"y\"\n", chain(10));
        assert!(check(&lark(fine)).is_ok());
    }
}
