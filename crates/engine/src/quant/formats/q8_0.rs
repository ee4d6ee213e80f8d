//! Q8_0: 32 eight-bit values with an f16 scale (34 bytes).

use bytemuck::{Pod, Zeroable};
use candle_core::quantized::GgmlDType;

use super::block32::{self, block_bytes, Block32};
use super::FormatInfo;
use crate::quant::q8::quantize_row;
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

/// Quantizes `x` (a multiple of 32 values) into Q8_0 blocks in `out` (34 bytes each), as
/// llama.cpp's CPU backend quantizes a row it stores (`quantize_row_q8_0`, x86): per block
/// `d = amax / 127` stored as f16, values `round_half_even(x · 127 / amax)`.
pub(in crate::quant) fn quantize_into(x: &[f32], out: &mut [u8]) {
    let q = quantize_row(x);
    for ((block, d), qs) in out
        .chunks_exact_mut(block_bytes::<Q8_0>())
        .zip(&q.d)
        .zip(q.qs.chunks_exact(32))
    {
        // `d` is an f16 widened, so this is exact.
        block[..2].copy_from_slice(&half::f16::from_f32(*d).to_le_bytes());
        for (b, &v) in block[2..].iter_mut().zip(qs) {
            *b = v as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_stored_row_is_the_quantized_activation_row() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) / 3.0).collect();
        let mut out = vec![0u8; 68];
        quantize_into(&x, &mut out);
        let q = quantize_row(&x);
        for b in 0..2 {
            let block = &out[b * 34..(b + 1) * 34];
            assert_eq!(f16_le([block[0], block[1]]), q.d[b]);
            let qs: Vec<i8> = block[2..].iter().map(|&v| v as i8).collect();
            assert_eq!(qs, q.qs[b * 32..(b + 1) * 32]);
        }
    }
}
