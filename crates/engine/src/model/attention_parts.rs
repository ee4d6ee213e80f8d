//! What the attention kernels share, beneath the dispatcher ([`super::attention`]) that
//! chooses among them: how a dot product becomes a score, the keys and values a query row
//! attends to, a row's running maximum and sum, one step of the online softmax, the f16
//! query·key dot product of the row kernels, and the final normalisation.

use half::f16;

use crate::kv_cache::LayerView;
use crate::simd::reduce::reduce_add_16;

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

    /// [`Self::runs`] for a cache of any types: the run's stored key and value rows (every
    /// KV head, a row per position in its type) and its length.
    pub(super) fn byte_runs(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8], usize)> + '_ {
        self.view.runs(self.first..self.last + 1).map(|r| {
            (
                self.view.key_bytes(r.clone()),
                self.view.value_bytes(r.clone()),
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

/// One key's step of a row's online softmax, as ggml's flash attention takes it: a score
/// `s` greater than the running maximum raises it (a NaN never does), weighs 1 and
/// rescales what came before by `expf(old maximum − s)`; any other weighs
/// `expf(s − maximum)` and rescales by 1. Returns (rescale, weight, raised).
pub(super) fn online_step(s: f32, max: &mut f32) -> (f32, f32, bool) {
    if s > *max {
        let rescale = (*max - s).exp();
        *max = s;
        (rescale, 1.0, true)
    } else {
        (1.0, (s - *max).exp(), false)
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
