//! Truncation filters over candidates: each keeps part of the distribution and, where it
//! works on probabilities, renormalises what it keeps. Pure functions.

use super::Candidate;
use crate::tokenizer::TokenId;

/// All tokens of a logits row as candidates, in id order.
pub fn candidates(logits: &[f32]) -> Vec<Candidate> {
    logits
        .iter()
        .enumerate()
        .map(|(i, &v)| Candidate {
            id: i as TokenId,
            value: v,
        })
        .collect()
}

/// The `k` candidates with the highest logits, sorted best first, ties kept by lower id
/// (the first `k` of `sort_best_first` over every token; a `k` of 0 is taken as 1). The
/// vector holds `k` entries' worth of memory, not the vocabulary's it was chosen from:
/// callers keep it (a token's alternatives live as long as its request, and `collect` into
/// a same-sized type reuses the allocation), and at 49,152 tokens a vocabulary's worth is
/// 384 KiB.
///
/// One pass over the logits, a span of `SPAN` (64) at a time: once `4k` are gathered (at
/// least 256, and no more than there are logits), the best `k` of them stay and the
/// `k`-th's value becomes the floor; a span whose largest value is not above it is passed
/// over whole. Building a candidate for every token and selecting among them took 0.87 ms
/// a token at `k` = 40 over Gemma 3's 262,144, this 0.15 (`benches/sampling.rs`).
pub fn top_k(logits: &[f32], k: usize) -> Vec<Candidate> {
    let k = k.max(1);
    if k >= logits.len() {
        let mut c = candidates(logits);
        sort_best_first(&mut c);
        return c;
    }
    let capacity = (4 * k).max(256).min(logits.len());
    let mut kept: Vec<Candidate> = Vec::with_capacity(capacity);
    // Only values ranked above the floor can still be among the best `k`: an equal one
    // comes later, so its id is higher than the `k`-th's.
    let mut floor = None;
    for (s, span) in logits.chunks(SPAN).enumerate() {
        if let Some(floor) = floor {
            let best = span.iter().map(|&v| total_key(v)).max();
            if best.is_none_or(|best| best <= floor) {
                continue;
            }
        }
        for (j, &value) in span.iter().enumerate() {
            if floor.is_some_and(|floor| total_key(value) <= floor) {
                continue;
            }
            kept.push(Candidate {
                id: (s * SPAN + j) as TokenId,
                value,
            });
            if kept.len() == capacity {
                keep_best(&mut kept, k);
                floor = Some(total_key(kept[k - 1].value));
            }
        }
    }
    keep_best(&mut kept, k);
    sort_best_first(&mut kept);
    kept.shrink_to_fit();
    kept
}

/// Logits a span of [`top_k`]'s pass takes: its largest key is found first (a loop the
/// compiler may vectorise), and the span passed over if that is not above the floor.
const SPAN: usize = 64;

/// `value` as an integer that orders as [`f32::total_cmp`] orders values (negative NaNs
/// lowest, then -∞ … -0, 0 … ∞, positive NaNs highest).
fn total_key(value: f32) -> i32 {
    let bits = value.to_bits() as i32;
    // Negative values' bits other than the sign flipped: larger magnitudes rank lower.
    bits ^ (((bits >> 31) as u32) >> 1) as i32
}

/// Keeps the best `k` of `candidates` as [`sort_best_first`] ranks them (in no order).
fn keep_best(candidates: &mut Vec<Candidate>, k: usize) {
    if candidates.len() > k {
        candidates.select_nth_unstable_by(k - 1, best_first);
        candidates.truncate(k);
    }
}

/// [`sort_best_first`]'s order: higher value first, ties by lower id.
fn best_first(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.value.total_cmp(&a.value).then(a.id.cmp(&b.id))
}

/// Sorts by value, highest first (ties by id, so the order is deterministic).
pub fn sort_best_first(candidates: &mut [Candidate]) {
    candidates.sort_by(best_first);
}

/// Divides every logit by `temperature`.
pub fn apply_temperature(candidates: &mut [Candidate], temperature: f32) {
    for c in candidates {
        c.value /= temperature;
    }
}

/// Turns logits into probabilities that sum to 1. Tokens at -inf get probability 0.
pub fn softmax_in_place(candidates: &mut [Candidate]) {
    let max = super::largest(candidates, |c| c.value);
    // As `sum_exp`: a stretch at a time through a buffer on the stack.
    let mut sums = super::LaneSums::default();
    let mut buffer = [0f32; super::STRETCH];
    for stretch in candidates.chunks_mut(super::STRETCH) {
        let e = &mut buffer[..stretch.len()];
        for (e, c) in e.iter_mut().zip(stretch.iter()) {
            *e = c.value - max;
        }
        crate::simd::exp_in_place(e);
        sums.add(e);
        for (c, &e) in stretch.iter_mut().zip(e.iter()) {
            c.value = e;
        }
    }
    let sum = sums.total();
    for c in candidates.iter_mut() {
        c.value /= sum;
    }
}

/// Divides the probabilities by their sum.
fn renormalise(candidates: &mut [Candidate]) {
    let total: f32 = candidates.iter().map(|c| c.value).sum();
    if total > 0.0 {
        for c in candidates.iter_mut() {
            c.value /= total;
        }
    }
}

/// Keeps the shortest prefix (at least one) whose probabilities reach `mass`, and
/// renormalises it.
pub(super) fn keep_prefix_with_mass(candidates: &mut Vec<Candidate>, mass: f32) {
    let keep = prefix_reaching(candidates, mass).unwrap_or(candidates.len());
    candidates.truncate(keep.max(1));
    renormalise(candidates);
}

/// The length of the shortest prefix whose probabilities, summed in order, reach `mass`;
/// `None` where all of them do not.
fn prefix_reaching(candidates: &[Candidate], mass: f32) -> Option<usize> {
    let mut total = 0.0;
    candidates
        .iter()
        .position(|c| {
            total += c.value;
            total >= mass
        })
        .map(|i| i + 1)
}

/// Nucleus: keeps the smallest prefix of the probabilities sorted best first (ties by id)
/// whose mass reaches `top_p`, and renormalises it. The candidates may come in any order;
/// the kept ones are left sorted best first.
///
/// The prefix is found without sorting the whole vocabulary (262,144 tokens for Gemma 3,
/// at every token of every sequence with a `top_p`): the tokens at least as likely as a
/// threshold are the head of the sorted order, so where their mass reaches `top_p` the
/// prefix lies among them, and only they are sorted. The thresholds are the best
/// probability over 2^10, then over 2^20, then none (every token); a NaN anywhere (whose
/// place in the order depends on its sign) takes the last at once. The order is that of
/// the probabilities: two logits that round to one probability are in id order.
pub fn apply_top_p(candidates: &mut Vec<Candidate>, top_p: f32) {
    // A NaN `top_p` cuts nothing.
    if top_p >= 1.0 || top_p.is_nan() || candidates.is_empty() {
        return;
    }
    let best = super::largest(candidates, |c| c.value).max(0.0);
    let thresholds = match candidates.iter().any(|c| c.value.is_nan()) {
        true => [None, None, None],
        false => [Some(best / 1024.0), Some(best / 1_048_576.0), None],
    };
    for threshold in thresholds {
        // The head: every candidate at or above the threshold, moved to the front.
        let head = match threshold {
            Some(threshold) => {
                let mut head = 0;
                for i in 0..candidates.len() {
                    if candidates[i].value >= threshold {
                        candidates.swap(head, i);
                        head += 1;
                    }
                }
                head
            }
            None => candidates.len(),
        };
        sort_best_first(&mut candidates[..head]);
        // The same sums, in the same order, as over the whole vocabulary sorted.
        let reached = prefix_reaching(&candidates[..head], top_p);
        if reached.is_some() || head == candidates.len() {
            candidates.truncate(reached.unwrap_or(head).max(1));
            renormalise(candidates);
            return;
        }
    }
}

/// Min-p: keeps the tokens whose probability is at least `min_p` times the largest one,
/// sorted best first, and renormalises them in that order. The candidates may come in any
/// order: only the kept ones are sorted (found in one pass where they were already).
pub fn apply_min_p(candidates: &mut Vec<Candidate>, min_p: f32) {
    if min_p <= 0.0 || candidates.is_empty() {
        return;
    }
    let max = super::largest(candidates, |c| c.value).max(0.0);
    let threshold = min_p * max;
    candidates.retain(|c| c.value >= threshold);
    sort_best_first(candidates);
    renormalise(candidates);
}

/// Locally typical sampling: orders tokens by how far their surprise `-ln p` is from the
/// distribution's entropy, keeps the closest ones until their mass reaches `typical_p`,
/// renormalises, and leaves them sorted best first.
pub fn apply_typical_p(candidates: &mut Vec<Candidate>, typical_p: f32) {
    if typical_p >= 1.0 || candidates.is_empty() {
        return;
    }
    let entropy: f32 = candidates
        .iter()
        .filter(|c| c.value > 0.0)
        .map(|c| -c.value * c.value.ln())
        .sum();
    let distance = |c: &Candidate| {
        if c.value > 0.0 {
            (-c.value.ln() - entropy).abs()
        } else {
            f32::INFINITY
        }
    };
    candidates.sort_by(|a, b| distance(a).total_cmp(&distance(b)).then(a.id.cmp(&b.id)));
    keep_prefix_with_mass(candidates, typical_p);
    sort_best_first(candidates);
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
    candidates
        .iter()
        .rev()
        .find(|c| c.value > 0.0)
        .or(candidates.last())
        .map_or(0, |c| c.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Probabilities given in id order.
    use super::candidates as probs;

    fn ids(c: &[Candidate]) -> Vec<TokenId> {
        c.iter().map(|c| c.id).collect()
    }

    #[test]
    fn top_k_keeps_the_best_sorted() {
        // Only k entries' worth of memory is kept.
        assert!(top_k(&vec![0.0; 50_000], 3).capacity() < 64);
        let c = top_k(&[0.1, 3.0, 2.0, 5.0], 2);
        assert_eq!(ids(&c), vec![3, 1]);
    }

    #[test]
    fn top_p_keeps_the_smallest_prefix_reaching_the_mass() {
        let mut c = probs(&[0.5, 0.3, 0.2]);
        apply_top_p(&mut c, 0.75);
        assert_eq!(c.len(), 2);
        assert!((c[0].value - 0.625).abs() < 1e-6 && (c[1].value - 0.375).abs() < 1e-6);
    }

    /// The nucleus as a whole vocabulary sorted gives it (the kept tokens, their order
    /// and their values, bit for bit), over distributions whose prefix ends above the first
    /// threshold, between the two, and below both, and with ties and a NaN.
    #[test]
    fn top_p_keeps_what_sorting_everything_keeps() {
        let sorted_then_cut = |c: &[Candidate], top_p: f32| {
            let mut c = c.to_vec();
            sort_best_first(&mut c);
            keep_prefix_with_mass(&mut c, top_p);
            c
        };
        let mut rng = crate::quant::sample::Xorshift::new(5);
        // The last spread underflows most probabilities to exactly 0 (ties in id order),
        // and a top_p of 1 less an ulp may never be reached: every stage is taken.
        for (spread, n) in [
            (0.5f32, 300),
            (4.0, 3000),
            (12.0, 3000),
            (30.0, 5000),
            (300.0, 3000),
        ] {
            // Logits with a steep or a flat fall, a few ties, shuffled ids.
            let mut logits: Vec<f32> = (0..n)
                .map(|i| -spread * (i as f32 / n as f32) + 0.01 * (rng.next_u64() % 7) as f32)
                .collect();
            logits[n / 2] = logits[0];
            let mut c = probs(&logits);
            softmax_in_place(&mut c);
            for i in (1..n).rev() {
                c.swap(i, rng.next_u64() as usize % (i + 1));
            }
            for top_p in [0.01, 0.3, 0.9, 0.999, 0.999_999, 0.999_999_94] {
                let mut fast = c.clone();
                apply_top_p(&mut fast, top_p);
                let slow = sorted_then_cut(&c, top_p);
                assert_eq!(ids(&fast), ids(&slow), "spread {spread}, top_p {top_p}");
                let bits =
                    |c: &[Candidate]| c.iter().map(|c| c.value.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast), bits(&slow));
            }
        }
        let mut c = probs(&[0.25, f32::NAN, 0.5, 0.25]);
        let slow = sorted_then_cut(&c, 0.5);
        apply_top_p(&mut c, 0.5);
        assert_eq!(ids(&c), ids(&slow));
        let bits = |c: &[Candidate]| c.iter().map(|c| c.value.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&c), bits(&slow));
        // A NaN top_p cuts nothing.
        let mut c = probs(&[0.25, 0.5, 0.25]);
        apply_top_p(&mut c, f32::NAN);
        assert_eq!(ids(&c), [0, 1, 2]);
    }

    #[test]
    fn min_p_drops_tokens_below_the_scaled_maximum() {
        // max 0.5, min_p 0.3 → threshold 0.15: 0.1 goes, the rest renormalise to 1.
        let mut c = probs(&[0.5, 0.25, 0.15, 0.1]);
        apply_min_p(&mut c, 0.3);
        assert_eq!(ids(&c), vec![0, 1, 2]);
        assert!((c[0].value - 0.5 / 0.9).abs() < 1e-6);
    }

    #[test]
    fn typical_p_keeps_tokens_closest_to_the_entropy() {
        // Entropy of [0.7, 0.2, 0.1] is 0.8018 nats; surprises are 0.357, 1.609, 2.303,
        // so the distances order the tokens 0 (0.445), 1 (0.808), 2 (1.501).
        let mut c = probs(&[0.7, 0.2, 0.1]);
        apply_typical_p(&mut c, 0.8);
        assert_eq!(ids(&c), vec![0, 1]);
        assert!((c[0].value - 0.7 / 0.9).abs() < 1e-6);
        // A mass already reached by the first keeps only it.
        let mut c = probs(&[0.7, 0.2, 0.1]);
        apply_typical_p(&mut c, 0.5);
        assert_eq!(ids(&c), vec![0]);
    }

    #[test]
    fn typical_p_can_drop_the_most_likely_token() {
        // Entropy of [0.9, 0.05, 0.05] is 0.394; surprises 0.105, 2.996, 2.996: the top
        // token is the closest. With [0.4, 0.3, 0.3] (entropy 1.089; surprises 0.916,
        // 1.204, 1.204) the distances are 0.173, 0.115, 0.115: the two 0.3s come first.
        let mut c = probs(&[0.4, 0.3, 0.3]);
        apply_typical_p(&mut c, 0.5);
        assert_eq!(ids(&c), vec![1, 2]);
    }

    #[test]
    fn draw_walks_the_cumulative_mass() {
        let c = probs(&[0.2, 0.5, 0.3]);
        assert_eq!(draw(&c, 0.1), 0);
        assert_eq!(draw(&c, 0.2), 1);
        assert_eq!(draw(&c, 0.69), 1);
        assert_eq!(draw(&c, 0.7), 2);
        assert_eq!(draw(&c, 0.999_999_9), 2);
    }
}
