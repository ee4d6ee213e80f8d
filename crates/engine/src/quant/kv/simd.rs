//! AVX2 twins of the KV cache's key dots and value sums (`quant/kv.rs`), bit-identical to its
//! portable code: a block's integer lanes are exact, the lanes are folded with the same
//! fused multiply-adds and summed in `hsum_float_8` order (eight keys' sums finished
//! together), and a quantized value is `q · d` exactly before its fused multiply-add
//! (values converted once for every row, four rows' accumulators held in registers across
//! a run of keys). llama.cpp's AVX-512 builds run these same AVX2 kernels, so one width
//! serves both.

use std::arch::x86_64::*;

use super::{KvQuery, KvType};
use crate::simd::convert::f16_le;
use crate::simd::int_lanes::{lanes_avx2, nibbles_less_8};
use crate::simd::lanes::hsum8_each;
use crate::simd::reduce::hsum_m256;
use crate::simd::softmax::KeySteps;

/// Keys whose dot products are finished together ([`hsum8_each`]).
const KEY_GROUP: usize = 8;

/// Query rows whose accumulators a pass over the values updates together.
const ROW_TILE: usize = 4;

/// Values of a head a pass over the keys updates (two vectors per row).
const VALUE_CHUNK: usize = 16;

/// Values converted to f32 before they are added (16 KiB): as many keys' heads as fit,
/// at least one.
pub(super) const MAX_VALUE_HEAD: usize = 4096;

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

/// [`KvType::key_dots`] with AVX2: eight keys at a time, each key's lanes folded block by
/// block as [`KvType::key_dot`] does and the eight sums finished together; the rest one
/// at a time.
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
    // One key's lanes after block `b`, added into `acc`.
    let fold = |acc: __m256, key: usize, b: usize, q: __m256i, qd: __m256| {
        // SAFETY: the caller guarantees the head's blocks lie within `keys`.
        let (k, kd) = unsafe { block_values(t, keys.as_ptr().add(key * stride + b * block)) };
        // Signed by signed: |k| times q carrying k's sign, as ggml's sign trick.
        let lanes = lanes_avx2(_mm256_sign_epi8(k, k), _mm256_sign_epi8(q, k));
        _mm256_fmadd_ps(
            _mm256_mul_ps(_mm256_set1_ps(kd), qd),
            _mm256_cvtepi32_ps(lanes),
            acc,
        )
    };
    // SAFETY: the query holds 32 values per scale.
    let query_block =
        |b: usize| unsafe { _mm256_loadu_si256(values.as_ptr().add(b * 32) as *const __m256i) };
    let grouped = out.len() / KEY_GROUP * KEY_GROUP;
    for j in (0..grouped).step_by(KEY_GROUP) {
        // Key by key, each one's blocks in the order they lie in memory, its sum in a
        // register (an element of the array would go through memory at every block).
        let acc: [__m256; KEY_GROUP] = std::array::from_fn(|i| {
            let mut acc = _mm256_setzero_ps();
            for (b, &qd) in scales.iter().enumerate() {
                acc = fold(acc, j + i, b, query_block(b), _mm256_set1_ps(qd));
            }
            acc
        });
        // SAFETY: `j + 8 <= out.len()`.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(j), hsum8_each(&acc)) };
    }
    for (j, o) in out.iter_mut().enumerate().skip(grouped) {
        let mut acc = _mm256_setzero_ps();
        for (b, &qd) in scales.iter().enumerate() {
            acc = fold(acc, j, b, query_block(b), _mm256_set1_ps(qd));
        }
        *o = hsum_m256(acc);
    }
}

/// Block `b` of a stored head (`row`, in type `t`): its 32 values as four vectors of f32,
/// exactly as stored (a quantized value `q · d`, exact in f32).
///
/// # Safety
/// AVX2 and F16C must be available; `row` points at a whole head of `t` of more than `b`
/// blocks of 32.
#[inline(always)]
unsafe fn value_block(t: KvType, row: *const u8, b: usize) -> [__m256; 4] {
    // SAFETY: the caller gives a head holding block `b`.
    unsafe {
        if t == KvType::F16 {
            let p = row.add(64 * b) as *const __m128i;
            return std::array::from_fn(|i| _mm256_cvtph_ps(_mm_loadu_si128(p.add(i))));
        }
        let block = row.add(b * t.row_bytes(32));
        let ints: [__m256i; 4] = if t == KvType::Q8_0 {
            // Widened straight from memory: splitting one loaded vector into quarters
            // measured 7-12% slower over the whole attention (`attention_kernels`).
            std::array::from_fn(|i| {
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(block.add(2 + 8 * i) as *const __m128i))
            })
        } else {
            let (q, _) = block_values(t, block);
            let (low, high) = (_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
            [
                low,
                _mm_unpackhi_epi64(low, low),
                high,
                _mm_unpackhi_epi64(high, high),
            ]
            .map(|bytes| _mm256_cvtepi8_epi32(bytes))
        };
        let d = _mm256_set1_ps(f16_le([*block, *block.add(1)]));
        ints.map(|i| _mm256_mul_ps(_mm256_cvtepi32_ps(i), d))
    }
}

/// [`KvType::add_values`] with AVX2 (heads of whole blocks of 32, at most
/// [`MAX_VALUE_HEAD`] values): a few keys at a time, their heads converted to f32 once
/// (each read in order), then added four rows at a time, sixteen values of each row's
/// accumulator held in registers across those keys.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `acc` holds the accumulators of `steps.len()`
/// rows, a multiple of 32 values each and at most [`MAX_VALUE_HEAD`]; head `i` of
/// `t.row_bytes(head)` bytes lies at `values[i · stride..]` for every `i < keys`; `keys`
/// is at most the steps' keys.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn add_values(
    t: KvType,
    values: &[u8],
    stride: usize,
    keys: usize,
    steps: &[KeySteps],
    acc: &mut [f32],
) {
    let rows = steps.len();
    let head = acc.len() / rows;
    let per_pass = MAX_VALUE_HEAD / head;
    let mut converted = std::mem::MaybeUninit::<[f32; MAX_VALUE_HEAD]>::uninit();
    let converted = converted.as_mut_ptr() as *mut f32;
    for first in (0..keys).step_by(per_pass) {
        let n = per_pass.min(keys - first);
        for k in 0..n {
            // SAFETY: the caller guarantees head `first + k` lies within `values`; `n`
            // heads of `head` values fit in `converted`.
            unsafe {
                let row = values.as_ptr().add((first + k) * stride);
                for b in 0..head / 32 {
                    let to = converted.add(k * head + 32 * b);
                    for (i, v) in value_block(t, row, b).into_iter().enumerate() {
                        _mm256_storeu_ps(to.add(8 * i), v);
                    }
                }
            }
        }
        let pass = Pass {
            converted,
            head,
            first,
            keys: n,
            f16_acc: t == KvType::F16,
        };
        for g in (0..rows).step_by(ROW_TILE) {
            let (steps, a) = (&steps[g..], acc[g * head..].as_mut_ptr());
            // SAFETY: as the caller guarantees, for the rows from `g`; the pass's heads
            // are converted.
            unsafe {
                match rows - g {
                    1 => pass.add_rows::<1>(steps, a),
                    2 => pass.add_rows::<2>(steps, a),
                    3 => pass.add_rows::<3>(steps, a),
                    _ => pass.add_rows::<ROW_TILE>(steps, a),
                }
            }
        }
    }
}

/// Values of keys `first..first + keys` converted to f32 (`head` each, one after another
/// from `converted`), to be added into rows' accumulators.
struct Pass {
    converted: *const f32,
    head: usize,
    first: usize,
    keys: usize,
    /// Whether the accumulators are f16 (f16 values): each step rounded to f16 and back.
    f16_acc: bool,
}

impl Pass {
    /// Adds the pass's values into `R` rows' accumulators (`head` apart from `acc`),
    /// sixteen values at a time, each row rescaled where a key raised its maximum.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available; `acc` reaches `R` rows of `head` writable values
    /// and `steps` holds `R` rows.
    #[inline(always)]
    unsafe fn add_rows<const R: usize>(&self, steps: &[KeySteps], acc: *mut f32) {
        // SAFETY: the caller guarantees AVX2, FMA and F16C and the accumulators; the
        // converted values lie within the pass.
        unsafe {
            let steps: &[KeySteps; R] = steps[..R].try_into().unwrap();
            let (head, f16_acc) = (self.head, self.f16_acc);
            let round = |x: __m256| {
                if f16_acc {
                    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
                } else {
                    x
                }
            };
            for d in (0..head).step_by(VALUE_CHUNK) {
                // `d + 16 <= head` (a multiple of 32) in each of the `R` rows.
                let mut a: [[__m256; 2]; R] = std::array::from_fn(|r| {
                    let p = acc.add(r * head + d);
                    [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))]
                });
                for k in 0..self.keys {
                    let i = self.first + k;
                    let from = self.converted.add(k * head + d);
                    let v = [_mm256_loadu_ps(from), _mm256_loadu_ps(from.add(8))];
                    for (a, steps) in a.iter_mut().zip(steps) {
                        if steps.raised(i) {
                            let s = _mm256_set1_ps(steps.rescale[i]);
                            *a = a.map(|a| round(_mm256_mul_ps(a, s)));
                        }
                        let w = _mm256_set1_ps(steps.weight[i]);
                        a[0] = round(_mm256_fmadd_ps(v[0], w, a[0]));
                        a[1] = round(_mm256_fmadd_ps(v[1], w, a[1]));
                    }
                }
                for (r, a) in a.iter().enumerate() {
                    let p = acc.add(r * head + d);
                    _mm256_storeu_ps(p, a[0]);
                    _mm256_storeu_ps(p.add(8), a[1]);
                }
            }
        }
    }
}
