//! Causal attention against a sequence's f16 KV cache, with the numerics of llama.cpp's
//! CPU flash attention (one query row at a time): the query is rounded to f16, key dot
//! products accumulate in f32 over 4 × 16 lanes, and the weighted sum of values
//! accumulates in f16 with an online softmax. The models are sensitive enough to these
//! roundings that matching them is what makes greedy output agree with llama.cpp. An
//! AVX2 version gives bit-identical results faster.

use half::f16;

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

/// The keys and values one query row attends to: positions `range` of one KV head.
#[derive(Clone, Copy)]
struct KvRows<'a> {
    keys: &'a [f16],
    values: &'a [f16],
    /// Values per position (all KV heads).
    stride: usize,
    /// Where this KV head starts within a position.
    offset: usize,
    first: usize,
    last: usize,
}

/// Causal attention of `n` new tokens of one sequence, whose keys and values were already
/// appended to `keys`/`values` (`[position][kv head][dim]`, the new ones last).
/// `q` is `n × n_head × head_dim`; the result has the same shape. Query rows are
/// independent and run in parallel.
pub fn attend(
    shape: &AttentionShape,
    q: &[f32],
    keys: &[f16],
    values: &[f16],
    n: usize,
) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    let fast = shape.head_dim.is_multiple_of(64) && crate::quant::simd::available();
    #[cfg(not(target_arch = "x86_64"))]
    let fast = false;
    attend_with(shape, q, keys, values, n, fast)
}

/// [`attend`] in portable code.
pub fn attend_portable(
    shape: &AttentionShape,
    q: &[f32],
    keys: &[f16],
    values: &[f16],
    n: usize,
) -> Vec<f32> {
    attend_with(shape, q, keys, values, n, false)
}

fn attend_with(
    shape: &AttentionShape,
    q: &[f32],
    keys: &[f16],
    values: &[f16],
    n: usize,
    fast: bool,
) -> Vec<f32> {
    use rayon::prelude::*;

    let AttentionShape {
        n_head,
        n_kv_head,
        head_dim,
        scale,
        window,
    } = *shape;
    let stride = n_kv_head * head_dim;
    let total = keys.len() / stride;
    assert!(values.len() == keys.len() && total >= n && q.len() >= n * n_head * head_dim);
    let first_new = total - n;
    let group = n_head / n_kv_head;
    let mut out = vec![0.0f32; n * n_head * head_dim];
    out.par_chunks_mut(head_dim)
        .enumerate()
        .for_each(|(row, o)| {
            let (t, h) = (row / n_head, row % n_head);
            let pos = first_new + t;
            let kv = KvRows {
                keys,
                values,
                stride,
                offset: (h / group) * head_dim,
                first: window.map_or(0, |w| (pos + 1).saturating_sub(w)),
                last: pos,
            };
            let q = &q[row * head_dim..][..head_dim];
            #[cfg(target_arch = "x86_64")]
            if fast {
                // SAFETY: `fast` is only set when AVX2, FMA and F16C are available and the
                // head size is a multiple of 64.
                unsafe { avx2::attend_row(q, &kv, scale, o) };
                return;
            }
            let _ = fast;
            attend_row(q, &kv, scale, o);
        });
    out
}

/// One query row in portable code.
fn attend_row(q: &[f32], kv: &KvRows<'_>, scale: f32, out: &mut [f32]) {
    let head_dim = q.len();
    let q16: Vec<f16> = q.iter().map(|&x| f16::from_f32(x)).collect();
    let mut acc = vec![f16::ZERO; head_dim];
    let mut max = f32::NEG_INFINITY;
    let mut sum = 0.0f32;
    for j in kv.first..=kv.last {
        let at = j * kv.stride + kv.offset;
        let s = dot_f16(&q16, &kv.keys[at..at + head_dim]) * scale;
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
        for (a, v) in acc.iter_mut().zip(&kv.values[at..at + head_dim]) {
            *a = f16::from_f32(v.to_f32().mul_add(weight, a.to_f32()));
        }
        sum = sum.mul_add(rescale, weight);
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

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::KvRows;

    const ROUND: i32 = _MM_FROUND_TO_NEAREST_INT;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store8(p: *mut f16, v: __m256) {
        _mm_storeu_si128(p as *mut __m128i, _mm256_cvtps_ph::<ROUND>(v));
    }

    /// `hsum_float_8` order.
    #[target_feature(enable = "avx2")]
    unsafe fn hsum(v: __m256) -> f32 {
        let r = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
    }

    /// f16 dot product over 4 accumulators of 16 lanes (each kept as two halves), as
    /// ggml's AVX-512 `ggml_vec_dot_f16`; `len` is a multiple of 64.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot(a: *const f16, b: *const f16, len: usize) -> f32 {
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        for step in (0..len).step_by(64) {
            for (c, pair) in acc.iter_mut().enumerate() {
                for (half, lane) in pair.iter_mut().enumerate() {
                    let i = step + c * 16 + half * 8;
                    *lane = _mm256_fmadd_ps(load8(a.add(i)), load8(b.add(i)), *lane);
                }
            }
        }
        let x0 = [
            _mm256_add_ps(acc[0][0], acc[2][0]),
            _mm256_add_ps(acc[0][1], acc[2][1]),
        ];
        let x1 = [
            _mm256_add_ps(acc[1][0], acc[3][0]),
            _mm256_add_ps(acc[1][1], acc[3][1]),
        ];
        let v = [_mm256_add_ps(x0[0], x1[0]), _mm256_add_ps(x0[1], x1[1])];
        hsum(_mm256_add_ps(v[0], v[1]))
    }

    /// One query row, as [`super::attend_row`].
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; the head size is a multiple of 64.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn attend_row(q: &[f32], kv: &KvRows<'_>, scale: f32, out: &mut [f32]) {
        let head_dim = q.len();
        assert!(out.len() == head_dim && (kv.last + 1) * kv.stride <= kv.keys.len());
        let mut q16 = vec![f16::ZERO; head_dim];
        let mut acc = vec![f16::ZERO; head_dim];
        for i in (0..head_dim).step_by(8) {
            store8(q16.as_mut_ptr().add(i), _mm256_loadu_ps(q.as_ptr().add(i)));
        }
        let mut max = f32::NEG_INFINITY;
        let mut sum = 0.0f32;
        for j in kv.first..=kv.last {
            let at = j * kv.stride + kv.offset;
            let s = dot(q16.as_ptr(), kv.keys.as_ptr().add(at), head_dim) * scale;
            let (mut rescale, mut weight) = (1.0f32, 1.0f32);
            if s > max {
                rescale = (max - s).exp();
                max = s;
                let r = _mm256_set1_ps(rescale);
                for i in (0..head_dim).step_by(8) {
                    let p = acc.as_mut_ptr().add(i);
                    store8(p, _mm256_mul_ps(load8(p), r));
                }
            } else {
                weight = (s - max).exp();
            }
            let w = _mm256_set1_ps(weight);
            let v = kv.values.as_ptr().add(at);
            for i in (0..head_dim).step_by(8) {
                let p = acc.as_mut_ptr().add(i);
                store8(p, _mm256_fmadd_ps(load8(v.add(i)), w, load8(p)));
            }
            sum = sum.mul_add(rescale, weight);
        }
        let inv = _mm256_set1_ps(if sum == 0.0 { 0.0 } else { 1.0 / sum });
        for i in (0..head_dim).step_by(8) {
            _mm256_storeu_ps(
                out.as_mut_ptr().add(i),
                _mm256_mul_ps(load8(acc.as_ptr().add(i)), inv),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(v: &[f32]) -> Vec<f16> {
        v.iter().map(|&x| f16::from_f32(x)).collect()
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
        let out = attend(
            &shape,
            &[1.0, 0.0, 0.0, 1.0],
            &h(&[0.5, 0.5]),
            &h(&[2.0, 3.0]),
            1,
        );
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
        let out = attend(&shape, &[1.0], &h(&[1.0, 1.0]), &h(&[5.0, 7.0]), 1);
        assert_eq!(out, vec![7.0]);
    }

    #[test]
    fn fast_path_is_bit_identical_to_the_portable_one() {
        for (head_dim, n_head, n_kv_head, window) in [(64, 9, 3, None), (256, 4, 1, Some(3))] {
            let shape = AttentionShape {
                n_head,
                n_kv_head,
                head_dim,
                scale: 0.125,
                window,
            };
            let positions = 7;
            let n = 3;
            let kv: Vec<f32> = (0..positions * n_kv_head * head_dim)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0)
                .collect();
            let vals: Vec<f32> = (0..positions * n_kv_head * head_dim)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 7.0)
                .collect();
            let q: Vec<f32> = (0..n * n_head * head_dim)
                .map(|i| ((i * 29 % 89) as f32 - 44.0) / 11.0)
                .collect();
            let (k, v) = (h(&kv), h(&vals));
            let slow = attend_portable(&shape, &q, &k, &v, n);
            let fast = attend(&shape, &q, &k, &v, n);
            assert!(
                slow.iter()
                    .zip(&fast)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "head_dim {head_dim}"
            );
        }
    }
}
