//! Turning a logits row into the next token: temperature, top-k and top-p (nucleus)
//! filtering, then a draw from a per-sequence seeded ChaCha generator.
//!
//! Order, fixed: greedy short-circuit when `temperature == 0`; otherwise top-k, then
//! temperature, then softmax, then top-p, then the draw.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::tokenizer::TokenId;

/// How a sequence picks its tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 keeps everything.
    pub top_p: f32,
    /// Keep only the k most likely tokens; `None` keeps all.
    pub top_k: Option<usize>,
    /// Seed of this sequence's generator.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            seed: 0,
        }
    }
}

/// `ln softmax(logits)`, computed stably.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let log_sum = log_sum_exp(logits);
    logits.iter().map(|&l| l - log_sum).collect()
}

/// `ln Σ exp(logits)`, computed stably; `logit - log_sum_exp` is a log-probability.
pub fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln()
}

/// Index of the largest value (the first on ties).
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

/// A token and its (unnormalised) weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The token.
    pub id: TokenId,
    /// Its logit, or after [`softmax_in_place`] its probability.
    pub value: f32,
}

/// The `k` candidates with the highest logits, sorted best first.
pub fn top_k(logits: &[f32], k: usize) -> Vec<Candidate> {
    let mut c: Vec<Candidate> = logits
        .iter()
        .enumerate()
        .map(|(i, &v)| Candidate {
            id: i as TokenId,
            value: v,
        })
        .collect();
    let k = k.clamp(1, c.len());
    if k < c.len() {
        c.select_nth_unstable_by(k - 1, |a, b| b.value.total_cmp(&a.value));
        c.truncate(k);
    }
    c.sort_by(|a, b| b.value.total_cmp(&a.value));
    c
}

/// Divides every logit by `temperature`.
pub fn apply_temperature(candidates: &mut [Candidate], temperature: f32) {
    for c in candidates {
        c.value /= temperature;
    }
}

/// Turns logits into probabilities that sum to 1.
pub fn softmax_in_place(candidates: &mut [Candidate]) {
    let max = candidates
        .iter()
        .map(|c| c.value)
        .fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for c in candidates.iter_mut() {
        c.value = (c.value - max).exp();
        sum += c.value;
    }
    for c in candidates.iter_mut() {
        c.value /= sum;
    }
}

/// Keeps the smallest prefix of the (sorted, best-first) probabilities whose mass
/// reaches `top_p`, and renormalises it.
pub fn apply_top_p(candidates: &mut Vec<Candidate>, top_p: f32) {
    if top_p >= 1.0 {
        return;
    }
    let mut mass = 0.0;
    let mut keep = candidates.len();
    for (i, c) in candidates.iter().enumerate() {
        mass += c.value;
        if mass >= top_p {
            keep = i + 1;
            break;
        }
    }
    candidates.truncate(keep.max(1));
    let total: f32 = candidates.iter().map(|c| c.value).sum();
    for c in candidates.iter_mut() {
        c.value /= total;
    }
}

/// Draws a token from probabilities with a uniform number `u` in [0, 1).
pub fn draw(candidates: &[Candidate], u: f32) -> TokenId {
    let mut acc = 0.0;
    for c in candidates {
        acc += c.value;
        if u < acc {
            return c.id;
        }
    }
    candidates.last().map_or(0, |c| c.id)
}

/// Picks tokens for one sequence with its own seeded generator, so a seeded sequence
/// draws the same tokens whatever else runs beside it.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// A sampler whose generator starts from `params.seed`.
    pub fn new(params: SamplingParams) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Self { params, rng }
    }

    /// Picks the next token from a logits row.
    pub fn sample(&mut self, logits: &[f32]) -> TokenId {
        if self.params.temperature <= 0.0 {
            return argmax(logits) as TokenId;
        }
        let k = self.params.top_k.unwrap_or(logits.len());
        let mut candidates = if k >= logits.len() && self.params.top_p >= 1.0 {
            // Nothing to cut: no need to sort the whole vocabulary.
            logits
                .iter()
                .enumerate()
                .map(|(i, &v)| Candidate {
                    id: i as TokenId,
                    value: v,
                })
                .collect()
        } else {
            top_k(logits, k)
        };
        apply_temperature(&mut candidates, self.params.temperature);
        softmax_in_place(&mut candidates);
        apply_top_p(&mut candidates, self.params.top_p);
        let u: f32 = self.rng.random();
        draw(&candidates, u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_normalises() {
        let lp = log_softmax(&[1.0, 2.0, 3.0]);
        let total: f32 = lp.iter().map(|v| v.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!((lp[2] - lp[1] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn log_sum_exp_gives_the_log_normaliser() {
        let expected = (1f32.exp() + 2f32.exp() + 3f32.exp()).ln();
        assert!((log_sum_exp(&[1.0, 2.0, 3.0]) - expected).abs() < 1e-6);
    }

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&[0.1, 3.0, 2.9, -1.0]), 1);
    }

    #[test]
    fn top_k_keeps_the_best_sorted() {
        let c = top_k(&[0.1, 3.0, 2.0, 5.0], 2);
        assert_eq!(c.iter().map(|c| c.id).collect::<Vec<_>>(), vec![3, 1]);
    }

    #[test]
    fn top_p_keeps_the_smallest_prefix_reaching_the_mass() {
        let mut c = vec![
            Candidate { id: 0, value: 0.5 },
            Candidate { id: 1, value: 0.3 },
            Candidate { id: 2, value: 0.2 },
        ];
        apply_top_p(&mut c, 0.75);
        assert_eq!(c.len(), 2);
        assert!((c[0].value - 0.625).abs() < 1e-6 && (c[1].value - 0.375).abs() < 1e-6);
    }

    #[test]
    fn seed_fixes_the_draws() {
        let params = SamplingParams {
            temperature: 1.0,
            seed: 42,
            ..Default::default()
        };
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |p: SamplingParams| {
            let mut s = Sampler::new(p);
            (0..20).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(params.clone()), run(params.clone()));
        assert_ne!(
            run(params.clone()),
            run(SamplingParams { seed: 43, ..params })
        );
    }
}
