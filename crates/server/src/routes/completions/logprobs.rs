//! The legacy completions `logprobs` object: `tokens`, `token_logprobs`, `top_logprobs`
//! (a map per token) and `text_offset` (characters into the returned text).

use ferrite_engine::tokenizer::{TokenId, Tokenizer};
use ferrite_engine::PromptLogprob;
use serde_json::{json, Map, Value};

/// Builds one choice's logprobs, token by token.
pub struct LogprobsBuilder {
    tokens_as_ids: bool,
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<usize>,
    /// Characters of text before the next token.
    offset: usize,
}

impl LogprobsBuilder {
    /// An empty builder; `offset` is where the first token's text starts.
    pub fn new(tokens_as_ids: bool, offset: usize) -> Self {
        Self {
            tokens_as_ids,
            tokens: Vec::new(),
            token_logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            text_offset: Vec::new(),
            offset,
        }
    }

    fn spell(&self, tokenizer: &Tokenizer, id: TokenId) -> String {
        if self.tokens_as_ids {
            format!("token_id:{id}")
        } else {
            String::from_utf8_lossy(&tokenizer.token_bytes(id, true)).into_owned()
        }
    }

    /// Adds one token with its logprob (`None` for a prompt's first token) and the most
    /// likely tokens at its position (`None`: no map, as for a prompt's first token). The
    /// map always lists the chosen token too, as OpenAI's does.
    pub fn push(
        &mut self,
        tokenizer: &Tokenizer,
        id: TokenId,
        logprob: Option<f32>,
        top: Option<&[(TokenId, f32)]>,
    ) {
        let text = self.spell(tokenizer, id);
        self.text_offset.push(self.offset);
        self.offset += text.chars().count();
        self.tokens.push(Value::String(text));
        self.token_logprobs
            .push(logprob.map_or(Value::Null, |l| json!(l)));
        let map = top.map(|top| {
            let mut map = Map::new();
            for &(alt, lp) in top {
                map.insert(self.spell(tokenizer, alt), json!(lp));
            }
            if let Some(lp) = logprob {
                map.entry(self.spell(tokenizer, id)).or_insert(json!(lp));
            }
            Value::Object(map)
        });
        self.top_logprobs.push(map.unwrap_or(Value::Null));
    }

    /// Adds the prompt's tokens (echo).
    pub fn push_prompt(&mut self, tokenizer: &Tokenizer, scores: &[PromptLogprob]) {
        for s in scores {
            let top = s.logprob.map(|_| s.top.as_slice());
            self.push(tokenizer, s.id, s.logprob, top);
        }
    }

    /// Sets where the next token's text starts: after an echoed prompt, its length in
    /// characters (its tokens' spellings may differ from it, BOS for one).
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
