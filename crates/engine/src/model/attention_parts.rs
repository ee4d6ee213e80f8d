//! What the attention kernels share, beneath the dispatcher ([`super::attention`]) that
//! chooses among them: how a dot product becomes a score, the keys and values a query row
//! attends to, a row's running maximum and sum, the f16 query·key dot product of the row
//! kernels, and the final normalisation. The online softmax's steps are the vector
//! floor's ([`crate::simd::softmax`]).

use half::f16;

use crate::kv_cache::LayerView;
use crate::simd::reduce::reduce_add_16;
use crate::simd::softmax::STEP_KEYS;

/// How a query·key dot product becomes a score, as ggml's flash attention computes it:
/// `dot · factor`, then, with a soft cap, `cap · tanhf(that)` (libm's `tanhf`, as ggml).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreScale {
    pub(super) factor: f32,
    /// Zero for no cap.
    pub(super) cap: f32,
}

impl ScoreScale {
    /// The factor the dot product is multiplied by.
    pub fn factor(self) -> f32 {
        self.factor
    }

    /// The score of a dot product.
    #[inline]
    pub fn apply(self, dot: f32) -> f32 {
        self.cap(dot * self.factor)
    }

    /// Whether scores are soft-capped.
    pub fn is_capped(self) -> bool {
        self.cap != 0.0
    }

    /// The scores of a block's keys (at most [`STEP_KEYS`]) scaled and capped, -∞ past
    /// them: what [`crate::simd::softmax::KeySteps::fill_scaled`] takes.
    pub fn scaled_block(self, scores: &[f32]) -> [f32; STEP_KEYS] {
        let mut scaled = [f32::NEG_INFINITY; STEP_KEYS];
        for (s, &score) in scaled.iter_mut().zip(scores) {
            *s = self.apply(score);
        }
        scaled
    }

    /// A scaled score, soft-capped if the shape says so.
    #[inline]
    pub fn cap(self, scaled: f32) -> f32 {
        if self.cap != 0.0 {
            self.cap * scaled.tanh()
        } else {
            scaled
        }
    }
}

/// The keys and values one query row attends to: positions `first..=last` of one KV head.
#[derive(Clone, Copy)]
pub(super) struct KvRows<'a> {
    pub(super) view: LayerView<'a>,
    /// Where this KV head starts within a position.
    pub(super) offset: usize,
    pub(super) first: usize,
    pub(super) last: usize,
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

/// A query row's attention before normalisation: the largest score seen and the sum of
/// the weights (relative to it). The weighted values are kept beside it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Partial {
    pub(crate) max: f32,
    pub(crate) sum: f32,
}

impl Partial {
    /// Nothing attended yet.
    pub(crate) const EMPTY: Self = Self {
        max: f32::NEG_INFINITY,
        sum: 0.0,
    };
}

/// Divides the weighted values by the sum of the weights (nothing when it is zero).
pub(crate) fn normalise(acc: &mut [f32], sum: f32) {
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for a in acc {
        *a *= inv;
    }
}

/// f16 dot product accumulated in f32 the way ggml's AVX-512 `ggml_vec_dot_f16` does:
/// four accumulators of sixteen lanes over steps of 64, reduced pairwise, then a tree
/// over the lanes. Any tail past a multiple of 64 is added in order.
pub(super) fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
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

/// Asks for one KV head's keys or values at the `len` positions of a run (`stride`
/// elements apart, the head `offset` elements into each, `head` elements long), into the
/// second-level cache: every line a head touches, wherever the block's allocation put
/// it against line boundaries. Elements are f16 values, or bytes of a quantized cache's
/// rows.
///
/// A position holds every KV head, so one head's values are a few of a position's lines
/// (Llama 3.2 1B: 128 of 1,024 bytes). The hardware's prefetchers did not follow that
/// pattern: at a 1,000-token context, a 1B model's decode step spent a fifth of its time
/// in attention, most of it waiting on key and value loads. The row kernels ask for the
/// next run while they score and add this one (a run takes microseconds).
#[inline(always)]
pub(super) fn ask_for_head<T>(run: &[T], len: usize, stride: usize, offset: usize, head: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = head * std::mem::size_of::<T>();
        let mut at = run.as_ptr().wrapping_add(offset);
        for _ in 0..len {
            crate::simd::prefetch::ask_for_lines(at, bytes);
            at = at.wrapping_add(stride);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (run, len, stride, offset, head);
}
