//! AVX2 versions of the block-of-32 dot products. Integer lane sums are exact, and the
//! floating-point steps (one fused multiply-add per lane per block, then `hsum8`) are the
//! same as in the portable code, so both give bit-identical results.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use half::f16;

use super::dot::{hsum8, BlockFormat};
use super::q8::Q8Row;

/// Whether this CPU can run the AVX2 kernels.
pub fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// Low nibbles of 16 bytes, then their high nibbles: 32 values 0..=15.
#[target_feature(enable = "avx2")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// 0xFF in byte i where bit i of `bits` is set, else 0.
#[target_feature(enable = "avx2")]
unsafe fn bit_bytes(bits: u32) -> __m256i {
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

/// Eight lanes of four products each, for unsigned `x` (≤ 128) and signed `y`.
#[target_feature(enable = "avx2")]
unsafe fn lanes_unsigned(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

/// Eight lanes of four products each, for signed `x` and `y`.
#[target_feature(enable = "avx2")]
unsafe fn lanes_signed(x: __m256i, y: __m256i) -> __m256i {
    lanes_unsigned(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// The dot product of a weight row with a quantized activation row.
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`available`]).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot(format: BlockFormat, w: &[u8], a: &Q8Row) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut extra = 0f32;
    for (b, block) in w.chunks_exact(format.block_bytes()).enumerate() {
        let y = _mm256_loadu_si256(a.qs.as_ptr().add(b * 32) as *const __m256i);
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let lanes = match format {
            BlockFormat::Q4_1 => {
                let m = f16::from_le_bytes([block[2], block[3]]).to_f32();
                extra = m.mul_add(a.s[b], extra);
                lanes_unsigned(nibbles(block.as_ptr().add(4)), y)
            }
            BlockFormat::Q5_0 => {
                let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                let high = _mm256_andnot_si256(bit_bytes(qh), _mm256_set1_epi8(0xF0u8 as i8));
                let x = _mm256_or_si256(nibbles(block.as_ptr().add(6)), high);
                lanes_signed(x, y)
            }
            BlockFormat::Q8_0 => {
                let x = _mm256_loadu_si256(block.as_ptr().add(2) as *const __m256i);
                lanes_signed(x, y)
            }
        };
        let dd = _mm256_set1_ps(d * a.d[b]);
        acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(lanes), acc);
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    hsum8(&lanes) + extra
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8::quantize_row;

    #[test]
    fn avx2_matches_the_portable_kernels_bit_for_bit() {
        if !available() {
            return;
        }
        let cols = 256;
        let x: Vec<f32> = (0..cols)
            .map(|i| (i * 7919 % 1013) as f32 / 300.0 - 1.7)
            .collect();
        let a = quantize_row(&x);
        for format in [BlockFormat::Q4_1, BlockFormat::Q5_0, BlockFormat::Q8_0] {
            let mut w = vec![0u8; format.row_bytes(cols)];
            for (i, byte) in w.iter_mut().enumerate() {
                *byte = (i * 131 % 251) as u8;
            }
            // Keep the f16 scales finite and small.
            for block in w.chunks_exact_mut(format.block_bytes()) {
                block[0..2].copy_from_slice(&f16::from_f32(0.013).to_le_bytes());
                if format == BlockFormat::Q4_1 {
                    block[2..4].copy_from_slice(&f16::from_f32(-0.1).to_le_bytes());
                }
            }
            let portable = format.dot_portable(&w, &a);
            let fast = unsafe { dot(format, &w, &a) };
            assert_eq!(
                portable.to_bits(),
                fast.to_bits(),
                "{format:?}: {portable} vs {fast}"
            );
        }
    }
}
