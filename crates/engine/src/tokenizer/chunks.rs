//! Long runs of text cut into chunks that merge on their own, so that a merge's working
//! memory (tens of bytes per character) is bounded by the chunk, not by the prompt.
//!
//! Merging joins adjacent symbols into a vocabulary entry. Between two characters that no
//! vocabulary entry holds side by side, no merge can ever join: the text on either side
//! merges exactly as it would in one piece, and the cut changes no token. Text is cut at the
//! first such place past [`MIN_CHUNK`] bytes. A run of [`MAX_CHUNK`] bytes with no such
//! place (every neighbouring pair of its characters occurs in some entry: a megabyte of one
//! letter) is cut there anyway; only there can the tokens differ from llama.cpp's, which
//! merges the whole run at once.

/// Bytes a chunk holds at least before a cut is looked for.
pub(super) const MIN_CHUNK: usize = 1 << 10;

/// Bytes after which a chunk is cut even where a merge could join across the cut.
pub(super) const MAX_CHUNK: usize = 256 << 10;

/// No neighbour, in the linked list of a chunk's symbols that a merge walks: a chunk is at
/// most [`MAX_CHUNK`] bytes, so a `u32` holds every index and this one is never one.
pub(super) const NONE: u32 = u32::MAX;

/// The pairs of characters that stand side by side in some vocabulary entry.
#[derive(Debug)]
pub(super) struct Joins {
    /// `(first << 32) | second`, sorted, distinct.
    pairs: Vec<u64>,
    /// [`MIN_CHUNK`] and [`MAX_CHUNK`]; tests set both past any text to merge whole texts.
    min_chunk: usize,
    max_chunk: usize,
}

impl Joins {
    /// The neighbouring character pairs of `pieces`.
    pub(super) fn new<'a>(pieces: impl IntoIterator<Item = &'a str>) -> Self {
        let mut pairs: Vec<u64> = pieces
            .into_iter()
            .flat_map(|piece| {
                piece
                    .chars()
                    .zip(piece.chars().skip(1))
                    .map(|(a, b)| key(a, b))
            })
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        pairs.shrink_to_fit();
        Self {
            pairs,
            min_chunk: MIN_CHUNK,
            max_chunk: MAX_CHUNK,
        }
    }

    /// Never cut: every text merges whole, as in llama.cpp (the reference of the tests).
    #[cfg(test)]
    pub(super) fn never_cut(&mut self) {
        (self.min_chunk, self.max_chunk) = (usize::MAX, usize::MAX);
    }

    /// Whether a merge could join `a` to the `b` after it.
    pub(super) fn joinable(&self, a: char, b: char) -> bool {
        self.pairs.binary_search(&key(a, b)).is_ok()
    }

    /// The byte offset that ends the next chunk of a text `len` bytes long, whose
    /// characters (as the vocabulary spells them) `chars` yields with their offsets: the
    /// whole text when it is short, else the first offset past [`MIN_CHUNK`] between two
    /// characters no merge can join, else [`MAX_CHUNK`] (or the first character boundary
    /// after it).
    pub(super) fn chunk_end(
        &self,
        len: usize,
        chars: impl Iterator<Item = (usize, char)>,
    ) -> usize {
        if len <= self.min_chunk {
            return len;
        }
        let mut before: Option<char> = None;
        for (at, c) in chars {
            if at >= self.max_chunk {
                return at;
            }
            if at >= self.min_chunk {
                if let Some(a) = before {
                    if !self.joinable(a, c) {
                        return at;
                    }
                }
            }
            before = Some(c);
        }
        len
    }
}

fn key(a: char, b: char) -> u64 {
    (u64::from(a) << 32) | u64::from(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_only_where_no_entry_joins_or_past_the_maximum() {
        let joins = Joins::new(["ab", "bb", "▁x"]);
        assert!(joins.joinable('a', 'b') && joins.joinable('▁', 'x'));
        assert!(!joins.joinable('b', 'a'));
        let short = "ab".repeat(10);
        assert_eq!(
            joins.chunk_end(short.len(), short.char_indices()),
            short.len()
        );
        // "abab…": a cut between "b" and "a", the first one past the minimum.
        let text = "ab".repeat(MIN_CHUNK);
        let end = joins.chunk_end(text.len(), text.char_indices());
        assert_eq!(end, MIN_CHUNK);
        assert!(!joins.joinable(
            text[..end].chars().last().unwrap(),
            text[end..].chars().next().unwrap()
        ));
        // One letter all along: cut at the maximum.
        let run = "b".repeat(MAX_CHUNK + 10);
        assert_eq!(joins.chunk_end(run.len(), run.char_indices()), MAX_CHUNK);
        // A multi-byte character is never split.
        let wide = "é".repeat(MAX_CHUNK);
        let end = Joins::new(["éé"]).chunk_end(wide.len(), wide.char_indices());
        assert!(wide.is_char_boundary(end) && end >= MAX_CHUNK);
    }
}
