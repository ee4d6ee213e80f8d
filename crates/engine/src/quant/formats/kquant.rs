//! The K-quant family: super-blocks of 256 values in sub-blocks with scales of their own,
//! multiplied with Q8_K activations (`quant::q8k`): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, and
//! IQ4_XS, whose super-block has the same shape. A format of it is its block struct as
//! stored ([`SuperBlock`]) and its products in llama.cpp's x86 arithmetic, which differ
//! from member to member (each file says which of llama.cpp's kernels it follows); what
//! they share is here: the packed 6-bit scales of Q4_K and Q5_K, the two ways of rounding
//! the sums of a repacked product ([`PairSums`]), the eight integer lanes of a `vec_dot`,
//! and the products of one row with up to four activation rows.
//!
//! Their SIMD layouts (`q4k_lanes.rs`, `q6k_lanes.rs`, `k_lanes.rs`, `pair_lanes.rs`) are
//! chosen by the formats' rows of the kernels' table (`quant/table.rs`) and checked against
//! these products bit for bit.

use bytemuck::Pod;
use candle_core::quantized::GgmlDType;

use super::super::q8k::{Q8KRow, QK_K};
use super::super::RowKernel;
use super::{FormatInfo, MatrixReader};

/// A format of the family: its super-block as stored.
pub(in crate::quant) trait SuperBlock: Pod + Send + Sync + 'static {
    /// ggml's name.
    const NAME: &'static str;
    /// ggml's type id.
    const GGML_TYPE: u32;
}

/// The registry's row of a format of the family that candle reads (its tensors and
/// embeddings); `QMatrix::new` then lays its matrices out for kernels of our own.
pub(in crate::quant) const fn info<F: SuperBlock>(candle: GgmlDType) -> FormatInfo {
    FormatInfo {
        name: F::NAME,
        ggml_type: F::GGML_TYPE,
        block_values: 256,
        block_bytes: size_of::<F>(),
        matrix: MatrixReader::Candle(candle),
        dequantize: None,
    }
}

/// The 6-bit scale and minimum of sub-block `j` (0..8) from the twelve packed scale bytes
/// of a Q4_K or Q5_K super-block.
pub(in crate::quant) fn scale_min_k4(j: usize, s: &[u8]) -> (i32, i32) {
    if j < 4 {
        ((s[j] & 63) as i32, (s[j + 4] & 63) as i32)
    } else {
        (
            ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4)) as i32,
            ((s[j + 4] >> 4) | ((s[j] >> 6) << 4)) as i32,
        )
    }
}

/// The floating-point side of a repacked Q4_K or Q2_K dot product: the GEMV folds a
/// super-block's integer sums into one fused multiply-add, the GEMM each pair of
/// sub-blocks' (Q2_K: each half super-block's). Shared by the portable and SIMD kernels so
/// that both round alike.
pub(in crate::quant) struct PairSums {
    per_pair: bool,
    acc: f32,
    acc_min: f32,
    isum: i32,
    imin: i32,
}

impl PairSums {
    /// Empty sums for `kernel`.
    pub(in crate::quant) fn new(kernel: RowKernel) -> Self {
        Self {
            per_pair: kernel.in_group_of_four(),
            acc: 0.0,
            acc_min: 0.0,
            isum: 0,
            imin: 0,
        }
    }

    /// Adds a pair of sub-blocks' scaled dot product and scaled minimum term; `dd` and `dm`
    /// are the super-block's `d` and `dmin` times the activations' scale.
    pub(in crate::quant) fn pair(&mut self, psum: i32, pmin: i32, dd: f32, dm: f32) {
        if self.per_pair {
            self.acc = (psum as f32).mul_add(dd, self.acc);
            self.acc_min = (pmin as f32).mul_add(dm, self.acc_min);
        } else {
            self.isum += psum;
            self.imin += pmin;
        }
    }

    /// Ends a super-block.
    pub(in crate::quant) fn end_block(&mut self, dd: f32, dm: f32) {
        if !self.per_pair {
            self.acc = (self.isum as f32).mul_add(dd, self.acc);
            self.acc_min = (self.imin as f32).mul_add(dm, self.acc_min);
            (self.isum, self.imin) = (0, 0);
        }
    }

    /// The dot product.
    pub(in crate::quant) fn result(&self) -> f32 {
        self.acc - self.acc_min
    }
}

/// Adds `scale` times each group of four `products` to its lane (lane `l` takes products
/// `4l..4l + 4`), as the x86 kernels' `madd` does.
#[inline]
pub(in crate::quant) fn add_lanes(lanes: &mut [i32; 8], products: &[i32; 32], scale: i32) {
    for (lane, four) in lanes.iter_mut().zip(products.chunks_exact(4)) {
        *lane += scale * (four[0] + four[1] + four[2] + four[3]);
    }
}

/// `dot` of one weight row with each of up to four activation rows (entries past the
/// given rows are zero): the portable code of a format's SIMD layout.
pub(in crate::quant) fn tile(a: &[&Q8KRow], dot: impl Fn(usize, &Q8KRow) -> f32) -> [f32; 4] {
    assert!(a.len() <= 4);
    let mut out = [0f32; 4];
    for (r, a) in a.iter().enumerate() {
        out[r] = dot(r, a);
    }
    out
}

/// The activations' values of super-block `b` and their sums by sixteen.
pub(in crate::quant) fn super_block(a: &Q8KRow, b: usize) -> (&[i8], &[i32]) {
    (
        &a.qs[b * QK_K..(b + 1) * QK_K],
        &a.bsums[b * 16..(b + 1) * 16],
    )
}

#[cfg(test)]
pub(in crate::quant) mod tests {
    use super::super::super::q8k::{quantize_row_q8k, Q8KRow, QK_K};
    use super::super::super::sample::Xorshift;
    use super::RowKernel;

    /// `got` is `exact` up to the rounding of a float product of 256 terms.
    pub(in crate::quant) fn assert_close(got: f32, exact: f32) {
        assert!(
            (got - exact).abs() < 1e-3 * exact.abs().max(1.0),
            "{got} vs {exact}"
        );
    }

    /// Each of `dots` of one random super-block of `dtype` (`bytes` long, the f16 fields at
    /// `scales` set to the values given) with random activations is the product of candle's
    /// dequantization of it.
    pub(in crate::quant) fn dots_match_candle(
        dtype: candle_core::quantized::GgmlDType,
        bytes: usize,
        scales: &[(usize, f32)],
        dots: &[fn(&[u8], &Q8KRow) -> f32],
        seed: u64,
    ) {
        let mut rng = Xorshift::new(seed);
        let x: Vec<f32> = (0..QK_K).map(|_| rng.next_f32() * 2.0).collect();
        let a = quantize_row_q8k(&x, RowKernel::Gemv);
        let mut block: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
        for &(at, value) in scales {
            block[at..at + 2].copy_from_slice(&half::f16::from_f32(value).to_le_bytes());
        }
        let w = candle_dequantized(&block, dtype);
        let exact: f32 = (0..QK_K).map(|i| w[i] * a.d[0] * a.qs[i] as f32).sum();
        for dot in dots {
            assert_close(dot(&block, &a), exact);
        }
    }

    /// The weights of one super-block as candle decodes them (an independent reading of
    /// the format).
    fn candle_dequantized(block: &[u8], dtype: candle_core::quantized::GgmlDType) -> Vec<f32> {
        use candle_core::quantized::{QStorage, QTensor};
        use candle_core::Device;
        let storage =
            QStorage::from_data(std::borrow::Cow::Borrowed(block), &Device::Cpu, dtype).unwrap();
        QTensor::new(storage, (1, QK_K))
            .unwrap()
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    }
}
