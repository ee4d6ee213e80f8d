//! Dot products of one quantized weight row with one Q8 activation row, in ggml's x86
//! arithmetic: eight lanes of four products per block, a fused multiply-add of the block
//! scale into each lane, then the lanes summed as `hsum_float_8` does.

#[cfg(test)]
use super::q8::quantize_row;
use super::q8::Q8Row;
use crate::simd::convert::f16_at;
use crate::simd::reduce::hsum8;

/// The block formats with kernels of our own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockFormat {
    /// 4-bit with scale, values offset by 8 (18 bytes per 32 values).
    Q4_0,
    /// 4-bit with scale and minimum (20 bytes per 32 values).
    Q4_1,
    /// 5-bit with scale (22 bytes per 32 values).
    Q5_0,
    /// 8-bit with scale (34 bytes per 32 values).
    Q8_0,
}

/// Q4_0 block size in bytes.
pub const Q4_0: usize = 18;
/// Q4_1 block size in bytes.
pub const Q4_1: usize = 20;
/// Q5_0 block size in bytes.
pub const Q5_0: usize = 22;
/// Q8_0 block size in bytes.
pub const Q8_0: usize = 34;

impl BlockFormat {
    /// Bytes per block of 32 values.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => Q4_0,
            Self::Q4_1 => Q4_1,
            Self::Q5_0 => Q5_0,
            Self::Q8_0 => Q8_0,
        }
    }

    /// Bytes per row of `cols` values.
    pub fn row_bytes(self, cols: usize) -> usize {
        cols / 32 * self.block_bytes()
    }

    /// The dot product in portable code.
    pub fn dot_portable(self, w: &[u8], a: &Q8Row) -> f32 {
        let mut acc = [0f32; 8];
        let mut extra = 0f32;
        let mut vals = [0i32; 32];
        for (b, block) in w.chunks_exact(self.block_bytes()).enumerate() {
            let scale = match self {
                Self::Q4_0 => {
                    for j in 0..16 {
                        vals[j] = (block[2 + j] & 0x0F) as i32 - 8;
                        vals[j + 16] = (block[2 + j] >> 4) as i32 - 8;
                    }
                    f16_at(block, 0)
                }
                Self::Q4_1 => {
                    let (d, m) = (f16_at(block, 0), f16_at(block, 2));
                    for j in 0..16 {
                        vals[j] = (block[4 + j] & 0x0F) as i32;
                        vals[j + 16] = (block[4 + j] >> 4) as i32;
                    }
                    extra = m.mul_add(a.s[b], extra);
                    d
                }
                Self::Q5_0 => {
                    let d = f16_at(block, 0);
                    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                    for j in 0..16 {
                        let lo = (block[6 + j] & 0x0F) as i32 | (((qh >> j) & 1) << 4) as i32;
                        let hi = (block[6 + j] >> 4) as i32 | (((qh >> (j + 16)) & 1) << 4) as i32;
                        vals[j] = lo - 16;
                        vals[j + 16] = hi - 16;
                    }
                    d
                }
                Self::Q8_0 => {
                    for j in 0..32 {
                        vals[j] = block[2 + j] as i8 as i32;
                    }
                    f16_at(block, 0)
                }
            };
            let dd = scale * a.d[b];
            let q = &a.qs[b * 32..(b + 1) * 32];
            for (lane, acc) in acc.iter_mut().enumerate() {
                let mut s = 0i32;
                for e in lane * 4..lane * 4 + 4 {
                    s += vals[e] * q[e] as i32;
                }
                *acc = dd.mul_add(s as f32, *acc);
            }
        }
        hsum8(&acc) + extra
    }
}

/// Q5_1 block size in bytes.
pub const Q5_1: usize = 24;

/// The dot product of a Q5_1 weight row with a Q8 activation row, as llama.cpp's x86
/// `ggml_vec_dot_q5_1_q8_1` computes it (Q5_1 is not repacked): eight lanes of four
/// products per block, one fused multiply-add of `d_w · d_a` into each lane, the minimums'
/// `m · s` folded into a scalar, then `hsum(lanes) + minimums`.
pub fn dot_q5_1(w: &[u8], a: &Q8Row) -> f32 {
    let mut acc = [0f32; 8];
    let mut mins = 0f32;
    for (b, block) in w.chunks_exact(Q5_1).enumerate() {
        let (d, m) = (f16_at(block, 0), f16_at(block, 2));
        let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
        let q = &a.qs[b * 32..(b + 1) * 32];
        mins = m.mul_add(a.s[b], mins);
        let dd = d * a.d[b];
        for (lane, acc) in acc.iter_mut().enumerate() {
            let mut sum = 0i32;
            for e in lane * 4..lane * 4 + 4 {
                let nibble = if e < 16 {
                    block[8 + e] & 0x0F
                } else {
                    block[8 + e - 16] >> 4
                };
                let value = nibble as i32 | ((((qh >> e) & 1) as i32) << 4);
                sum += value * q[e] as i32;
            }
            *acc = (sum as f32).mul_add(dd, *acc);
        }
    }
    hsum8(&acc) + mins
}

/// The dot product of a Q4_0 weight row with a Q8 activation row as llama.cpp computes it
/// once it has repacked the matrix eight rows at a time (x86 with AVX2, rows a multiple of
/// eight): each block's integer sum, converted, is folded into one accumulator with a
/// fused multiply-add by `d_w · d_a`, block after block. Its GEMV and four-row GEMM give
/// the same sums, so the row's kernel does not matter.
pub fn dot_q4_0_repacked(w: &[u8], a: &Q8Row) -> f32 {
    let mut acc = 0f32;
    for (b, block) in w.chunks_exact(Q4_0).enumerate() {
        let q = &a.qs[b * 32..(b + 1) * 32];
        let mut sum = 0i32;
        for j in 0..16 {
            sum += ((block[2 + j] & 0x0F) as i32 - 8) * q[j] as i32;
            sum += ((block[2 + j] >> 4) as i32 - 8) * q[j + 16] as i32;
        }
        acc = (sum as f32).mul_add(f16_at(block, 0) * a.d[b], acc);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn q8_0_block(d: f32, qs: &[i8; 32]) -> Vec<u8> {
        let mut b = f16::from_f32(d).to_le_bytes().to_vec();
        b.extend(qs.iter().map(|&q| q as u8));
        b
    }

    #[test]
    fn q8_0_dot_matches_the_dequantized_product() {
        let mut qs = [0i8; 32];
        for (i, q) in qs.iter_mut().enumerate() {
            *q = i as i8 - 16;
        }
        let w = q8_0_block(0.5, &qs);
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 10.0) / 4.0).collect();
        let a = quantize_row(&x);
        let exact: f32 = (0..32)
            .map(|i| 0.5 * qs[i] as f32 * a.d[0] * a.qs[i] as f32)
            .sum();
        assert!((BlockFormat::Q8_0.dot_portable(&w, &a) - exact).abs() < 1e-3);
    }

    #[test]
    fn q4_1_dot_includes_the_minimum() {
        // All nibbles 1, d = 1, m = -2: every weight is -1.
        let mut w = f16::from_f32(1.0).to_le_bytes().to_vec();
        w.extend(f16::from_f32(-2.0).to_le_bytes());
        w.extend([0x11u8; 16]);
        let a = quantize_row(&[1.0f32; 32]);
        // The activation scale 1/127 is stored as f16, hence the tolerance.
        assert!((BlockFormat::Q4_1.dot_portable(&w, &a) + 32.0).abs() < 1e-2);
    }

    #[test]
    fn q5_0_uses_the_high_bits() {
        // Nibbles 0 with every high bit set: every weight is 16 - 16 = 0; with none set, -16.
        let mut w = f16::from_f32(1.0).to_le_bytes().to_vec();
        w.extend(u32::MAX.to_le_bytes());
        w.extend([0u8; 16]);
        let a = quantize_row(&[1.0f32; 32]);
        assert_eq!(BlockFormat::Q5_0.dot_portable(&w, &a), 0.0);
        w[2..6].copy_from_slice(&0u32.to_le_bytes());
        assert!((BlockFormat::Q5_0.dot_portable(&w, &a) + 16.0 * 32.0).abs() < 0.2);
    }
}
