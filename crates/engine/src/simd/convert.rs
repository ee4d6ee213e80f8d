//! Number conversions the kernels share: half-precision values read from weight bytes,
//! and activations rounded to the precision of the weights they meet, as llama.cpp
//! converts them.

use half::{bf16, f16};

/// The little-endian f16 at `bytes[at..at + 2]`, as f32.
#[inline]
pub fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16_le([bytes[at], bytes[at + 1]])
}

/// A little-endian f16 as stored (a block's scale field), as f32.
#[inline]
pub fn f16_le(bytes: [u8; 2]) -> f32 {
    f16::from_le_bytes(bytes).to_f32()
}

/// Activations rounded to BF16 and back, as llama.cpp converts them for BF16 weights
/// (round to nearest even).
pub fn round_to_bf16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect()
}

/// Values already rounded to BF16 (by [`round_to_bf16`]) as BF16: each one's upper 16
/// bits, exactly.
pub fn narrow_to_bf16(x: &[f32]) -> Vec<bf16> {
    x.iter()
        .map(|v| bf16::from_bits((v.to_bits() >> 16) as u16))
        .collect()
}

/// Activations rounded to F16, as llama.cpp converts them for F16 weights.
pub fn round_to_f16(x: &[f32]) -> Vec<f16> {
    x.iter().map(|&v| f16::from_f32(v)).collect()
}

#[cfg(target_arch = "x86_64")]
/// An f16 (little-endian bytes at `p`) as f32, with the F16C instruction.
///
/// # Safety
/// The CPU must have AVX2 and F16C, and `p` must point at two readable bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn f16_at_ptr(p: *const u8) -> f32 {
    // SAFETY: the caller gives two readable bytes at `p`.
    let bits = unsafe { u16::from_le_bytes([*p, *p.add(1)]) };
    use std::arch::x86_64::*;
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}
