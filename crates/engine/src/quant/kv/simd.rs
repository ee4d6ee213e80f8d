//! AVX2 twins of the KV cache's key dots and value sums (`quant/kv.rs`), bit-identical to its
//! portable code: a block's integer lanes are exact, the lanes are folded with the same
//! fused multiply-adds and summed in `hsum_float_8` order, and a quantized value is
//! `q · d` exactly before its fused multiply-add. llama.cpp's AVX-512 builds run these
//! same AVX2 kernels, so one width serves both.

use std::arch::x86_64::*;

use super::{KvQuery, KvType, ValueStep};
use crate::simd::convert::f16_le;
use crate::simd::int_lanes::{lanes_avx2, nibbles_less_8};
use crate::simd::reduce::hsum_m256;

/// A stored block's 32 values as signed bytes, and its scale.
///
/// # Safety
/// AVX2 must be available; `block` points at a whole block of `t` (quantized).
#[inline(always)]
unsafe fn block_values(t: KvType, block: *const u8) -> (__m256i, f32) {
    // SAFETY: the caller gives a whole block at `block`.
    unsafe {
        let d = f16_le([*block, *block.add(1)]);
        let q = match t {
            KvType::Q4_0 => nibbles_less_8(block.add(2)),
            _ => _mm256_loadu_si256(block.add(2) as *const __m256i),
        };
        (q, d)
    }
}

/// [`KvType::key_dots`] with AVX2.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `t` is quantized; head `i` of
/// `t.row_bytes(query length)` bytes lies at `keys[i · stride..]` for every `i < out.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn key_dots(
    t: KvType,
    keys: &[u8],
    stride: usize,
    query: &KvQuery,
    out: &mut [f32],
) {
    let block = t.row_bytes(32);
    let (scales, values) = (query.scales(), query.values());
    for (i, o) in out.iter_mut().enumerate() {
        let mut acc = _mm256_setzero_ps();
        for (b, &qd) in scales.iter().enumerate() {
            // SAFETY: the caller guarantees the head's blocks lie within `keys`; the
            // query holds 32 values per scale.
            let (k, q) = unsafe {
                let (k, kd) = block_values(t, keys.as_ptr().add(i * stride + b * block));
                let q = _mm256_loadu_si256(values.as_ptr().add(b * 32) as *const __m256i);
                ((k, kd), q)
            };
            let (k, kd) = k;
            // Signed by signed: |k| times q carrying k's sign, as ggml's sign trick.
            let lanes = lanes_avx2(_mm256_sign_epi8(k, k), _mm256_sign_epi8(q, k));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(kd * qd), _mm256_cvtepi32_ps(lanes), acc);
        }
        *o = hsum_m256(acc);
    }
}

/// [`KvType::add_values`] with AVX2 (a quantized type, whole blocks): each value block is
/// read and converted once, then added into every row's accumulator.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `t` is quantized; `steps` holds `keys` steps of
/// each of the rows whose accumulators `acc` holds (a multiple of 32 values each); head `i`
/// of `t.row_bytes(head)` bytes lies at `values[i · stride..]` for every `i < keys`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn add_values(
    t: KvType,
    values: &[u8],
    stride: usize,
    keys: usize,
    steps: &[ValueStep],
    acc: &mut [f32],
) {
    let block = t.row_bytes(32);
    let rows = steps.len() / keys;
    let head = acc.len() / rows;
    let a = acc.as_mut_ptr();
    for i in 0..keys {
        for r in 0..rows {
            if let Some(scale) = steps[r * keys + i].rescale {
                let scale = _mm256_set1_ps(scale);
                for at in (r * head..(r + 1) * head).step_by(8) {
                    // SAFETY: `at + 8 <= acc.len()`: heads are multiples of 32.
                    unsafe {
                        _mm256_storeu_ps(
                            a.add(at),
                            _mm256_mul_ps(_mm256_loadu_ps(a.add(at)), scale),
                        )
                    };
                }
            }
        }
        for b in 0..head / 32 {
            // SAFETY: the caller guarantees the head's blocks lie within `values`; block
            // `b`'s 32 accumulators of each row lie within `acc`.
            unsafe {
                let (q, d) = block_values(t, values.as_ptr().add(i * stride + b * block));
                let d = _mm256_set1_ps(d);
                let (low, high) = (_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
                let value = |bytes: __m128i| {
                    _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), d)
                };
                let v = [
                    value(low),
                    value(_mm_unpackhi_epi64(low, low)),
                    value(high),
                    value(_mm_unpackhi_epi64(high, high)),
                ];
                for r in 0..rows {
                    let w = _mm256_set1_ps(steps[r * keys + i].weight);
                    let at = a.add(r * head + b * 32);
                    for (k, v) in v.iter().enumerate() {
                        let at = at.add(k * 8);
                        _mm256_storeu_ps(at, _mm256_fmadd_ps(*v, w, _mm256_loadu_ps(at)));
                    }
                }
            }
        }
    }
}
