//! What every request handler shares: the engine once it is loaded, the served names,
//! and server-wide settings.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ferrite_engine::EngineHandle;

use crate::auth::ApiKeys;
use crate::chat::ChatSetup;
use crate::cors::AllowedOrigins;
use crate::error::ApiError;
use crate::hosts::AllowedHosts;
use crate::images::ImageRules;
use crate::media::MediaFetcher;
use crate::metrics::Metrics;
use crate::validate::FieldLimits;

/// How much one request may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Largest request body in bytes (413 past it, at once when `Content-Length` says so).
    pub max_body_bytes: usize,
    /// Longest a client may take to send a request's body (400 past it).
    pub body_read_timeout: Duration,
    /// Most prompt tokens in one request, over all its prompts (400 past it).
    pub max_prompt_tokens: usize,
    /// Most tokens one request may ask to generate: `max_tokens` times `best_of`, over
    /// all its prompts (400 past it).
    pub max_generated_tokens: usize,
    /// Most log-probabilities one answer may carry: over every choice, (echoed prompt
    /// tokens plus `max_tokens`) times (1 plus the alternatives asked for) (400 past it).
    pub max_logprob_entries: usize,
    /// Most bytes of echoed prompt text one answer may carry, over every choice (400 past
    /// it).
    pub max_echo_bytes: usize,
    /// `max_tokens` of a chat request that gives none (lowered to fit the context and
    /// these limits): the engine reserves KV cache for all of it while the answer runs.
    pub chat_max_tokens: usize,
    /// Largest grammar a request may ask to compile, in bytes of its source (a JSON
    /// schema's text, a regex, a Lark grammar, `guided_choice`'s alternatives, the tools'
    /// call grammar); 400 past it. Compiling costs some hundreds of bytes per source
    /// byte (a 1 MiB `guided_choice` list took 175 MiB).
    pub max_grammar_bytes: usize,
    /// The sizes of the request's fields (`stop`, `logit_bias`, tool names, …).
    pub fields: FieldLimits,
    /// How many images a request may carry, and how large each.
    pub images: ImageRules,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: 8 << 20,
            body_read_timeout: Duration::from_secs(30),
            max_prompt_tokens: 1 << 18,
            max_generated_tokens: 1 << 18,
            max_logprob_entries: 1 << 18,
            max_echo_bytes: 16 << 20,
            chat_max_tokens: 4096,
            max_grammar_bytes: 256 << 10,
            fields: FieldLimits::DEFAULT,
            images: ImageRules::default(),
        }
    }
}

/// Shared state of the HTTP server.
pub struct AppState {
    /// Names the model answers to (the first is the canonical one).
    pub names: Vec<String>,
    /// Set once the model is loaded and warmed up.
    pub engine: OnceLock<EngineHandle>,
    /// The chat template, set with the engine.
    pub chat: OnceLock<Arc<ChatSetup>>,
    /// Drop unknown request fields instead of refusing them.
    pub ignore_unknown_fields: bool,
    /// Unix time the server started.
    pub created: u64,
    /// `system_fingerprint` of every response.
    pub fingerprint: String,
    /// The keys the protected routes need (none: open).
    pub api_keys: ApiKeys,
    /// How much one request may ask for.
    pub limits: RequestLimits,
    /// Longest any completion request may run (`inference_timeout` may only shorten it).
    pub request_timeout: Option<Duration>,
    /// What the HTTP layer measures.
    pub metrics: Metrics,
    /// Origins whose browser pages may call the API (`--allowed-origins`).
    pub allowed_origins: AllowedOrigins,
    /// `Host` names the server answers to (`--allowed-hosts`).
    pub allowed_hosts: AllowedHosts,
    /// Fetches images by URL from the hosts the operator allows (none: no image URL is
    /// fetched).
    pub media: Option<Arc<MediaFetcher>>,
    /// Heavy preparations running at once (a grammar to compile, a long text to
    /// tokenize): more wait their turn, so that the cores and memory they take are
    /// bounded by the server, not by how many clients send them together.
    heavy_preparations: tokio::sync::Semaphore,
    shutting_down: AtomicBool,
}

/// Heavy preparations run at once ([`AppState::heavy_turn`]).
pub const HEAVY_PREPARATIONS_AT_ONCE: usize = 2;

/// Text longer than this is a heavy preparation to tokenize or render (a few milliseconds
/// and a few MiB of merge state: shorter prompts never wait).
const LONG_TEXT_BYTES: usize = 64 << 10;

impl AppState {
    /// New state for a model served under `names`; the engine comes later.
    pub fn new(names: Vec<String>, ignore_unknown_fields: bool) -> Self {
        Self {
            names,
            engine: OnceLock::new(),
            chat: OnceLock::new(),
            ignore_unknown_fields,
            created: unix_now(),
            fingerprint: format!("fp_ferrite_{}", env!("CARGO_PKG_VERSION")),
            api_keys: ApiKeys::default(),
            limits: RequestLimits::default(),
            request_timeout: None,
            metrics: Metrics::default(),
            allowed_origins: AllowedOrigins::None,
            allowed_hosts: AllowedHosts::Any,
            media: None,
            heavy_preparations: tokio::sync::Semaphore::new(HEAVY_PREPARATIONS_AT_ONCE),
            shutting_down: AtomicBool::new(false),
        }
    }

    /// A turn among the heavy preparations (held until the preparation is done) for one
    /// that compiles a grammar or goes over `text_bytes` of text, more than
    /// [`LONG_TEXT_BYTES`]; nothing to wait for otherwise.
    pub async fn heavy_turn(
        &self,
        text_bytes: usize,
        compiles_grammar: bool,
    ) -> Result<Option<tokio::sync::SemaphorePermit<'_>>, ApiError> {
        if !compiles_grammar && text_bytes <= LONG_TEXT_BYTES {
            return Ok(None);
        }
        let permit = self.heavy_preparations.acquire().await;
        permit.map(Some).map_err(|_| ApiError::Internal)
    }

    /// The engine, or 503 while the model is loading or once the server is shutting down.
    pub fn engine(&self) -> Result<&EngineHandle, ApiError> {
        if self.is_shutting_down() {
            return Err(ApiError::Unavailable("the server is shutting down".into()));
        }
        self.engine.get().ok_or_else(|| {
            ApiError::Unavailable("the model is still loading; retry shortly".into())
        })
    }

    /// The chat template, or 503 while the model is loading.
    pub fn chat(&self) -> Result<&Arc<ChatSetup>, ApiError> {
        self.chat.get().ok_or_else(|| {
            ApiError::Unavailable("the model is still loading; retry shortly".into())
        })
    }

    /// From now on `/ready` and every new request answer 503, and the engine takes no
    /// new work; what runs goes on.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        if let Some(engine) = self.engine.get() {
            engine.close();
        }
    }

    /// Whether [`AppState::begin_shutdown`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// The canonical served name.
    pub fn model_name(&self) -> &str {
        &self.names[0]
    }

    /// Checks a request's `model`: a served name, `default`, or a path such as
    /// `vendor/models/NAME` whose last segment is a served name.
    pub fn check_model(&self, requested: &str) -> Result<(), ApiError> {
        let last = requested.rsplit('/').next().unwrap_or(requested);
        let matches = |name: &str| self.names.iter().any(|n| n == name);
        if requested == "default" || matches(requested) || matches(last) {
            Ok(())
        } else {
            Err(ApiError::ModelNotFound(requested.to_string()))
        }
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_match_as_documented() {
        let s = AppState::new(vec!["smollm2-135m".into(), "alias".into()], false);
        for ok in [
            "smollm2-135m",
            "alias",
            "default",
            "accounts/x/models/smollm2-135m",
        ] {
            assert!(s.check_model(ok).is_ok(), "{ok}");
        }
        assert_eq!(
            s.check_model("gpt-4"),
            Err(ApiError::ModelNotFound("gpt-4".into()))
        );
    }
}
