//! llguidance's view of our tokenizer: every token's bytes in a trie (special tokens behind
//! the marker byte, so that text never spells them) and our own encoder.

use std::sync::Arc;

use toktrie::{TokRxInfo, TokTrie, TokenizerEnv};

use crate::tokenizer::{TokenId, TokenKind, Tokenizer};

/// Longest byte string tokenized with the model's own tokenizer for llguidance; longer
/// ones are spelled greedily from the trie.
const MAX_ENCODED_BYTES: usize = 4096;

/// Our tokenizer as a `toktrie::TokenizerEnv`.
pub(super) struct TokenizerEnvAdapter {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
}

impl TokenizerEnvAdapter {
    pub(super) fn new(tokenizer: Arc<Tokenizer>) -> Self {
        let n = tokenizer.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as TokenId)
            .map(|id| match tokenizer.kind(id) {
                Some(TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown) => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tokenizer.piece(id).unwrap_or_default().as_bytes());
                    w
                }
                _ => tokenizer.token_bytes(id, false),
            })
            .collect();
        let eos = tokenizer
            .eos()
            .or_else(|| tokenizer.end_of_generation().first().copied())
            .unwrap_or(0);
        let mut info = TokRxInfo::new(n as u32, eos);
        info.tok_bos = tokenizer.bos();
        let trie = TokTrie::from(&info, &words);
        Self { tokenizer, trie }
    }
}

impl TokenizerEnv for TokenizerEnvAdapter {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        if s.len() > MAX_ENCODED_BYTES {
            // A grammar that forces a long run of bytes (`a{100000}`) asks for them at
            // every mask: the trie's greedy spelling is linear and cheap, and valid.
            return self.trie.greedy_tokenize(s);
        }
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false),
            // Not text (a cut UTF-8 sequence): the longest tokens that spell the bytes.
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}
