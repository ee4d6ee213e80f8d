//! Q5_0: 32 five-bit values, offset by 16, with an f16 scale (22 bytes).

use bytemuck::{Pod, Zeroable};
use candle_core::quantized::GgmlDType;

use super::block32::{self, Block32};
use super::{nibbles, FormatInfo};
use crate::simd::convert::f16_le;

/// A block as stored.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(in crate::quant) struct Q5_0 {
    /// The scale, an f16.
    d: [u8; 2],
    /// Value `j`'s fifth bit is bit `j` (a little-endian u32).
    qh: [u8; 4],
    /// The low four bits: low nibbles the first sixteen values, high nibbles the rest.
    qs: [u8; 16],
}

impl Block32 for Q5_0 {
    const NAME: &'static str = "Q5_0";
    const GGML_TYPE: u32 = 6;
    const CANDLE: GgmlDType = GgmlDType::Q5_0;
    fn scale(&self) -> f32 {
        f16_le(self.d)
    }
    fn values(&self) -> [i32; 32] {
        nibbles(&self.qs, Some(u32::from_le_bytes(self.qh)), 16)
    }
}

/// The registry's row.
pub(super) const INFO: FormatInfo = block32::info::<Q5_0>();

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8::quantize_row;

    #[test]
    fn dots_match_the_dequantized_product() {
        block32::tests::dots_match_the_dequantized_product::<Q5_0>();
    }

    #[test]
    fn the_high_bits_are_the_fifth_bits() {
        // Nibbles 0 with every high bit set: every weight is 16 - 16 = 0; with none set, -16.
        let mut w = half::f16::from_f32(1.0).to_le_bytes().to_vec();
        w.extend(u32::MAX.to_le_bytes());
        w.extend([0u8; 16]);
        let a = quantize_row(&[1.0f32; 32]);
        assert_eq!(block32::dot::<Q5_0>(&w, &a), 0.0);
        w[2..6].copy_from_slice(&0u32.to_le_bytes());
        assert!((block32::dot::<Q5_0>(&w, &a) + 16.0 * 32.0).abs() < 0.2);
    }
}
