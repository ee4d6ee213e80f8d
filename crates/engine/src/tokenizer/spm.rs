//! SentencePiece (`tokenizer.ggml.model = "llama"`): spaces become `▁`, then adjacent
//! symbols are merged greedily by vocabulary score; characters outside the vocabulary
//! fall back to `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{self, AtomicBool};

use super::{Cancelled, TokenId, MERGES_PER_CHECK};

/// SentencePiece state: the score of every token.
#[derive(Debug)]
pub(super) struct Spm {
    scores: Vec<f32>,
    add_space_prefix: bool,
}

/// A symbol of the word being merged: a byte range of the text and its neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of two adjacent symbols.
#[derive(Debug, PartialEq)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
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
    pub(super) fn new(scores: Vec<f32>, add_space_prefix: bool) -> Self {
        Self {
            scores,
            add_space_prefix,
        }
    }

    /// Whether encoding puts a space before text that starts the input or follows a
    /// special token (which decoding then takes away again).
    pub(super) fn adds_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// Appends the ids of `text` (no special tokens inside) to `out`, giving up once
    /// `cancelled` is set. `after_special` is
    /// true at the start of input and after a special token, where the model's space
    /// prefix (if it has one) is added.
    pub(super) fn encode(
        &self,
        text: &str,
        after_special: bool,
        vocab: &HashMap<String, TokenId>,
        cancelled: &AtomicBool,
        out: &mut Vec<TokenId>,
    ) -> Result<(), Cancelled> {
        let mut escaped = String::with_capacity(text.len() + 3);
        if self.add_space_prefix && after_special {
            escaped.push('▁');
        }
        for c in text.chars() {
            escaped.push(if c == ' ' { '▁' } else { c });
        }
        let text = escaped.as_str();
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }
        let mut queue = BinaryHeap::new();
        let try_add =
            |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: usize, right: usize| {
                let (l, r) = (symbols[left], symbols[right]);
                let piece = &text[l.start..r.start + r.len];
                if let Some(&id) = vocab.get(piece) {
                    queue.push(Bigram {
                        score: self.scores.get(id as usize).copied().unwrap_or(0.0),
                        left,
                        right,
                        len: piece.len(),
                    });
                }
            };
        for i in 1..symbols.len() {
            try_add(&mut queue, &symbols, i - 1, i);
        }
        let mut popped = 0usize;
        while let Some(bigram) = queue.pop() {
            popped += 1;
            if popped.is_multiple_of(MERGES_PER_CHECK) && cancelled.load(atomic::Ordering::Relaxed)
            {
                return Err(Cancelled);
            }
            let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
            // Skip pairs made stale by an earlier merge.
            if l.len == 0 || r.len == 0 || l.len + r.len != bigram.len {
                continue;
            }
            symbols[bigram.left].len += r.len;
            symbols[bigram.right].len = 0;
            symbols[bigram.left].next = r.next;
            if let Some(next) = r.next {
                symbols[next].prev = Some(bigram.left);
            }
            if let Some(prev) = symbols[bigram.left].prev {
                try_add(&mut queue, &symbols, prev, bigram.left);
            }
            if let Some(next) = symbols[bigram.left].next {
                try_add(&mut queue, &symbols, bigram.left, next);
            }
        }
        let mut i = if symbols.is_empty() { None } else { Some(0) };
        while let Some(idx) = i {
            let s = symbols[idx];
            let piece = &text[s.start..s.start + s.len];
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
            i = s.next;
        }
        Ok(())
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
    use super::*;

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
        let spm = Spm::new(vec![0.0, 0.0, 1.0, 0.0, 2.0, 0.0, 0.0], false);
        let mut out = Vec::new();
        spm.encode(" abé", true, &v, &AtomicBool::new(false), &mut out)
            .unwrap();
        assert_eq!(out, vec![4, 5, 6]);
    }

    #[test]
    fn byte_pieces_decode_to_bytes() {
        assert_eq!(piece_to_bytes("<0x0A>"), vec![b'\n']);
        assert_eq!(piece_to_bytes("▁the"), b" the".to_vec());
    }
}
