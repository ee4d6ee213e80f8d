//! Stop strings matched on generated text, across token boundaries. Text that might be
//! the start of a stop string is held back until it is known not to be one.

use std::cmp::Reverse;
use std::sync::Arc;

/// What the matcher decided after new text arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopCheck {
    /// No stop string yet: `release` is safe to send on.
    Continue {
        /// Text that can no longer be part of a stop string.
        release: String,
    },
    /// A stop string matched: `release` is the text before it; generation ends.
    Stopped {
        /// Text up to the stop string (and the stop string itself when it is kept).
        release: String,
        /// The stop string that matched.
        matched: String,
    },
}

/// A request's stop strings, compiled once and shared by all its choices: each string
/// with its Knuth-Morris-Pratt failure table, so that matching costs a few steps per new
/// byte whatever the strings' lengths.
#[derive(Debug, Clone, Default)]
pub struct StopStrings(Arc<[Pattern]>);

#[derive(Debug)]
struct Pattern {
    text: String,
    /// `fail[i]`: length of the longest proper prefix of `text[..=i]` that is also its
    /// suffix.
    fail: Vec<usize>,
}

impl Pattern {
    fn new(text: String) -> Self {
        let bytes = text.as_bytes();
        let mut fail = vec![0; bytes.len()];
        let mut k = 0;
        for i in 1..bytes.len() {
            while k > 0 && bytes[i] != bytes[k] {
                k = fail[k - 1];
            }
            if bytes[i] == bytes[k] {
                k += 1;
            }
            fail[i] = k;
        }
        Self { text, fail }
    }

    /// The matched length after `byte`, from the matched length `state`.
    fn step(&self, mut state: usize, byte: u8) -> usize {
        let bytes = self.text.as_bytes();
        if state == bytes.len() {
            state = self.fail[state - 1];
        }
        while state > 0 && bytes[state] != byte {
            state = self.fail[state - 1];
        }
        if bytes[state] == byte {
            state += 1;
        }
        state
    }
}

impl StopStrings {
    /// Compiles stop strings (empty ones are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        Self(
            stops
                .into_iter()
                .filter(|s| !s.is_empty())
                .map(Pattern::new)
                .collect(),
        )
    }
}

/// Tracks one sequence's generated text against its stop strings.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: StopStrings,
    include_stop: bool,
    /// For each stop string, how many of its first bytes the text ends with.
    states: Vec<usize>,
    /// Text not yet released: at most the longest stop string's length.
    held: String,
}

impl StopMatcher {
    /// A matcher for these stop strings. With `include_stop` the matched stop string
    /// stays in the output.
    pub fn new(stops: StopStrings, include_stop: bool) -> Self {
        Self {
            states: vec![0; stops.0.len()],
            stops,
            include_stop,
            held: String::new(),
        }
    }

    /// Adds newly decoded text and says what can be sent on. Costs a few steps per byte
    /// of `delta` and stop string.
    pub fn push(&mut self, delta: &str) -> StopCheck {
        let base = self.held.len();
        self.held.push_str(delta);
        // The matches that end inside the new text: the one that starts first wins, the
        // longest among those.
        let mut found: Option<(usize, Reverse<usize>, usize)> = None;
        for (s, pattern) in self.stops.0.iter().enumerate() {
            let len = pattern.text.len();
            let mut state = self.states[s];
            for (i, &byte) in delta.as_bytes().iter().enumerate() {
                state = pattern.step(state, byte);
                if state == len {
                    let candidate = (base + i + 1 - len, Reverse(len), s);
                    found = Some(found.map_or(candidate, |best| best.min(candidate)));
                    break;
                }
            }
            self.states[s] = state;
        }
        if let Some((start, _, s)) = found {
            let matched = self.stops.0[s].text.clone();
            let end = if self.include_stop {
                start + matched.len()
            } else {
                start
            };
            let release = self.held[..end].to_string();
            self.held.clear();
            return StopCheck::Stopped { release, matched };
        }
        // Keep back the longest end of the text that may still begin a stop string.
        let keep = self.states.iter().copied().max().unwrap_or(0);
        let release: String = self.held.drain(..self.held.len() - keep).collect();
        StopCheck::Continue { release }
    }

    /// Adds text that may not end generation (before `min_tokens`): it is released at
    /// once, and a stop string can no longer match text before its end.
    pub fn push_unmatched(&mut self, delta: &str) -> String {
        self.held.push_str(delta);
        self.flush()
    }

    /// Releases everything held back (generation ended for another reason).
    pub fn flush(&mut self) -> String {
        self.states.iter_mut().for_each(|s| *s = 0);
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn released(c: &StopCheck) -> &str {
        match c {
            StopCheck::Continue { release } | StopCheck::Stopped { release, .. } => release,
        }
    }

    #[test]
    fn matches_across_pieces_and_holds_back_prefixes() {
        let mut m = StopMatcher::new(StopStrings::new(vec!["END".into()]), false);
        assert_eq!(released(&m.push("hello E")), "hello ");
        assert_eq!(released(&m.push("N")), "");
        let done = m.push("D and more");
        assert_eq!(
            done,
            StopCheck::Stopped {
                release: String::new(),
                matched: "END".into()
            }
        );
    }

    #[test]
    fn a_false_start_is_released() {
        let mut m = StopMatcher::new(StopStrings::new(vec!["END".into()]), false);
        assert_eq!(released(&m.push("E")), "");
        assert_eq!(released(&m.push("x")), "Ex");
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn earliest_stop_wins_and_can_be_kept() {
        let mut m = StopMatcher::new(StopStrings::new(vec!["b".into(), "a".into()]), true);
        assert_eq!(
            m.push("xxab"),
            StopCheck::Stopped {
                release: "xxa".into(),
                matched: "a".into()
            }
        );
    }

    #[test]
    fn unmatched_text_is_released_and_never_matched_later() {
        let mut m = StopMatcher::new(StopStrings::new(vec!["ab".into()]), false);
        assert_eq!(m.push_unmatched("xa"), "xa");
        // "a" + "b" would straddle the boundary: it is not a match.
        assert_eq!(released(&m.push("b")), "b");
        assert!(matches!(m.push("ab"), StopCheck::Stopped { .. }));
    }

    #[test]
    fn include_stop_keeps_the_matched_string() {
        let mut m = StopMatcher::new(StopStrings::new(vec!["END".into()]), true);
        match m.push("done END more") {
            StopCheck::Stopped { release, matched } => {
                assert_eq!((release.as_str(), matched.as_str()), ("done END", "END"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn flush_releases_held_text() {
        let mut m = StopMatcher::new(StopStrings::new(vec!["\n\n".into()]), false);
        assert_eq!(released(&m.push("line\n")), "line");
        assert_eq!(m.flush(), "\n");
    }

    #[test]
    fn byte_by_byte_the_first_stop_to_complete_wins() {
        let stops = ["aab", "ab", "bab", "bbb", "abba"];
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for round in 0..2000 {
            let text: String = (0..round % 30)
                .map(|_| if rng.random_bool(0.5) { 'a' } else { 'b' })
                .collect();
            // The reference: the first end at which some stop string ends, the longest
            // of those that end there.
            let first = (1..=text.len()).find_map(|end| {
                stops
                    .iter()
                    .filter(|s| text[..end].ends_with(*s))
                    .max_by_key(|s| s.len())
                    .map(|s| (end - s.len(), s.to_string()))
            });
            let mut m = StopMatcher::new(
                StopStrings::new(stops.iter().map(|s| s.to_string()).collect()),
                false,
            );
            let mut out = String::new();
            let mut matched = None;
            for c in text.chars() {
                match m.push(&c.to_string()) {
                    StopCheck::Continue { release } => out.push_str(&release),
                    StopCheck::Stopped {
                        release,
                        matched: s,
                    } => {
                        out.push_str(&release);
                        matched = Some(s);
                        break;
                    }
                }
            }
            match first {
                Some((start, s)) => {
                    assert_eq!((out.as_str(), matched), (&text[..start], Some(s)), "{text}");
                }
                None => {
                    out.push_str(&m.flush());
                    assert_eq!((out.as_str(), matched), (text.as_str(), None));
                }
            }
        }
    }

    #[test]
    fn multibyte_text_is_safe() {
        let mut m = StopMatcher::new(StopStrings::new(vec!["éé".into()]), false);
        assert_eq!(released(&m.push("aé")), "a");
        assert!(matches!(m.push("é"), StopCheck::Stopped { .. }));
    }
}
