//! Prompt prefix cache: the keys and values of finished sequences, kept so that a new
//! sequence whose prompt starts the same way (a repeated system prompt, a conversation
//! re-sent with a new turn) starts from them instead of recomputing them. Entries are
//! evicted least recently used within a budget of cached positions.

use crate::kv_cache::{SequenceCache, BLOCK_POSITIONS};
use crate::tokenizer::TokenId;

/// One cached sequence.
struct Entry {
    /// The tokens whose keys and values `cache` holds.
    tokens: Vec<TokenId>,
    /// The prompt length of the sequence that computed them (how its rows were rounded).
    prompt_len: usize,
    cache: SequenceCache,
    last_used: u64,
}

/// The positions of memory a cache holds: its blocks'.
fn held(cache: &SequenceCache) -> usize {
    cache.blocks() * BLOCK_POSITIONS
}

/// A reusable start found for a new sequence.
pub(crate) struct PrefixHit {
    /// A copy of the cached keys and values, cut to the reusable positions.
    pub cache: SequenceCache,
    /// How many positions it holds.
    pub positions: usize,
}

/// Finished sequences' caches, least recently used first out.
pub(crate) struct PrefixCache {
    entries: Vec<Entry>,
    budget: usize,
    clock: u64,
}

impl PrefixCache {
    /// A cache holding at most `budget` positions in all (0 turns it off).
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            entries: Vec::new(),
            budget,
            clock: 0,
        }
    }

    /// Positions held: an entry's cache holds whole blocks, so an entry of 30 tokens
    /// holds a block's worth of memory, and that is what the budget counts.
    pub(crate) fn positions(&self) -> usize {
        self.entries.iter().map(|e| held(&e.cache)).sum()
    }

    /// Keeps a finished sequence's cache for `tokens` (those it holds).
    pub(crate) fn insert(&mut self, tokens: &[TokenId], prompt_len: usize, cache: SequenceCache) {
        let len = cache.len().min(tokens.len());
        if len == 0 || held(&cache) > self.budget {
            return;
        }
        let tokens = &tokens[..len];
        self.clock += 1;
        // An entry that this one extends adds nothing; one that extends it makes it
        // redundant.
        self.entries.retain(|e| !tokens.starts_with(&e.tokens));
        if self.entries.iter().any(|e| e.tokens.starts_with(tokens)) {
            return;
        }
        self.entries.push(Entry {
            tokens: tokens.to_vec(),
            prompt_len,
            cache,
            last_used: self.clock,
        });
        while self.positions() > self.budget {
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i)
                .expect("over budget means not empty");
            self.entries.swap_remove(oldest);
        }
    }

    /// The longest cached start of `prompt` that may be reused, at most `prompt.len() - 1`
    /// positions (the last prompt token must run to give the first logits), with room
    /// for `capacity` positions. `reusable(old_prompt_len, common)` says how many of the
    /// `common` positions shared with an entry are exactly what the new sequence would
    /// compute.
    pub(crate) fn lookup(
        &mut self,
        prompt: &[TokenId],
        capacity: usize,
        reusable: impl Fn(usize, usize) -> usize,
    ) -> Option<PrefixHit> {
        let limit = prompt.len().saturating_sub(1);
        let (best, positions) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let common = e
                    .tokens
                    .iter()
                    .zip(prompt)
                    .take(limit)
                    .take_while(|(a, b)| a == b)
                    .count();
                (i, reusable(e.prompt_len, common))
            })
            .max_by_key(|&(_, n)| n)?;
        if positions == 0 {
            return None;
        }
        self.clock += 1;
        let entry = &mut self.entries[best];
        entry.last_used = self.clock;
        Some(PrefixHit {
            cache: entry.cache.fork_prefix(positions, capacity),
            positions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(n: usize) -> SequenceCache {
        let mut c = SequenceCache::new(1, 2, n);
        let kv: Vec<f32> = (0..2 * n).map(|i| i as f32).collect();
        c.write(0, &kv, &kv);
        c.commit(n);
        c
    }

    fn all(_: usize, common: usize) -> usize {
        common
    }

    #[test]
    fn a_new_prompt_reuses_the_longest_shared_start() {
        let mut p = PrefixCache::new(4 * BLOCK_POSITIONS);
        p.insert(&[1, 2, 3, 4, 5], 3, cache(5));
        p.insert(&[1, 2, 9], 3, cache(3));
        let hit = p.lookup(&[1, 2, 3, 4, 7, 8], 10, all).unwrap();
        assert_eq!((hit.positions, hit.cache.len()), (4, 4));
        // The whole prompt is never reused: its last token must run.
        assert_eq!(p.lookup(&[1, 2, 3], 10, all).unwrap().positions, 2);
        assert!(p.lookup(&[7, 7], 10, all).is_none());
        // What the model says cannot be reused is not.
        assert_eq!(
            p.lookup(&[1, 2, 3, 4, 7], 10, |_, c| c.min(1))
                .unwrap()
                .positions,
            1
        );
    }

    /// `n` consecutive token ids from `first`.
    fn run(first: u32, n: usize) -> Vec<u32> {
        (first..first + n as u32).collect()
    }

    #[test]
    fn redundant_entries_go_and_the_budget_holds() {
        const B: usize = BLOCK_POSITIONS;
        // The budget counts whole blocks, the memory entries hold.
        let mut p = PrefixCache::new(5 * B);
        p.insert(&[1, 2], 2, cache(2));
        p.insert(&[1, 2, 3], 2, cache(3));
        assert_eq!(
            p.positions(),
            B,
            "the shorter entry is covered by the longer"
        );
        p.insert(&[1, 2], 2, cache(2));
        assert_eq!(p.positions(), B, "a covered entry is not added");
        let long = run(100, 2 * B + 1);
        p.insert(&long, 4, cache(long.len()));
        assert_eq!(p.positions(), 4 * B);
        p.lookup(&[1, 2, 3, 9], 10, all);
        let other = run(1000, B + 1);
        p.insert(&other, 3, cache(other.len()));
        // 1 + 3 + 2 blocks > 5: the least recently used (`long`) goes.
        assert_eq!(p.positions(), 3 * B);
        assert!(p.lookup(&[100, 101, 102, 0], 10, all).is_none());
        assert!(p.lookup(&[1, 2, 3, 0], 10, all).is_some());
        // An entry larger than the whole budget is never kept.
        let huge = run(5000, 5 * B + 1);
        p.insert(&huge, 3, cache(huge.len()));
        assert!(p.lookup(&[5000, 5001, 0], 10, all).is_none());
    }

    #[test]
    fn a_zero_budget_keeps_nothing() {
        let mut p = PrefixCache::new(0);
        p.insert(&[1, 2, 3], 3, cache(3));
        assert!(p.lookup(&[1, 2, 3, 4], 10, all).is_none());
    }
}
