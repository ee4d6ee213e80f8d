//! Q4_0: 32 four-bit values, offset by 8, with an f16 scale (18 bytes).

use bytemuck::{Pod, Zeroable};
use candle_core::quantized::GgmlDType;

use super::block32::{self, Block32};
use super::{nibbles, FormatInfo};
use crate::simd::convert::f16_le;

/// A block as stored.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(in crate::quant) struct Q4_0 {
    /// The scale, an f16.
    d: [u8; 2],
    /// Low nibbles the first sixteen values, high nibbles the last sixteen.
    qs: [u8; 16],
}

impl Block32 for Q4_0 {
    const NAME: &'static str = "Q4_0";
    const GGML_TYPE: u32 = 2;
    const CANDLE: GgmlDType = GgmlDType::Q4_0;
    fn scale(&self) -> f32 {
        f16_le(self.d)
    }
    fn values(&self) -> [i32; 32] {
        nibbles(&self.qs, None, 8)
    }
}

/// The registry's row.
pub(super) const INFO: FormatInfo = block32::info::<Q4_0>();

/// Quantizes `x` (a multiple of 32 values) into Q4_0 blocks in `out` (18 bytes each), as
/// llama.cpp quantizes a row it stores (`quantize_row_q4_0_ref`, which its CPU backend
/// runs): per block the signed value of largest magnitude `max` (the first on ties),
/// `d = max / -8` stored as f16, and each value `min(15, trunc(x · (1/d) + 8.5))` with
/// `1/d` taken from the unrounded `d` (0 for an all-zero block).
pub(in crate::quant) fn quantize_into(x: &[f32], out: &mut [u8]) {
    for (block, x) in out
        .chunks_exact_mut(block32::block_bytes::<Q4_0>())
        .zip(x.chunks_exact(32))
    {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // ggml's `(int8_t)(x*id + 8.5f)`: a product then a sum, each rounded (that file
        // is built without FMA), truncated toward zero; always within 0..=16 here.
        let level = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        block[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for j in 0..16 {
            block[2 + j] = level(x[j]) | (level(x[16 + j]) << 4);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dots_match_the_dequantized_product() {
        block32::tests::dots_match_the_dequantized_product::<Q4_0>();
    }

    /// The signed extreme sets the scale (the first of a tie), the extreme itself lands on
    /// level 0, the opposite extreme's 16.5 is clamped to 15, and halves truncate.
    #[test]
    fn quantizes_as_llama_cpp_with_its_ties_and_clamp() {
        let mut x = [0f32; 32];
        x[3] = -4.0;
        x[20] = 4.0; // ties with -4 in magnitude: -4 came first, so d = -4 / -8 = 0.5
        x[5] = 1.0; // 1 / 0.5 + 8.5 = 10.5 → 10
        x[6] = -0.25; // -0.5 + 8.5 = 8.0 → 8
        let mut out = [0u8; 18];
        quantize_into(&x, &mut out);
        assert_eq!(f16_le([out[0], out[1]]), 0.5);
        let q = Q4_0 {
            d: [out[0], out[1]],
            qs: out[2..].try_into().unwrap(),
        }
        .values();
        assert_eq!(q[3], -8, "the extreme: 0 - 8");
        assert_eq!(q[20], 7, "16.5 clamps to 15, less 8");
        assert_eq!((q[5], q[6], q[0]), (2, 0, 0));
        // An all-zero block: scale -0 (0 / -8), every value at level 8.
        let mut zero = [1u8; 18];
        quantize_into(&[0.0; 32], &mut zero);
        assert_eq!(
            zero,
            [
                0, 0x80, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88,
                0x88, 0x88, 0x88, 0x88
            ]
        );
    }
}
