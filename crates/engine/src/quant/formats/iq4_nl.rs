//! IQ4_NL: llama.cpp's non-linear 4-bit format, a block of 32 indices into
//! [`iq4::VALUES`] with an f16 scale (18 bytes). Where llama.cpp repacks a matrix (rows a
//! multiple of eight) its rows keep their sixteen-row lanes (`block_lanes`, AVX2 and
//! AVX-512 VNNI), in the family's [`table4::dot`] arithmetic. Other matrices llama.cpp
//! multiplies with tinyBLAS (`llamafile/sgemm.cpp`), whose sums ferrite does not follow
//! for this format: it refuses them.

use super::super::iq4;
use super::table4::{self, Table4};
use super::{FormatInfo, MatrixReader};
use crate::simd::convert::f16_at;

/// The format.
pub(in crate::quant) struct Iq4Nl;

impl Table4 for Iq4Nl {
    const NAME: &'static str = "IQ4_NL";
    const GGML_TYPE: u32 = 20;
    const BLOCK_BYTES: usize = 18;
    const VALUES: [i8; 16] = iq4::VALUES;

    fn scale(block: &[u8]) -> f32 {
        f16_at(block, 0)
    }
}

/// The registry's row: the family's, but its matrices multiplied as the kernels' table
/// says (the sixteen-row lanes where llama.cpp repacks them, and no other matrices).
pub(super) const INFO: FormatInfo = FormatInfo {
    matrix: MatrixReader::Table,
    ..table4::info::<Iq4Nl>()
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::sample::Xorshift;

    #[test]
    fn the_dot_product_and_every_kernel_follow_the_table() {
        let mut rng = Xorshift::new(4);
        let data = table4::tests::random_rows::<Iq4Nl>(16, 256, &mut rng, |b, rng| {
            let scale = 0.002 + 0.02 * rng.next_f32().abs();
            b[..2].copy_from_slice(&half::f16::from_f32(scale).to_le_bytes());
        });
        table4::tests::dot_equals_the_dequantized_product::<Iq4Nl>(&data, 256);
        table4::tests::kernels_equal_the_dot_product::<Iq4Nl>(&data, 16, 256);
        // The registry's matrix: the sixteen-row lanes, in the same arithmetic.
        let lanes = table4::tests::random_rows::<Iq4Nl>(40, 512, &mut rng, |b, _| {
            b[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        });
        table4::tests::matrix_equals_the_dot_product::<Iq4Nl>(&lanes, 40, 512);
    }
}
