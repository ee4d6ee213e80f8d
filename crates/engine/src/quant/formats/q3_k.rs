//! Q3_K: a super-block of 256 three-bit values in sixteen sub-blocks of 16, each with a
//! signed 6-bit scale, and an f16 `d` (110 bytes). llama.cpp does not repack it: its
//! products follow its AVX2 `vec_dot` for rows of micro-batches under 8 ([`dot`]) and its
//! tiled matmul for wider ones ([`dot_tiled`]).

use bytemuck::{Pod, Zeroable};
use candle_core::quantized::GgmlDType;

use super::super::q8k::Q8KRow;
use super::kquant::{self, add_lanes, super_block, SuperBlock};
use super::{blocks, FormatInfo};
use crate::simd::convert::f16_le;
use crate::simd::reduce::hsum8;

/// A super-block as stored.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(in crate::quant) struct Q3K {
    /// Value `128j + 32c + e`'s third bit is bit `4j + c` of byte `e`, inverted (a clear
    /// bit takes 4 off).
    hmask: [u8; 32],
    /// The low two bits: value `128j + 32c + e` at bits `2c..2c + 2` of byte `32j + e`.
    qs: [u8; 64],
    /// The sixteen scales, packed ([`Q3K::scales`]).
    packed_scales: [u8; 12],
    /// The scales' scale, an f16.
    d: [u8; 2],
}

impl SuperBlock for Q3K {
    const NAME: &'static str = "Q3_K";
    const GGML_TYPE: u32 = 11;
}

/// Bytes per super-block.
pub(in crate::quant) const BYTES: usize = size_of::<Q3K>();

/// The registry's row.
pub(super) const INFO: FormatInfo = kquant::info::<Q3K>(GgmlDType::Q3K);

impl Q3K {
    /// The sixteen signed 6-bit scales.
    pub(in crate::quant) fn scales(&self) -> [i32; 16] {
        let word = |i: usize| {
            let bytes = &self.packed_scales[4 * i..4 * i + 4];
            u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
        };
        let (a0, a1, a2) = (word(0), word(1), word(2));
        let (low, high) = (0x0f0f_0f0fu32, 0x0303_0303u32);
        let words = [
            (a0 & low) | ((a2 & high) << 4),
            (a1 & low) | (((a2 >> 2) & high) << 4),
            ((a0 >> 4) & low) | (((a2 >> 4) & high) << 4),
            ((a1 >> 4) & low) | (((a2 >> 6) & high) << 4),
        ];
        let mut out = [0i32; 16];
        for (i, w) in words.iter().enumerate() {
            for (k, b) in w.to_le_bytes().iter().enumerate() {
                out[4 * i + k] = *b as i32 - 32;
            }
        }
        out
    }

    /// The eight integer lanes of the super-block times its activations `q8`, as
    /// llama.cpp's x86 `ggml_vec_dot_q3_K_q8_K` sums them (exact, so their total is also
    /// the tiled kernel's integer sum).
    fn lanes(&self, q8: &[i8]) -> [i32; 8] {
        let scales = self.scales();
        let mut lanes = [0i32; 8];
        for j in 0..2 {
            for c in 0..4 {
                let bit = 4 * j + c;
                let at = 128 * j + 32 * c;
                // Two sub-blocks of 16 with their own scales; exact integer sums.
                for half in 0..2 {
                    let mut products = [0i32; 32];
                    for e in 16 * half..16 * half + 16 {
                        let low = ((self.qs[32 * j + e] >> (2 * c)) & 3) as i32;
                        let high = 4 - 4 * ((self.hmask[e] >> bit) & 1) as i32;
                        products[e] = (low - high) * q8[at + e] as i32;
                    }
                    add_lanes(&mut lanes, &products, scales[at / 16 + half]);
                }
            }
        }
        lanes
    }
}

/// The dot product of a weight row with a Q8_K activation row, rounded as llama.cpp's
/// x86 `ggml_vec_dot_q3_K_q8_K`: eight integer lanes per super-block folded into float
/// lanes with one fused multiply-add by `d`, then `hsum_float_8`.
pub(in crate::quant) fn dot(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = [0f32; 8];
    for (b, block) in blocks::<Q3K>(w).iter().enumerate() {
        let d = a.d[b] * f16_le(block.d);
        let lanes = block.lanes(super_block(a, b).0);
        for (l, &lane) in lanes.iter().enumerate() {
            acc[l] = d.mul_add(lane as f32, acc[l]);
        }
    }
    hsum8(&acc)
}

/// The dot product as llama.cpp's tiled matmul computes it for 8 or more activation rows
/// (see `q5_k::dot_tiled`): per super-block the exact integer sum, one rounded product by
/// `d`, added with a fused multiply-add times the activation's scale to a running sum that
/// starts at zero.
pub(in crate::quant) fn dot_tiled(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = 0f32;
    for (b, block) in blocks::<Q3K>(w).iter().enumerate() {
        let lanes = block.lanes(super_block(a, b).0);
        let s1 = lanes.iter().fold(0i32, |s, &l| s.wrapping_add(l));
        acc = (s1 as f32 * f16_le(block.d)).mul_add(a.d[b], acc);
    }
    acc
}

/// [`dot_tiled`] or [`dot`] of one weight row with up to four activation rows (entries
/// past the given rows are zero).
pub(in crate::quant) fn dot_tile(w: &[u8], a: &[&Q8KRow], tiled: bool) -> [f32; 4] {
    kquant::tile(a, |_, a| if tiled { dot_tiled(w, a) } else { dot(w, a) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::formats::kquant::tests::dots_match_candle;

    #[test]
    fn both_dot_products_match_candles_dequantized_product() {
        dots_match_candle(GgmlDType::Q3K, BYTES, &[(108, 0.01)], &[dot, dot_tiled], 5);
    }
}
