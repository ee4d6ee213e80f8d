//! Q5_1: 32 five-bit values with an f16 scale and an f16 minimum (24 bytes).

use bytemuck::{Pod, Zeroable};
use candle_core::quantized::GgmlDType;

use super::block32::{self, Block32};
use super::{nibbles, FormatInfo};
use crate::simd::convert::f16_le;

/// A block as stored.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(in crate::quant) struct Q5_1 {
    /// The scale, an f16.
    d: [u8; 2],
    /// The minimum, an f16.
    m: [u8; 2],
    /// Value `j`'s fifth bit is bit `j` (a little-endian u32).
    qh: [u8; 4],
    /// The low four bits: low nibbles the first sixteen values, high nibbles the rest.
    qs: [u8; 16],
}

impl Block32 for Q5_1 {
    const NAME: &'static str = "Q5_1";
    const GGML_TYPE: u32 = 7;
    const CANDLE: GgmlDType = GgmlDType::Q5_1;
    fn scale(&self) -> f32 {
        f16_le(self.d)
    }
    fn minimum(&self) -> Option<f32> {
        Some(f16_le(self.m))
    }
    fn values(&self) -> [i32; 32] {
        nibbles(&self.qs, Some(u32::from_le_bytes(self.qh)), 0)
    }
}

/// The registry's row.
pub(super) const INFO: FormatInfo = block32::info::<Q5_1>();

#[cfg(test)]
mod tests {
    #[test]
    fn dots_match_the_dequantized_product() {
        super::block32::tests::dots_match_the_dequantized_product::<super::Q5_1>();
    }
}
