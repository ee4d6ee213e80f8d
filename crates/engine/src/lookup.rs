//! Prompt lookup: speculative decoding without a draft model. When the last few tokens of
//! a sequence (prompt and output together) occurred before, the tokens that followed them
//! then are a guess at what comes next. Extraction, summarisation, code editing and
//! quoting repeat their input this way. The guess is fed as draft tokens after the
//! sampled one and verified in the same forward step. Every row is computed with the
//! kernels of a token decoded alone and sampled in order, so the output is the one
//! decoding without drafts gives, token for token. A matrix's weights are read once for
//! all of a step's rows, so each accepted draft token saves most of a step.

use crate::tokenizer::TokenId;
/// Most draft tokens verified in one step, whatever drafted them (a prompt lookup, a
/// prediction or a grammar's forced tokens).
pub const MAX_DRAFT: usize = 8;

/// The configuration: how long a repeated run of tokens must be before it is trusted, and
/// how many tokens may be guessed in one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptLookup {
    /// Shortest repeated run (n-gram) taken as a match.
    pub min_ngram: usize,
    /// Longest repeated run looked for; a longer match is preferred over a more recent one.
    pub max_ngram: usize,
    /// Most tokens drafted in one step.
    pub max_draft: usize,
}

impl PromptLookup {
    /// Checks the configuration: `1 ≤ min_ngram ≤ max_ngram ≤` [`MAX_NGRAM`] and `1 ≤ max_draft ≤`
    /// [`MAX_DRAFT`].
    pub fn new(min_ngram: usize, max_ngram: usize, max_draft: usize) -> Result<Self, String> {
        if min_ngram == 0 || min_ngram > max_ngram || max_ngram > MAX_NGRAM {
            return Err(format!(
                "the n-gram sizes must satisfy 1 <= min <= max <= {MAX_NGRAM} (got min \
                 {min_ngram}, max {max_ngram})"
            ));
        }
        if max_draft == 0 || max_draft > MAX_DRAFT {
            return Err(format!(
                "prompt lookup drafts 1 to {MAX_DRAFT} tokens per step (got {max_draft})"
            ));
        }
        Ok(Self {
            min_ngram,
            max_ngram,
            max_draft,
        })
    }
}

/// Longest repeated run that may be looked for: it bounds the work per position of
/// [`find`].
pub const MAX_NGRAM: usize = 16;

/// Earlier occurrences of the matched suffix whose continuations a draft must agree with.
pub const COMPARED: usize = 4;

/// The tokens that followed the most recent earlier occurrence of the longest suffix of
/// `tokens` (between `min_ngram` and `max_ngram` tokens long) that occurred before, at most
/// `len` of them, and only as far as the continuations of the other occurrences of that
/// suffix (the [`COMPARED`] most recent in all) agree with it, its first token always
/// kept; empty when there is none.
///
/// Where the suffix was followed by different tokens before (an item's number, a value
/// that changes from line to line), the tokens after the first disagreement are a guess
/// that usually fails, and each costs the step a row. On Gemma 3 270M extracting dated
/// sentences from a report, cutting drafts there raised prompt lookup's speed-up (see
/// BENCHMARKS-history.md) and left copying and code editing as they were.
///
/// One backward pass over `tokens`: each position is compared with the suffix for at most
/// `max_ngram` tokens (16 at most: a 128k-token sequence takes about 2 M comparisons), so
/// the work is linear in the sequence's length, and it stops once it has [`COMPARED`]
/// matches of the longest size.
pub fn find<'a>(tokens: &'a [TokenId], config: &PromptLookup, len: usize) -> &'a [TokenId] {
    let n = tokens.len();
    let max_ngram = config.max_ngram.min(MAX_NGRAM);
    if n < config.min_ngram + 1 || len == 0 {
        return &[];
    }
    let last = tokens[n - 1];
    // The best match length so far, and the ends of its earlier runs, most recent first.
    let (mut best, mut ends, mut found) = (0, [0; COMPARED], 0);
    // `end` is the last token of a candidate earlier run; it must leave a token after it.
    for end in (0..n - 1).rev() {
        if tokens[end] != last {
            continue;
        }
        let longest = max_ngram.min(end + 1);
        let mut m = 1;
        while m < longest && tokens[end - m] == tokens[n - 1 - m] {
            m += 1;
        }
        if m < config.min_ngram || m < best {
            continue;
        }
        if m > best {
            (best, found) = (m, 0);
        }
        if found < COMPARED {
            ends[found] = end;
            found += 1;
        }
        if m == max_ngram && found == COMPARED {
            break;
        }
    }
    if found == 0 {
        return &[];
    }
    let from = ends[0] + 1;
    let draft = &tokens[from..(from + len).min(n)];
    // The first position where another occurrence was followed by something else.
    let differs = |i: usize| {
        ends[1..found]
            .iter()
            .any(|&e| tokens.get(e + 1 + i).is_some_and(|&t| t != draft[i]))
    };
    let agreed = (0..draft.len())
        .find(|&i| differs(i))
        .unwrap_or(draft.len());
    &draft[..agreed.max(1)]
}

/// How many tokens one sequence drafts next, adapted to how its drafts fared: doubled
/// after a draft accepted whole, halved after one rejected at its first token. A sequence
/// whose output stops repeating its input soon drafts one token at a time, which costs a
/// step little; one that keeps repeating soon drafts the most allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftLength {
    now: usize,
    max: usize,
}

impl DraftLength {
    /// Starts at half the most allowed.
    pub fn new(max: usize) -> Self {
        Self {
            now: max.div_ceil(2).max(1),
            max: max.max(1),
        }
    }

    /// Tokens to draft next.
    pub fn get(self) -> usize {
        self.now
    }

    /// Records that `accepted` of `fed` drafted tokens were accepted.
    pub fn record(&mut self, fed: usize, accepted: usize) {
        if fed == 0 {
            return;
        }
        if accepted >= fed {
            self.now = (self.now * 2).min(self.max);
        } else if accepted == 0 {
            self.now = (self.now / 2).max(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(min: usize, max: usize, draft: usize) -> PromptLookup {
        PromptLookup::new(min, max, draft).unwrap()
    }

    #[test]
    fn continues_the_earlier_occurrence_of_the_suffix() {
        // "... 1 2 3 [4 5 6] ... 1 2 3" → 4 5 6.
        let t = [9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3];
        assert_eq!(find(&t, &config(2, 4, 3), 3), &[4, 5, 6]);
        assert_eq!(find(&t, &config(2, 4, 8), 8), &[4, 5, 6, 7, 8, 1, 2, 3]);
    }

    #[test]
    fn prefers_the_longer_match_to_the_more_recent_one() {
        // The suffix `5 1 2` occurs once (followed by 30); `1 2` alone later (followed by
        // 40).
        let t = [5, 1, 2, 30, 7, 1, 2, 40, 9, 5, 1, 2];
        assert_eq!(find(&t, &config(2, 3, 1), 1), &[30]);
        // With runs of two at most, the more recent wins.
        assert_eq!(find(&t, &config(2, 2, 1), 1), &[40]);
    }

    #[test]
    fn needs_the_minimum_run() {
        let t = [1, 2, 3, 4, 9, 4];
        assert_eq!(find(&t, &config(1, 3, 2), 2), &[9, 4]);
        assert!(find(&t, &config(2, 3, 2), 2).is_empty());
        assert!(find(&[4], &config(1, 3, 2), 2).is_empty());
        assert!(find(&[], &config(1, 3, 2), 2).is_empty());
    }

    #[test]
    fn a_run_of_one_token_repeated_drafts_more_of_it() {
        let t = [7, 7, 7, 7];
        assert_eq!(find(&t, &config(2, 4, 8), 8), &[7]);
        assert_eq!(find(&t, &config(2, 2, 8), 8), &[7]);
    }

    #[test]
    fn the_draft_is_cut_at_the_sequence_end_and_the_length_asked() {
        let t = [1, 2, 3, 1, 2];
        assert_eq!(find(&t, &config(2, 4, 8), 8), &[3, 1, 2]);
        assert_eq!(find(&t, &config(2, 4, 8), 1), &[3]);
        assert!(find(&t, &config(2, 4, 8), 0).is_empty());
    }

    #[test]
    fn a_long_sequence_is_searched_in_linear_time() {
        // The worst case: every position matches all but the first token of the longest
        // suffix looked for, so every one is compared 15 times and none ends the search.
        let mut t = vec![1u32; 200_000];
        t.push(2);
        t.extend([1; 15]);
        let started = std::time::Instant::now();
        // (The runs of fifteen ones before the last were followed by a one, not a two.)
        assert_eq!(find(&t, &config(2, 16, 8), 2), &[2]);
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn configuration_is_checked() {
        assert!(PromptLookup::new(0, 3, 4).is_err());
        assert!(PromptLookup::new(4, 3, 4).is_err());
        assert!(PromptLookup::new(2, MAX_NGRAM + 1, 4).is_err());
        assert!(PromptLookup::new(2, 3, 0).is_err());
        assert!(PromptLookup::new(2, 3, MAX_DRAFT + 1).is_err());
        assert!(PromptLookup::new(1, MAX_NGRAM, MAX_DRAFT).is_ok());
    }

    /// The definition, written the slow way: for each size from the longest down, the
    /// earlier occurrences of the suffix of that size, the most recent's continuation kept
    /// while the next [`COMPARED`] - 1 occurrences' agree with it (its first token always).
    fn reference(tokens: &[TokenId], config: &PromptLookup, len: usize) -> Vec<TokenId> {
        let n = tokens.len();
        for size in (config.min_ngram..=config.max_ngram).rev() {
            if size >= n || len == 0 {
                continue;
            }
            let suffix = &tokens[n - size..];
            // An occurrence ending at `end` must leave a token after it.
            let ends: Vec<usize> = (size - 1..n - 1)
                .rev()
                .filter(|&end| &tokens[end + 1 - size..=end] == suffix)
                .take(COMPARED)
                .collect();
            let Some(&first) = ends.first() else {
                continue;
            };
            // Whether every occurrence was followed by `t` at `i` (or by nothing yet).
            let agree = |i: usize, t: TokenId| {
                ends.iter()
                    .all(|&e| tokens.get(e + 1 + i).is_none_or(|&u| u == t))
            };
            let mut draft = vec![tokens[first + 1]];
            if !agree(0, draft[0]) {
                return draft;
            }
            for i in 1..len {
                match tokens.get(first + 1 + i) {
                    Some(&t) if agree(i, t) => draft.push(t),
                    _ => break,
                }
            }
            return draft;
        }
        Vec::new()
    }

    #[test]
    fn a_draft_stops_where_earlier_continuations_disagree() {
        // `1 2` was followed by `3 4 5` and by `3 4 6`: the draft stops before the `5`.
        let t = [1, 2, 3, 4, 6, 0, 1, 2, 3, 4, 5, 0, 1, 2];
        assert_eq!(find(&t, &config(2, 2, 8), 8), &[3, 4]);
        // Followed by `7` and by `3`: only the most recent's first token.
        let t = [1, 2, 7, 4, 0, 1, 2, 3, 4, 0, 1, 2];
        assert_eq!(find(&t, &config(2, 2, 8), 8), &[3]);
        // A longer match is unique: its whole continuation.
        let t = [9, 1, 2, 7, 8, 0, 5, 1, 2, 3, 4, 0, 9, 1, 2];
        assert_eq!(find(&t, &config(2, 3, 8), 3), &[7, 8, 0]);
    }

    proptest::proptest! {
        #[test]
        fn matches_the_definition(
            tokens in proptest::collection::vec(0u32..4, 0..60),
            min in 1usize..4,
            extra in 0usize..4,
            len in 0usize..10,
        ) {
            let config = config(min, min + extra, 8);
            proptest::prop_assert_eq!(find(&tokens, &config, len), &reference(&tokens, &config, len)[..]);
        }
    }

    #[test]
    fn draft_length_adapts() {
        let mut d = DraftLength::new(8);
        assert_eq!(d.get(), 4);
        d.record(4, 4);
        assert_eq!(d.get(), 8);
        d.record(8, 8);
        assert_eq!(d.get(), 8);
        d.record(8, 3);
        assert_eq!(d.get(), 8);
        for _ in 0..5 {
            d.record(d.get(), 0);
        }
        assert_eq!(d.get(), 1);
        d.record(0, 0);
        assert_eq!(d.get(), 1);
    }
}
