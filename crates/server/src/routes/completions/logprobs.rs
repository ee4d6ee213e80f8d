//! The legacy completions `logprobs` object: `tokens`, `token_logprobs`, `top_logprobs`
//! (a map per token) and `text_offset` (characters into the returned text).
//!
//! `text_offset[i]` is where token `i`'s text starts in the choice's `text`: the number of
//! characters the tokens before it added to that text, counted from what they really
//! added (an echoed prompt's decoded pieces, a generated token's released text), never
//! from the token's spelling. So the offsets never go backwards and never pass the end of
//! the text, whatever BOS, special tokens left out of the text, characters split across
//! tokens or text held back for a stop string do.

use ferrite_engine::tokenizer::{TokenId, Tokenizer};
use ferrite_engine::PromptLogprob;
use serde_json::{json, Map, Value};

/// Builds one choice's logprobs, token by token.
pub struct LogprobsBuilder {
    tokens_as_ids: bool,
    /// Alternatives per token (the engine may have computed more for the prompt, when
    /// `prompt_logprobs` asked for more).
    alternatives: usize,
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<usize>,
    /// Characters of text before the next token.
    offset: usize,
}

impl LogprobsBuilder {
    /// An empty builder with `alternatives` per token.
    pub fn new(tokens_as_ids: bool, alternatives: usize) -> Self {
        Self {
            tokens_as_ids,
            alternatives,
            tokens: Vec::new(),
            token_logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            text_offset: Vec::new(),
            offset: 0,
        }
    }

    fn spell(&self, tokenizer: &Tokenizer, id: TokenId) -> String {
        if self.tokens_as_ids {
            format!("token_id:{id}")
        } else {
            String::from_utf8_lossy(&tokenizer.token_bytes(id, true)).into_owned()
        }
    }

    /// Adds one token with its logprob (`None` for a prompt's first token), the most
    /// likely tokens at its position (`None`: no map, as for a prompt's first token), and
    /// the number of characters it added to the choice's text. The map always lists the
    /// chosen token too, as OpenAI's does.
    pub fn push(
        &mut self,
        tokenizer: &Tokenizer,
        id: TokenId,
        logprob: Option<f32>,
        top: Option<&[(TokenId, f32)]>,
        text_chars: usize,
    ) {
        let text = self.spell(tokenizer, id);
        self.text_offset.push(self.offset);
        self.offset += text_chars;
        self.tokens.push(Value::String(text));
        self.token_logprobs
            .push(logprob.map_or(Value::Null, |l| json!(l)));
        let map = top.map(|top| {
            let mut map = Map::new();
            for &(alt, lp) in top.iter().take(self.alternatives) {
                map.insert(self.spell(tokenizer, alt), json!(lp));
            }
            if let Some(lp) = logprob {
                map.entry(self.spell(tokenizer, id)).or_insert(json!(lp));
            }
            Value::Object(map)
        });
        self.top_logprobs.push(map.unwrap_or(Value::Null));
    }

    /// Adds the prompt's tokens (echo); `token_chars` are the characters each adds to
    /// the echoed text.
    pub fn push_prompt(
        &mut self,
        tokenizer: &Tokenizer,
        scores: &[PromptLogprob],
        token_chars: &[usize],
    ) {
        for (i, s) in scores.iter().enumerate() {
            let top = s.logprob.map(|_| s.top.as_slice());
            let chars = token_chars.get(i).copied().unwrap_or(0);
            self.push(tokenizer, s.id, s.logprob, top, chars);
        }
    }

    /// Sets where the next token's text starts: after an echoed prompt, its length in
    /// characters.
    pub fn set_offset(&mut self, chars: usize) {
        self.offset = chars;
    }

    /// Takes what was pushed since the last call, as a `logprobs` object, leaving the
    /// builder empty but with its offset (streaming sends one object per chunk).
    pub fn take(&mut self) -> Value {
        json!({
            "tokens": std::mem::take(&mut self.tokens),
            "token_logprobs": std::mem::take(&mut self.token_logprobs),
            "top_logprobs": std::mem::take(&mut self.top_logprobs),
            "text_offset": std::mem::take(&mut self.text_offset),
        })
    }
}

/// vLLM's `prompt_logprobs` of one prompt: `null` for the first token, then for each
/// token a map from token id to `{"logprob", "rank", "decoded_token"}` holding the prompt's
/// own token first and the `k` most likely tokens (ranks 1..=k). A log-probability of
/// -inf is written -9999.0, as vLLM writes it (JSON has no infinity).
pub fn prompt_logprobs(tokenizer: &Tokenizer, scores: &[PromptLogprob], k: usize) -> Value {
    let entry = |id: TokenId, logprob: f32, rank: Option<u32>| {
        json!({
            "logprob": if logprob.is_finite() { logprob } else { -9999.0 },
            "rank": rank,
            "decoded_token": String::from_utf8_lossy(&tokenizer.token_bytes(id, true)),
        })
    };
    let positions = scores
        .iter()
        .map(|s| {
            let Some(logprob) = s.logprob else {
                return Value::Null;
            };
            let mut map = Map::new();
            map.insert(s.id.to_string(), entry(s.id, logprob, s.rank));
            for (i, &(alt, lp)) in s.top.iter().take(k).enumerate() {
                map.entry(alt.to_string())
                    .or_insert_with(|| entry(alt, lp, Some(i as u32 + 1)));
            }
            Value::Object(map)
        })
        .collect();
    Value::Array(positions)
}
