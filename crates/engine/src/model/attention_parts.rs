//! What the attention kernels share, beneath the dispatcher ([`super::attention`]) that
//! chooses among them: how a dot product becomes a score, the keys and values a query row
//! attends to, a row's running maximum and sum, and the final normalisation.

use half::f16;

use crate::kv_cache::LayerView;

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
