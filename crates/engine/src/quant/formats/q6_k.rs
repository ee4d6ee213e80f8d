//! Q6_K: a super-block of 256 six-bit values (offset by 32) in sixteen sub-blocks of 16,
//! each with a signed 8-bit scale, and an f16 `d` (210 bytes). Its products follow
//! llama.cpp's AVX2 `vec_dot` (eight lanes, summed as `hsum_float_8`) for rows of
//! micro-batches under 8 ([`dot`]) and its tiled matmul for wider ones ([`dot_tiled`]).

use bytemuck::{Pod, Zeroable};
use candle_core::quantized::GgmlDType;

use super::super::q8k::{Q8KRow, QK_K};
use super::kquant::{self, super_block, SuperBlock};
use super::{blocks, FormatInfo};
use crate::simd::convert::f16_le;
use crate::simd::reduce::hsum8;

/// A super-block as stored.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(in crate::quant) struct Q6K {
    /// The values' low four bits ([`Q6K::values`] says where each is).
    ql: [u8; 128],
    /// Their high two bits.
    qh: [u8; 64],
    /// Each sub-block's scale, a signed byte.
    pub(in crate::quant) scales: [u8; 16],
    /// The scales' scale, an f16.
    d: [u8; 2],
}

impl SuperBlock for Q6K {
    const NAME: &'static str = "Q6_K";
    const GGML_TYPE: u32 = 14;
}

/// Bytes per super-block.
pub(in crate::quant) const BYTES: usize = size_of::<Q6K>();

/// The registry's row.
pub(super) const INFO: FormatInfo = kquant::info::<Q6K>(GgmlDType::Q6K);

impl Q6K {
    /// The 256 values in order, as unsigned 6-bit numbers (value + 32).
    pub(in crate::quant) fn values(&self) -> [u8; QK_K] {
        let mut out = [0u8; QK_K];
        for half in 0..2 {
            let (ql, qh) = (&self.ql[64 * half..][..64], &self.qh[32 * half..][..32]);
            for e in 0..32 {
                let k = 128 * half + e;
                out[k] = (ql[e] & 0x0F) | ((qh[e] & 3) << 4);
                out[k + 32] = (ql[e + 32] & 0x0F) | (((qh[e] >> 2) & 3) << 4);
                out[k + 64] = (ql[e] >> 4) | (((qh[e] >> 4) & 3) << 4);
                out[k + 96] = (ql[e + 32] >> 4) | (((qh[e] >> 6) & 3) << 4);
            }
        }
        out
    }
}

/// The dot product of a weight row with a Q8_K activation row, as llama.cpp's AVX2
/// `vec_dot`: per super-block eight integer lanes (the 32 offset terms taken off through
/// the activations' sums), each folded into its float lane with a fused multiply-add by
/// `d · d_a`, then `hsum_float_8`.
pub(in crate::quant) fn dot(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = [0f32; 8];
    for (b, block) in blocks::<Q6K>(w).iter().enumerate() {
        let sc = block.scales.map(|s| s as i8 as i32);
        let d = a.d[b] * f16_le(block.d);
        let (q8, bsums) = super_block(a, b);
        let mut lanes = [0i32; 8];
        for j in 0..2 {
            let (ql, qh) = (
                &block.ql[64 * j..64 * j + 64],
                &block.qh[32 * j..32 * j + 32],
            );
            for v in 0..4 {
                for e in 0..32 {
                    let (lo, hi) = match v {
                        0 => (ql[e] & 0x0F, qh[e] & 3),
                        1 => (ql[e + 32] & 0x0F, (qh[e] >> 2) & 3),
                        2 => (ql[e] >> 4, (qh[e] >> 4) & 3),
                        _ => (ql[e + 32] >> 4, (qh[e] >> 6) & 3),
                    };
                    let u = (lo | (hi << 4)) as i32;
                    let scale = sc[8 * j + 2 * v + usize::from(e >= 16)];
                    lanes[e / 4] += scale * u * q8[128 * j + 32 * v + e] as i32;
                }
            }
        }
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane -= 32 * (bsums[2 * l] * sc[2 * l] + bsums[2 * l + 1] * sc[2 * l + 1]);
            acc[l] = d.mul_add(*lane as f32, acc[l]);
        }
    }
    hsum8(&acc)
}

/// The dot product as llama.cpp's tiled matmul computes it for 8 or more activation rows
/// (see `q5_k::dot_tiled`): per super-block the scaled sums of its sixteen sub-blocks of
/// 16 in exact integers, one rounded product by `d`, added with a fused multiply-add times
/// the activation's scale to a running sum that starts at zero.
pub(in crate::quant) fn dot_tiled(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = 0f32;
    for (b, block) in blocks::<Q6K>(w).iter().enumerate() {
        let (q8, _) = super_block(a, b);
        let values = block.values().map(|u| u as i32 - 32);
        let mut s1 = 0i32;
        for (s, &scale) in block.scales.iter().enumerate() {
            let raw: i32 = (16 * s..16 * s + 16)
                .map(|k| values[k] * q8[k] as i32)
                .sum();
            s1 = s1.wrapping_add((scale as i8 as i32).wrapping_mul(raw));
        }
        acc = (s1 as f32 * f16_le(block.d)).mul_add(a.d[b], acc);
    }
    acc
}

/// [`dot_tiled`] or [`dot`] of one weight row with up to four activation rows (entries
/// past the given rows are zero), in portable code: CPUs with AVX2 take the interleaved
/// layout's kernels (`q6k_lanes`) instead.
pub(in crate::quant) fn dot_tile(w: &[u8], a: &[&Q8KRow], tiled: bool) -> [f32; 4] {
    kquant::tile(a, |_, a| if tiled { dot_tiled(w, a) } else { dot(w, a) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::formats::kquant::tests::{assert_close, dots_match_candle};
    use crate::quant::q8k::quantize_row_q8k;
    use crate::quant::RowKernel;
    use half::f16;

    #[test]
    fn the_dot_product_matches_the_dequantized_product() {
        let mut block = vec![0u8; BYTES];
        for (i, b) in block[..208].iter_mut().enumerate() {
            *b = (i * 53 % 256) as u8;
        }
        block[208..210].copy_from_slice(&f16::from_f32(0.003).to_le_bytes());
        let x: Vec<f32> = (0..QK_K)
            .map(|i| ((i * 5 % 19) as f32 - 9.0) / 3.0)
            .collect();
        let a = quantize_row_q8k(&x, RowKernel::Gemv);
        let d = f16::from_le_bytes([block[208], block[209]]).to_f32();
        let mut exact = 0f32;
        for j in 0..2 {
            for l in 0..32 {
                let (ql, qh) = (&block[64 * j..], block[128 + 32 * j + l]);
                let vals = [
                    (ql[l] & 0xF) | ((qh & 3) << 4),
                    (ql[l + 32] & 0xF) | (((qh >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4),
                ];
                for (v, &u) in vals.iter().enumerate() {
                    let e = 128 * j + 32 * v + l;
                    let sc = block[192 + e / 16] as i8 as f32;
                    exact += d * sc * (u as f32 - 32.0) * a.d[0] * a.qs[e] as f32;
                }
            }
        }
        assert_close(dot_tile(&block, &[&a], false)[0], exact);
    }

    /// The tiled product is the dequantized product (candle's dequantization), up to
    /// rounding.
    #[test]
    fn the_tiled_dot_product_matches_candles_dequantized_product() {
        dots_match_candle(GgmlDType::Q6K, BYTES, &[(208, 0.01)], &[dot_tiled], 7);
    }
}
