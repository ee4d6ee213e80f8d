//! Q8_0: 32 eight-bit values with an f16 scale (34 bytes).

use bytemuck::{Pod, Zeroable};
use candle_core::quantized::GgmlDType;

use super::block32::{self, Block32};
use super::FormatInfo;
use crate::simd::convert::f16_le;

/// A block as stored.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(in crate::quant) struct Q8_0 {
    /// The scale, an f16.
    d: [u8; 2],
    /// The values, signed bytes.
    qs: [u8; 32],
}

impl Block32 for Q8_0 {
    const NAME: &'static str = "Q8_0";
    const GGML_TYPE: u32 = 8;
    const CANDLE: GgmlDType = GgmlDType::Q8_0;
    fn scale(&self) -> f32 {
        f16_le(self.d)
    }
    fn values(&self) -> [i32; 32] {
        self.qs.map(|q| q as i8 as i32)
    }
}

/// The registry's row.
pub(super) const INFO: FormatInfo = block32::info::<Q8_0>();

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8::quantize_row;

    #[test]
    fn dots_match_the_dequantized_product() {
        block32::tests::dots_match_the_dequantized_product::<Q8_0>();
    }

    #[test]
    fn a_block_is_its_scale_times_its_bytes() {
        let mut w = half::f16::from_f32(0.5).to_le_bytes().to_vec();
        w.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 10.0) / 4.0).collect();
        let a = quantize_row(&x);
        let exact: f32 = (0..32)
            .map(|i| 0.5 * (i as f32 - 16.0) * a.d[0] * a.qs[i] as f32)
            .sum();
        assert!((block32::dot::<Q8_0>(&w, &a) - exact).abs() < 1e-3);
    }
}
