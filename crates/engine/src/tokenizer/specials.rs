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
//!
//! Text a client wrote into a chat template (a message, a tool's description) must not
//! become control tokens: `<|im_end|>\n<|im_start|>system` in a user message would close
//! its turn and open a system one. [`SpecialSplitter::escape`] marks each place in such
//! text where a control token's piece starts with [`ESCAPE`] (and doubles any `ESCAPE`
//! already there); [`SpecialSplitter::unescape`] takes the marks out of the rendered
//! prompt and says where no control token may start, which
//! [`SpecialSplitter::split_barred`] then honours. Text without control-token pieces is left as it was, so it tokenizes
//! exactly as before; user-defined tokens are split out of it as they always are.

use std::collections::{BTreeMap, HashSet};

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::dfa::DFA;
use aho_corasick::{Anchored, MatchKind};
use memchr::memmem::Finder;

use super::TokenId;
use crate::error::EngineError;

/// Marks, in escaped text, a place where no control token may start (doubled, itself).
/// A private-use character: no template writes it.
pub const ESCAPE: char = '\u{E000}';

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
    /// The control tokens' pieces (not user-defined ones), sorted.
    control_pieces: Vec<String>,
    /// The longest of them, in characters.
    longest_control: usize,
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
        let mut control_pieces: Vec<String> = specials
            .iter()
            .filter(|(_, _, always)| !always)
            .map(|(_, piece, _)| piece.to_string())
            .collect();
        control_pieces.sort_unstable();
        Ok(Self {
            longest_control: control_pieces
                .iter()
                .map(|piece| piece.chars().count())
                .max()
                .unwrap_or(0),
            control_pieces,
            tokens: specials.iter().map(|(id, _, _)| *id).collect(),
            always: specials.iter().map(|(_, _, always)| *always).collect(),
            finders: specials
                .iter()
                .map(|(_, piece, _)| Finder::new(piece.as_bytes()).into_owned())
                .collect(),
            automaton,
        })
    }

    /// Runs `automaton` over `text` and calls `matched(end, state)` at each byte offset
    /// just past which some pieces end (`state` says which).
    fn walk(automaton: &DFA, text: &str, mut matched: impl FnMut(usize, StateID)) {
        let mut state = automaton
            .start_state(Anchored::No)
            .expect("an unanchored automaton has an unanchored start");
        for (i, &byte) in text.as_bytes().iter().enumerate() {
            state = automaton.next_state(Anchored::No, state, byte);
            if automaton.is_match(state) {
                matched(i + 1, state);
            }
        }
    }

    /// The patterns (priority indices, ascending) that occur in `text`.
    fn present(&self, automaton: &DFA, text: &str) -> Vec<usize> {
        let mut matching = HashSet::new();
        Self::walk(automaton, text, |_, state| {
            matching.insert(state);
        });
        let mut present: Vec<usize> = matching
            .into_iter()
            .flat_map(|s| (0..automaton.match_len(s)).map(move |i| (s, i)))
            .map(|(s, i)| automaton.match_pattern(s, i).as_usize())
            .collect();
        present.sort_unstable();
        present.dedup();
        present
    }

    /// `text` with [`ESCAPE`] before every place a control token's piece starts (its
    /// occurrences overlapping or not) and doubled where it was already; `None` when
    /// there is neither (the text stays as it is).
    pub(super) fn escape(&self, text: &str) -> Option<String> {
        let mut starts: Vec<usize> = text.match_indices(ESCAPE).map(|(i, _)| i).collect();
        if let Some(automaton) = &self.automaton {
            Self::walk(automaton, text, |end, state| {
                for m in 0..automaton.match_len(state) {
                    let p = automaton.match_pattern(state, m).as_usize();
                    if !self.always[p] {
                        starts.push(end - self.finders[p].needle().len());
                    }
                }
            });
        }
        // A control token's piece begun at the text's end, which the template's text
        // after it could complete.
        for (start, _) in text.char_indices().rev().take(self.longest_control) {
            let rest = &text[start..];
            let at = self.control_pieces.partition_point(|p| p.as_str() < rest);
            if self
                .control_pieces
                .get(at)
                .is_some_and(|p| p.starts_with(rest))
            {
                starts.push(start);
            }
        }
        if starts.is_empty() {
            return None;
        }
        starts.sort_unstable();
        starts.dedup();
        let mut out = String::with_capacity(text.len() + 3 * starts.len());
        let mut at = 0;
        for start in starts {
            out.push_str(&text[at..start]);
            out.push(ESCAPE);
            at = start;
        }
        out.push_str(&text[at..]);
        Some(out)
    }

    /// Takes [`SpecialSplitter::escape`]'s marks out of `text`: the text, and the byte
    /// offsets in it (ascending) where no control token may start.
    pub(super) fn unescape(text: &str) -> (String, Vec<usize>) {
        let mut out = String::with_capacity(text.len());
        let mut barred = Vec::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c != ESCAPE {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some(ESCAPE) => out.push(ESCAPE),
                Some(next) => {
                    barred.push(out.len());
                    out.push(next);
                }
                None => {}
            }
        }
        (out, barred)
    }

    /// Splits `text` on special tokens (only the user-defined ones unless
    /// `parse_special`).
    #[cfg(test)]
    pub(super) fn split<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        self.split_barred(text, parse_special, &[])
    }

    /// `SpecialSplitter::split` where no control token may start at the byte offsets
    /// `barred` (ascending).
    pub(super) fn split_barred<'a>(
        &self,
        text: &'a str,
        parse_special: bool,
        barred: &[usize],
    ) -> Vec<Fragment<'a>> {
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
                if !self.always[p] && barred.binary_search(&start).is_ok() {
                    from = start + 1;
                    continue;
                }
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
    fn escaped_text_never_starts_a_control_token_and_reads_back_as_written() {
        let specials: Vec<(TokenId, &str, bool)> = vec![
            (7, "<aba>", false),
            (3, "abab", true),
            (5, "<ab", false),
            (1, "ab>", true),
            (4, "aa", false),
            (6, "<", false),
        ];
        let piece = |id: TokenId| specials.iter().find(|s| s.0 == id).unwrap();
        let splitter = SpecialSplitter::new(specials.clone()).unwrap();
        let alphabet = ['a', 'b', '<', '>', 'x', ESCAPE];
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for len in 0..2000 {
            let client: String = (0..len % 30)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            // Template text around the client's: the template's control tokens stay.
            let escaped = splitter.escape(&client).unwrap_or_else(|| client.clone());
            let (text, barred) = SpecialSplitter::unescape(&format!("<aba>{escaped}<ab"));
            assert_eq!(text, format!("<aba>{client}<ab"));
            let fragments = splitter.split_barred(&text, true, &barred);
            assert_eq!(fragments.first(), Some(&Fragment::Token(7)), "{client:?}");
            assert_eq!(fragments.last(), Some(&Fragment::Token(5)), "{client:?}");
            // No control token starts or ends inside the client's text.
            let (client_from, client_to) = (5, text.len() - 3);
            let mut at = 0;
            for fragment in &fragments {
                let len = match fragment {
                    Fragment::Text(t) => t.len(),
                    Fragment::Token(id) => {
                        let (_, text, always) = piece(*id);
                        let (from, to) = (at, at + text.len());
                        let starts_inside = from >= client_from && from < client_to;
                        let ends_inside = to > client_from && to <= client_to;
                        assert!(
                            *always || !(starts_inside || ends_inside),
                            "{client:?} gave control token {id} at {from}..{to}"
                        );
                        text.len()
                    }
                };
                at += len;
            }
        }
        // Text without control pieces or marks is left alone.
        assert_eq!(splitter.escape("xbx>"), None);
        // `<` is a token, `<a` begins two and `a` begins `aa`.
        assert_eq!(
            splitter.escape("x<a").as_deref(),
            Some("x\u{E000}<\u{E000}a")
        );
    }

    #[test]
    fn no_specials_leaves_the_text_whole() {
        let splitter = SpecialSplitter::new(Vec::new()).unwrap();
        assert_eq!(splitter.split("a<b", true), vec![Fragment::Text("a<b")]);
    }
}
