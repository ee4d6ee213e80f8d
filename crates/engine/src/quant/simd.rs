//! The AVX2 (and AVX-512 VNNI) pieces the block-of-32 kernels share: CPU feature checks,
//! decoding nibbles and high bits, the four-product integer lanes, `hsum_float_8`, and
//! activation quantization. Integer lane sums are exact, and the floating-point steps are
//! those of the portable code, so the kernels built on them give bit-identical results.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;
#[cfg(test)]
use std::ops::Range;

use super::kquant::{Q8KRow, QK_K};
use super::q8::Q8Row;
use super::RowKernel;
use crate::simd::reduce::hsum8;

/// Low nibbles of 16 bytes, then their high nibbles: 32 values 0..=15.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn nibbles(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// 0xFF in byte i where bit i of `bits` is set, else 0.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn bit_bytes(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select)
}

/// An f16 (little-endian bytes at `p`) as f32, with the F16C instruction.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Sums the eight lanes in `hsum_float_8` order.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn hsum(acc: __m256) -> f32 {
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    hsum8(&lanes)
}

/// [`super::q8::quantize_row`] eight values at a time: the same block maximum, scale and
/// rounding (half to even), so the same bytes.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`available`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_row(x: &[f32]) -> Q8Row {
    let blocks = x.len() / 32;
    let mut row = Q8Row {
        d: Vec::with_capacity(blocks),
        s: Vec::with_capacity(blocks),
        qs: vec![0; blocks * 32],
    };
    let sign = _mm256_set1_ps(-0.0);
    for b in 0..blocks {
        let p = x.as_ptr().add(b * 32);
        let v = [0, 8, 16, 24].map(|i| _mm256_loadu_ps(p.add(i)));
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for v in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *v));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let amax = lanes.iter().fold(0f32, |a, &l| a.max(l));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let q = v.map(|v| _mm256_cvtps_epi32(_mm256_round_ps::<NEAREST>(_mm256_mul_ps(v, id))));
        let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let mut sums = [0i32; 8];
        _mm256_storeu_si256(sums.as_mut_ptr() as *mut __m256i, sum);
        // Pack to bytes; the packs interleave 128-bit halves, the permutation undoes it.
        let packed = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let packed = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(row.qs.as_mut_ptr().add(b * 32) as *mut __m256i, packed);
        row.d.push(half::f16::from_f32(d).to_f32());
        row.s
            .push(half::f16::from_f32(d * sums.iter().sum::<i32>() as f32).to_f32());
    }
    row
}

/// [`super::kquant::quantize_row_q8k`] eight values at a time: the same extreme (the first
/// of largest magnitude, or for the GEMM the positive one on a tie), scale and rounding
/// (half to even), so the same bytes, sums and scales.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`available`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_row_q8k(x: &[f32], kernel: RowKernel) -> Q8KRow {
    let blocks = x.len() / QK_K;
    let mut row = Q8KRow {
        d: Vec::with_capacity(blocks),
        qs: vec![0; blocks * QK_K],
        bsums: vec![0; blocks * 16],
    };
    let sign = _mm256_set1_ps(-0.0);
    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for b in 0..blocks {
        let block = &x[b * QK_K..(b + 1) * QK_K];
        let p = block.as_ptr();
        let mut m = _mm256_setzero_ps();
        for i in (0..QK_K).step_by(8) {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(i))));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let amax = lanes.iter().fold(0f32, |a, &l| a.max(l));
        if amax == 0.0 {
            row.d.push(0.0);
            continue;
        }
        // The first value of that magnitude; on a tie the GEMM takes +amax.
        let first = block
            .iter()
            .position(|v| v.abs() == amax)
            .expect("amax is some value's magnitude");
        let mut max = block[first];
        if kernel.in_group_of_four() && max < 0.0 && block[first..].contains(&amax) {
            max = amax;
        }
        let iscale = -127.0 / max;
        let scale = _mm256_set1_ps(iscale);
        let top = _mm256_set1_epi32(127);
        let qs = row.qs.as_mut_ptr().add(b * QK_K);
        for g in 0..16 {
            let q = [0, 8].map(|i| {
                let v = _mm256_mul_ps(scale, _mm256_loadu_ps(p.add(16 * g + i)));
                _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_round_ps::<NEAREST>(v)), top)
            });
            let mut sums = [0i32; 8];
            _mm256_storeu_si256(
                sums.as_mut_ptr() as *mut __m256i,
                _mm256_add_epi32(q[0], q[1]),
            );
            row.bsums[b * 16 + g] = sums.iter().sum();
            // Pack to bytes (the packs interleave 128-bit halves; the permutation undoes it).
            let words = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[0], q[1]));
            let bytes = _mm256_packs_epi16(words, words);
            let bytes = _mm256_permute4x64_epi64::<0b11_01_10_00>(bytes);
            _mm_storeu_si128(
                qs.add(16 * g) as *mut __m128i,
                _mm256_castsi256_si128(bytes),
            );
        }
        row.d.push(1.0 / iscale);
    }
    row
}

/// Two 16-bit integers (the low 16 bits of each) in one 32-bit lane, `low` first.
#[inline(always)]
pub(super) fn pair16(low: i32, high: i32) -> i32 {
    ((low as i16 as u16 as u32) | ((high as i16 as u16 as u32) << 16)) as i32
}

/// Eight lanes of four products each, for unsigned `x` (≤ 128) and signed `y`, with AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn lanes_avx2(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

/// Asks for every cache line of `bytes` bytes from `p` on, `distance` bytes further on,
/// into the first-level cache (nothing where that is 0). Any address will do: a prefetch
/// never faults, so running past the end of a matrix is harmless.
///
/// `distance` is [`crate::simd::cpu::prefetch_ahead`], which each kernel reads once, before its
/// loop: a plain local the compiler can test outside the loop (read inside it, from the
/// static, it cost 1B Q4_K_M prefill two fifths of its speed on a CPU without prefetch).
#[inline(always)]
pub(super) fn prefetch_span<T>(p: *const T, bytes: usize, distance: usize) {
    if distance == 0 {
        return;
    }
    let ahead = (p as *const i8).wrapping_add(distance);
    for off in (0..bytes).step_by(64) {
        // SAFETY: a prefetch reads nothing architecturally and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off)) };
    }
}

/// Asks for every cache line that the `bytes` bytes from `p` on touch, into the
/// second-level cache (`prefetcht1`): from the line holding `p`, whatever its alignment, to
/// the one holding the last byte. Any address will do: a prefetch never faults.
#[inline(always)]
pub(crate) fn ask_for_lines<T>(p: *const T, bytes: usize) {
    const LINE: usize = 64;
    let misalign = p as usize % LINE;
    let first = (p as *const i8).wrapping_sub(misalign);
    for off in (0..misalign + bytes).step_by(LINE) {
        // SAFETY: a prefetch reads nothing architecturally and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(first.wrapping_add(off)) };
    }
}

/// Lines of weights a kernel asks the memory for while it computes on lines it already
/// holds: in a product of several activation rows, the next group's lines during the
/// second and later passes over a group ([`super::layout::lane_groups`]).
///
/// The first pass streams a group from memory, the later ones read it from the cache,
/// and the hardware's prefetchers, which follow the kernel's misses, then have none to
/// follow: the memory idled through them, and the time of a product was that of its
/// streaming plus that of its computing. Asked for a few lines at each step of the
/// later passes, the next group arrives while they compute.
///
/// `matmul_kernels`, 2 threads, matrices of 142–178 MiB, the builds alternating, giga
/// multiply-adds a second: Q4_1 at 8 rows 147 → 180, Q5_0 at 4 rows 81–85 → 126, Q4_K at
/// 8 rows 161–172 → 188–234, Q8_0 at 16 rows 135–137 → 176–179 (Gemma 3's output matrix
/// 126–131 → 147–152). A pass of one row after a pair asks for a whole group alone and
/// loses (Q8_0, 2048 wide, 3 rows: 72 → 57–60; Gemma's 640-wide one 81–82 → 74–79);
/// other counts of rows gain or stay. Into the second-level cache (`prefetcht1`): into
/// the first (`prefetcht0`), 4 rows of Q8_0 gained nothing.
pub(super) struct Upcoming {
    /// The next line to ask for, and the end of the lines, as addresses.
    next: usize,
    end: usize,
    /// Bytes asked for at each step.
    per_step: usize,
}

impl Upcoming {
    /// Nothing to ask for.
    pub const NONE: Self = Self {
        next: 0,
        end: 0,
        per_step: 0,
    };

    /// `lines` asked for `per_step` lines a step (at least one).
    pub fn new<T>(lines: &[T], per_step: usize) -> Self {
        let at = lines.as_ptr() as usize;
        Self {
            next: at,
            end: at + size_of_val(lines),
            per_step: 64 * per_step.max(1),
        }
    }

    /// The addresses still to be asked for (for tests).
    #[cfg(test)]
    pub fn span(&self) -> Range<usize> {
        self.next..self.end.max(self.next)
    }

    /// Asks for the next step's share (nothing once all have been asked for).
    #[inline(always)]
    pub fn step(&mut self) {
        let stop = self.end.min(self.next + self.per_step);
        if self.next < stop {
            ask_for_lines(self.next as *const i8, stop - self.next);
            self.next = stop;
        }
    }
}
