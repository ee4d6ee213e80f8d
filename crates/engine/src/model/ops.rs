//! The small numeric kernels the forward passes share: norms, rotary embeddings,
//! activations, attention over a sequence's cache, and matrix products.

use candle_core::quantized::QMatMul;
use candle_core::{Device, Module, Tensor};
use half::f16;

use crate::EngineError;

/// Multiplies each of the `rows` rows of `x` (row-major, `x.len() / rows` wide) by `w`ᵀ.
pub fn linear(w: &QMatMul, x: &[f32], rows: usize) -> Result<Vec<f32>, EngineError> {
    let cols = x.len() / rows;
    let t = Tensor::from_slice(x, (rows, cols), &Device::Cpu)?;
    Ok(w.forward(&t)?.flatten_all()?.to_vec1::<f32>()?)
}

/// RMS normalisation of every `weight.len()`-wide row of `x`, in place.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let width = weight.len();
    for row in x.chunks_exact_mut(width) {
        // Sum in f64 and scale, then weigh, in two roundings as ggml does.
        let mean_sq = (row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / width as f64) as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v = (*v * scale) * w;
        }
    }
}

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)` (llama in GGUF, whose Q/K rows were permuted for it).
    Interleaved,
    /// Halves `(i, i + d/2)` (GPT-NeoX, Gemma).
    Neox,
}

/// Rotary position embedding for one frequency base.
#[derive(Debug, Clone)]
pub struct Rope {
    half: usize,
    theta_scale: f32,
    position_scale: f32,
    style: RopeStyle,
}

impl Rope {
    /// Rotary embedding over `head_dim` dimensions with base `theta`, positions divided by
    /// `scale` (linear scaling; 1.0 for none).
    pub fn new(head_dim: usize, theta: f32, scale: f32, style: RopeStyle) -> Self {
        Self {
            half: head_dim / 2,
            theta_scale: theta.powf(-2.0 / head_dim as f32),
            position_scale: 1.0 / scale,
            style,
        }
    }

    /// Rotates every head of one token's row (`n_heads × head_dim` floats) for `pos`.
    pub fn apply(&self, row: &mut [f32], pos: usize) {
        let half = self.half;
        // The angle of pair i is pos·base^(-2i/d), built by repeated multiplication in f32
        // as ggml builds it.
        let mut angles = Vec::with_capacity(half);
        let mut theta = pos as f32 * self.position_scale;
        for _ in 0..half {
            angles.push(theta.sin_cos());
            theta *= self.theta_scale;
        }
        for head in row.chunks_exact_mut(half * 2) {
            for (i, &(sin, cos)) in angles.iter().enumerate() {
                let (a, b) = match self.style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos - x1 * sin;
                head[b] = x0 * sin + x1 * cos;
            }
        }
    }
}

/// SiLU-gated unit: `gate = silu(gate) * up`, in place.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// GELU (tanh approximation) gated unit: `gate = gelu(gate) * up`, in place. Like ggml's
/// table-driven GELU, the input and result are rounded to f16 inside (-10, 10).
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let gelu = |x: f32| {
        let inner = SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x);
        0.5 * x * (1.0 + inner.tanh())
    };
    for (g, u) in gate.iter_mut().zip(up) {
        let x = *g;
        let y = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x
        } else {
            let x16 = f16::from_f32(x).to_f32();
            f16::from_f32(gelu(x16)).to_f32()
        };
        *g = y * u;
    }
}

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

/// Causal attention of `n` new tokens of one sequence, whose keys and values were already
/// appended to `keys`/`values` (`[position][kv head][dim]`, the new ones last).
/// `q` is `n × n_head × head_dim`; the result has the same shape.
///
/// This is a single-pass (online softmax) attention with the numerics of llama.cpp's CPU
/// flash attention: the query is rounded to f16, dot products accumulate in f32, and the
/// weighted sum of values accumulates in f16. The models are sensitive enough to these
/// roundings that matching them is what makes greedy output agree with llama.cpp.
pub fn attend(shape: &AttentionShape, q: &[f32], keys: &[f16], values: &[f16], n: usize) -> Vec<f32> {
    let AttentionShape { n_head, n_kv_head, head_dim, scale, window } = *shape;
    let kv_width = n_kv_head * head_dim;
    let total = keys.len() / kv_width;
    let first_new = total - n;
    let group = n_head / n_kv_head;
    let mut out = vec![0.0f32; n * n_head * head_dim];
    let mut q16 = vec![f16::ZERO; head_dim];
    let mut acc = vec![f16::ZERO; head_dim];
    for t in 0..n {
        let pos = first_new + t;
        let start = window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for h in 0..n_head {
            let g = h / group;
            let qh = &q[(t * n_head + h) * head_dim..][..head_dim];
            for (d, s) in q16.iter_mut().zip(qh) {
                *d = f16::from_f32(*s);
            }
            acc.fill(f16::ZERO);
            let mut max = f32::NEG_INFINITY;
            let mut sum = 0.0f32;
            for j in start..=pos {
                let k = &keys[j * kv_width + g * head_dim..][..head_dim];
                let s = dot_f16(&q16, k) * scale;
                let v = &values[j * kv_width + g * head_dim..][..head_dim];
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
                for (a, v) in acc.iter_mut().zip(v) {
                    *a = f16::from_f32(v.to_f32().mul_add(weight, a.to_f32()));
                }
                sum = sum * rescale + weight;
            }
            let o = &mut out[(t * n_head + h) * head_dim..][..head_dim];
            let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            for (o, a) in o.iter_mut().zip(&acc) {
                *o = a.to_f32() * inv;
            }
        }
    }
    out
}

fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
    a.iter().zip(b).fold(0.0f32, |acc, (x, y)| x.to_f32().mul_add(y.to_f32(), acc))
}

/// Adds `b` to `a` element-wise.
pub fn add_assign(a: &mut [f32], b: &[f32]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_scales_to_unit_rms() {
        let mut x = vec![3.0, 4.0];
        rms_norm(&mut x, &[1.0, 2.0], 0.0);
        let rms = (12.5f32).sqrt();
        assert!((x[0] - 3.0 / rms).abs() < 1e-6 && (x[1] - 8.0 / rms).abs() < 1e-6);
    }

    #[test]
    fn rope_at_zero_is_identity_and_preserves_norm() {
        let rope = Rope::new(4, 10000.0, 1.0, RopeStyle::Neox);
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        rope.apply(&mut x, 0);
        assert_eq!(x, vec![1.0, 2.0, 3.0, 4.0]);
        rope.apply(&mut x, 7);
        let norm: f32 = x.iter().map(|v| v * v).sum();
        assert!((norm - 30.0).abs() < 1e-4);
    }

    #[test]
    fn attention_to_one_key_returns_its_value() {
        let shape = AttentionShape { n_head: 2, n_kv_head: 1, head_dim: 2, scale: 1.0, window: None };
        let h = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
        let out = attend(&shape, &[1.0, 0.0, 0.0, 1.0], &h(&[0.5, 0.5]), &h(&[2.0, 3.0]), 1);
        assert_eq!(out, vec![2.0, 3.0, 2.0, 3.0]);
    }

    #[test]
    fn sliding_window_hides_old_keys() {
        let shape = AttentionShape { n_head: 1, n_kv_head: 1, head_dim: 1, scale: 1.0, window: Some(1) };
        let h = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
        let out = attend(&shape, &[1.0], &h(&[1.0, 1.0]), &h(&[5.0, 7.0]), 1);
        assert_eq!(out, vec![7.0]);
    }
}
