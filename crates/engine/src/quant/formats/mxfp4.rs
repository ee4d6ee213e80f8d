//! MXFP4 (the OCP microscaling format of OpenAI's gpt-oss weights): a block of 32 FP4
//! (E2M1) values with one shared power-of-two scale (E8M0), 17 bytes. ggml stores the
//! exponent byte first, then the indices, and doubles E2M1's values to integers
//! (`kvalues_mxfp4`), halving the scale to make up for it
//! (`GGML_E8M0_TO_FP32_HALF`). llama.cpp repacks it as IQ4_NL, with the same kernels.

use super::table4::{self, Table4};
use super::FormatInfo;

/// The format.
pub(in crate::quant) struct Mxfp4;

impl Table4 for Mxfp4 {
    const NAME: &'static str = "MXFP4";
    const GGML_TYPE: u32 = 39;
    const BLOCK_BYTES: usize = 17;
    const VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

    /// `2^(e − 128)`, the f32 of that bit pattern (a subnormal for `e` below 2).
    fn scale(block: &[u8]) -> f32 {
        let e = block[0] as u32;
        f32::from_bits(if e < 2 {
            0x0020_0000 << e
        } else {
            (e - 1) << 23
        })
    }
}

/// The registry's row.
pub(super) const INFO: FormatInfo = table4::info::<Mxfp4>();

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::sample::Xorshift;

    #[test]
    fn the_scale_is_half_of_two_to_the_exponent_less_127() {
        assert_eq!(Mxfp4::scale(&[127]), 0.5);
        assert_eq!(Mxfp4::scale(&[130]), 4.0);
        assert_eq!(Mxfp4::scale(&[2]), 2f64.powi(-126) as f32);
        assert_eq!(Mxfp4::scale(&[1]), 2f64.powi(-127) as f32);
        assert_eq!(Mxfp4::scale(&[0]), 2f64.powi(-128) as f32);
        assert_eq!(Mxfp4::scale(&[255]), 2f64.powi(127) as f32);
    }

    #[test]
    fn a_block_dequantizes_to_its_fp4_values_times_its_scale() {
        // Exponent 128 (scale 1, so the doubled values), then indices 0..16 in the low
        // nibbles and 15 - j in the high ones.
        let mut block = vec![128u8];
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut out = Vec::new();
        table4::dequantize::<Mxfp4>(&block, &mut out);
        let values = Mxfp4::VALUES.map(f32::from);
        assert_eq!(&out[..16], &values);
        let reversed: Vec<f32> = values.iter().rev().copied().collect();
        assert_eq!(&out[16..], &reversed[..]);
    }

    #[test]
    fn every_kernel_equals_the_dot_product() {
        let mut rng = Xorshift::new(3);
        // Scales from subnormal to large; 24 rows (repacked), and 21 (a last group of five,
        // llama.cpp's `vec_dot` arithmetic) over an odd number of blocks.
        let data = table4::tests::random_rows::<Mxfp4>(24, 256, &mut rng, |b, rng| {
            b[0] = [0, 1, 100, 118, 127, 140][(rng.next_u64() % 6) as usize];
        });
        table4::tests::kernels_equal_the_dot_product::<Mxfp4>(&data, 24, 256);
        let odd = table4::tests::random_rows::<Mxfp4>(21, 224, &mut rng, |b, _| b[0] = 119);
        table4::tests::kernels_equal_the_dot_product::<Mxfp4>(&odd, 21, 224);
        // 150 rows: two chunks of the parallel product, the second ending mid-group.
        let wide = table4::tests::random_rows::<Mxfp4>(150, 512, &mut rng, |b, _| b[0] = 121);
        table4::tests::matrix_equals_the_dot_product::<Mxfp4>(&wide, 150, 512);
        let normal = table4::tests::random_rows::<Mxfp4>(4, 256, &mut rng, |b, _| b[0] = 120);
        table4::tests::dot_equals_the_dequantized_product::<Mxfp4>(&normal, 256);
    }
}
