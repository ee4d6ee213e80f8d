//! A choice's tokens on their way out: the legacy completions `logprobs` object
//! (`tokens`, `token_logprobs`, `top_logprobs`, a map per token, and `text_offset`) and
//! vLLM's `token_ids`, both handed out with the text the tokens decoded to.
//!
//! `text_offset[i]` is where token `i`'s text starts in the choice's `text`: the number of
//! characters the tokens before it decoded to (an echoed prompt's decoded pieces, a
//! generated token's text), never its spelling. A token is handed out once its text has
//! begun to come out (the text released so far reaches past its start), so a stream's
//! chunk carries the tokens its text came from; text held back for a possible stop string
//! keeps its tokens back with it. What is left at the end (text held back for a stop string
//! that then matched, never sent) points at the end of the text. So the offsets never go
//! backwards and never pass the end of the text, whatever BOS, special tokens left out of
//! the text, characters split across tokens or stop strings do, and a stream's offsets
//! are the non-streaming answer's.

use std::collections::VecDeque;

use ferrite_engine::tokenizer::{TokenId, Tokenizer};
use ferrite_engine::PromptLogprob;
use ferrite_protocol::RawJson;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

/// One token of a choice, as the ledger hands it out.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerToken {
    /// The token.
    pub id: TokenId,
    /// Whether it is a prompt token (echo), not a generated one.
    pub prompt: bool,
    /// Its log-probability (`None` for a prompt's first token, or when not computed).
    pub logprob: Option<f32>,
    /// The most likely tokens at its position (`None`: no map, as for a prompt's first).
    pub top: Option<Vec<(TokenId, f32)>>,
    /// Where its text starts in the choice's text, in characters.
    pub offset: usize,
    /// Characters it decoded to.
    chars: usize,
}

/// A choice's tokens in order, and how much of their text has come out.
#[derive(Debug, Default)]
pub struct TokenLedger {
    pending: VecDeque<LedgerToken>,
    /// Characters the tokens so far decoded to.
    decoded: usize,
    /// Characters of text released so far.
    released: usize,
}

impl TokenLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a token that decoded to `chars` characters.
    pub fn push(
        &mut self,
        id: TokenId,
        prompt: bool,
        logprob: Option<f32>,
        top: Option<Vec<(TokenId, f32)>>,
        chars: usize,
    ) {
        self.pending.push_back(LedgerToken {
            id,
            prompt,
            logprob,
            top,
            offset: self.decoded,
            chars,
        });
        self.decoded += chars;
    }

    /// Adds the prompt's tokens (echo) with their scores; `token_chars` are the characters
    /// each adds to the echoed text.
    pub fn push_prompt(&mut self, scores: &[PromptLogprob], token_chars: &[usize]) {
        for (i, s) in scores.iter().enumerate() {
            let top = s.logprob.map(|_| s.top.clone());
            let chars = token_chars.get(i).copied().unwrap_or(0);
            self.push(s.id, true, s.logprob, top, chars);
        }
    }

    /// Counts text before the tokens this ledger will see (an echo without scores).
    pub fn skip(&mut self, chars: usize) {
        self.decoded += chars;
        self.released += chars;
    }

    /// Records `chars` more characters of text sent to the client.
    pub fn release(&mut self, chars: usize) {
        self.released += chars;
    }

    /// The tokens whose text has begun to come out, in order (and those that add nothing
    /// where the text has come to).
    pub fn take_ready(&mut self) -> Vec<LedgerToken> {
        let mut ready = Vec::new();
        while let Some(t) = self.pending.front() {
            let started = t.offset < self.released || (t.offset == self.released && t.chars == 0);
            if !started {
                break;
            }
            ready.extend(self.pending.pop_front());
        }
        ready
    }

    /// Every token left, at the end of the choice: those whose text never came out point
    /// at the end of the text.
    pub fn take_all(&mut self) -> Vec<LedgerToken> {
        let released = self.released;
        self.pending
            .drain(..)
            .map(|mut t| {
                t.offset = t.offset.min(released);
                t
            })
            .collect()
    }
}

/// The legacy `logprobs` object of `tokens`, each with `alternatives` alternatives at
/// most (the engine may have computed more for the prompt, for `prompt_logprobs`). Tokens
/// are spelled as their text, special tokens included, or `token_id:<id>`. The map always
/// lists the chosen token too, as OpenAI's does.
pub fn logprobs_object(
    tokenizer: &Tokenizer,
    tokens: &[LedgerToken],
    alternatives: usize,
    tokens_as_ids: bool,
) -> Value {
    let spell = |id: TokenId| {
        if tokens_as_ids {
            format!("token_id:{id}")
        } else {
            String::from_utf8_lossy(&tokenizer.token_bytes(id, true)).into_owned()
        }
    };
    let top = |t: &LedgerToken| {
        let Some(top) = &t.top else {
            return Value::Null;
        };
        let mut map = Map::new();
        for &(alt, lp) in top.iter().take(alternatives) {
            map.insert(spell(alt), json!(lp));
        }
        if let Some(lp) = t.logprob {
            map.entry(spell(t.id)).or_insert(json!(lp));
        }
        Value::Object(map)
    };
    json!({
        "tokens": tokens.iter().map(|t| spell(t.id)).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob.map_or(Value::Null, |l| json!(l))).collect::<Vec<_>>(),
        "top_logprobs": tokens.iter().map(top).collect::<Vec<_>>(),
        "text_offset": tokens.iter().map(|t| t.offset).collect::<Vec<_>>(),
    })
}

/// vLLM's `prompt_logprobs` of one prompt: `null` for the first token, then for each
/// token a map from token id to `{"logprob", "rank", "decoded_token"}` holding the prompt's
/// own token first and the `k` most likely tokens (ranks 1..=k). A log-probability of
/// -inf is written -9999.0, as vLLM writes it (JSON has no infinity).
pub fn prompt_logprobs(tokenizer: &Tokenizer, scores: &[PromptLogprob], k: usize) -> RawJson {
    let entry = |id: TokenId, logprob: f32, rank: Option<u32>| {
        json!({
            "logprob": if logprob.is_finite() { logprob } else { -9999.0 },
            "rank": rank,
            "decoded_token": String::from_utf8_lossy(&tokenizer.token_bytes(id, true)),
        })
    };
    // Each position is written as soon as it is built: the answer holds its JSON text
    // (~60 bytes an entry), never a tree of all of them.
    let mut out = String::from("[");
    for (i, s) in scores.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let Some(logprob) = s.logprob else {
            out.push_str("null");
            continue;
        };
        let mut map = Map::new();
        map.insert(s.id.to_string(), entry(s.id, logprob, s.rank));
        for (i, &(alt, lp)) in s.top.iter().take(k).enumerate() {
            map.entry(alt.to_string())
                .or_insert_with(|| entry(alt, lp, Some(i as u32 + 1)));
        }
        out.push_str(&Value::Object(map).to_string());
    }
    out.push(']');
    RawJson(RawValue::from_string(out).expect("serde_json writes valid JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(tokens: &[LedgerToken]) -> Vec<(u32, usize)> {
        tokens.iter().map(|t| (t.id, t.offset)).collect()
    }

    #[test]
    fn tokens_wait_for_their_text() {
        let mut ledger = TokenLedger::new();
        ledger.skip(3); // an echoed prompt without scores
                        // " Paris" comes out at once.
        ledger.push(1, false, None, None, 6);
        ledger.release(6);
        assert_eq!(offsets(&ledger.take_ready()), [(1, 3)]);
        // "\n" is held back (it may start a stop string), then "\n" too.
        ledger.push(2, false, None, None, 1);
        assert!(ledger.take_ready().is_empty());
        ledger.push(3, false, None, None, 1);
        assert!(ledger.take_ready().is_empty());
        // "The" releases "\n\nThe": all three come out where their text starts.
        ledger.push(4, false, None, None, 3);
        ledger.release(5);
        assert_eq!(offsets(&ledger.take_ready()), [(2, 9), (3, 10), (4, 11)]);
        // An end-of-sequence token adds nothing and comes out at the end.
        ledger.push(5, false, None, None, 0);
        assert_eq!(offsets(&ledger.take_ready()), [(5, 14)]);
    }

    #[test]
    fn text_never_sent_points_at_the_end() {
        let mut ledger = TokenLedger::new();
        ledger.push(1, false, None, None, 6);
        ledger.release(6);
        ledger.take_ready();
        // "\n" and "User" match a stop string and are dropped.
        ledger.push(2, false, None, None, 1);
        ledger.push(3, false, None, None, 4);
        assert!(ledger.take_ready().is_empty());
        assert_eq!(offsets(&ledger.take_all()), [(2, 6), (3, 6)]);
    }

    #[test]
    fn a_character_split_across_tokens_belongs_to_the_last() {
        let mut ledger = TokenLedger::new();
        // Two byte tokens of "é": the first decodes to nothing yet.
        ledger.push(1, false, None, None, 0);
        ledger.push(2, false, None, None, 1);
        ledger.release(1);
        assert_eq!(offsets(&ledger.take_ready()), [(1, 0), (2, 0)]);
    }
}
