//! IQ4_XS: a super-block of 256 four-bit indices into IQ4_NL's non-linear table, in eight
//! blocks of 32 with a signed 6-bit scale each, and an f16 `d` (136 bytes). ferrite reads
//! its matrices and embeddings itself. Its products follow llama.cpp's `vec_dot` (eight
//! integer lanes, one fused multiply-add per super-block, `hsum_float_8`) for rows of
//! micro-batches under 8 ([`dot`]) and its tiled matmul for wider ones ([`dot_tiled`]).

use bytemuck::{Pod, Zeroable};

use super::super::q8k::Q8KRow;
use super::iq4_nl::Iq4Nl;
use super::kquant::{self, add_lanes, super_block, SuperBlock};
use super::table4;
use super::{blocks, FormatInfo, MatrixReader};
use crate::simd::convert::f16_le;

/// A super-block as stored.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(in crate::quant) struct Iq4Xs {
    /// The scales' scale, an f16.
    d: [u8; 2],
    /// Bits `2i..2i + 2`: block `i`'s scale's high two bits (a little-endian u16).
    scales_h: [u8; 2],
    /// Block `i`'s scale's low four bits, in nibble `i` (low nibbles first).
    scales_l: [u8; 4],
    /// Block `i`'s indices in bytes `16i..16i + 16`: low nibbles its first sixteen values,
    /// high nibbles the rest.
    qs: [u8; 128],
}

impl SuperBlock for Iq4Xs {
    const NAME: &'static str = "IQ4_XS";
    const GGML_TYPE: u32 = 23;
}

/// Bytes per super-block.
pub(in crate::quant) const BYTES: usize = size_of::<Iq4Xs>();

/// The registry's row: ferrite reads its matrices and dequantizes its embeddings.
pub(super) const INFO: FormatInfo = FormatInfo {
    name: Iq4Xs::NAME,
    ggml_type: Iq4Xs::GGML_TYPE,
    block_values: 256,
    block_bytes: BYTES,
    matrix: MatrixReader::Table,
    dequantize: Some(dequantize),
};

impl Iq4Xs {
    /// The signed scale of block `ib` (0..8).
    pub(in crate::quant) fn scale(&self, ib: usize) -> i32 {
        let high = u16::from_le_bytes(self.scales_h);
        let low = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
        (low as i32 | ((((high >> (2 * ib)) & 3) as i32) << 4)) - 32
    }

    /// The 32 table values of block `ib`.
    fn values(&self, ib: usize) -> [i32; 32] {
        table4::indexed::<Iq4Nl>(&self.qs[16 * ib..16 * ib + 16])
    }
}

/// The dot product of a weight row with a Q8_K activation row, as llama.cpp's `vec_dot`.
pub(in crate::quant) fn dot(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = [0f32; 8];
    for (b, block) in blocks::<Iq4Xs>(w).iter().enumerate() {
        let (q8, _) = super_block(a, b);
        let mut lanes = [0i32; 8];
        for ib in 0..8 {
            let (values, q8) = (block.values(ib), &q8[32 * ib..32 * ib + 32]);
            // Exact integer sums, in an order the compiler vectorises.
            let products: [i32; 32] = std::array::from_fn(|e| values[e] * q8[e] as i32);
            add_lanes(&mut lanes, &products, block.scale(ib));
        }
        let d = f16_le(block.d) * a.d[b];
        for (l, &lane) in lanes.iter().enumerate() {
            acc[l] = d.mul_add(lane as f32, acc[l]);
        }
    }
    crate::simd::reduce::hsum8(&acc)
}

/// The dot product as llama.cpp's tiled matmul computes it for 8 or more activation rows
/// (see `q5_k::dot_tiled`): per super-block the scaled sub-block sums in exact integers,
/// one rounded product by `d`, added times the activation's scale to a running sum that
/// starts at zero. (Its kernel looks the table up 128 higher and takes 128 times the
/// activations' sums back off, which leaves these exact sums.)
pub(in crate::quant) fn dot_tiled(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = 0f32;
    for (b, block) in blocks::<Iq4Xs>(w).iter().enumerate() {
        let (q8, _) = super_block(a, b);
        let mut s1 = 0i32;
        for ib in 0..8 {
            let values = block.values(ib);
            let raw: i32 = (0..32).map(|e| values[e] * q8[32 * ib + e] as i32).sum();
            s1 = s1.wrapping_add(block.scale(ib).wrapping_mul(raw));
        }
        acc = (s1 as f32 * f16_le(block.d)).mul_add(a.d[b], acc);
    }
    acc
}

/// [`dot_tiled`] or [`dot`] of one weight row with up to four activation rows (entries
/// past the given rows are zero).
pub(in crate::quant) fn dot_tile(w: &[u8], a: &[&Q8KRow], tiled: bool) -> [f32; 4] {
    kquant::tile(a, |_, a| if tiled { dot_tiled(w, a) } else { dot(w, a) })
}

/// One row's values as f32, appended, as llama.cpp's `dequantize_row_iq4_xs`: the block's
/// scale `d · (ls − 32)` first, then times the table value.
pub(in crate::quant) fn dequantize(row: &[u8], out: &mut Vec<f32>) {
    for block in blocks::<Iq4Xs>(row) {
        let d = f16_le(block.d);
        for ib in 0..8 {
            let dl = d * block.scale(ib) as f32;
            out.extend(block.values(ib).iter().map(|&v| dl * v as f32));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::formats::kquant::tests::assert_close;
    use crate::quant::q8k::{quantize_row_q8k, QK_K};
    use crate::quant::RowKernel;

    #[test]
    fn the_dot_product_equals_the_dequantized_product() {
        let mut rng = crate::quant::sample::Xorshift::new(9);
        let x: Vec<f32> = (0..QK_K).map(|_| rng.next_f32() * 2.0).collect();
        let mut xs: Vec<u8> = (0..BYTES).map(|_| rng.next_u64() as u8).collect();
        xs[0..2].copy_from_slice(&half::f16::from_f32(0.001).to_le_bytes());
        let a = quantize_row_q8k(&x, RowKernel::Gemv);
        let mut w = Vec::new();
        dequantize(&xs, &mut w);
        let exact: f32 = (0..QK_K).map(|i| w[i] * a.d[0] * a.qs[i] as f32).sum();
        let got = dot(&xs, &a);
        assert_close(got, exact);
    }

    #[test]
    fn scales_take_four_low_and_two_high_bits() {
        let mut bytes = vec![0u8; BYTES];
        // Block 3: low nibble from scales_l[1] >> 4, high bits 6..8 of scales_h.
        bytes[5] = 0xA0;
        bytes[2..4].copy_from_slice(&(0b10u16 << 6).to_le_bytes());
        let block: &Iq4Xs = super::super::view(&bytes);
        assert_eq!(block.scale(3), (0xA | (0b10 << 4)) - 32);
        assert_eq!(block.scale(2), -32);
    }
}
