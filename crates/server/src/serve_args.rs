//! The options of `ferrite serve`: every one a flag and a `FERRITE_*` variable.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use ferrite_engine::kv_cache::{KvType, KvTypes};
use ferrite_engine::lookup::PromptLookup;
use ferrite_server::validate::FieldLimits;

/// The options of `ferrite serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// A GGUF path, a known model name, or a Hugging Face repo id (owner/repo[:file.gguf]).
    /// Default: smollm2-135m, fetched on first use.
    #[arg(long, env = "FERRITE_MODEL")]
    pub model: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", env = "FERRITE_HOST")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080, env = "FERRITE_PORT")]
    pub port: u16,
    /// Names the model answers to in requests (repeatable); default: the model's name.
    #[arg(
        long = "served-model-name",
        env = "FERRITE_SERVED_MODEL_NAME",
        value_delimiter = ','
    )]
    pub served_model_names: Vec<String>,
    /// A vision projector for the model (llama.cpp's `mmproj` GGUF): the model then reads
    /// images (`images` on completions, `image_url` parts in chat).
    #[arg(long, env = "FERRITE_MMPROJ")]
    pub mmproj: Option<std::path::PathBuf>,
    /// Most images in one request.
    #[arg(long, default_value_t = 16, env = "FERRITE_MAX_IMAGES")]
    pub max_images: usize,
    /// Most pixels (width times height) of one image, checked from its header before it
    /// is decoded.
    #[arg(long, default_value_t = 32 << 20, env = "FERRITE_MAX_IMAGE_PIXELS")]
    pub max_image_pixels: u64,
    /// Hosts whose images a request may give by `http(s)` URL (repeatable or
    /// comma-separated; `example.com`, `*.example.com` for the names under it, `*` for
    /// any). Default: none, and image URLs are refused.
    #[arg(long, env = "FERRITE_ALLOWED_MEDIA_DOMAINS", value_delimiter = ',')]
    pub allowed_media_domains: Vec<String>,
    /// Let image URLs reach loopback, private, link-local and other non-public addresses
    /// (refused by default, whatever the host's name: a client must not reach, through
    /// the server, what only the server can reach).
    #[arg(long, env = "FERRITE_ALLOW_PRIVATE_MEDIA_ADDRESSES")]
    pub allow_private_media_addresses: bool,
    /// Seconds all of one request's image fetches may take together.
    #[arg(long, default_value_t = 10.0, env = "FERRITE_MEDIA_FETCH_TIMEOUT", value_parser = positive_seconds)]
    pub media_fetch_timeout: f64,
    /// Longest prompt plus completion, in tokens; default: the model's training context.
    #[arg(long, env = "FERRITE_CTX_SIZE")]
    pub ctx_size: Option<usize>,
    /// Most sequences decoded together; a quarter more (rounded down) are kept for
    /// requests that have nothing running yet, so that one request's choices cannot hold
    /// every slot.
    #[arg(long, default_value_t = 64, env = "FERRITE_MAX_RUNNING")]
    pub max_running: usize,
    /// Most tokens in one forward step (prefill chunk size plus decodes).
    #[arg(long, default_value_t = 512, env = "FERRITE_MAX_STEP_TOKENS")]
    pub max_step_tokens: usize,
    /// KV cache that running sequences may reserve together: positions (`131072`), or
    /// bytes with a unit (`4GiB`, `512MiB`, `2G`), which become as many positions as fit
    /// with the model's layers and the cache types below.
    #[arg(long, default_value = "131072", env = "FERRITE_KV_BUDGET", value_parser = KvBudget::parse)]
    pub kv_budget: KvBudget,
    /// Type the KV cache stores keys in: `f16` (the default), `q8_0` (about half the
    /// memory) or `q4_0` (about a quarter), with llama.cpp's arithmetic for each (its
    /// `-ctk`). Heads must be a multiple of 32 values for a quantized type.
    #[arg(long = "cache-type-k", visible_alias = "kv-type-k", default_value = "f16", env = "FERRITE_CACHE_TYPE_K", value_parser = kv_type)]
    pub cache_type_k: KvType,
    /// Type the KV cache stores values in, as `--cache-type-k` (llama.cpp's `-ctv`).
    #[arg(long = "cache-type-v", visible_alias = "kv-type-v", default_value = "f16", env = "FERRITE_CACHE_TYPE_V", value_parser = kv_type)]
    pub cache_type_v: KvType,
    /// KV cache positions kept from finished sequences for prompts that start the same
    /// way (0 turns the prefix cache off).
    #[arg(long, default_value_t = 8192, env = "FERRITE_PREFIX_CACHE_POSITIONS")]
    pub prefix_cache_positions: usize,
    /// Drop request fields that no supported API documents instead of answering 400.
    #[arg(long, env = "FERRITE_IGNORE_UNKNOWN_FIELDS")]
    pub ignore_unknown_fields: bool,
    /// A key every route but /health, /ready and /metrics then needs, as `Authorization:
    /// Bearer KEY` or `x-api-key: KEY` (repeatable; the variable takes one).
    #[arg(long = "api-key", env = "FERRITE_API_KEY")]
    pub api_keys: Vec<String>,
    /// A file of API keys, one per line (`#` starts a comment line).
    #[arg(long, env = "FERRITE_API_KEY_FILE")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Origins whose browser pages may call the API (CORS), as scheme://host[:port]
    /// (repeatable or comma-separated; `*`: any). Default: none.
    #[arg(long, env = "FERRITE_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Host names the server answers to besides loopback names (`Host` header;
    /// repeatable or comma-separated; `*`: any). Default: only loopback names when bound
    /// to a loopback address (a web page rebinding its DNS to 127.0.0.1 is refused), any
    /// name otherwise.
    #[arg(long, env = "FERRITE_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Compute threads for the forward passes. Default: the cores this process may use
    /// (its CPU affinity mask and cgroup quota), not the host's.
    #[arg(long, env = "FERRITE_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// Most requests waiting for the engine (one per request, whatever its prompts); past
    /// it, requests get 429 with `Retry-After`.
    #[arg(long, default_value_t = 512, env = "FERRITE_MAX_WAITING")]
    pub max_waiting: usize,
    /// Largest request body in bytes; past it, 413.
    #[arg(long, default_value_t = 8 << 20, env = "FERRITE_MAX_BODY_SIZE")]
    pub max_body_size: usize,
    /// Most prompt tokens in one request, over all its prompts; past it, 400.
    #[arg(long, default_value_t = 1 << 18, env = "FERRITE_MAX_PROMPT_TOKENS")]
    pub max_prompt_tokens: usize,
    /// Most tokens one request may ask to generate (`max_tokens` times `best_of` or `n`,
    /// over all its prompts); past it, 400.
    #[arg(long, default_value_t = 1 << 18, env = "FERRITE_MAX_REQUEST_TOKENS")]
    pub max_request_tokens: usize,
    /// Most log-probabilities one answer may carry: over every choice, (echoed prompt
    /// tokens plus `max_tokens`) times (1 plus the alternatives asked for), and with
    /// `prompt_logprobs` prompt tokens times (2 plus its alternatives) per choice; past it,
    /// 400. An entry costs ~60 bytes of JSON and ~150 while the answer is built.
    #[arg(long, default_value_t = 1 << 18, env = "FERRITE_MAX_LOGPROB_ENTRIES")]
    pub max_logprob_entries: usize,
    /// Most bytes of echoed prompt text one answer may carry, over every choice; past it,
    /// 400.
    #[arg(long, default_value_t = 16 << 20, env = "FERRITE_MAX_ECHO_BYTES")]
    pub max_echo_bytes: usize,
    /// Longest a completion request may run, in seconds (a request's `inference_timeout`
    /// can only shorten it); past it, 504 or an error event. Default: no limit.
    #[arg(long, env = "FERRITE_REQUEST_TIMEOUT", value_parser = positive_seconds)]
    pub request_timeout: Option<f64>,
    /// On SIGINT or SIGTERM: seconds running requests get to finish (new ones get 503)
    /// before the rest are ended with an error and the server exits.
    #[arg(long, default_value_t = 20.0, env = "FERRITE_SHUTDOWN_GRACE", value_parser = non_negative_seconds)]
    pub shutdown_grace: f64,
    /// Seconds a client has to send a request's headers, and then its body; also how long
    /// an idle keep-alive connection is kept open.
    #[arg(long, default_value_t = 30.0, env = "FERRITE_REQUEST_READ_TIMEOUT", value_parser = positive_seconds)]
    pub request_read_timeout: f64,
    /// Seconds a response may wait on a client that does not read it (a write blocked on
    /// the client, or a stream whose buffer is full); then the connection is closed (or
    /// the stream ended) and its sequences are freed.
    #[arg(long, default_value_t = 30.0, env = "FERRITE_RESPONSE_WRITE_TIMEOUT", value_parser = positive_seconds)]
    pub response_write_timeout: f64,
    /// Kernel send buffer of each connection, in bytes (0: the kernel's default, which
    /// grows to megabytes): with the server's own bounded buffers, it bounds what waits
    /// for a client that stopped reading before its stream stops generating.
    #[arg(long, default_value_t = 128 << 10, env = "FERRITE_SEND_BUFFER_BYTES")]
    pub send_buffer_bytes: usize,
    /// Most bytes of a request's headers (HTTP/1: 431 past it; HTTP/2: the header list is
    /// refused), also what is buffered of an HTTP/1 answer; at least 8192.
    #[arg(long, default_value_t = ferrite_server::listen::DEFAULT_MAX_HEADER_BYTES, env = "FERRITE_MAX_HEADER_BYTES", value_parser = header_bytes)]
    pub max_header_bytes: usize,
    /// Most connections open at once; one more is answered 503 and closed.
    #[arg(long, default_value_t = 512, env = "FERRITE_MAX_CONNECTIONS")]
    pub max_connections: usize,
    /// Serve `/metrics` on this port (same host) instead of the API's port.
    #[arg(long, env = "FERRITE_METRICS_PORT")]
    pub metrics_port: Option<u16>,
    /// Log lines as text or as JSON objects (one per line).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "FERRITE_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// `max_tokens` of a chat request that gives none (lowered to fit the context and
    /// the per-request limits).
    #[arg(long, default_value_t = 4096, env = "FERRITE_CHAT_MAX_TOKENS", value_parser = positive_count)]
    pub chat_max_tokens: usize,
    /// Largest grammar one request may have compiled, in bytes of its source (a JSON
    /// schema's text, a regex, a Lark grammar, the alternatives of `guided_choice`, the
    /// tools' call grammar); past it, 400.
    #[arg(long, default_value_t = 256 << 10, env = "FERRITE_MAX_GRAMMAR_BYTES")]
    pub max_grammar_bytes: usize,
    /// Longest shortest match a regex in a grammar may have, in bytes (`guided_regex`, a
    /// JSON schema's `pattern`, a Lark terminal): compiling one builds every byte it
    /// forces (a 20-byte `(a{1000}){1000}` took 320 MiB); past it, 400.
    #[arg(long, default_value_t = ferrite_engine::constrain::regexes::DEFAULT_MAX_REGEX_MATCH_BYTES, env = "FERRITE_MAX_REGEX_MATCH_BYTES")]
    pub max_regex_match_bytes: usize,
    /// Longest tool name, in bytes; past it, 400 naming `tools` (OpenAI allows 64
    /// characters).
    #[arg(long, default_value_t = FieldLimits::DEFAULT.max_tool_name_bytes, env = "FERRITE_MAX_TOOL_NAME_BYTES")]
    pub max_tool_name_bytes: usize,
    /// Longest stop string, in bytes (every choice matches its stop strings at every
    /// token); past it, 400 naming `stop`.
    #[arg(long, default_value_t = FieldLimits::DEFAULT.max_stop_bytes, env = "FERRITE_MAX_STOP_BYTES")]
    pub max_stop_bytes: usize,
    /// Most `stop_token_ids` in one request; past it, 400.
    #[arg(long, default_value_t = FieldLimits::DEFAULT.max_stop_token_ids, env = "FERRITE_MAX_STOP_TOKEN_IDS")]
    pub max_stop_token_ids: usize,
    /// Most `logit_bias` entries in one request; past it, 400.
    #[arg(long, default_value_t = FieldLimits::DEFAULT.max_logit_bias, env = "FERRITE_MAX_LOGIT_BIAS")]
    pub max_logit_bias: usize,
    /// Most `allowed_token_ids` in one request; past it, 400.
    #[arg(long, default_value_t = FieldLimits::DEFAULT.max_allowed_token_ids, env = "FERRITE_MAX_ALLOWED_TOKEN_IDS")]
    pub max_allowed_token_ids: usize,
    /// Most `dry_sequence_breakers` in one request (each at most 64 bytes); past it, 400.
    #[arg(long, default_value_t = FieldLimits::DEFAULT.max_dry_breakers, env = "FERRITE_MAX_DRY_BREAKERS")]
    pub max_dry_breakers: usize,
    /// Tokens a stream may have generated ahead of what its client has read (its events
    /// waiting in the server); then it stops generating until the client reads, and ends
    /// after `--response-write-timeout`.
    #[arg(long, default_value_t = ferrite_engine::sequence::DEFAULT_MAX_UNREAD_EVENTS, env = "FERRITE_MAX_UNREAD_EVENTS", value_parser = positive_count)]
    pub max_unread_events: usize,
    /// Bytes of logits one step may compute for a prompt scored with `prompt_logprobs`
    /// (a row of the vocabulary's size per position): the prompt goes in as many
    /// positions a step as they hold, one at least.
    #[arg(long, default_value_t = ferrite_engine::DEFAULT_SCORED_LOGITS_BYTES, env = "FERRITE_MAX_SCORED_LOGITS_BYTES")]
    pub max_scored_logits_bytes: usize,
    /// A Jinja chat template for `/v1/chat/completions`, replacing the model's own (a
    /// model without one gets ChatML).
    #[arg(long, env = "FERRITE_CHAT_TEMPLATE")]
    pub chat_template: Option<PathBuf>,
    /// Let control-token text that clients write into chat messages, tool definitions
    /// and `chat_template_kwargs` become control tokens, as it did before: a user could
    /// then end its turn and open a system one (`<|im_end|><|im_start|>system`). By
    /// default it stays text, and only the template's own markers are control tokens.
    #[arg(long, env = "FERRITE_SPECIAL_TOKENS_IN_MESSAGES")]
    pub special_tokens_in_messages: bool,
    /// Most bytes the chat template may write for one request; past it, 400 naming
    /// `messages`. The template's fuel bounds its instructions, this what they write (a
    /// loop over a client's `chat_template_kwargs` number, each turn writing a message).
    #[arg(long, default_value_t = 16 << 20, env = "FERRITE_MAX_RENDERED_BYTES")]
    pub max_rendered_bytes: usize,
    /// Speculative decoding by prompt lookup: up to this many tokens per step are guessed
    /// from an earlier occurrence of the text's last tokens (in the prompt or the output)
    /// and verified in the same forward step. The output is unchanged; text that repeats
    /// its input (extraction, editing, quoting) comes faster. 0 (the default) turns it
    /// off; at most 8.
    #[arg(long, default_value_t = 0, env = "FERRITE_PROMPT_LOOKUP")]
    pub prompt_lookup: usize,
    /// Shortest run of tokens prompt lookup takes as a repetition.
    #[arg(long, default_value_t = 2, env = "FERRITE_PROMPT_LOOKUP_MIN")]
    pub prompt_lookup_min: usize,
    /// Longest run of tokens prompt lookup matches (a longer match wins over a more
    /// recent one).
    #[arg(long, default_value_t = 4, env = "FERRITE_PROMPT_LOOKUP_MAX")]
    pub prompt_lookup_max: usize,
}

impl ServeArgs {
    /// The types the KV cache stores keys and values in.
    pub fn kv_types(&self) -> KvTypes {
        KvTypes {
            keys: self.cache_type_k,
            values: self.cache_type_v,
        }
    }

    /// The sizes a request's fields may have.
    pub fn field_limits(&self) -> FieldLimits {
        FieldLimits {
            max_stop_bytes: self.max_stop_bytes,
            max_stop_token_ids: self.max_stop_token_ids,
            max_logit_bias: self.max_logit_bias,
            max_allowed_token_ids: self.max_allowed_token_ids,
            max_dry_breakers: self.max_dry_breakers,
            max_tool_name_bytes: self.max_tool_name_bytes,
        }
    }

    /// The prompt lookup configured, if it is on.
    pub fn prompt_lookup(&self) -> Result<Option<PromptLookup>> {
        if self.prompt_lookup == 0 {
            return Ok(None);
        }
        PromptLookup::new(
            self.prompt_lookup_min,
            self.prompt_lookup_max,
            self.prompt_lookup,
        )
        .map(Some)
        .map_err(|e| anyhow::anyhow!("--prompt-lookup: {e}"))
    }
}

/// How log lines are written.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, with the request id of the span it belongs to.
    Json,
}

/// A number of header bytes hyper can take (8192 or more).
pub fn header_bytes(s: &str) -> Result<usize, String> {
    let least = ferrite_server::listen::MIN_MAX_HEADER_BYTES;
    match s.parse::<usize>() {
        Ok(v) if v >= least => Ok(v),
        _ => Err(format!("`{s}` is not a whole number of at least {least}")),
    }
}

/// A whole number above 0.
pub fn positive_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(format!("`{s}` is not a positive whole number")),
    }
}

/// A finite number of seconds, 0 or more.
pub fn non_negative_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds")),
    }
}

/// A finite number of seconds above 0.
pub fn positive_seconds(s: &str) -> Result<f64, String> {
    non_negative_seconds(s).and_then(|v| {
        if v > 0.0 {
            Ok(v)
        } else {
            Err("the timeout must be more than 0 seconds".into())
        }
    })
}

/// A KV cache type by llama.cpp's name.
fn kv_type(value: &str) -> Result<KvType, String> {
    KvType::parse(value.trim()).ok_or_else(|| {
        let names: Vec<&str> = KvType::ALL.iter().map(|t| t.name()).collect();
        format!("{value:?}: expected one of {}", names.join(", "))
    })
}

/// How much KV cache the running sequences may reserve together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvBudget {
    /// This many positions.
    Positions(usize),
    /// As many positions as fit in this many bytes.
    Bytes(u64),
}

impl KvBudget {
    /// A count of positions (`131072`), or bytes with a unit: `B`, `K`/`KB`/`KiB`,
    /// `M`/`MB`/`MiB`, `G`/`GB`/`GiB`, `T`/`TB`/`TiB` (the letters alone and `iB` powers
    /// of 1024, `B` after a letter powers of 1000), any case, a space allowed before it.
    pub fn parse(value: &str) -> Result<Self, String> {
        let value = value.trim();
        let digits = value
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(value.len());
        let (number, unit) = value.split_at(digits);
        let number: u64 = number.parse().map_err(|_| {
            format!("{value:?}: expected positions (131072) or bytes with a unit (4GiB)")
        })?;
        let unit = unit.trim().to_ascii_lowercase();
        if unit.starts_with(['.', ',']) {
            return Err(format!(
                "{value:?}: a whole number of positions or bytes (1536MiB, not 1.5GiB)"
            ));
        }
        if unit.is_empty() {
            return usize::try_from(number)
                .map(KvBudget::Positions)
                .map_err(|_| format!("{value:?}: too many positions"));
        }
        let power = |p: u32, base: u64| base.pow(p);
        let factor = match unit.as_str() {
            "b" => 1,
            "k" | "kib" => power(1, 1024),
            "m" | "mib" => power(2, 1024),
            "g" | "gib" => power(3, 1024),
            "t" | "tib" => power(4, 1024),
            "kb" => power(1, 1000),
            "mb" => power(2, 1000),
            "gb" => power(3, 1000),
            "tb" => power(4, 1000),
            _ => {
                return Err(format!(
                    "{value:?}: unknown unit {unit:?} (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
                ))
            }
        };
        number
            .checked_mul(factor)
            .map(KvBudget::Bytes)
            .ok_or_else(|| format!("{value:?}: too large"))
    }

    /// The positions this budget gives when one position takes `position_bytes` bytes.
    pub fn positions(self, position_bytes: usize) -> usize {
        match self {
            KvBudget::Positions(n) => n,
            KvBudget::Bytes(b) => {
                usize::try_from(b / position_bytes.max(1) as u64).unwrap_or(usize::MAX)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_are_positions_or_bytes_with_a_unit() {
        assert_eq!(KvBudget::parse("131072"), Ok(KvBudget::Positions(131_072)));
        assert_eq!(KvBudget::parse("4GiB"), Ok(KvBudget::Bytes(4 << 30)));
        assert_eq!(KvBudget::parse("512 mib"), Ok(KvBudget::Bytes(512 << 20)));
        assert_eq!(KvBudget::parse("2G"), Ok(KvBudget::Bytes(2 << 30)));
        assert_eq!(KvBudget::parse("3GB"), Ok(KvBudget::Bytes(3_000_000_000)));
        for bad in [
            "",
            "GiB",
            "-5",
            "4 parsecs",
            "99999999999999999999",
            "5e3",
            "1.5GiB",
        ] {
            assert!(KvBudget::parse(bad).is_err(), "{bad:?}");
        }
        // SmolLM2: 30 layers of 192 keys and values, f16: 23,040 bytes a position.
        assert_eq!(KvBudget::Bytes(23_040 * 1000 + 5).positions(23_040), 1000);
        assert_eq!(KvBudget::Positions(77).positions(23_040), 77);
        assert_eq!(kv_type("Q8_0"), Ok(KvType::Q8_0));
        assert!(kv_type("q5_1").unwrap_err().contains("f16, q8_0, q4_0"));
    }
}
