//! The family of formats whose block is 32 four-bit indices into a table of sixteen small
//! integers with one scale (IQ4_NL, for one): what a format of it says ([`Table4`]), and
//! what the family has for any of them: dequantization, the dot product with Q8
//! activations in llama.cpp's arithmetic, and a matrix layout with its kernels.
//!
//! llama.cpp multiplies such a matrix, once its rows are a multiple of eight, with one
//! repacked kernel template (`gemv`/`gemm_q4_b32_8x8_q8_0_lut_avx` on x86, AVX2 and
//! AVX-512 alike): per block the integer sum of the 32 products, converted to f32 and
//! folded into the row's accumulator with one fused multiply-add by `scale · d_a`. The
//! integer sums are exact in any order, so every kernel here computes exactly [`dot`].
//!
//! A matrix whose rows are not a multiple of eight it multiplies with its `vec_dot`
//! instead, another order of the same sums ([`dot_plain`]).
//!
//! The layout ([`Rows8`]) holds eight rows to a group, each block of the group its eight
//! scales (as f32) and the eight rows' sixteen bytes of indices; a matrix whose rows are
//! not a multiple of eight gets zero rows to fill its last group, which nothing reads
//! back. The kernel is chosen once, at load.

use std::marker::PhantomData;
use std::ops::Range;

use super::super::layout::Layout;
use super::super::output::Columns;
use super::super::own::quantized;
use super::super::q8::{quantize_row_portable, Q8Row};
use super::super::{ActivationKind, Activations, OwnFormat, QMatrix, RowKernel};
use super::{FormatInfo, MatrixReader};
use crate::error::EngineError;

#[cfg(target_arch = "x86_64")]
mod avx2;

/// A format of the family: its facts and the two things that differ between its members,
/// the table and how a block's scale is stored.
pub(in crate::quant) trait Table4: Send + Sync + 'static {
    /// ggml's name.
    const NAME: &'static str;
    /// ggml's type id.
    const GGML_TYPE: u32;
    /// Bytes per block of 32 values: the scale, then 16 bytes of indices (low nibbles the
    /// first 16 values, high nibbles the last 16).
    const BLOCK_BYTES: usize;
    /// The sixteen values an index stands for; each within -127..=127.
    const VALUES: [i8; 16];
    /// The block's scale (the values are `scale · VALUES[index]`).
    fn scale(block: &[u8]) -> f32;
}

/// Bytes of a block's scale: the indices follow it.
fn scale_bytes<F: Table4>() -> usize {
    F::BLOCK_BYTES - 16
}

/// The 32 table values of a block, in order.
fn values<F: Table4>(block: &[u8]) -> [i32; 32] {
    indexed::<F>(&block[scale_bytes::<F>()..])
}

/// The 32 table values of a block's 16 bytes of indices, in order (IQ4_XS's blocks of
/// 32 index IQ4_NL's table the same way).
pub(in crate::quant) fn indexed<F: Table4>(qs: &[u8]) -> [i32; 32] {
    let mut out = [0i32; 32];
    for (j, &b) in qs.iter().enumerate() {
        out[j] = F::VALUES[(b & 0x0F) as usize] as i32;
        out[j + 16] = F::VALUES[(b >> 4) as usize] as i32;
    }
    out
}

/// One row's values as f32, appended (ggml's `dequantize_row_*`: `scale · value`).
pub(in crate::quant) fn dequantize<F: Table4>(row: &[u8], out: &mut Vec<f32>) {
    for block in row.chunks_exact(F::BLOCK_BYTES) {
        let d = F::scale(block);
        out.extend(values::<F>(block).iter().map(|&v| v as f32 * d));
    }
}

/// A block's integer sum: its 32 values times the activations' 32 quants.
fn block_sum(values: &[i32; 32], q: &[i8]) -> i32 {
    values.iter().zip(q).map(|(&v, &q)| v * q as i32).sum()
}

/// The dot product of a weight row with a Q8 activation row, in llama.cpp's repacked
/// arithmetic: per block `acc = fma(Σ value·q, scale · d_a, acc)`.
pub(in crate::quant) fn dot<F: Table4>(w: &[u8], a: &Q8Row) -> f32 {
    let blocks = w.chunks_exact(F::BLOCK_BYTES);
    repacked_sum(blocks.map(|b| (values::<F>(b), F::scale(b))), a)
}

/// [`dot`] of the blocks' values and scales.
fn repacked_sum(blocks: impl Iterator<Item = ([i32; 32], f32)>, a: &Q8Row) -> f32 {
    let mut acc = 0f32;
    for (b, (v, scale)) in blocks.enumerate() {
        let sum = block_sum(&v, &a.qs[b * 32..(b + 1) * 32]);
        acc = (sum as f32).mul_add(scale * a.d[b], acc);
    }
    acc
}

/// The dot product in the arithmetic of llama.cpp's x86 `vec_dot` for the family (a
/// matrix it does not repack): each block's 32 products summed four at a time into eight
/// lanes, the lanes folded by a fused multiply-add of `d_a · scale` into one of two
/// accumulators (even blocks, odd blocks), the two added and summed as `hsum_float_8`;
/// an odd last block's integer sum then added alone, `sum + (d_a · scale) · Σ`, unfused.
#[cfg(test)]
pub(in crate::quant) fn dot_plain<F: Table4>(w: &[u8], a: &Q8Row) -> f32 {
    let blocks = w.chunks_exact(F::BLOCK_BYTES);
    plain_sum(blocks.map(|b| (values::<F>(b), F::scale(b))), a)
}

/// [`dot_plain`] of the blocks' values and scales (as many as `a` has).
fn plain_sum(blocks: impl ExactSizeIterator<Item = ([i32; 32], f32)>, a: &Q8Row) -> f32 {
    let mut acc = [[0f32; 8]; 2];
    let lanes = |acc: &[[f32; 8]; 2]| {
        crate::simd::reduce::hsum8(&std::array::from_fn(|l| acc[0][l] + acc[1][l]))
    };
    let paired = blocks.len() / 2 * 2;
    for (b, (v, scale)) in blocks.enumerate() {
        let q = &a.qs[b * 32..(b + 1) * 32];
        let d = a.d[b] * scale;
        if b == paired {
            // The odd last block, added alone after the lanes are summed: a product, then a
            // sum (the compiler does not fuse them there).
            return lanes(&acc) + d * block_sum(&v, q) as f32;
        }
        for (lane, acc) in acc[b % 2].iter_mut().enumerate() {
            let sum: i32 = (4 * lane..4 * lane + 4).map(|e| v[e] * q[e] as i32).sum();
            *acc = d.mul_add(sum as f32, *acc);
        }
    }
    lanes(&acc)
}

/// The registry's row of a format of the family: read from the file's bytes, laid out
/// as [`Rows8`].
pub(in crate::quant) const fn info<F: Table4>() -> FormatInfo {
    FormatInfo {
        name: F::NAME,
        ggml_type: F::GGML_TYPE,
        block_values: 32,
        block_bytes: F::BLOCK_BYTES,
        matrix: MatrixReader::Raw(matrix::<F>),
        dequantize: Some(dequantize::<F>),
    }
}

/// A matrix of `F` from the file's bytes, in the family's layout.
fn matrix<F: Table4>(
    data: &[u8],
    rows: usize,
    cols: usize,
) -> Option<Result<QMatrix, EngineError>> {
    Some(QMatrix::from_slice(Rows8::<F>::OWN, data, rows, cols))
}

/// [`dot`] of a weight row with an f32 activation row, quantized to Q8.
fn reference<F: Table4>(w: &[u8], x: &[f32], _: RowKernel) -> f32 {
    dot::<F>(w, &quantize_row_portable(x))
}

/// [`Rows8`] of the raw rows, as a layout.
fn lay_out<F: Table4>(data: &[u8], rows: usize, cols: usize) -> Box<dyn Layout> {
    Box::new(Rows8::<F>::new(data, rows, cols))
}

/// A block of a group of eight rows: their scales and their indices.
#[derive(Clone, Copy)]
#[repr(C)]
pub(in crate::quant) struct Block8 {
    /// Row `r`'s scale.
    scales: [f32; 8],
    /// Row `r`'s sixteen bytes of indices, as stored.
    qs: [[u8; 16]; 8],
}

/// The kernels a [`Rows8`] can run: one group of eight rows by one activation row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// [`dot_plain`]'s arithmetic, for a matrix llama.cpp does not repack (its rows not a
    /// multiple of eight), in portable code: only matrices of unusual shapes take it.
    Plain,
    /// [`dot`]'s, in portable code.
    Portable,
    /// AVX2 (with FMA).
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

/// A matrix of `F` eight rows to a group, and the kernel chosen for this CPU.
pub(in crate::quant) struct Rows8<F> {
    /// `blocks` blocks per group, group after group.
    groups: Vec<Block8>,
    /// Blocks per row.
    blocks: usize,
    kernel: Kernel,
    format: PhantomData<F>,
}

impl<F: Table4> Rows8<F> {
    /// The kernels' row of a format of the family: Q8 activations, this layout, [`dot`]
    /// the reference (a matrix whose rows are not a multiple of eight takes
    /// [`dot_plain`]'s arithmetic instead, as llama.cpp does).
    const OWN: &'static OwnFormat = &quantized(
        F::NAME,
        (32, F::BLOCK_BYTES),
        ActivationKind::Q8,
        lay_out::<F>,
        reference::<F>,
    );
}

impl<F: Table4> Rows8<F> {
    /// The `rows × cols` raw rows of `F` (sizes already checked), grouped.
    pub fn new(data: &[u8], rows: usize, cols: usize) -> Self {
        let kernel = match rows.is_multiple_of(8) {
            false => Kernel::Plain,
            #[cfg(target_arch = "x86_64")]
            true if crate::simd::avx2() => Kernel::Avx2,
            true => Kernel::Portable,
        };
        Self::with_kernel(data, rows, cols, kernel)
    }

    fn with_kernel(data: &[u8], rows: usize, cols: usize, kernel: Kernel) -> Self {
        let blocks = cols / 32;
        let row_bytes = blocks * F::BLOCK_BYTES;
        let empty = Block8 {
            scales: [0.0; 8],
            qs: [[0; 16]; 8],
        };
        let mut groups = vec![empty; rows.div_ceil(8) * blocks];
        for r in 0..rows {
            let row = &data[r * row_bytes..(r + 1) * row_bytes];
            for (b, block) in row.chunks_exact(F::BLOCK_BYTES).enumerate() {
                let into = &mut groups[r / 8 * blocks + b];
                into.scales[r % 8] = F::scale(block);
                into.qs[r % 8].copy_from_slice(&block[scale_bytes::<F>()..]);
            }
        }
        Self {
            groups,
            blocks,
            kernel,
            format: PhantomData,
        }
    }

    /// Group `g`'s eight rows by activation row `a`.
    fn group(&self, g: usize, a: &Q8Row) -> [f32; 8] {
        let blocks = &self.groups[g * self.blocks..(g + 1) * self.blocks];
        let rows = |r: usize| {
            blocks
                .iter()
                .map(move |b| (indexed::<F>(&b.qs[r]), b.scales[r]))
        };
        match self.kernel {
            Kernel::Plain => std::array::from_fn(|r| plain_sum(rows(r), a)),
            Kernel::Portable => std::array::from_fn(|r| repacked_sum(rows(r), a)),
            // SAFETY: chosen only where the CPU has AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::group::<F>(blocks, a) },
        }
    }
}

impl<F: Table4> Layout for Rows8<F> {
    fn back_with_huge_pages(&self) {
        crate::huge_pages::back(&self.groups);
    }

    fn chunk(&self, acts: &Activations, _: &[RowKernel], range: Range<usize>, out: &Columns) {
        let Activations::Q8(a, _, _) = acts else {
            unreachable!("the family's formats take Q8 activations")
        };
        for g in range.start / 8..range.end.div_ceil(8) {
            let first = (g * 8).max(range.start);
            let last = (g * 8 + 8).min(range.end);
            for (t, a) in a.iter().enumerate() {
                let got = self.group(g, a);
                out.set_run(t, first, &got[first - g * 8..last - g * 8]);
            }
        }
    }
}

#[cfg(test)]
pub(in crate::quant) mod tests {
    use super::*;
    use crate::quant::q8::quantize_row_portable;
    use crate::quant::sample::Xorshift;

    /// `rows × cols` random blocks of `F`, every index and scale byte random but the scale
    /// kept finite by `scale_fix`.
    pub fn random_rows<F: Table4>(
        rows: usize,
        cols: usize,
        rng: &mut Xorshift,
        scale_fix: impl Fn(&mut [u8], &mut Xorshift),
    ) -> Vec<u8> {
        let mut data: Vec<u8> = (0..rows * cols / 32 * F::BLOCK_BYTES)
            .map(|_| rng.next_u64() as u8)
            .collect();
        for block in data.chunks_exact_mut(F::BLOCK_BYTES) {
            scale_fix(block, rng);
        }
        data
    }

    /// [`dot`] comes within rounding of the exact product of the dequantized weights with
    /// the dequantized activations (a wrong table or scale does not).
    pub fn dot_equals_the_dequantized_product<F: Table4>(data: &[u8], cols: usize) {
        let mut rng = Xorshift::new(9);
        let x: Vec<f32> = (0..cols).map(|_| rng.next_f32() * 2.0).collect();
        let a = quantize_row_portable(&x);
        let row_bytes = cols / 32 * F::BLOCK_BYTES;
        for row in data.chunks_exact(row_bytes) {
            let mut w = Vec::new();
            dequantize::<F>(row, &mut w);
            let exact: f64 = (0..cols)
                .map(|i| w[i] as f64 * a.d[i / 32] as f64 * a.qs[i] as f64)
                .sum();
            let scale: f64 = (0..cols)
                .map(|i| (w[i] as f64 * a.d[i / 32] as f64 * a.qs[i] as f64).abs())
                .sum();
            let got = dot::<F>(row, &a) as f64;
            assert!((got - exact).abs() <= 1e-5 * scale, "{got} vs {exact}");
        }
    }

    /// The arithmetic llama.cpp gives a matrix of `rows` rows: repacked or its `vec_dot`.
    fn reference<F: Table4>(rows: usize) -> fn(&[u8], &Q8Row) -> f32 {
        match rows.is_multiple_of(8) {
            true => dot::<F>,
            false => dot_plain::<F>,
        }
    }

    /// The matrix the registry reads from `data` (`rows × cols` of `F`) multiplies every
    /// activation row as [`dot`] does, bit for bit, whatever the number of rows.
    pub fn matrix_equals_the_dot_product<F: Table4>(data: &[u8], rows: usize, cols: usize) {
        let m = QMatrix::from_raw(F::GGML_TYPE, data, rows, cols)
            .expect("read from raw bytes")
            .unwrap();
        let mut rng = Xorshift::new(8);
        let row_bytes = cols / 32 * F::BLOCK_BYTES;
        for n in [1, 3, 4, 9, 21] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.next_f32() * 2.0).collect();
            let got = m.matmul(&x, &vec![RowKernel::Gemv; n]).unwrap();
            for (t, xt) in x.chunks_exact(cols).enumerate() {
                let a = quantize_row_portable(xt);
                for r in 0..rows {
                    let want = reference::<F>(rows)(&data[r * row_bytes..(r + 1) * row_bytes], &a);
                    assert_eq!(
                        got[t * rows + r].to_bits(),
                        want.to_bits(),
                        "{n} rows: {t}, {r}"
                    );
                }
            }
        }
    }

    /// Every kernel of the layout equals [`dot`] on each row, bit for bit ([`dot_plain`]
    /// where the rows are not a multiple of eight), for activations at ±127.
    pub fn kernels_equal_the_dot_product<F: Table4>(data: &[u8], rows: usize, cols: usize) {
        let mut rng = Xorshift::new(5);
        let mut x: Vec<f32> = (0..3 * cols).map(|_| rng.next_f32() * 3.0).collect();
        x[7] = 50.0; // one value at the block's extreme: q = 127
        x[cols + 9] = -50.0;
        let acts: Vec<Q8Row> = x.chunks_exact(cols).map(quantize_row_portable).collect();
        let row_bytes = cols / 32 * F::BLOCK_BYTES;
        let mut kernels = match rows.is_multiple_of(8) {
            true => vec![Kernel::Portable],
            false => vec![Kernel::Plain],
        };
        #[cfg(target_arch = "x86_64")]
        if crate::simd::avx2() && rows.is_multiple_of(8) {
            kernels.push(Kernel::Avx2);
        }
        for kernel in kernels {
            let m = Rows8::<F>::with_kernel(data, rows, cols, kernel);
            for a in &acts {
                for g in 0..rows.div_ceil(8) {
                    let got = m.group(g, a);
                    for r in g * 8..(g * 8 + 8).min(rows) {
                        let want =
                            reference::<F>(rows)(&data[r * row_bytes..(r + 1) * row_bytes], a);
                        assert_eq!(
                            got[r - g * 8].to_bits(),
                            want.to_bits(),
                            "{kernel:?}, row {r}"
                        );
                    }
                }
            }
        }
    }
}
