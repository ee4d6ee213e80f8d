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

#[cfg(test)]
mod tests {
    #[test]
    fn dots_match_the_dequantized_product() {
        super::block32::tests::dots_match_the_dequantized_product::<super::Q4_0>();
    }
}
