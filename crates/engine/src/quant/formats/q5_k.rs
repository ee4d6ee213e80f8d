//! Q5_K: a super-block of 256 five-bit values in eight sub-blocks of 32, each with a 6-bit
//! scale and minimum, and f16 `d` and `dmin` (176 bytes). llama.cpp does not repack it:
//! its products follow its AVX2 `vec_dot` for rows of micro-batches under 8 ([`dot`]) and
//! its tiled matmul for wider ones ([`dot_tiled`]).

use bytemuck::{Pod, Zeroable};
use candle_core::quantized::GgmlDType;

use super::super::q8k::Q8KRow;
use super::kquant::{self, add_lanes, scale_min_k4, super_block, SuperBlock};
use super::{blocks, FormatInfo};
use crate::simd::convert::f16_le;
use crate::simd::reduce::hsum8;

/// A super-block as stored.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(in crate::quant) struct Q5K {
    /// The scales' scale, an f16.
    d: [u8; 2],
    /// The minimums' scale, an f16.
    dmin: [u8; 2],
    /// Eight 6-bit scales and eight 6-bit minimums, packed ([`scale_min_k4`]).
    pub(in crate::quant) scales: [u8; 12],
    /// Value `32j + e`'s fifth bit is bit `j` of byte `e`.
    qh: [u8; 32],
    /// The low four bits: sub-blocks `2p` and `2p + 1` in the low and high nibbles of
    /// bytes `32p..32p + 32`.
    qs: [u8; 128],
}

impl SuperBlock for Q5K {
    const NAME: &'static str = "Q5_K";
    const GGML_TYPE: u32 = 13;
}

/// Bytes per super-block.
pub(in crate::quant) const BYTES: usize = size_of::<Q5K>();

/// The registry's row.
pub(super) const INFO: FormatInfo = kquant::info::<Q5K>(GgmlDType::Q5K);

impl Q5K {
    /// The 32 unsigned values of sub-block `j`.
    fn sub_block(&self, j: usize) -> [i32; 32] {
        let (bytes, shift) = (&self.qs[(j / 2) * 32..(j / 2) * 32 + 32], 4 * (j % 2));
        std::array::from_fn(|e| {
            (((bytes[e] >> shift) & 0x0F) | (((self.qh[e] >> j) & 1) << 4)) as i32
        })
    }
}

/// The dot product of a weight row with a Q8_K activation row, rounded as llama.cpp's
/// x86 `ggml_vec_dot_q5_K_q8_K`: eight integer lanes per super-block, each lane folded
/// into its float accumulator with one fused multiply-add by `d`, the minimums' integer
/// sum folded into a scalar by another, and `hsum(lanes) + minimums` at the end.
pub(in crate::quant) fn dot(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = [0f32; 8];
    let mut mins = 0f32;
    for (b, block) in blocks::<Q5K>(w).iter().enumerate() {
        let d = a.d[b] * f16_le(block.d);
        let dmin = -a.d[b] * f16_le(block.dmin);
        let (q8, bsums) = super_block(a, b);
        let mut imin = 0i32;
        let mut lanes = [0i32; 8];
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &block.scales);
            imin += m * (bsums[2 * j] + bsums[2 * j + 1]);
            // Integer sums are exact in any order.
            let values = block.sub_block(j);
            let q8 = &q8[j * 32..j * 32 + 32];
            let products: [i32; 32] = std::array::from_fn(|e| values[e] * q8[e] as i32);
            add_lanes(&mut lanes, &products, sc);
        }
        mins = (imin as f32).mul_add(dmin, mins);
        for (l, &lane) in lanes.iter().enumerate() {
            acc[l] = d.mul_add(lane as f32, acc[l]);
        }
    }
    hsum8(&acc) + mins
}

/// The dot product as llama.cpp's tiled matmul computes it (`ggml-cpu/tiled`, its
/// AVX-512 VNNI microkernel), which it takes for a matmul of 8 or more activation rows:
/// per super-block the scaled sub-block sums and the minimum terms in exact integers, one
/// float result `s1·d − dmin·s2` (a fused multiply-add after a rounded product), added
/// with a fused multiply-add times the activation's scale to a running sum that starts at
/// zero. (llama.cpp writes that last step as an add of a product; GCC, with its default
/// `-ffp-contract=fast`, fuses it, and the fixtures come from a GCC build. A build that
/// did not fuse would round twice.)
pub(in crate::quant) fn dot_tiled(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = 0f32;
    for (b, block) in blocks::<Q5K>(w).iter().enumerate() {
        let (d, dmin) = (f16_le(block.d), f16_le(block.dmin));
        let (q8, bsums) = super_block(a, b);
        let (mut s1, mut s2) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &block.scales);
            let values = block.sub_block(j);
            let raw: i32 = (0..32).map(|e| values[e] * q8[j * 32 + e] as i32).sum();
            s1 = s1.wrapping_add(sc.wrapping_mul(raw));
            s2 = s2.wrapping_add(m * (bsums[2 * j] + bsums[2 * j + 1]));
        }
        let result = (-dmin).mul_add(s2 as f32, s1 as f32 * d);
        acc = result.mul_add(a.d[b], acc);
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
        let scales = [(0, 0.01), (2, 0.02)];
        dots_match_candle(GgmlDType::Q5K, BYTES, &scales, &[dot, dot_tiled], 5);
    }
}
