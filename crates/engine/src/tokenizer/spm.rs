//! SentencePiece (`tokenizer.ggml.model = "llama"`): spaces become `▁`, then adjacent
//! symbols are merged greedily by vocabulary score; characters outside the vocabulary
//! fall back to `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{self, AtomicBool};

use super::chunks::{Joins, NONE};
use super::{Cancelled, TokenId, MERGES_PER_CHECK};

/// SentencePiece state: the score of every token.
#[derive(Debug)]
pub(super) struct Spm {
    scores: Vec<f32>,
    add_space_prefix: bool,
    /// Where long texts may be cut without changing their tokens.
    joins: Joins,
}

/// A symbol of the chunk being merged: a byte range of the text and its neighbours
/// (indices into the chunk's symbols, [`NONE`] at either end). A chunk is at most
/// [`MAX_CHUNK`](super::chunks::MAX_CHUNK) bytes, so `u32` holds every index: 16 bytes a
/// symbol.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

/// A candidate merge of two adjacent symbols.
#[derive(Debug, PartialEq)]
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    len: u32,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    /// Highest score first; on ties the leftmost pair first.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Spm {
    /// SentencePiece over a vocabulary of `pieces` with their `scores`.
    pub(super) fn new(scores: Vec<f32>, add_space_prefix: bool, pieces: &[String]) -> Self {
        Self {
            scores,
            add_space_prefix,
            joins: Joins::new(pieces.iter().map(String::as_str)),
        }
    }

    /// Merges every text whole (the tests' reference).
    #[cfg(test)]
    pub(super) fn never_cut(&mut self) {
        self.joins.never_cut();
    }

    /// Whether encoding puts a space before text that starts the input or follows a
    /// special token (which decoding then takes away again).
    pub(super) fn adds_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// Appends the ids of `text` (no special tokens inside) to `out`, giving up once
    /// `cancelled` is set. `after_special` is true at the start of input and after a
    /// special token, where the model's space prefix (if it has one) is added. llama.cpp
    /// merges the whole text at once; here it is merged a chunk at a time, cut where no
    /// merge can join ([`Joins::chunk_end`]), which gives the same tokens.
    pub(super) fn encode(
        &self,
        text: &str,
        after_special: bool,
        vocab: &HashMap<String, TokenId>,
        cancelled: &AtomicBool,
        out: &mut Vec<TokenId>,
    ) -> Result<(), Cancelled> {
        let mut prefix = self.add_space_prefix && after_special;
        let mut rest = text;
        while !rest.is_empty() || prefix {
            let chars = rest.char_indices().map(|(i, c)| (i, escaped(c)));
            let (chunk, tail) = rest.split_at(self.joins.chunk_end(rest.len(), chars));
            self.encode_chunk(chunk, prefix, vocab, cancelled, out)?;
            prefix = false;
            rest = tail;
        }
        Ok(())
    }

    /// Merges one chunk (with `▁` before it when `prefix`) and appends its ids.
    fn encode_chunk(
        &self,
        chunk: &str,
        prefix: bool,
        vocab: &HashMap<String, TokenId>,
        cancelled: &AtomicBool,
        out: &mut Vec<TokenId>,
    ) -> Result<(), Cancelled> {
        let mut text = String::with_capacity(chunk.len() + 3);
        if prefix {
            text.push('▁');
        }
        text.extend(chunk.chars().map(escaped));
        let text = text.as_str();
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            let i = i as u32;
            symbols.push(Symbol {
                start: start as u32,
                len: c.len_utf8() as u32,
                prev: i.checked_sub(1).unwrap_or(NONE),
                next: NONE,
            });
            if i > 0 {
                symbols[i as usize - 1].next = i;
            }
        }
        let piece = |s: &Symbol, len: u32| &text[s.start as usize..(s.start + len) as usize];
        let mut queue = BinaryHeap::new();
        let try_add =
            |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: u32, right: u32| {
                let (l, r) = (symbols[left as usize], symbols[right as usize]);
                let len = r.start + r.len - l.start;
                if let Some(&id) = vocab.get(piece(&l, len)) {
                    queue.push(Bigram {
                        score: self.scores.get(id as usize).copied().unwrap_or(0.0),
                        left,
                        right,
                        len,
                    });
                }
            };
        for i in 1..symbols.len() as u32 {
            try_add(&mut queue, &symbols, i - 1, i);
        }
        let mut popped = 0usize;
        while let Some(bigram) = queue.pop() {
            popped += 1;
            if popped.is_multiple_of(MERGES_PER_CHECK) && cancelled.load(atomic::Ordering::Relaxed)
            {
                return Err(Cancelled);
            }
            let (left, right) = (bigram.left as usize, bigram.right as usize);
            let (l, r) = (symbols[left], symbols[right]);
            // Skip pairs made stale by an earlier merge.
            if l.len == 0 || r.len == 0 || l.len + r.len != bigram.len {
                continue;
            }
            symbols[left].len += r.len;
            symbols[right].len = 0;
            symbols[left].next = r.next;
            if r.next != NONE {
                symbols[r.next as usize].prev = bigram.left;
            }
            if l.prev != NONE {
                try_add(&mut queue, &symbols, l.prev, bigram.left);
            }
            if r.next != NONE {
                try_add(&mut queue, &symbols, bigram.left, r.next);
            }
        }
        let mut at = if symbols.is_empty() { NONE } else { 0 };
        while at != NONE {
            let s = symbols[at as usize];
            let piece = piece(&s, s.len);
            match vocab.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        if let Some(&id) = vocab.get(&format!("<0x{b:02X}>")) {
                            out.push(id);
                        }
                    }
                }
            }
            at = s.next;
        }
        Ok(())
    }
}

/// A character as SentencePiece's vocabulary spells it: a space is `▁`.
fn escaped(c: char) -> char {
    if c == ' ' {
        '▁'
    } else {
        c
    }
}

/// The bytes a SentencePiece piece stands for: `▁` is a space, `<0xXX>` one byte.
pub(super) fn piece_to_bytes(piece: &str) -> Vec<u8> {
    if let Some(hex) = piece.strip_prefix("<0x").and_then(|p| p.strip_suffix('>')) {
        if hex.len() == 2 {
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                return vec![b];
            }
        }
    }
    piece.replace('▁', " ").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::super::chunks::MAX_CHUNK;
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn vocab(pieces: &[&str]) -> HashMap<String, TokenId> {
        pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (p.to_string(), i as TokenId))
            .collect()
    }

    #[test]
    fn merges_by_score_and_falls_back_to_bytes() {
        let v = vocab(&["a", "b", "ab", "▁", "▁ab", "<0xC3>", "<0xA9>"]);
        let pieces = ["a", "b", "ab", "▁", "▁ab", "<0xC3>", "<0xA9>"].map(String::from);
        let spm = Spm::new(vec![0.0, 0.0, 1.0, 0.0, 2.0, 0.0, 0.0], false, &pieces);
        let mut out = Vec::new();
        spm.encode(" abé", true, &v, &AtomicBool::new(false), &mut out)
            .unwrap();
        assert_eq!(out, vec![4, 5, 6]);
    }

    #[test]
    fn a_long_text_merged_in_chunks_gives_the_tokens_of_one_merge() {
        // "c" never follows "b" in an entry, nor a letter "▁": those are the cuts.
        let pieces = [
            "a", "b", "c", "▁", "ab", "ba", "abab", "ca", "cab", "▁a", "▁c", "aa", "▁▁",
        ]
        .map(String::from);
        let scores: Vec<f32> = (0..pieces.len()).map(|i| (i * 7 % 5) as f32).collect();
        let vocab: HashMap<String, TokenId> = (0..pieces.len())
            .map(|i| (pieces[i].clone(), i as TokenId))
            .collect();
        let spm = Spm::new(scores, true, &pieces);
        let never = AtomicBool::new(false);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let alphabets: [&[char]; 3] = [&['a', 'b', 'c', ' '], &['a', 'b'], &['a', 'c', 'é']];
        for (round, alphabet) in alphabets.iter().cycle().take(9).enumerate() {
            let len = [3000, 70_000, MAX_CHUNK + 5000][round % 3];
            let text: String = (0..len)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            let (mut chunked, mut whole) = (Vec::new(), Vec::new());
            spm.encode(&text, true, &vocab, &never, &mut chunked)
                .unwrap();
            spm.encode_chunk(&text, true, &vocab, &never, &mut whole)
                .unwrap();
            if alphabet.len() == 2 && len > MAX_CHUNK {
                // "abab…" has no place to cut: cut at the maximum, the tokens may differ
                // around the cut.
                assert!(chunked.len().abs_diff(whole.len()) <= 2);
            } else {
                assert!(chunked == whole, "round {round}");
            }
        }
    }

    #[test]
    fn byte_pieces_decode_to_bytes() {
        assert_eq!(piece_to_bytes("<0x0A>"), vec![b'\n']);
        assert_eq!(piece_to_bytes("▁the"), b" the".to_vec());
    }
}
