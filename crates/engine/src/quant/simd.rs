//! AVX2 versions of the block-of-32 dot products. Integer lane sums are exact, and the
//! floating-point steps (one fused multiply-add per lane per block, then `hsum8`) are the
//! same as in the portable code, so both give bit-identical results.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::dot::{hsum8, BlockFormat};
use super::q8::Q8Row;

/// Whether this CPU can run the AVX2 kernels.
pub fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
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

/// An f16 (little-endian bytes at `p`) as f32, with the F16C instruction.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Sums the eight lanes in `hsum_float_8` order.
#[target_feature(enable = "avx2")]
unsafe fn hsum(acc: __m256) -> f32 {
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    hsum8(&lanes)
}

/// The dot product of a weight row with a quantized activation row.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`available`]); `w` holds whole blocks and
/// `a` at least as many.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot(format: BlockFormat, w: &[u8], a: &Q8Row) -> f32 {
    dot_rows::<1>(format, w, [a])[0]
}

/// Dot products of one weight row with `N` activation rows: each weight block is decoded
/// once for all of them. Every row accumulates exactly as [`dot`] would.
///
/// # Safety
/// As for [`dot`], for every row.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_rows<const N: usize>(format: BlockFormat, w: &[u8], a: [&Q8Row; N]) -> [f32; N] {
    let bytes = format.block_bytes();
    let blocks = w.len() / bytes;
    for row in &a {
        assert!(row.d.len() >= blocks && row.s.len() >= blocks && row.qs.len() >= blocks * 32);
    }
    let wp = w.as_ptr();
    let qs = a.map(|row| row.qs.as_ptr());
    let ds = a.map(|row| row.d.as_ptr());
    let ss = a.map(|row| row.s.as_ptr());
    let mut acc = [_mm256_setzero_ps(); N];
    let mut extra = [0f32; N];
    let high_mask = _mm256_set1_epi8(0xF0u8 as i8);
    for b in 0..blocks {
        let block = wp.add(b * bytes);
        let d = f16_at(block);
        // The weights as bytes, and whether they are signed (then the sign trick applies).
        let (x, signed) = match format {
            BlockFormat::Q4_1 => {
                let m = f16_at(block.add(2));
                for r in 0..N {
                    extra[r] = m.mul_add(*ss[r].add(b), extra[r]);
                }
                (nibbles(block.add(4)), false)
            }
            BlockFormat::Q5_0 => {
                let qh = u32::from_le_bytes([
                    *block.add(2),
                    *block.add(3),
                    *block.add(4),
                    *block.add(5),
                ]);
                let high = _mm256_andnot_si256(bit_bytes(qh), high_mask);
                (_mm256_or_si256(nibbles(block.add(6)), high), true)
            }
            BlockFormat::Q8_0 => (_mm256_loadu_si256(block.add(2) as *const __m256i), true),
        };
        let ux = if signed { _mm256_sign_epi8(x, x) } else { x };
        for r in 0..N {
            let y = _mm256_loadu_si256(qs[r].add(b * 32) as *const __m256i);
            let y = if signed { _mm256_sign_epi8(y, x) } else { y };
            let lanes = lanes_unsigned(ux, y);
            let dd = _mm256_set1_ps(d * *ds[r].add(b));
            acc[r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(lanes), acc[r]);
        }
    }
    let mut out = [0f32; N];
    for r in 0..N {
        out[r] = hsum(acc[r]) + extra[r];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8::quantize_row;
    use half::f16;

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
