//! `prompt` read straight from the body: a string, or an array whose first element says
//! which of the three array shapes it is (strings, token ids, arrays of token ids), each
//! element then read as that shape. Nothing is buffered on the way.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use crate::Prompt;

/// What `prompt` must be, for the messages of a mismatch.
const EXPECTED: &str =
    "a string, an array of strings, an array of token ids or an array of arrays of token ids";

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(PromptVisitor)
    }
}

struct PromptVisitor;

impl<'de> Visitor<'de> for PromptVisitor {
    type Value = Prompt;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(EXPECTED)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Prompt, E> {
        Ok(Prompt::Text(text.to_string()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Prompt, E> {
        Ok(Prompt::Text(text))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prompt, A::Error> {
        // The first element decides the shape; an empty array is a list of no texts.
        let Some(first) = seq.next_element::<Element>()? else {
            return Ok(Prompt::Texts(Vec::new()));
        };
        let capacity = seq.size_hint().unwrap_or(0).min(4096);
        Ok(match first {
            Element::Text(text) => {
                let mut texts = Vec::with_capacity(capacity + 1);
                texts.push(text);
                while let Some(text) = seq.next_element::<String>()? {
                    texts.push(text);
                }
                Prompt::Texts(texts)
            }
            Element::Id(id) => {
                let mut ids = Vec::with_capacity(capacity + 1);
                ids.push(id);
                while let Some(id) = seq.next_element::<i64>()? {
                    ids.push(id);
                }
                Prompt::Tokens(ids)
            }
            Element::Ids(list) => {
                let mut lists = Vec::with_capacity(capacity + 1);
                lists.push(list);
                while let Some(list) = seq.next_element::<Vec<i64>>()? {
                    lists.push(list);
                }
                Prompt::TokenLists(lists)
            }
        })
    }
}

/// The first element of a prompt array.
enum Element {
    Text(String),
    Id(i64),
    Ids(Vec<i64>),
}

impl<'de> Deserialize<'de> for Element {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ElementVisitor)
    }
}

struct ElementVisitor;

impl<'de> Visitor<'de> for ElementVisitor {
    type Value = Element;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string, a token id or an array of token ids")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Element, E> {
        Ok(Element::Text(text.to_string()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Element, E> {
        Ok(Element::Text(text))
    }

    fn visit_i64<E: de::Error>(self, id: i64) -> Result<Element, E> {
        Ok(Element::Id(id))
    }

    fn visit_u64<E: de::Error>(self, id: u64) -> Result<Element, E> {
        i64::try_from(id)
            .map(Element::Id)
            .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(id), &self))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Element, A::Error> {
        let mut ids = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(id) = seq.next_element::<i64>()? {
            ids.push(id);
        }
        Ok(Element::Ids(ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Prompt, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn reads_each_shape_and_refuses_mixtures() {
        assert_eq!(parse(r#""hi""#).unwrap(), Prompt::Text("hi".into()));
        assert_eq!(parse("[]").unwrap(), Prompt::Texts(vec![]));
        assert_eq!(
            parse(r#"["a", "b"]"#).unwrap(),
            Prompt::Texts(vec!["a".into(), "b".into()])
        );
        assert_eq!(parse("[1, -2, 3]").unwrap(), Prompt::Tokens(vec![1, -2, 3]));
        assert_eq!(
            parse("[[1], [], [2, 3]]").unwrap(),
            Prompt::TokenLists(vec![vec![1], vec![], vec![2, 3]])
        );
        for bad in [
            r#"[1, "a"]"#,
            r#"["a", 1]"#,
            "[[1], 2]",
            "[1.5]",
            "[1, 2.5]",
            "[18446744073709551615]",
            "[null]",
            "[{}]",
            "{}",
            "3",
            "null",
            r#"[["a"]]"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        // Read as it comes: a value (from a tree) gives the same answers.
        let value: serde_json::Value = serde_json::from_str("[[4, 5]]").unwrap();
        assert_eq!(
            Prompt::deserialize(value).unwrap(),
            Prompt::TokenLists(vec![vec![4, 5]])
        );
    }
}
