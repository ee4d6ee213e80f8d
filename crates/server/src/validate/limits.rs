//! The sizes of a request's fields that the operator sets: each is a `ferrite serve` flag,
//! with these defaults. The maxima the APIs themselves document (`n` ≤ 128, `best_of` ≤ 20,
//! `logprobs` ≤ 20, four stop strings) stay rules of the API, not settings.

/// How large a request's lists and strings may be; past each, a 400 naming the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldLimits {
    /// Longest stop string, in bytes of UTF-8 (`--max-stop-bytes`): every choice matches
    /// its stop strings at every token.
    pub max_stop_bytes: usize,
    /// Most `stop_token_ids` (`--max-stop-token-ids`).
    pub max_stop_token_ids: usize,
    /// Most `logit_bias` entries (`--max-logit-bias`).
    pub max_logit_bias: usize,
    /// Most `allowed_token_ids` (`--max-allowed-token-ids`; the largest vocabularies
    /// served have 262,144 tokens).
    pub max_allowed_token_ids: usize,
    /// Most `dry_sequence_breakers` (`--max-dry-breakers`), each at most 64 bytes.
    pub max_dry_breakers: usize,
    /// Longest tool name, in bytes (`--max-tool-name-bytes`; OpenAI allows 64
    /// characters): a megabyte-long name took 255 MiB to render and tokenize before its
    /// 400.
    pub max_tool_name_bytes: usize,
}

impl FieldLimits {
    /// The defaults of the flags.
    pub const DEFAULT: Self = Self {
        max_stop_bytes: 512,
        max_stop_token_ids: 64,
        max_logit_bias: 1024,
        max_allowed_token_ids: 1 << 18,
        max_dry_breakers: 32,
        max_tool_name_bytes: 256,
    };
}

impl Default for FieldLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}
