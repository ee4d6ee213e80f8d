//! GPT-2 style byte-level BPE: regex pre-tokenization, bytes mapped to printable
//! characters, then merges applied in rank order within each pre-token.

use std::collections::HashMap;

use fancy_regex::Regex;

use super::TokenId;
use crate::EngineError;

/// The GPT-2 pre-tokenizer pattern, shared by most byte-level BPE vocabularies.
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Byte-level BPE state: merge ranks and the pre-tokenizer pipeline.
#[derive(Debug)]
pub(super) struct Bpe {
    /// `(left id, right id)` → `(rank, merged id)`.
    ranks: HashMap<(TokenId, TokenId), (usize, TokenId)>,
    /// Regexes applied one after another; each splits the pieces the previous one left.
    pre: Vec<Regex>,
    byte_to_char: [char; 256],
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
                ranks.entry((a, b)).or_insert((rank, merged));
            }
        }
        let patterns: Vec<&str> = match pre {
            // Digits are split one by one before the GPT-2 pattern runs.
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" => {
                vec![r"\p{N}", GPT2_PATTERN]
            }
            "gpt-2" | "gpt2" | "default" | "" | "mpt" | "olmo" | "jais" => vec![GPT2_PATTERN],
            other => {
                return Err(EngineError::Unsupported(format!(
                    "BPE pre-tokenizer `{other}` (supported: smollm, starcoder, gpt-2)"
                )))
            }
        };
        let pre = patterns
            .into_iter()
            .map(|p| Regex::new(p).map_err(|e| EngineError::InvalidModel(e.to_string())))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            ranks,
            pre,
            byte_to_char: byte_to_char_table(),
        })
    }

    /// Splits `text` with the pre-tokenizer regexes. Each regex splits every piece left by
    /// the one before it; both the matches and the text between them are kept.
    fn pre_tokenize<'a>(&self, text: &'a str) -> Vec<&'a str> {
        let mut pieces = vec![text];
        for re in &self.pre {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                let mut last = 0;
                for m in re.find_iter(piece).flatten() {
                    if m.start() > last {
                        next.push(&piece[last..m.start()]);
                    }
                    if m.end() > m.start() {
                        next.push(m.as_str());
                    }
                    last = m.end();
                }
                if last < piece.len() {
                    next.push(&piece[last..]);
                }
            }
            pieces = next;
        }
        pieces
    }

    /// Appends the ids of `text` (no special tokens inside) to `out`.
    pub(super) fn encode(
        &self,
        text: &str,
        vocab: &HashMap<String, TokenId>,
        out: &mut Vec<TokenId>,
    ) {
        for word in self.pre_tokenize(text) {
            // A byte-level vocabulary holds every single mapped byte; a byte it lacks is
            // dropped rather than guessed.
            let symbols: Vec<TokenId> = word
                .bytes()
                .filter_map(|b| {
                    vocab
                        .get(&self.byte_to_char[b as usize].to_string())
                        .copied()
                })
                .collect();
            out.extend(self.merge(symbols));
        }
    }

    /// Applies merges to a word's symbols, lowest rank first, leftmost on ties.
    fn merge(&self, mut symbols: Vec<TokenId>) -> Vec<TokenId> {
        loop {
            let mut best: Option<(usize, usize, TokenId)> = None;
            for i in 0..symbols.len().saturating_sub(1) {
                if let Some(&(rank, merged)) = self.ranks.get(&(symbols[i], symbols[i + 1])) {
                    if best.is_none_or(|(r, _, _)| rank < r) {
                        best = Some((rank, i, merged));
                    }
                }
            }
            let Some((_, i, merged)) = best else {
                return symbols;
            };
            symbols[i] = merged;
            symbols.remove(i + 1);
        }
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

    #[test]
    fn byte_map_round_trips() {
        let table = byte_to_char_table();
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(table[b as usize]), b);
        }
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
    }

    #[test]
    fn smollm_splits_digits_and_trailing_space() {
        let bpe = Bpe::new(&[], "smollm", &HashMap::new()).unwrap();
        assert_eq!(
            bpe.pre_tokenize("ab 12 c  d "),
            vec!["ab", " ", "1", "2", " c", " ", " d", " "]
        );
    }
}
