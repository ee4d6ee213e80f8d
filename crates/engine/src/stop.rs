//! Stop strings matched on generated text, across token boundaries. Text that might be
//! the start of a stop string is held back until it is known not to be one.

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

/// Tracks one sequence's generated text against its stop strings.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    include_stop: bool,
    text: String,
    released: usize,
}

impl StopMatcher {
    /// A matcher for these stop strings (empty strings are ignored). With `include_stop`
    /// the matched stop string stays in the output.
    pub fn new(stops: Vec<String>, include_stop: bool) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        Self {
            stops,
            include_stop,
            text: String::new(),
            released: 0,
        }
    }

    /// Adds newly decoded text and says what can be sent on.
    pub fn push(&mut self, delta: &str) -> StopCheck {
        let old_len = self.text.len();
        self.text.push_str(delta);
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        // A new match must end inside the new text, so it starts at most `longest - 1`
        // bytes before it (and never before what was already released).
        let mut from = old_len
            .saturating_sub(longest.saturating_sub(1))
            .max(self.released);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|p| (from + p, s)))
            .min_by_key(|(pos, s)| (*pos, std::cmp::Reverse(s.len())));
        if let Some((pos, stop)) = found {
            let end = if self.include_stop {
                pos + stop.len()
            } else {
                pos
            };
            let release = self.text[self.released..end.max(self.released)].to_string();
            let matched = stop.clone();
            self.released = self.text.len();
            return StopCheck::Stopped { release, matched };
        }
        let held = self.partial_suffix_len();
        let end = self.text.len() - held;
        let release = self.text[self.released..end].to_string();
        self.released = end;
        StopCheck::Continue { release }
    }

    /// Adds text that may not end generation (before `min_tokens`): it is released at
    /// once, and a stop string can no longer match text before its end.
    pub fn push_unmatched(&mut self, delta: &str) -> String {
        self.text.push_str(delta);
        self.flush()
    }

    /// Releases everything held back (generation ended for another reason).
    pub fn flush(&mut self) -> String {
        let rest = self.text[self.released..].to_string();
        self.released = self.text.len();
        rest
    }

    /// Length of the longest unreleased suffix that is a proper prefix of a stop string.
    fn partial_suffix_len(&self) -> usize {
        let pending = &self.text[self.released..];
        let mut best = 0;
        for stop in &self.stops {
            for (i, _) in stop.char_indices().skip(1) {
                let prefix = &stop[..i];
                if i > best && pending.ends_with(prefix) {
                    best = i;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released(c: &StopCheck) -> &str {
        match c {
            StopCheck::Continue { release } | StopCheck::Stopped { release, .. } => release,
        }
    }

    #[test]
    fn matches_across_pieces_and_holds_back_prefixes() {
        let mut m = StopMatcher::new(vec!["END".into()], false);
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
        let mut m = StopMatcher::new(vec!["END".into()], false);
        assert_eq!(released(&m.push("E")), "");
        assert_eq!(released(&m.push("x")), "Ex");
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn earliest_stop_wins_and_can_be_kept() {
        let mut m = StopMatcher::new(vec!["b".into(), "a".into()], true);
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
        let mut m = StopMatcher::new(vec!["ab".into()], false);
        assert_eq!(m.push_unmatched("xa"), "xa");
        // "a" + "b" would straddle the boundary: it is not a match.
        assert_eq!(released(&m.push("b")), "b");
        assert!(matches!(m.push("ab"), StopCheck::Stopped { .. }));
    }

    #[test]
    fn include_stop_keeps_the_matched_string() {
        let mut m = StopMatcher::new(vec!["END".into()], true);
        match m.push("done END more") {
            StopCheck::Stopped { release, matched } => {
                assert_eq!((release.as_str(), matched.as_str()), ("done END", "END"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn flush_releases_held_text() {
        let mut m = StopMatcher::new(vec!["\n\n".into()], false);
        assert_eq!(released(&m.push("line\n")), "line");
        assert_eq!(m.flush(), "\n");
    }

    #[test]
    fn multibyte_text_is_safe() {
        let mut m = StopMatcher::new(vec!["éé".into()], false);
        assert_eq!(released(&m.push("aé")), "a");
        assert!(matches!(m.push("é"), StopCheck::Stopped { .. }));
    }
}
