//! Pre-tokenizer regexes in linear time.
//!
//! The GPT-2 family of patterns ends in `\s+(?!\S)|\s+`: a run of whitespace followed by
//! text leaves its last character to start the next piece (so " word" keeps its space).
//! A look-ahead needs a backtracking engine, and fancy-regex's took minutes on a megabyte
//! of one letter. Here the pattern runs without the look-ahead on the `regex` crate
//! (linear time) and the look-ahead's effect is applied to its matches: a match made of
//! whitespace only, at least two characters long and followed by more text, gives its last
//! character back. Only the `\s+` alternatives can match whitespace alone, so this is
//! exactly the original pattern's split.

use std::sync::atomic::{AtomicBool, Ordering};

use regex::Regex;

use super::{Cancelled, MERGES_PER_CHECK};

use crate::error::EngineError;

/// How a pattern's `\s+(?!\S)` look-ahead is applied to its matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GiveBack {
    /// The pattern had no look-ahead.
    Never,
    /// The pattern ended in `\s+(?!\S)|\s+`: a whitespace match of two characters or more
    /// followed by text gives its last character back.
    LastSpace,
    /// The same, but the pattern had `\s*[\r\n]+` before those alternatives (Llama 3,
    /// Qwen 2, Tekken): a whitespace match ending in a line break came from it and keeps
    /// its last character.
    LastSpaceUnlessLineBreak,
}

/// One pre-tokenizer regex.
#[derive(Debug)]
pub(super) struct Splitter {
    regex: Regex,
    give_back: GiveBack,
}

/// The GPT-2 pre-tokenizer pattern with its final `\s+(?!\S)|\s+` written as `\s+`.
pub(super) const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+";

/// Llama 3's (`llama-bpe`) pattern, its `\s+(?!\S)|\s+` written as `\s+`: letters may take
/// one leading non-letter, numbers go three digits at a time, line breaks form their own
/// pieces with the whitespace before them.
pub(super) const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+";

/// Qwen 2's pattern: Llama 3's with one digit at a time.
pub(super) const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+";

/// Mistral's Tekken pattern as llama.cpp writes it, each `(?=[\p{L}])[^a-z]` (a letter
/// that is not a lower-case ASCII one) written as the class `[\p{L}&&[^a-z]]`: words split
/// where case changes, one digit at a time.
pub(super) const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{L}&&[^a-z]]*[\p{L}&&[^A-Z]]+|[^\r\n\p{L}\p{N}]?[\p{L}&&[^a-z]]+[\p{L}&&[^A-Z]]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+";

impl Splitter {
    /// A splitter for `pattern`, applying the look-ahead it stood for as `give_back` says.
    pub(super) fn new(pattern: &str, give_back: GiveBack) -> Result<Self, EngineError> {
        let regex = Regex::new(pattern).map_err(|e| EngineError::InvalidModel(e.to_string()))?;
        Ok(Self { regex, give_back })
    }

    /// Calls `found` with the byte range of each match of the pattern in `text`, in
    /// order, never empty; gives up ([`Cancelled`]) once `cancelled` is set, checked every
    /// [`MERGES_PER_CHECK`] matches (a whole prompt is one text: megabytes of it take a
    /// while), or when `found` gives up.
    pub(super) fn each_match(
        &self,
        text: &str,
        cancelled: &AtomicBool,
        found: &mut dyn FnMut(usize, usize) -> Result<(), Cancelled>,
    ) -> Result<(), Cancelled> {
        let mut at = 0;
        let mut count = 0usize;
        while at < text.len() {
            if count.is_multiple_of(MERGES_PER_CHECK) && cancelled.load(Ordering::Relaxed) {
                return Err(Cancelled);
            }
            let Some(m) = self.regex.find_at(text, at) else {
                break;
            };
            let (start, mut end) = (m.start(), m.end());
            if end == start {
                // An empty match: step over one character.
                at = end + text[end..].chars().next().map_or(1, char::len_utf8);
                continue;
            }
            if self.give_back != GiveBack::Never && end < text.len() {
                let mut chars = m.as_str().chars();
                let last = chars.next_back().expect("a match is not empty");
                let line_break = matches!(last, '\r' | '\n');
                let keeps = self.give_back == GiveBack::LastSpaceUnlessLineBreak && line_break;
                if !keeps
                    && chars.clone().next().is_some()
                    && m.as_str().chars().all(char::is_whitespace)
                {
                    end -= last.len_utf8();
                }
            }
            found(start, end)?;
            count += 1;
            at = end;
        }
        Ok(())
    }

    /// The byte ranges [`Self::each_match`] finds, collected.
    #[cfg(test)]
    pub(super) fn matches(
        &self,
        text: &str,
        cancelled: &AtomicBool,
    ) -> Result<Vec<(usize, usize)>, Cancelled> {
        let mut out = Vec::new();
        self.each_match(text, cancelled, &mut |start, end| {
            out.push((start, end));
            Ok(())
        })?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const GPT2_ORIGINAL: &str =
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

    /// llama.cpp's patterns with their look-aheads (`src/llama-vocab.cpp`).
    const LLAMA3_ORIGINAL: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2_ORIGINAL: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const TEKKEN_ORIGINAL: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

    #[test]
    fn splits_exactly_like_the_look_ahead_pattern() {
        for (original, ours, give_back) in [
            (GPT2_ORIGINAL, GPT2, GiveBack::LastSpace),
            (LLAMA3_ORIGINAL, LLAMA3, GiveBack::LastSpaceUnlessLineBreak),
            (QWEN2_ORIGINAL, QWEN2, GiveBack::LastSpaceUnlessLineBreak),
            (TEKKEN_ORIGINAL, TEKKEN, GiveBack::LastSpaceUnlessLineBreak),
        ] {
            splits_like(original, &Splitter::new(ours, give_back).unwrap());
        }
    }

    fn splits_like(original: &str, ours: &Splitter) {
        let original = fancy_regex::Regex::new(original).unwrap();
        let alphabet = [
            "a", "Z", "é", "É", "字", "1", "٣", "12345", " ", "  ", "\n", "\t", "\u{a0}",
            "\u{3000}", "'", "'s", "'S", "'ll", "!", "-", "/", "😀", "\r\n", "\r",
        ];
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for round in 0..3000 {
            let text: String = (0..round % 24)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            let want: Vec<(usize, usize)> = original
                .find_iter(&text)
                .map(|m| m.unwrap())
                .map(|m| (m.start(), m.end()))
                .collect();
            assert_eq!(
                ours.matches(&text, &AtomicBool::new(false)).unwrap(),
                want,
                "{original:?}: {text:?}"
            );
        }
    }

    #[test]
    fn a_megabyte_of_one_letter_is_one_piece_in_linear_time() {
        let ours = Splitter::new(GPT2, GiveBack::LastSpace).unwrap();
        let text = "a".repeat(1 << 20);
        let started = std::time::Instant::now();
        assert_eq!(
            ours.matches(&text, &AtomicBool::new(false)).unwrap(),
            vec![(0, 1 << 20)]
        );
        // Linear: a few milliseconds; the backtracking engine took minutes.
        assert!(started.elapsed().as_secs() < 5);
    }
}
