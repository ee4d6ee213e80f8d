//! Logit processors: each adjusts a logits row in place from the request and the tokens
//! so far. Pure functions.

use std::collections::HashMap;

use crate::tokenizer::TokenId;

/// Adds each `(token, bias)` to that token's logit.
pub fn apply_logit_bias(logits: &mut [f32], bias: &[(TokenId, f32)]) {
    for &(id, b) in bias {
        if let Some(l) = logits.get_mut(id as usize) {
            *l += b;
        }
    }
}

/// Makes the given tokens impossible.
pub fn ban(logits: &mut [f32], tokens: &[TokenId]) {
    for &id in tokens {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// CTRL's repetition penalty over every token seen (prompt and output): a positive logit
/// is divided by `penalty`, a negative one multiplied, so `penalty > 1` discourages
/// repeats and `< 1` encourages them.
pub fn apply_repetition_penalty(
    logits: &mut [f32],
    seen: impl IntoIterator<Item = TokenId>,
    penalty: f32,
) {
    if penalty == 1.0 {
        return;
    }
    for id in seen {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
        }
    }
}

/// OpenAI's frequency and presence penalties over the generated tokens' counts:
/// `logit -= count * frequency + (count > 0) * presence`.
pub fn apply_frequency_presence(
    logits: &mut [f32],
    counts: &HashMap<TokenId, u32>,
    frequency: f32,
    presence: f32,
) {
    if frequency == 0.0 && presence == 0.0 {
        return;
    }
    for (&id, &count) in counts {
        if let Some(l) = logits.get_mut(id as usize) {
            *l -= count as f32 * frequency + if count > 0 { presence } else { 0.0 };
        }
    }
}

/// DRY ("don't repeat yourself") settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DryParams {
    /// Penalty scale; 0 turns DRY off.
    pub multiplier: f32,
    /// Growth of the penalty per token of repeat beyond the allowed length.
    pub base: f32,
    /// Longest repeat that goes unpunished.
    pub allowed_length: usize,
    /// Tokens that end a repeat (their text contains a sequence breaker).
    pub breakers: Vec<TokenId>,
}

/// Most recent tokens DRY searches for repeats.
const DRY_WINDOW: usize = 4096;

/// DRY: for each token that would extend a repeat of the context's last tokens (a
/// sequence seen earlier and followed then by that token), subtracts
/// `multiplier * base^(length - allowed_length)` from its logit, `length` being the
/// longest such repeat, when it is at least `allowed_length`. Repeats do not extend over
/// breaker tokens.
pub fn apply_dry(logits: &mut [f32], context: &[TokenId], dry: &DryParams) {
    if dry.multiplier == 0.0 || context.len() < 2 {
        return;
    }
    let context = &context[context.len().saturating_sub(DRY_WINDOW)..];
    let is_breaker = |t: TokenId| dry.breakers.contains(&t);
    let last = context.len() - 1;
    let mut longest: HashMap<TokenId, usize> = HashMap::new();
    // Each earlier position `end` that matches the last token starts a candidate repeat:
    // its length is how far the two suffixes agree backwards.
    for end in 0..last {
        let mut len = 0;
        while len <= end
            && context[end - len] == context[last - len]
            && !is_breaker(context[end - len])
        {
            len += 1;
        }
        if len == 0 {
            continue;
        }
        let next = context[end + 1];
        if is_breaker(next) {
            continue;
        }
        let entry = longest.entry(next).or_default();
        *entry = (*entry).max(len);
    }
    for (id, len) in longest {
        if len >= dry.allowed_length {
            let penalty = dry.multiplier * dry.base.powi((len - dry.allowed_length) as i32);
            if let Some(l) = logits.get_mut(id as usize) {
                *l -= penalty;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logit_bias_adds_and_ignores_ids_outside_the_row() {
        let mut l = vec![1.0, 2.0, 3.0];
        apply_logit_bias(&mut l, &[(0, 100.0), (2, -1.5), (9, 5.0)]);
        assert_eq!(l, vec![101.0, 2.0, 1.5]);
    }

    #[test]
    fn ban_sets_minus_infinity() {
        let mut l = vec![1.0, 2.0];
        ban(&mut l, &[1]);
        assert_eq!(l, vec![1.0, f32::NEG_INFINITY]);
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
        let mut l = vec![2.0, -2.0, 3.0];
        apply_repetition_penalty(&mut l, [0, 1], 2.0);
        assert_eq!(l, vec![1.0, -4.0, 3.0]);
    }

    #[test]
    fn frequency_and_presence_follow_openai() {
        let mut l = vec![0.0, 0.0, 0.0];
        let counts = HashMap::from([(0, 3), (1, 1)]);
        apply_frequency_presence(&mut l, &counts, 0.5, 0.25);
        assert_eq!(l, vec![-1.75, -0.75, 0.0]);
    }

    #[test]
    fn dry_penalises_the_token_that_would_continue_a_repeat() {
        // Context "1 2 3 4 | 1 2 3": a repeat of length 3 ending in 3, followed before by 4.
        let dry = DryParams {
            multiplier: 0.8,
            base: 2.0,
            allowed_length: 2,
            breakers: vec![],
        };
        let mut l = vec![0.0; 6];
        apply_dry(&mut l, &[1, 2, 3, 4, 1, 2, 3], &dry);
        // length 3, allowed 2 → 0.8 * 2^1.
        assert_eq!(l, vec![0.0, 0.0, 0.0, 0.0, -1.6, 0.0]);
    }

    #[test]
    fn dry_allows_short_repeats_and_stops_at_breakers() {
        let dry = DryParams {
            multiplier: 1.0,
            base: 2.0,
            allowed_length: 3,
            breakers: vec![9],
        };
        let mut l = vec![0.0; 10];
        apply_dry(&mut l, &[1, 2, 5, 1, 2], &dry);
        assert!(l.iter().all(|&v| v == 0.0), "a repeat of 2 < 3 is allowed");
        let mut l = vec![0.0; 10];
        apply_dry(&mut l, &[9, 1, 2, 3, 5, 7, 9, 1, 2, 3], &dry);
        // The repeat "1 2 3" has length 3 (the breaker 9 before it does not count).
        assert_eq!(l[5], -1.0);
        let dry = DryParams {
            multiplier: 0.0,
            ..dry
        };
        let mut l = vec![0.0; 10];
        apply_dry(&mut l, &[1, 2, 3, 1, 2, 3], &dry);
        assert!(l.iter().all(|&v| v == 0.0), "multiplier 0 is off");
    }
}
