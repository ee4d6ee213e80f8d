//! Structured output with llguidance: a grammar (JSON schema, regex, Lark, or llguidance's
//! own format) compiled once per request against our tokenizer, then one [`Constraint`]
//! (an llguidance `Matcher`) per sequence that masks the logits before sampling, consumes
//! each sampled token, and names the tokens the grammar forces next.
//!
//! A grammar that does not compile is an error before any generation; one that fails
//! midway ends its sequence with an error. llguidance turns its own panics into errors.

mod tokenizer_env;

use std::fmt;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use toktrie::TokEnv;

use crate::tokenizer::{TokenId, Tokenizer};
use crate::EngineError;

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

/// Compiles grammars for one tokenizer. Building it indexes the vocabulary once.
pub struct ConstraintFactory {
    factory: ParserFactory,
}

impl ConstraintFactory {
    /// A factory for `tokenizer`'s vocabulary.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<Self, EngineError> {
        let env: TokEnv = Arc::new(tokenizer_env::TokenizerEnvAdapter::new(tokenizer));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| EngineError::InvalidModel(format!("grammar support: {e}")))?;
        factory.quiet();
        Ok(Self { factory })
    }

    /// Compiles `grammar` into a constraint ready for a fresh sequence; the error is
    /// llguidance's message.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, String> {
        let top = TopLevelGrammar::from_tagged_str(grammar.kind.tag(), &grammar.source)
            .map_err(|e| e.to_string())?;
        let parser = self.factory.create_parser(top).map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        match matcher.get_error() {
            Some(e) => Err(e),
            None => Ok(Constraint { matcher }),
        }
    }
}

/// One sequence's grammar state.
pub struct Constraint {
    matcher: Matcher,
}

impl Clone for Constraint {
    /// An independent copy: what one sequence consumes does not affect the other.
    fn clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
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
    /// Sets the logit of every token the grammar does not allow next to -inf.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self.matcher.compute_mask().map_err(|e| e.to_string())?;
        for (id, logit) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(id as TokenId) {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances the grammar by a sampled token.
    pub fn consume(&mut self, token: TokenId) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| e.to_string())
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
