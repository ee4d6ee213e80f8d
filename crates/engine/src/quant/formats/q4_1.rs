//! Q4_1: 32 four-bit values with an f16 scale and an f16 minimum (20 bytes).

use bytemuck::{Pod, Zeroable};
use candle_core::quantized::GgmlDType;

use super::block32::{self, Block32};
use super::{nibbles, FormatInfo};
use crate::simd::convert::f16_le;

/// A block as stored.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(in crate::quant) struct Q4_1 {
    /// The scale, an f16.
    d: [u8; 2],
    /// The minimum, an f16.
    m: [u8; 2],
    /// Low nibbles the first sixteen values, high nibbles the last sixteen.
    qs: [u8; 16],
}

impl Block32 for Q4_1 {
    const NAME: &'static str = "Q4_1";
    const GGML_TYPE: u32 = 3;
    const CANDLE: GgmlDType = GgmlDType::Q4_1;
    fn scale(&self) -> f32 {
        f16_le(self.d)
    }
    fn minimum(&self) -> Option<f32> {
        Some(f16_le(self.m))
    }
    fn values(&self) -> [i32; 32] {
        nibbles(&self.qs, None, 0)
    }
}

/// The registry's row.
pub(super) const INFO: FormatInfo = block32::info::<Q4_1>();

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8::quantize_row;

    #[test]
    fn dots_match_the_dequantized_product() {
        block32::tests::dots_match_the_dequantized_product::<Q4_1>();
    }

    #[test]
    fn the_dot_product_includes_the_minimum() {
        // All nibbles 1, d = 1, m = -2: every weight is -1.
        let mut w = half::f16::from_f32(1.0).to_le_bytes().to_vec();
        w.extend(half::f16::from_f32(-2.0).to_le_bytes());
        w.extend([0x11u8; 16]);
        let a = quantize_row(&[1.0f32; 32]);
        // The activation scale 1/127 is stored as f16, hence the tolerance.
        assert!((block32::dot::<Q4_1>(&w, &a) + 32.0).abs() < 1e-2);
    }
}
