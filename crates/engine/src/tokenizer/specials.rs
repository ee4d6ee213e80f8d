//! Splitting text on special tokens the way llama.cpp does, in time linear in the text.
//!
//! llama.cpp takes the special tokens longest first and, for each in turn, cuts every
//! text fragment still left at the token's leftmost non-overlapping occurrences. Done
//! literally that is one scan of every fragment per special token: Gemma's vocabulary has
//! thousands, so a megabyte of text took seconds. Here one pass of an Aho-Corasick
//! automaton over the text says which special tokens occur at all (by the automaton
//! states it visits, so nested tokens such as runs of spaces cost nothing extra); only
//! those are then searched for, in priority order, each with one substring scan that
//! skips over the occurrences already taken.

use std::collections::{BTreeMap, HashSet};

use aho_corasick::automaton::Automaton;
use aho_corasick::dfa::DFA;
use aho_corasick::{Anchored, MatchKind};
use memchr::memmem::Finder;

use super::TokenId;
use crate::EngineError;

/// A piece of input text, or a special token recognised in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fragment<'a> {
    /// Text to run through the vocabulary's algorithm.
    Text(&'a str),
    /// A special token written in the text.
    Token(TokenId),
}

/// The special tokens of a vocabulary, ready to be found in text.
#[derive(Debug)]
pub(super) struct SpecialSplitter {
    /// The tokens in priority order (longest piece first, then by id).
    tokens: Vec<TokenId>,
    /// Whether each token is split out even without `parse_special` (user-defined).
    always: Vec<bool>,
    /// A substring searcher for each token's piece.
    finders: Vec<Finder<'static>>,
    /// Every piece; pattern `i` is `tokens[i]`. `None` without special tokens.
    automaton: Option<DFA>,
}

impl SpecialSplitter {
    /// `specials` lists `(id, piece, always)` in priority order.
    pub(super) fn new(specials: Vec<(TokenId, &str, bool)>) -> Result<Self, EngineError> {
        let automaton = if specials.is_empty() {
            None
        } else {
            let built = DFA::builder()
                .match_kind(MatchKind::Standard)
                .build(specials.iter().map(|(_, piece, _)| piece))
                .map_err(|e| EngineError::InvalidModel(format!("special tokens: {e}")))?;
            Some(built)
        };
        Ok(Self {
            tokens: specials.iter().map(|(id, _, _)| *id).collect(),
            always: specials.iter().map(|(_, _, always)| *always).collect(),
            finders: specials
                .iter()
                .map(|(_, piece, _)| Finder::new(piece.as_bytes()).into_owned())
                .collect(),
            automaton,
        })
    }

    /// The patterns (priority indices, ascending) that occur in `text`.
    fn present(&self, automaton: &DFA, text: &str) -> Vec<usize> {
        let mut state = automaton
            .start_state(Anchored::No)
            .expect("an unanchored automaton has an unanchored start");
        let mut matching = HashSet::new();
        for &byte in text.as_bytes() {
            state = automaton.next_state(Anchored::No, state, byte);
            if automaton.is_match(state) {
                matching.insert(state);
            }
        }
        let mut present: Vec<usize> = matching
            .into_iter()
            .flat_map(|s| (0..automaton.match_len(s)).map(move |i| (s, i)))
            .map(|(s, i)| automaton.match_pattern(s, i).as_usize())
            .collect();
        present.sort_unstable();
        present.dedup();
        present
    }

    /// Splits `text` on special tokens (only the user-defined ones unless
    /// `parse_special`).
    pub(super) fn split<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let Some(automaton) = &self.automaton else {
            return vec![Fragment::Text(text)];
        };
        let bytes = text.as_bytes();
        // Taken occurrences: start → (end, priority).
        let mut taken: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
        for p in self.present(automaton, text) {
            if !parse_special && !self.always[p] {
                continue;
            }
            let finder = &self.finders[p];
            let len = finder.needle().len();
            let mut from = 0;
            while let Some(found) = finder.find(&bytes[from..]) {
                let (start, end) = (from + found, from + found + len);
                // The taken occurrence this one would overlap, if any: the last one that
                // starts before its end.
                let blocker = taken
                    .range(..end)
                    .next_back()
                    .map(|(_, &(taken_end, _))| taken_end)
                    .filter(|&taken_end| taken_end > start);
                match blocker {
                    // No later occurrence that starts before the blocker's end fits
                    // before it either: search on after it.
                    Some(taken_end) => from = taken_end,
                    None => {
                        taken.insert(start, (end, p));
                        from = end;
                    }
                }
            }
        }
        let mut fragments = Vec::with_capacity(2 * taken.len() + 1);
        let mut at = 0;
        for (start, (end, p)) in taken {
            if start > at {
                fragments.push(Fragment::Text(&text[at..start]));
            }
            fragments.push(Fragment::Token(self.tokens[p]));
            at = end;
        }
        if at < text.len() {
            fragments.push(Fragment::Text(&text[at..]));
        }
        fragments
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// llama.cpp's procedure, literally: each token in priority order cuts every text
    /// fragment left at its leftmost non-overlapping occurrences.
    fn literal<'a>(
        specials: &[(TokenId, &str, bool)],
        text: &'a str,
        parse_special: bool,
    ) -> Vec<Fragment<'a>> {
        let mut fragments = vec![Fragment::Text(text)];
        for &(id, piece, always) in specials {
            if !parse_special && !always {
                continue;
            }
            let mut next = Vec::new();
            for fragment in fragments {
                let Fragment::Text(t) = fragment else {
                    next.push(fragment);
                    continue;
                };
                let mut rest = t;
                while let Some(pos) = rest.find(piece) {
                    if pos > 0 {
                        next.push(Fragment::Text(&rest[..pos]));
                    }
                    next.push(Fragment::Token(id));
                    rest = &rest[pos + piece.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            fragments = next;
        }
        fragments
    }

    #[test]
    fn splits_exactly_like_the_literal_procedure() {
        // Overlapping, nested and repeated pieces, longest first as the tokenizer sorts them.
        let specials: Vec<(TokenId, &str, bool)> = vec![
            (7, "<aba>", false),
            (3, "abab", true),
            (5, "<ab", false),
            (1, "ab>", true),
            (4, "aa", false),
            (2, "ba", true),
            (6, "<", false),
        ];
        let splitter = SpecialSplitter::new(specials.clone()).unwrap();
        let alphabet = ['a', 'b', '<', '>', 'x'];
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for len in 0..400 {
            let text: String = (0..len % 40)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            for parse_special in [true, false] {
                assert_eq!(
                    splitter.split(&text, parse_special),
                    literal(&specials, &text, parse_special),
                    "{text:?} parse_special={parse_special}"
                );
            }
        }
    }

    #[test]
    fn no_specials_leaves_the_text_whole() {
        let splitter = SpecialSplitter::new(Vec::new()).unwrap();
        assert_eq!(splitter.split("a<b", true), vec![Fragment::Text("a<b")]);
    }
}
