//! The small numeric kernels the forward passes share: norms, rotary embeddings,
//! activations, attention over a sequence's cache, and matrix products.

use half::f16;

use crate::error::EngineError;

/// Multiplies each row of `x` (one per entry of `kernels`, rounded as it says) by `w`ᵀ.
pub fn matmul(
    w: &crate::quant::QMatrix,
    x: &[f32],
    kernels: &[crate::quant::RowKernel],
) -> Result<Vec<f32>, EngineError> {
    w.matmul(x, kernels)
}

/// [`matmul`] with each activation row's result a vector of its own.
pub fn matmul_rows(
    w: &crate::quant::QMatrix,
    x: &[f32],
    kernels: &[crate::quant::RowKernel],
) -> Result<Vec<Vec<f32>>, EngineError> {
    w.matmul_rows(x, kernels)
}

/// [`matmul`] of several matrices with the same input, in one parallel pass.
pub fn matmul_many<const N: usize>(
    ws: [&crate::quant::QMatrix; N],
    x: &[f32],
    kernels: &[crate::quant::RowKernel],
) -> Result<[Vec<f32>; N], EngineError> {
    let outs = crate::quant::QMatrix::matmul_many(&ws, x, kernels)?;
    Ok(outs.try_into().expect("one product per matrix"))
}

/// RMS normalisation of every `weight.len()`-wide row of `x`, in place.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let width = weight.len();
    for row in x.chunks_exact_mut(width) {
        // Sum in f64 and scale, then weigh, in two roundings as ggml does.
        let mean_sq = (row.iter().map(|&v| (v * v) as f64).sum::<f64>() / width as f64) as f32;
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

/// Rotary position embedding for one frequency base, computed as ggml computes it.
#[derive(Debug, Clone)]
pub struct Rope {
    half: usize,
    theta_scale: f32,
    freq_scale: f32,
    /// Per-pair divisors of the angle (Llama 3.1's `rope_freqs`, Phi-3's LongRoPE factors).
    freq_factors: Option<Vec<f32>>,
    /// Factor on every cosine and sine (LongRoPE's attention factor); 1.0 for none.
    magnitude: f32,
    style: RopeStyle,
    /// Multi-section positions (Qwen2-VL's M-RoPE): how many pairs, cycling, take their
    /// angle from each of a position's four components (time, height, width, extra).
    sections: Option<[usize; 4]>,
    /// Whether each section's angles start again from its component (ggml's vision
    /// rotation) rather than going on from the pairs before.
    independent_sections: bool,
}

impl Rope {
    /// Rotary embedding over `head_dim` dimensions with base `theta`, angles divided by
    /// `scale` (linear scaling; 1.0 for none).
    pub fn new(head_dim: usize, theta: f32, scale: f32, style: RopeStyle) -> Self {
        Self {
            half: head_dim / 2,
            theta_scale: theta.powf(-2.0 / head_dim as f32),
            freq_scale: 1.0 / scale,
            freq_factors: None,
            magnitude: 1.0,
            style,
            sections: None,
            independent_sections: false,
        }
    }

    /// The rotation of a vision tower's patches (Qwen2.5-VL's, ggml's `VISION` mode):
    /// halves `(i, i + head_dim/2)`, the first quarter of the pairs turned by the
    /// position's first component (the patch's row), the second quarter by its second
    /// (the column), each from pair 0's angle, with `base^(-2i/(head_dim/2))`.
    pub fn vision(head_dim: usize, base: f32) -> Self {
        let half = head_dim / 2;
        Self {
            half,
            theta_scale: base.powf(-2.0 / half as f32),
            freq_scale: 1.0,
            freq_factors: None,
            magnitude: 1.0,
            style: RopeStyle::Neox,
            sections: Some([head_dim / 4; 4]),
            independent_sections: true,
        }
    }

    /// The same with multi-section positions (M-RoPE): pair `i` takes its angle from the
    /// component of the position that section `i mod sum(sections)` falls in. A token of
    /// text is at `(p, p, p, 0)`, as llama.cpp places it.
    pub fn with_sections(mut self, sections: [usize; 4]) -> Self {
        self.sections = Some(sections);
        self
    }

    /// Whether its positions have sections (M-RoPE).
    pub fn has_sections(&self) -> bool {
        self.sections.is_some()
    }

    /// The same with pair `i`'s angle divided by `factors[i]` (one per pair), if any.
    pub fn with_freq_factors(mut self, factors: Option<Vec<f32>>) -> Self {
        if let Some(f) = &factors {
            assert_eq!(f.len(), self.half, "one frequency factor per pair");
        }
        self.freq_factors = factors;
        self
    }

    /// The same with every cosine and sine multiplied by `magnitude`.
    pub fn with_magnitude(mut self, magnitude: f32) -> Self {
        self.magnitude = magnitude;
        self
    }

    /// Rotates every head of one token's row (`n_heads × head_dim` floats) for `pos`.
    pub fn apply(&self, row: &mut [f32], pos: usize) {
        self.apply_at(row, [pos, pos, pos, 0]);
    }

    /// [`Rope::apply`] at a multi-section position (time, height, width, extra); without
    /// sections only the first component counts.
    pub fn apply_at(&self, row: &mut [f32], position: [usize; 4]) {
        let half = self.half;
        // The angle of pair i is pos·base^(-2i/d), built by repeated multiplication in f32
        // as ggml builds it (one product chain per component, as its M-RoPE cache), then
        // divided by the pair's factor and scaled, in that order.
        let mut angles = Vec::with_capacity(half);
        let mut thetas = position.map(|p| p as f32);
        // Without sections only the first chain is read.
        let chains = if self.sections.is_some() { 4 } else { 1 };
        for i in 0..half {
            if let (true, Some(s)) = (self.independent_sections, self.sections) {
                let sector = i % s.iter().sum::<usize>().max(1);
                let starts = [0, s[0], s[0] + s[1], s[0] + s[1] + s[2]];
                if let Some(c) = starts.iter().position(|&start| start == sector) {
                    thetas[c] = position[c] as f32;
                }
            }
            let theta = thetas[self.component_of_pair(i)];
            let extrapolated = match &self.freq_factors {
                Some(f) => theta / f[i],
                None => theta,
            };
            let (sin, cos) = (self.freq_scale * extrapolated).sin_cos();
            angles.push((sin * self.magnitude, cos * self.magnitude));
            for t in &mut thetas[..chains] {
                *t *= self.theta_scale;
            }
        }
        for head in row.chunks_exact_mut(half * 2) {
            for (i, &(sin, cos)) in angles.iter().enumerate() {
                let (a, b) = match self.style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                // The fused forms ggml's compiled rotation uses.
                head[a] = x0.mul_add(cos, -(x1 * sin));
                head[b] = x0.mul_add(sin, x1 * cos);
            }
        }
    }
}

impl Rope {
    /// Which component of a position pair `i` takes its angle from: 0 (time) without
    /// sections.
    fn component_of_pair(&self, i: usize) -> usize {
        let Some(s) = self.sections else { return 0 };
        let sector = i % s.iter().sum::<usize>().max(1);
        match sector {
            x if x < s[0] => 0,
            x if x < s[0] + s[1] => 1,
            x if x < s[0] + s[1] + s[2] => 2,
            _ => 3,
        }
    }
}

/// SiLU-gated unit: `gate = silu(gate) * up`, in place, with ggml's vector `expf`; eight
/// at a time with AVX2 where the CPU has it (bit-identical).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    let len = gate.len().min(up.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::simd::avx2() {
        done = len / 8 * 8;
        // SAFETY: AVX2 and FMA are available.
        unsafe { avx2::silu_mul(&mut gate[..done], &up[..done]) };
    }
    silu_mul_portable(&mut gate[done..len], &up[done..len]);
}

/// [`silu_mul`] one value at a time.
fn silu_mul_portable(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = x / (1.0 + fast_exp(0.0 - x)) * u;
    }
}

/// `exp(x)` by the polynomial of ggml's SIMD `ggml_v_expf` (from ARM's optimized
/// routines; at most ~1.5 ulp from the true value), so SiLU rounds as in llama.cpp.
pub fn fast_exp(x: f32) -> f32 {
    let c = |bits: u32| f32::from_bits(bits);
    let shift = c(0x4b40_0000); // 1.5 · 2^23
    let z = x.mul_add(c(0x3fb8_aa3b), shift); // x / ln 2, rounded to an integer
    let n = z - shift;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
        .mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
    // j · 2^n, in two steps so that an intermediate power of two does not underflow.
    let half = (n / 2.0).trunc();
    j * 2f32.powi(half as i32) * 2f32.powi((n - half) as i32)
}

/// GELU (tanh approximation) gated unit: `gate = gelu(gate) * up`, in place. Like ggml's
/// table-driven GELU, the input and result are rounded to f16 inside (-10, 10): the
/// result is looked up in a table of every f16 input, built once.
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    for (g, u) in gate.iter_mut().zip(up) {
        *g = gelu_by_table(table, *g) * u;
    }
}

/// GELU (tanh approximation) of every value in place, as ggml's `gelu` computes it: the
/// table of [`gelu_mul`] inside (-10, 10), the identity above and zero below.
pub fn gelu_in_place(x: &mut [f32]) {
    let table = gelu_table();
    for v in x.iter_mut() {
        *v = gelu_by_table(table, *v);
    }
}

/// ggml's table-driven GELU of one value: zero at or below -10, the value itself at or
/// above 10, else the table's entry for the value rounded to f16.
fn gelu_by_table(table: &[f32], x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        table[f16::from_f32(x).to_bits() as usize]
    }
}

/// GELU of every f16 value, rounded to f16, indexed by the input's bits.
fn gelu_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| {
                let x = f16::from_bits(bits).to_f32();
                f16::from_f32(gelu(x)).to_f32()
            })
            .collect()
    })
}

/// GELU with the tanh approximation, `1 + c·x·x` fused as ggml's compiled table builder
/// computes it.
fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let inner = SQRT_2_OVER_PI * x * (0.044_715 * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + inner.tanh())
}

/// Adds `b` to `a` element-wise.
pub fn add_assign(a: &mut [f32], b: &[f32]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// [`super::fast_exp`] of eight values, step for step.
    #[target_feature(enable = "avx2,fma")]
    fn fast_exp(x: __m256) -> __m256 {
        let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
        let shift = c(0x4b40_0000);
        let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), shift);
        let n = _mm256_sub_ps(z, shift);
        let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)),
        );
        // j · 2^half · 2^(n - half), the powers of two built from their exponent bits
        // (|half| ≤ 96 wherever the result is used).
        let half = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
            n,
            _mm256_set1_ps(0.5),
        ));
        let pow2 = |k: __m256| {
            let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(k),
                _mm256_set1_epi32(127),
            ));
            _mm256_castsi256_ps(bits)
        };
        let scaled = _mm256_mul_ps(_mm256_mul_ps(j, pow2(half)), pow2(_mm256_sub_ps(n, half)));
        // |n| > 192: zero below, infinity above.
        let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let out_of_range = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
        let limit = _mm256_blendv_ps(
            _mm256_set1_ps(f32::INFINITY),
            _mm256_setzero_ps(),
            _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps()),
        );
        _mm256_blendv_ps(scaled, limit, out_of_range)
    }

    /// [`super::silu_mul_portable`] eight values at a time (the lengths equal multiples of
    /// 8, or it panics).
    #[target_feature(enable = "avx2,fma")]
    pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
        assert!(gate.len() == up.len() && gate.len().is_multiple_of(8));
        for (g, u) in gate.chunks_exact_mut(8).zip(up.chunks_exact(8)) {
            // SAFETY: `g` and `u` are chunks of eight values.
            let (x, u) = unsafe { (_mm256_loadu_ps(g.as_ptr()), _mm256_loadu_ps(u.as_ptr())) };
            let e = fast_exp(_mm256_sub_ps(_mm256_setzero_ps(), x));
            let y = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(g.as_mut_ptr(), _mm256_mul_ps(y, u)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_silu_matches_the_portable_one_bit_for_bit() {
        let mut rng = crate::quant::sample::Xorshift::new(5);
        // Ordinary values, large ones (exp over- and underflow) and exact zeros.
        let mut gate: Vec<f32> = (0..4096).map(|_| rng.next_f32() * 12.0).collect();
        gate.extend((0..64).map(|i| (i as f32 - 32.0) * 7.0));
        gate.extend([0.0, -0.0, 88.5, -88.5, 103.0, -103.0, 150.0, -150.0]);
        let up: Vec<f32> = (0..gate.len()).map(|_| rng.next_f32() * 3.0).collect();
        let mut fast = gate.clone();
        silu_mul(&mut fast, &up);
        silu_mul_portable(&mut gate, &up);
        for (i, (a, b)) in fast.iter().zip(&gate).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "value {i}: {a} vs {b}");
        }
    }

    #[test]
    fn fast_exp_is_close_to_exp() {
        for i in -800..800 {
            let x = i as f32 * 0.11;
            let (a, b) = (fast_exp(x), x.exp());
            assert!(
                (a - b).abs() <= b * 4e-7 + f32::MIN_POSITIVE,
                "{x}: {a} vs {b}"
            );
        }
        assert_eq!(fast_exp(-200.0), 0.0);
    }

    #[test]
    fn rms_norm_scales_to_unit_rms() {
        let mut x = vec![3.0, 4.0];
        rms_norm(&mut x, &[1.0, 2.0], 0.0);
        let rms = (12.5f32).sqrt();
        assert!((x[0] - 3.0 / rms).abs() < 1e-6 && (x[1] - 8.0 / rms).abs() < 1e-6);
    }

    /// The vision rotation turns pair i of the first quarter by `row * s^i` and pair i of
    /// the second by `col * s^(i - quarter)` (each chain started again), with
    /// `s = base^(-2 / (head_dim / 2))`, as ggml's `VISION` mode; the second half's pairs
    /// are the same angles' partners.
    #[test]
    fn vision_rope_turns_quarters_by_row_and_column() {
        let d = 32;
        let row: Vec<f32> = (0..2 * d).map(|i| (i as f32 * 0.61).cos()).collect();
        let rope = Rope::vision(d, 10000.0);
        let mut got = row.clone();
        rope.apply_at(&mut got, [3, 5, 3, 5]);
        let s = 10000f64.powf(-2.0 / 16.0);
        for head in 0..2 {
            for i in 0..16 {
                let theta = match i < 8 {
                    true => 3.0 * s.powi(i as i32),
                    false => 5.0 * s.powi(i as i32 - 8),
                };
                let (a, b) = (head * d + i, head * d + i + 16);
                let (x0, x1) = (f64::from(row[a]), f64::from(row[b]));
                let want = (
                    x0 * theta.cos() - x1 * theta.sin(),
                    x0 * theta.sin() + x1 * theta.cos(),
                );
                assert!((f64::from(got[a]) - want.0).abs() < 1e-5, "pair {i}");
                assert!((f64::from(got[b]) - want.1).abs() < 1e-5, "pair {i}");
            }
        }
    }

    /// M-RoPE at a text position (p, p, p, 0) is plain NeoX RoPE where no pair falls in
    /// the fourth section, bit for bit; pairs in the fourth are not rotated; and height
    /// and width positions move only their own sections' pairs.
    #[test]
    fn multi_section_rope_is_plain_rope_for_text() {
        let row: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
        let plain = Rope::new(64, 1e6, 1.0, RopeStyle::Neox);
        let sectioned = plain.clone().with_sections([8, 12, 12, 0]);
        let (mut a, mut b) = (row.clone(), row.clone());
        plain.apply(&mut a, 777);
        sectioned.apply(&mut b, 777);
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // Sections of 16 pairs: pairs 12..16 of each cycle are the fourth's, at 0.
        let extra = plain.clone().with_sections([4, 4, 4, 4]);
        let mut c = row.clone();
        extra.apply(&mut c, 777);
        for head in 0..2 {
            for i in 0..32 {
                let (x, y) = (head * 64 + i, head * 64 + i + 32);
                let untouched = (c[x], c[y]) == (row[x], row[y]);
                assert_eq!(untouched, i % 16 >= 12, "pair {i}");
            }
        }
        // Another height moves pairs 8..20 (the second section) and nothing else.
        let (mut d, mut e) = (row.clone(), row.clone());
        sectioned.apply_at(&mut d, [5, 5, 5, 0]);
        sectioned.apply_at(&mut e, [5, 9, 5, 0]);
        for i in 0..32 {
            assert_eq!(d[i] == e[i], !(8..20).contains(&i), "pair {i}");
        }
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
}
