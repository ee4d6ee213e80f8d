//! Causal attention against a sequence's paged f16 KV cache, with the numerics of
//! llama.cpp's CPU flash attention (one query row at a time): the query is rounded to
//! f16, key dot products accumulate in f32 over 4 × 16 lanes, and the weighted sum of
//! values accumulates in f16 with an online softmax. The models are sensitive enough to
//! these roundings that matching them is what makes greedy output agree with llama.cpp.
//! The AVX2 and AVX-512 versions in `attention_simd.rs` give bit-identical results
//! faster.

use half::f16;
use rayon::prelude::*;

use crate::kv_cache::LayerView;

/// The geometry of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_head`).
    pub n_kv_head: usize,
    /// Dimensions per head.
    pub head_dim: usize,
    /// Factor applied to query·key.
    pub scale: f32,
    /// Sliding window: a query at position p sees keys at positions > p - window.
    pub window: Option<usize>,
}

/// The new rows of one sequence: their queries, and the cache they attend to, whose last
/// `n` positions are theirs.
#[derive(Clone, Copy)]
pub struct AttentionInput<'a> {
    /// `n × n_head × head_dim` queries.
    pub q: &'a [f32],
    /// The sequence's keys and values for this layer, the new rows' included.
    pub kv: LayerView<'a>,
    /// New rows.
    pub n: usize,
}

/// The keys and values one query row attends to: positions `first..=last` of one KV head.
#[derive(Clone, Copy)]
pub(super) struct KvRows<'a> {
    pub(super) view: LayerView<'a>,
    /// Where this KV head starts within a position.
    pub(super) offset: usize,
    first: usize,
    last: usize,
}

impl<'a> KvRows<'a> {
    /// The attended positions in block-contiguous runs: the run's keys and values (every
    /// KV head, `kv_width` per position) and its length.
    pub(super) fn runs(&self) -> impl Iterator<Item = (&'a [f16], &'a [f16], usize)> + '_ {
        self.view.runs(self.first..self.last + 1).map(|r| {
            (
                self.view.key_run(r.clone()),
                self.view.value_run(r.clone()),
                r.len(),
            )
        })
    }
}

/// Causal attention of the new rows of several sequences (in order; each one's keys and
/// values already written to its cache). Returns every row's `n_head × head_dim` output,
/// in input order. Query rows are independent and all run in one parallel pass.
pub fn attend_many(shape: &AttentionShape, inputs: &[AttentionInput<'_>]) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if shape.head_dim.is_multiple_of(64) && crate::quant::simd::available() {
        // SAFETY: AVX2, FMA and F16C are available and the head size is a multiple of 64.
        return unsafe { attend_with(shape, inputs, super::attention_simd::attend_rows) };
    }
    attend_portable_many(shape, inputs)
}

/// [`attend_many`] for one sequence.
pub fn attend(shape: &AttentionShape, input: AttentionInput<'_>) -> Vec<f32> {
    attend_many(shape, &[input])
}

/// [`attend`] in portable code.
pub fn attend_portable(shape: &AttentionShape, input: AttentionInput<'_>) -> Vec<f32> {
    attend_portable_many(shape, &[input])
}

fn attend_portable_many(shape: &AttentionShape, inputs: &[AttentionInput<'_>]) -> Vec<f32> {
    let portable: GroupKernel = |q, kv, head_dim, scale, out| {
        for (q, o) in q.chunks_exact(head_dim).zip(out.chunks_exact_mut(head_dim)) {
            attend_row(q, kv, scale, o);
        }
    };
    // SAFETY: the portable kernel has no requirements.
    unsafe { attend_with(shape, inputs, portable) }
}

/// Attention for the query rows of one group of heads sharing a KV head (`q` and `out`
/// hold them one after another, `head_dim` each), with the given scale.
pub(super) type GroupKernel =
    unsafe fn(q: &[f32], kv: &KvRows<'_>, head_dim: usize, scale: f32, out: &mut [f32]);

/// Attention with `kernel` for every row and KV head, in one parallel pass.
///
/// # Safety
/// `kernel`'s requirements must hold for `shape`.
unsafe fn attend_with(
    shape: &AttentionShape,
    inputs: &[AttentionInput<'_>],
    kernel: GroupKernel,
) -> Vec<f32> {
    let AttentionShape {
        n_head,
        n_kv_head,
        head_dim,
        scale,
        window,
    } = *shape;
    let group = n_head / n_kv_head;
    // Each new row: its input and its index within it.
    let rows: Vec<(usize, usize)> = inputs
        .iter()
        .enumerate()
        .flat_map(|(i, input)| (0..input.n).map(move |t| (i, t)))
        .collect();
    for input in inputs {
        assert!(
            input.kv.kv_width() == n_kv_head * head_dim
                && input.kv.positions() >= input.n
                && input.q.len() >= input.n * n_head * head_dim
        );
    }
    let mut out = vec![0.0f32; rows.len() * n_head * head_dim];
    // One task per new row and KV head: the `group` query heads that share it.
    out.par_chunks_mut(group * head_dim)
        .enumerate()
        .for_each(|(task, o)| {
            let ((i, t), kv_head) = (rows[task / n_kv_head], task % n_kv_head);
            let input = &inputs[i];
            let pos = input.kv.positions() - input.n + t;
            let kv = KvRows {
                view: input.kv,
                offset: kv_head * head_dim,
                first: window.map_or(0, |w| (pos + 1).saturating_sub(w)),
                last: pos,
            };
            let q = &input.q[(t * n_head + kv_head * group) * head_dim..][..group * head_dim];
            // SAFETY: the caller guarantees `kernel`'s requirements.
            unsafe { kernel(q, &kv, head_dim, scale, o) };
        });
    out
}

/// One query row in portable code.
fn attend_row(q: &[f32], kv: &KvRows<'_>, scale: f32, out: &mut [f32]) {
    let head_dim = q.len();
    let stride = kv.view.kv_width();
    let q16: Vec<f16> = q.iter().map(|&x| f16::from_f32(x)).collect();
    let mut acc = vec![f16::ZERO; head_dim];
    let mut max = f32::NEG_INFINITY;
    let mut sum = 0.0f32;
    for (keys, values, len) in kv.runs() {
        for j in 0..len {
            let at = j * stride + kv.offset;
            let s = dot_f16(&q16, &keys[at..at + head_dim]) * scale;
            let (mut rescale, mut weight) = (1.0f32, 1.0f32);
            if s > max {
                rescale = (max - s).exp();
                max = s;
                for a in acc.iter_mut() {
                    *a = f16::from_f32(a.to_f32() * rescale);
                }
            } else {
                weight = (s - max).exp();
            }
            for (a, v) in acc.iter_mut().zip(&values[at..at + head_dim]) {
                *a = f16::from_f32(v.to_f32().mul_add(weight, a.to_f32()));
            }
            sum = sum.mul_add(rescale, weight);
        }
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = a.to_f32() * inv;
    }
}

/// f16 dot product accumulated in f32 the way ggml's AVX-512 `ggml_vec_dot_f16` does:
/// four accumulators of sixteen lanes over steps of 64, reduced pairwise, then a tree
/// over the lanes. Any tail past a multiple of 64 is added in order.
fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
    let mut acc = [[0f32; 16]; 4];
    let body = a.len() / 64 * 64;
    for step in (0..body).step_by(64) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, lane) in lanes.iter_mut().enumerate() {
                let i = step + j * 16 + l;
                *lane = a[i].to_f32().mul_add(b[i].to_f32(), *lane);
            }
        }
    }
    let mut x = [[0f32; 16]; 2];
    for l in 0..16 {
        x[0][l] = acc[0][l] + acc[2][l];
        x[1][l] = acc[1][l] + acc[3][l];
    }
    let mut v = [0f32; 16];
    for l in 0..16 {
        v[l] = x[0][l] + x[1][l];
    }
    let mut sum = reduce_add_16(&v) as f64;
    for i in body..a.len() {
        sum += (a[i].to_f32() * b[i].to_f32()) as f64;
    }
    sum as f32
}

/// `_mm512_reduce_add_ps`: halves added, then quarters, then pairs, then neighbours.
fn reduce_add_16(v: &[f32; 16]) -> f32 {
    let mut h = [0f32; 8];
    for i in 0..8 {
        h[i] = v[i] + v[i + 8];
    }
    let q = [h[0] + h[4], h[1] + h[5], h[2] + h[6], h[3] + h[7]];
    let p = [q[0] + q[2], q[1] + q[3]];
    p[0] + p[1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::SequenceCache;

    /// A one-layer cache holding `keys` and `values` (`kv_width` per position).
    fn cache(kv_width: usize, keys: &[f32], values: &[f32]) -> SequenceCache {
        let mut c = SequenceCache::new(1, kv_width, keys.len() / kv_width);
        c.write(0, keys, values);
        c.commit(keys.len() / kv_width);
        c
    }

    fn input<'a>(c: &'a SequenceCache, q: &'a [f32], n: usize) -> AttentionInput<'a> {
        AttentionInput {
            q,
            kv: c.layer(0, c.len()),
            n,
        }
    }

    #[test]
    fn attention_to_one_key_returns_its_value() {
        let shape = AttentionShape {
            n_head: 2,
            n_kv_head: 1,
            head_dim: 2,
            scale: 1.0,
            window: None,
        };
        let c = cache(2, &[0.5, 0.5], &[2.0, 3.0]);
        let out = attend(&shape, input(&c, &[1.0, 0.0, 0.0, 1.0], 1));
        assert_eq!(out, vec![2.0, 3.0, 2.0, 3.0]);
    }

    #[test]
    fn sliding_window_hides_old_keys() {
        let shape = AttentionShape {
            n_head: 1,
            n_kv_head: 1,
            head_dim: 1,
            scale: 1.0,
            window: Some(1),
        };
        let c = cache(1, &[1.0, 1.0], &[5.0, 7.0]);
        assert_eq!(attend(&shape, input(&c, &[1.0], 1)), vec![7.0]);
    }

    /// The SIMD kernels, each with whether this CPU can run it.
    fn simd_kernels() -> Vec<(&'static str, GroupKernel, bool)> {
        #[cfg(target_arch = "x86_64")]
        {
            use super::super::attention_simd as simd;
            // What the CPU can run, whatever FERRITE_CPU says.
            let cpu = crate::cpu::detected();
            vec![
                ("AVX2", simd::attend_avx2 as GroupKernel, cpu.avx2),
                ("AVX-512", simd::attend_avx512 as GroupKernel, cpu.avx512),
            ]
        }
        #[cfg(not(target_arch = "x86_64"))]
        Vec::new()
    }

    #[test]
    fn simd_kernels_are_bit_identical_to_the_portable_one() {
        for (head_dim, n_head, n_kv_head, window) in [
            (64, 9, 3, None),
            (256, 4, 1, Some(21)),
            (128, 14, 2, Some(30)),
        ] {
            let shape = AttentionShape {
                n_head,
                n_kv_head,
                head_dim,
                scale: 0.125,
                window,
            };
            // Enough positions to span several cache blocks.
            let positions = 40;
            let n = 5;
            let mut rng = crate::quant::sample::Xorshift::new(head_dim as u64);
            let width = n_kv_head * head_dim;
            let keys: Vec<f32> = (0..positions * width)
                .map(|_| rng.next_f32() * 4.0)
                .collect();
            let values: Vec<f32> = (0..positions * width)
                .map(|_| rng.next_f32() * 6.0)
                .collect();
            let q: Vec<f32> = (0..n * n_head * head_dim)
                .map(|_| rng.next_f32() * 4.0)
                .collect();
            let c = cache(width, &keys, &values);
            let slow = attend_portable(&shape, input(&c, &q, n));
            for (name, kernel, usable) in simd_kernels() {
                if !usable {
                    continue;
                }
                // SAFETY: the kernel's CPU features are present; head sizes are multiples
                // of 64.
                let fast = unsafe { attend_with(&shape, &[input(&c, &q, n)], kernel) };
                assert!(
                    slow.iter()
                        .zip(&fast)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{name}, head_dim {head_dim}"
                );
            }
        }
    }

    #[test]
    fn several_sequences_attend_as_each_alone() {
        let shape = AttentionShape {
            n_head: 2,
            n_kv_head: 1,
            head_dim: 64,
            scale: 0.125,
            window: None,
        };
        let mut rng = crate::quant::sample::Xorshift::new(9);
        let mut r = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.next_f32()).collect() };
        let (a, b) = (
            cache(64, &r(64 * 20), &r(64 * 20)),
            cache(64, &r(64 * 3), &r(64 * 3)),
        );
        let (qa, qb) = (r(2 * 128), r(128));
        let together = attend_many(&shape, &[input(&a, &qa, 2), input(&b, &qb, 1)]);
        let mut alone = attend(&shape, input(&a, &qa, 2));
        alone.extend(attend(&shape, input(&b, &qb, 1)));
        assert_eq!(together, alone);
    }
}
