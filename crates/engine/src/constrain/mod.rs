//! Structured output with llguidance: a grammar (JSON schema, regex, Lark, or llguidance's
//! own format) compiled once per request against our tokenizer, then one [`Constraint`]
//! (an llguidance `Matcher`) per sequence that masks the logits before sampling, consumes
//! each sampled token, and names the tokens the grammar forces next.
//!
//! Grammar work is bounded: llguidance's [`ParserLimits`] cap what one grammar may build
//! and what one token's mask may cost (see [`GRAMMAR_LIMITS`]), and [`depth`] how deep
//! compiling one may recurse (a grammar deeper than that is refused before it compiles,
//! on a stack with room for many times the deepest allowed). A grammar that does not
//! compile, exceeds the limits while compiling, or allows no output at all is refused
//! before any generation (compiling computes the first mask to find out). One that runs
//! over the limits midway ends its sequence ([`MaskError::OverLimit`]), never the engine.
//! llguidance turns its own panics into errors.

pub mod depth;
mod parts;
pub mod regexes;
mod tokenizer_env;

use std::fmt;
use std::sync::Arc;

use llguidance::api::{ParserLimits, StopReason, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use toktrie::{SimpleVob, TokEnv};

use crate::error::EngineError;
use crate::tokenizer::{TokenId, Tokenizer};

/// What a grammar's source text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrammarKind {
    /// A JSON schema, as JSON text.
    JsonSchema,
    /// A regular expression (Rust `regex` syntax) the whole output must match.
    Regex,
    /// A grammar in llguidance's Lark dialect.
    Lark,
    /// llguidance's own format: Lark, or a JSON list of grammars.
    Llguidance,
}

impl GrammarKind {
    fn tag(self) -> &'static str {
        match self {
            Self::JsonSchema => "json_schema",
            Self::Regex => "regex",
            Self::Lark => "lark",
            Self::Llguidance => "llguidance",
        }
    }
}

/// A grammar to constrain output with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grammar {
    /// How to read `source`.
    pub kind: GrammarKind,
    /// The grammar's text.
    pub source: String,
}

/// What one grammar may cost. Lexer fuel is llguidance's unit of regex work (about 14k a
/// millisecond), so a token's mask costs at most some tens of milliseconds; the lexer's
/// states (1–2 kB each) bound its memory to tens of megabytes; the grammar size bounds
/// what a schema may expand to.
pub const GRAMMAR_LIMITS: ParserLimits = ParserLimits {
    max_items_in_row: 2_000,
    initial_lexer_fuel: 1_000_000,
    step_lexer_fuel: 200_000,
    step_max_items: 50_000,
    max_lexer_states: 20_000,
    max_grammar_size: 200_000,
    precompute_large_lexemes: true,
    verbose_errors: false,
};

/// Why a grammar could not give the next token's mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaskError {
    /// Computing it went over [`GRAMMAR_LIMITS`] (or the grammar failed otherwise): the
    /// sequence cannot go on under its grammar.
    OverLimit(String),
    /// The grammar allows no token at all here.
    Nothing,
}

/// Compiles grammars for one tokenizer. Building it indexes the vocabulary once.
pub struct ConstraintFactory {
    factory: ParserFactory,
    max_regex_match: usize,
}

impl ConstraintFactory {
    /// A factory for `tokenizer`'s vocabulary, refusing grammars with a regex whose every
    /// match is longer than `max_regex_match` bytes (see [`regexes`]).
    pub fn new(tokenizer: Arc<Tokenizer>, max_regex_match: usize) -> Result<Self, EngineError> {
        let env: TokEnv = Arc::new(tokenizer_env::TokenizerEnvAdapter::new(tokenizer));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| EngineError::InvalidModel(format!("grammar support: {e}")))?;
        factory.quiet();
        *factory.limits_mut() = GRAMMAR_LIMITS.clone();
        Ok(Self {
            factory,
            max_regex_match,
        })
    }

    /// Compiles `grammar` into a constraint ready for a fresh sequence; the error is
    /// llguidance's message. The first token's mask is computed too, so that a grammar
    /// that exceeds the limits at once, or allows no output at all, is refused here
    /// rather than in a generation step.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, String> {
        parts::check_before_compiling(grammar, self.max_regex_match)?;
        // Compiling recurses as deep as the grammar goes: on a stack that holds the
        // deepest one `depth::check` lets through, many times over.
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("grammar-compile".into())
                .stack_size(depth::COMPILE_STACK_BYTES)
                .spawn_scoped(scope, || self.compile_here(grammar))
                .map_err(|e| format!("cannot start the grammar compiler: {e}"))?
                .join()
                .map_err(|_| "the grammar compiler failed".to_string())?
        })
    }

    /// [`ConstraintFactory::compile`] on the calling thread.
    fn compile_here(&self, grammar: &Grammar) -> Result<Constraint, String> {
        let top = TopLevelGrammar::from_tagged_str(grammar.kind.tag(), &grammar.source)
            .map_err(message)?;
        let parser = self.factory.create_parser(top).map_err(message)?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(message(e));
        }
        let mut constraint = Constraint {
            matcher,
            next: None,
        };
        constraint.prepare_next().map_err(|e| match e {
            MaskError::OverLimit(why) => why,
            MaskError::Nothing => NOTHING_ALLOWED.into(),
        })?;
        Ok(constraint)
    }
}

/// Why a grammar that can match nothing is refused.
const NOTHING_ALLOWED: &str = "the grammar allows no output at all (it can match nothing)";

/// llguidance's message without the marker it adds when errors are not verbose.
/// llguidance reports a grammar whose first mask is empty by this stop reason's name.
fn message(error: impl fmt::Display) -> String {
    let text = error.to_string();
    let text = text.trim_end_matches("<non-verbose/>").trim_end();
    if text == "NoExtensionBias" {
        NOTHING_ALLOWED.into()
    } else {
        text.into()
    }
}

/// One sequence's grammar state.
pub struct Constraint {
    matcher: Matcher,
    /// The next token's mask, once computed.
    next: Option<SimpleVob>,
}

impl Clone for Constraint {
    /// A copy for another sequence: what one consumes does not affect the other, and
    /// both share the grammar's lexer (its regexes and the states built from them,
    /// behind llguidance's lock), which holds nearly all of a compiled grammar's memory:
    /// a request's choices pay for their grammar once, not once each (`n: 64` with a
    /// schema pattern took 5.4 GiB with a copy each).
    fn clone(&self) -> Self {
        Self {
            matcher: self.matcher.clone(),
            next: self.next.clone(),
        }
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// Computes the next token's mask now (once): says whether the grammar can go on.
    /// A sequence calls it right after consuming a token, so that a grammar that cannot
    /// go on ends the sequence with that token.
    pub fn prepare_next(&mut self) -> Result<(), MaskError> {
        if self.next.is_none() {
            let allowed = match self.matcher.compute_mask() {
                Ok(allowed) => allowed,
                // llguidance stops with this reason when no token fits.
                Err(_) if self.matcher.stop_reason() == StopReason::NoExtensionBias => {
                    return Err(MaskError::Nothing)
                }
                Err(e) => return Err(MaskError::OverLimit(message(e))),
            };
            if allowed.is_zero() {
                return Err(MaskError::Nothing);
            }
            self.next = Some(allowed);
        }
        Ok(())
    }

    /// Sets the logit of every token the grammar does not allow next to -inf.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), MaskError> {
        self.prepare_next()?;
        let allowed = self.next.as_ref().expect("prepared above");
        for (id, logit) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(id as TokenId) {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances the grammar by a sampled token.
    pub fn consume(&mut self, token: TokenId) -> Result<(), String> {
        self.next = None;
        self.matcher.consume_token(token).map_err(message)
    }

    /// Whether the grammar is complete and allows nothing more.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }

    /// Tokens the grammar forces next (none when there is a choice).
    pub fn forced_tokens(&mut self) -> Vec<TokenId> {
        self.matcher.compute_ff_tokens()
    }
}

#[cfg(test)]
mod tests {
    //! Grammar behaviour needs a real vocabulary: see `tests/constrain.rs`.
}
