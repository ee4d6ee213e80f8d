//! GPT-2 style byte-level BPE: regex pre-tokenization, bytes mapped to printable
//! characters, then merges applied in rank order within each pre-token.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{self, AtomicBool};

use super::chunks::{Joins, MAX_CHUNK, NONE};
use super::pretokenize::{GiveBack, Splitter, GPT2, LLAMA3, QWEN2, TEKKEN};
use super::{Cancelled, TokenId, MERGES_PER_CHECK};
use crate::error::EngineError;

/// Byte-level BPE state: merge ranks and the pre-tokenizer pipeline.
#[derive(Debug)]
pub(super) struct Bpe {
    /// `(left id, right id)` → `(rank, merged id)`.
    ranks: HashMap<(TokenId, TokenId), (u32, TokenId)>,
    /// Regexes applied one after another; each splits the pieces the previous one left.
    pre: Vec<Splitter>,
    byte_to_char: [char; 256],
    /// Whether a pre-token that is itself in the vocabulary becomes that one token without
    /// merging (llama.cpp's `ignore_merges`: Llama 3, Tekken).
    ignore_merges: bool,
    /// Where long words may be cut without changing their tokens.
    joins: Joins,
}

impl Bpe {
    /// Builds the merge table and the pre-tokenizer named by `tokenizer.ggml.pre`.
    pub(super) fn new(
        merges: &[String],
        pre: &str,
        vocab: &HashMap<String, TokenId>,
    ) -> Result<Self, EngineError> {
        let mut ranks = HashMap::with_capacity(merges.len());
        for (rank, merge) in merges.iter().enumerate() {
            let Some((a, b)) = merge.split_once(' ') else {
                return Err(EngineError::InvalidModel(format!(
                    "malformed BPE merge `{merge}`"
                )));
            };
            let ids = (vocab.get(a), vocab.get(b), vocab.get(&format!("{a}{b}")));
            if let (Some(&a), Some(&b), Some(&merged)) = ids {
                ranks.entry((a, b)).or_insert((rank as u32, merged));
            }
        }
        use GiveBack::{LastSpace, LastSpaceUnlessLineBreak as UnlessLineBreak, Never};
        // The patterns llama.cpp runs for each name (`llama-vocab.cpp`), and whether a
        // pre-token that is a whole vocabulary entry is taken as it is, merges or not.
        let (patterns, ignore_merges): (Vec<(&str, GiveBack)>, bool) = match pre {
            // Digits are split one by one before the GPT-2 pattern runs.
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" => {
                (vec![(r"\p{N}", Never), (GPT2, LastSpace)], false)
            }
            "gpt-2" | "gpt2" | "default" | "" | "mpt" | "olmo" | "jais" => {
                (vec![(GPT2, LastSpace)], false)
            }
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "midm-2.0" => {
                (vec![(LLAMA3, UnlessLineBreak)], true)
            }
            "qwen2" | "deepseek-r1-qwen" | "megrez" => (vec![(QWEN2, UnlessLineBreak)], false),
            "tekken" => (vec![(TEKKEN, UnlessLineBreak)], true),
            other => {
                return Err(EngineError::Unsupported(format!(
                    "BPE pre-tokenizer `{other}` (supported: gpt-2, smollm, starcoder, llama-bpe, qwen2, tekken)"
                )))
            }
        };
        let pre = patterns
            .into_iter()
            .map(|(pattern, give_back)| Splitter::new(pattern, give_back))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            ranks,
            pre,
            byte_to_char: byte_to_char_table(),
            ignore_merges,
            joins: Joins::new(vocab.keys().map(String::as_str)),
        })
    }

    /// Merges every word whole (the tests' reference).
    #[cfg(test)]
    pub(super) fn never_cut(&mut self) {
        self.joins.never_cut();
    }

    /// Calls `word` with each piece of `text` the pre-tokenizer regexes split, in order:
    /// each regex splits every piece the one before it left, keeping both the matches and
    /// the text between them. Pieces are handed on as they are found, never collected.
    /// Gives up once `cancelled` is set.
    fn for_each_word(
        &self,
        text: &str,
        cancelled: &AtomicBool,
        word: &mut dyn FnMut(&str) -> Result<(), Cancelled>,
    ) -> Result<(), Cancelled> {
        split(&self.pre, text, cancelled, word)
    }

    /// Appends the ids of `text` (no special tokens inside) to `out`; gives up between
    /// words once `cancelled` is set.
    pub(super) fn encode(
        &self,
        text: &str,
        vocab: &HashMap<String, TokenId>,
        cancelled: &AtomicBool,
        out: &mut Vec<TokenId>,
    ) -> Result<(), Cancelled> {
        self.for_each_word(text, cancelled, &mut |word| {
            if cancelled.load(atomic::Ordering::Relaxed) {
                return Err(Cancelled);
            }
            if self.ignore_merges && word.len() <= MAX_CHUNK {
                let mapped: String = word
                    .bytes()
                    .map(|b| self.byte_to_char[b as usize])
                    .collect();
                if let Some(&id) = vocab.get(&mapped) {
                    out.push(id);
                    return Ok(());
                }
            }
            // A long word merges a chunk at a time, cut where no merge joins.
            let mut rest = word.as_bytes();
            while !rest.is_empty() {
                let chars = rest
                    .iter()
                    .enumerate()
                    .map(|(i, &b)| (i, self.byte_to_char[b as usize]));
                let (chunk, tail) = rest.split_at(self.joins.chunk_end(rest.len(), chars));
                // A byte-level vocabulary holds every single mapped byte; a byte it lacks
                // is dropped rather than guessed.
                let symbols: Vec<TokenId> = chunk
                    .iter()
                    .filter_map(|&b| {
                        let mut utf8 = [0; 4];
                        let mapped = self.byte_to_char[b as usize].encode_utf8(&mut utf8);
                        vocab.get(&*mapped).copied()
                    })
                    .collect();
                out.extend(self.merge(symbols, cancelled)?);
                rest = tail;
            }
            Ok(())
        })
    }

    /// Applies merges to a word's symbols, lowest rank first, leftmost on ties, as
    /// llama.cpp does: candidate pairs wait in a priority queue over a linked list of
    /// symbols, so a word of `n` symbols costs `O(n log n)` rather than a rescan of the
    /// whole word after every merge (quadratic on a long run of one character).
    fn merge(&self, ids: Vec<TokenId>, cancelled: &AtomicBool) -> Result<Vec<TokenId>, Cancelled> {
        if ids.len() < 2 {
            return Ok(ids);
        }
        let n = ids.len() as u32;
        let mut symbols: Vec<Symbol> = (0..n)
            .map(|i| Symbol {
                id: ids[i as usize],
                prev: i.checked_sub(1).unwrap_or(NONE),
                next: if i + 1 < n { i + 1 } else { NONE },
            })
            .collect();
        drop(ids);
        let mut queue = BinaryHeap::new();
        let candidate = |symbols: &[Symbol], left: u32, right: u32| {
            let pair = (symbols[left as usize].id, symbols[right as usize].id);
            self.ranks.get(&pair).map(|&(rank, merged)| Candidate {
                rank,
                left,
                right,
                pair,
                merged,
            })
        };
        for i in 1..n {
            queue.extend(candidate(&symbols, i - 1, i));
        }
        let mut popped = 0usize;
        while let Some(c) = queue.pop() {
            popped += 1;
            if popped.is_multiple_of(MERGES_PER_CHECK) && cancelled.load(atomic::Ordering::Relaxed)
            {
                return Err(Cancelled);
            }
            let (l, r) = (symbols[c.left as usize], symbols[c.right as usize]);
            // A pair is stale once either side was merged into something else.
            if l.next != c.right || (l.id, r.id) != c.pair {
                continue;
            }
            symbols[c.left as usize].id = c.merged;
            symbols[c.left as usize].next = r.next;
            symbols[c.right as usize].prev = NONE;
            symbols[c.right as usize].next = NONE;
            if r.next != NONE {
                symbols[r.next as usize].prev = c.left;
                queue.extend(candidate(&symbols, c.left, r.next));
            }
            if l.prev != NONE {
                queue.extend(candidate(&symbols, l.prev, c.left));
            }
        }
        let mut out = Vec::new();
        let mut at = 0;
        while at != NONE {
            out.push(symbols[at as usize].id);
            at = symbols[at as usize].next;
        }
        Ok(out)
    }
}

/// Calls `word` with the pieces `splitters` cut `text` into (see [`Bpe::for_each_word`]).
fn split(
    splitters: &[Splitter],
    text: &str,
    cancelled: &AtomicBool,
    word: &mut dyn FnMut(&str) -> Result<(), Cancelled>,
) -> Result<(), Cancelled> {
    let Some((first, later)) = splitters.split_first() else {
        return word(text);
    };
    let mut last = 0;
    first.each_match(text, cancelled, &mut |start, end| {
        if start > last {
            split(later, &text[last..start], cancelled, word)?;
        }
        split(later, &text[start..end], cancelled, word)?;
        last = end;
        Ok(())
    })?;
    if last < text.len() {
        split(later, &text[last..], cancelled, word)?;
    }
    Ok(())
}

/// A symbol of the word being merged and its neighbours in the linked list.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    id: TokenId,
    /// Indices of the neighbours, [`NONE`] at either end (a chunk is at most
    /// [`MAX_CHUNK`] bytes: `u32` holds every index).
    prev: u32,
    next: u32,
}

/// A merge of two adjacent symbols that may apply.
#[derive(Debug, PartialEq, Eq)]
struct Candidate {
    rank: u32,
    left: u32,
    right: u32,
    /// The two ids it merges, to tell a stale candidate.
    pair: (TokenId, TokenId),
    merged: TokenId,
}

impl Ord for Candidate {
    /// The max-heap pops the lowest rank first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// GPT-2's reversible map from bytes to printable characters.
fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            b as char
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("valid code point")
        };
    }
    table
}

/// The bytes a byte-level BPE piece stands for.
pub(super) fn piece_to_bytes(piece: &str) -> Vec<u8> {
    piece.chars().map(char_to_byte).collect()
}

fn char_to_byte(c: char) -> u8 {
    let cp = c as u32;
    match cp {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => cp as u8,
        // The 68 non-printable bytes were given code points 256.. in byte order.
        256..=323 => {
            let k = (cp - 256) as usize;
            (0..=255u8)
                .filter(|b| !matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF))
                .nth(k)
                .unwrap_or(b'?')
        }
        _ => b'?',
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn byte_map_round_trips() {
        let table = byte_to_char_table();
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(table[b as usize]), b);
        }
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
    }

    /// The textbook algorithm: rescan every pair after each merge.
    fn naive_merge(bpe: &Bpe, mut symbols: Vec<TokenId>) -> Vec<TokenId> {
        loop {
            let best = (0..symbols.len().saturating_sub(1))
                .filter_map(|i| {
                    let &(rank, merged) = bpe.ranks.get(&(symbols[i], symbols[i + 1]))?;
                    Some((rank, i, merged))
                })
                .min();
            let Some((_, i, merged)) = best else {
                return symbols;
            };
            symbols[i] = merged;
            symbols.remove(i + 1);
        }
    }

    #[test]
    fn the_queue_merges_exactly_like_the_rescan() {
        // A vocabulary over "abc" whose merges overlap, chain and compete.
        let pieces = [
            "a", "b", "c", "ab", "bc", "ca", "aa", "abc", "aab", "bca", "aaaa", "abab", "cc",
        ];
        let vocab: HashMap<String, TokenId> = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (p.to_string(), i as TokenId))
            .collect();
        let merges: Vec<String> = [
            "a b", "b c", "a a", "c a", "aa aa", "ab c", "a ab", "ab ab", "bc a", "c c",
        ]
        .iter()
        .map(|m| m.to_string())
        .collect();
        let bpe = Bpe::new(&merges, "gpt2", &vocab).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for len in 0..200 {
            let word: Vec<TokenId> = (0..len).map(|_| rng.random_range(0..3)).collect();
            assert_eq!(
                bpe.merge(word.clone(), &AtomicBool::new(false)).unwrap(),
                naive_merge(&bpe, word.clone()),
                "{word:?}"
            );
        }
        let run = vec![0; 5000];
        let never = AtomicBool::new(false);
        assert_eq!(
            bpe.merge(run.clone(), &never).unwrap(),
            naive_merge(&bpe, run)
        );
    }

    #[test]
    fn a_long_word_merged_in_chunks_gives_the_tokens_of_one_merge() {
        // "c" never follows "b" in an entry: that is where a long word is cut.
        let pieces = ["a", "b", "c", "ab", "ca", "aa", "cab", "aaaa"];
        let vocab: HashMap<String, TokenId> = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (p.to_string(), i as TokenId))
            .collect();
        let merges: Vec<String> = ["a b", "c a", "a a", "ca b", "aa aa"]
            .iter()
            .map(|m| m.to_string())
            .collect();
        let bpe = Bpe::new(&merges, "gpt2", &vocab).unwrap();
        let never = AtomicBool::new(false);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for len in [100, 5000, MAX_CHUNK + 3000] {
            let word: String = (0..len)
                .map(|_| ['a', 'b', 'c'][rng.random_range(0..3)])
                .collect();
            let mut chunked = Vec::new();
            bpe.encode(&word, &vocab, &never, &mut chunked).unwrap();
            let symbols = word
                .bytes()
                .map(|b| vocab[&(b as char).to_string()])
                .collect();
            assert!(chunked == bpe.merge(symbols, &never).unwrap(), "{len}");
        }
    }

    #[test]
    fn smollm_splits_digits_and_trailing_space() {
        let bpe = Bpe::new(&[], "smollm", &HashMap::new()).unwrap();
        let mut words = Vec::new();
        bpe.for_each_word("ab 12 c  d ", &AtomicBool::new(false), &mut |w| {
            words.push(w.to_string());
            Ok(())
        })
        .unwrap();
        assert_eq!(words, ["ab", " ", "1", "2", " c", " ", " d", " "]);
    }
}
