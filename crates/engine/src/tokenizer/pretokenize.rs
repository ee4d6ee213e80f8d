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

use regex::Regex;

use crate::EngineError;

/// One pre-tokenizer regex.
#[derive(Debug)]
pub(super) struct Splitter {
    regex: Regex,
    /// Whether the original pattern's whitespace alternatives were `\s+(?!\S)|\s+`.
    gives_back_last_space: bool,
}

/// The GPT-2 pre-tokenizer pattern with its final `\s+(?!\S)|\s+` written as `\s+`.
pub(super) const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+";

impl Splitter {
    /// A splitter for `pattern`; `gives_back_last_space` applies `\s+(?!\S)` as above.
    pub(super) fn new(pattern: &str, gives_back_last_space: bool) -> Result<Self, EngineError> {
        let regex = Regex::new(pattern).map_err(|e| EngineError::InvalidModel(e.to_string()))?;
        Ok(Self {
            regex,
            gives_back_last_space,
        })
    }

    /// The byte ranges the pattern matches in `text`, in order, never empty.
    pub(super) fn matches(&self, text: &str) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let Some(m) = self.regex.find_at(text, at) else {
                break;
            };
            let (start, mut end) = (m.start(), m.end());
            if end == start {
                // An empty match: step over one character.
                at = end + text[end..].chars().next().map_or(1, char::len_utf8);
                continue;
            }
            if self.gives_back_last_space && end < text.len() {
                let mut chars = m.as_str().chars();
                let last = chars.next_back().expect("a match is not empty");
                if chars.clone().next().is_some() && m.as_str().chars().all(char::is_whitespace) {
                    end -= last.len_utf8();
                }
            }
            out.push((start, end));
            at = end;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const GPT2_ORIGINAL: &str =
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

    #[test]
    fn splits_exactly_like_the_look_ahead_pattern() {
        let original = fancy_regex::Regex::new(GPT2_ORIGINAL).unwrap();
        let ours = Splitter::new(GPT2, true).unwrap();
        let alphabet = [
            "a", "Z", "é", "字", "1", "٣", " ", "  ", "\n", "\t", "\u{a0}", "\u{3000}", "'", "'s",
            "'ll", "!", "-", "😀", "\r\n",
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
            assert_eq!(ours.matches(&text), want, "{text:?}");
        }
    }

    #[test]
    fn a_megabyte_of_one_letter_is_one_piece_in_linear_time() {
        let ours = Splitter::new(GPT2, true).unwrap();
        let text = "a".repeat(1 << 20);
        let started = std::time::Instant::now();
        assert_eq!(ours.matches(&text), vec![(0, 1 << 20)]);
        // Linear: a few milliseconds; the backtracking engine took minutes.
        assert!(started.elapsed().as_secs() < 5);
    }
}
