//! Integer lanes the block kernels share (AVX2): nibbles and high bits spread to bytes,
//! two 16-bit values in one lane, and the four-product sums of unsigned by signed bytes.
//! Integer sums are exact, so every kernel built on them matches its portable twin.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

/// Low nibbles of 16 bytes, then their high nibbles: 32 values 0..=15.
///
/// # Safety
/// The CPU must have AVX2, and `p` must point at 16 readable bytes.
#[inline]
#[target_feature(enable = "avx2")]
pub unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller gives 16 readable bytes at `p`.
    let tmp = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let both = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// 32 values less 8 from sixteen bytes of nibbles at `p` (Q4_0's), as signed bytes.
///
/// # Safety
/// The CPU must have AVX2; `p` points at 16 readable bytes.
#[inline(always)]
pub unsafe fn nibbles_less_8(p: *const u8) -> __m256i {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe { _mm256_sub_epi8(nibbles(p), _mm256_set1_epi8(8)) }
}

/// 0xFF in byte i where bit i of `bits` is set, else 0.
///
/// # Safety
/// Register-only: safe to call from code compiled with AVX2; from other code the call
/// is `unsafe`, and the CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2")]
pub fn bit_bytes(bits: u32) -> __m256i {
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

/// Two 16-bit integers (the low 16 bits of each) in one 32-bit lane, `low` first.
#[inline(always)]
pub fn pair16(low: i32, high: i32) -> i32 {
    ((low as i16 as u16 as u32) | ((high as i16 as u16 as u32) << 16)) as i32
}

/// Eight lanes of four products each, for unsigned `x` (≤ 128) and signed `y`, with AVX2.
///
/// # Safety
/// Register-only: safe to call from code compiled with AVX2; from other code the call
/// is `unsafe`, and the CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2")]
pub fn lanes_avx2(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}
