//! Mirostat 2.0: keeps the surprise of the sampled text near a target by truncating the
//! distribution to tokens whose surprise is at most `mu`, and adjusting `mu` after each
//! token by the error between the observed surprise and the target.

use super::filters::{draw, sort_best_first};
use super::Candidate;
use crate::tokenizer::TokenId;

/// Mirostat 2.0 settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MirostatParams {
    /// Target surprise `tau`, in bits.
    pub target: f32,
    /// Learning rate `eta`.
    pub learning_rate: f32,
}

/// One sequence's Mirostat state.
#[derive(Debug, Clone)]
pub struct Mirostat {
    params: MirostatParams,
    mu: f32,
}

impl Mirostat {
    /// Starts with `mu = 2 * tau`, as the paper does.
    pub fn new(params: MirostatParams) -> Self {
        Self {
            params,
            mu: 2.0 * params.target,
        }
    }

    /// The current truncation threshold, in bits.
    pub fn mu(&self) -> f32 {
        self.mu
    }

    /// Picks a token from probabilities (any order) with the uniform number `u`, and
    /// updates `mu`.
    pub fn sample(&mut self, mut probs: Vec<Candidate>, u: f32) -> TokenId {
        sort_best_first(&mut probs);
        let keep = probs
            .iter()
            .position(|c| c.value <= 0.0 || -c.value.log2() > self.mu)
            .unwrap_or(probs.len())
            .max(1);
        probs.truncate(keep);
        let total: f32 = probs.iter().map(|c| c.value).sum();
        for c in probs.iter_mut() {
            c.value /= total;
        }
        let id = draw(&probs, u);
        let p = probs.iter().find(|c| c.id == id).map_or(1.0, |c| c.value);
        let surprise = -p.log2();
        self.mu -= self.params.learning_rate * (surprise - self.params.target);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Probabilities given in id order.
    use crate::sampling::candidates as probs;

    #[test]
    fn truncates_to_the_surprise_budget_and_learns() {
        // tau = 1 bit → mu = 2: tokens with p >= 0.25 survive (0.5 and 0.3; 0.2 is 2.32 bits).
        let mut m = Mirostat::new(MirostatParams {
            target: 1.0,
            learning_rate: 0.5,
        });
        assert_eq!(m.mu(), 2.0);
        // u = 0.9 in the renormalised [0.625, 0.375] picks token 1.
        let id = m.sample(probs(&[0.5, 0.3, 0.2]), 0.9);
        assert_eq!(id, 1);
        // Observed surprise -log2(0.375) = 1.415; mu -= 0.5 * (1.415 - 1).
        let expected = 2.0 - 0.5 * (-(0.375f32).log2() - 1.0);
        assert!((m.mu() - expected).abs() < 1e-6, "{}", m.mu());
    }

    #[test]
    fn always_keeps_one_token() {
        let mut m = Mirostat::new(MirostatParams {
            target: 0.01,
            learning_rate: 0.1,
        });
        assert_eq!(m.sample(probs(&[0.1, 0.6, 0.3]), 0.99), 1);
    }
}
