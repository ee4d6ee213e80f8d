//! Quantized weight matrices and their products with f32 activations.
//!
//! For the block formats whose kernels we own (Q4_1, Q5_0, Q8_0) the arithmetic follows
//! ggml's x86 kernels step for step: activations are quantized to Q8 blocks the same way
//! (scale `127/amax`, round half to even), each block's integer dot product is split into
//! the same eight lanes, lanes are accumulated with fused multiply-adds and summed in the
//! same order. The small models served here are chaotic enough that this is what keeps
//! greedy output identical to llama.cpp's; it also makes every row's result independent
//! of the other rows in the batch. Where llama.cpp rounds a row differently when it is
//! part of a four-row group of prompt tokens (its repacked Q4_K GEMM), the caller says per
//! row which of its kernels to follow ([`RowKernel`]); the result still depends only on
//! the row and that choice. Other formats use candle's kernels.

mod dot;
mod kquant;
mod kquant_simd;
mod q8;
pub(crate) mod simd;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use rayon::prelude::*;

use crate::model::ops;
use crate::EngineError;

pub use dot::{BlockFormat, Q4_1, Q5_0, Q8_0};

/// Which of llama.cpp's kernels a row's arithmetic follows. They compute the same sums and
/// differ only in rounding: llama.cpp multiplies a prompt's rows four at a time (GEMM) and
/// the rest, including every decoded token, one at a time (GEMV).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RowKernel {
    /// The row alone (matrix × vector).
    #[default]
    Gemv,
    /// The row as one of a group of four (matrix × four rows).
    Gemm4,
}

/// Weight formats with kernels of our own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnFormat {
    /// A block-of-32 format against Q8 activations.
    Blocks(BlockFormat),
    /// Q4_K against Q8_K activations.
    Q4K,
    /// Q6_K against Q8_K activations.
    Q6K,
}

impl OwnFormat {
    fn row_bytes(self, cols: usize) -> usize {
        match self {
            Self::Blocks(f) => f.row_bytes(cols),
            Self::Q4K => cols / kquant::QK_K * kquant::Q4_K,
            Self::Q6K => cols / kquant::QK_K * kquant::Q6_K,
        }
    }

    fn block_len(self) -> usize {
        match self {
            Self::Blocks(_) => 32,
            Self::Q4K | Self::Q6K => kquant::QK_K,
        }
    }
}

/// Quantized activations of one row, in the form a format's dot product takes.
enum Activations {
    Q8(q8::Q8Row),
    Q8K(kquant::Q8KRow),
}

/// The Q8 rows, when the activations are of that kind.
fn q8_rows(acts: &[Activations]) -> Option<Vec<&q8::Q8Row>> {
    acts.iter()
        .map(|a| match a {
            Activations::Q8(r) => Some(r),
            Activations::Q8K(_) => None,
        })
        .collect()
}

/// A weight matrix of `rows` output features by `cols` inputs.
pub enum QMatrix {
    /// A format with our own kernels: raw blocks, `row_bytes` per row.
    Own {
        /// Block format of the rows.
        format: OwnFormat,
        /// The blocks, row after row.
        data: Vec<u8>,
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
    },
    /// Any other format, through candle.
    Candle(QMatMul),
}

impl QMatrix {
    /// Wraps a GGUF tensor (`[rows, cols]`).
    pub fn new(tensor: QTensor) -> Result<Self, EngineError> {
        let format = match tensor.dtype() {
            GgmlDType::Q4_1 => Some(OwnFormat::Blocks(BlockFormat::Q4_1)),
            GgmlDType::Q5_0 => Some(OwnFormat::Blocks(BlockFormat::Q5_0)),
            GgmlDType::Q8_0 => Some(OwnFormat::Blocks(BlockFormat::Q8_0)),
            GgmlDType::Q4K => Some(OwnFormat::Q4K),
            GgmlDType::Q6K => Some(OwnFormat::Q6K),
            _ => None,
        };
        match format {
            Some(format) => {
                let (rows, cols) = tensor.shape().dims2()?;
                if cols % format.block_len() != 0 {
                    return Err(EngineError::InvalidModel(format!(
                        "row width {cols} is not a multiple of {}",
                        format.block_len()
                    )));
                }
                let data = tensor.data()?.into_owned();
                if data.len() != rows * format.row_bytes(cols) {
                    return Err(EngineError::InvalidModel(
                        "quantized tensor has the wrong size".into(),
                    ));
                }
                Ok(Self::Own {
                    format,
                    data,
                    rows,
                    cols,
                })
            }
            None => Ok(Self::Candle(QMatMul::from_qtensor(tensor)?)),
        }
    }

    /// Whether a row's result depends on its [`RowKernel`] (only the Q4_K kernels round
    /// differently as GEMV and GEMM).
    pub fn rounds_by_kernel(&self) -> bool {
        matches!(
            self,
            Self::Own {
                format: OwnFormat::Q4K,
                ..
            }
        )
    }

    /// `x · Wᵀ` for the activation rows of `x` (row-major), one per entry of `kernels`,
    /// each rounded as its kernel says: an `n × rows` result. Every row is computed on its
    /// own, so its result never depends on the rest of the batch.
    pub fn matmul(&self, x: &[f32], kernels: &[RowKernel]) -> Result<Vec<f32>, EngineError> {
        let n = kernels.len();
        match self {
            Self::Candle(m) => ops::linear(m, x, n),
            Self::Own {
                format,
                data,
                rows,
                cols,
            } => {
                let (format, rows, cols) = (*format, *rows, *cols);
                // Rows are quantized independently, in parallel.
                let acts: Vec<Activations> = x
                    .par_chunks_exact(cols)
                    .zip(kernels)
                    .map(|(r, &kernel)| match format {
                        OwnFormat::Blocks(f) => Activations::Q8(f.quantize_activations(r)),
                        // Only the repacked Q4_K GEMM quantizes its rows differently.
                        OwnFormat::Q4K => Activations::Q8K(kquant::quantize_row_q8k(r, kernel)),
                        OwnFormat::Q6K => {
                            Activations::Q8K(kquant::quantize_row_q8k(r, RowKernel::Gemv))
                        }
                    })
                    .collect();
                let dot = |w: &[u8], t: usize| match (&acts[t], format) {
                    (Activations::Q8(a), OwnFormat::Blocks(f)) => f.dot(w, a),
                    (Activations::Q8K(a), OwnFormat::Q4K) => kquant::dot_q4k(w, a, kernels[t]),
                    (Activations::Q8K(a), OwnFormat::Q6K) => kquant::dot_q6k(w, a),
                    _ => unreachable!("activations are quantized for the matrix's format"),
                };
                let row_bytes = format.row_bytes(cols);
                let q8 = q8_rows(&acts);
                let mut out = vec![0f32; n * rows];
                // Split the output features into chunks; every chunk computes all
                // activation rows, so each weight row is read once per step.
                const CHUNK: usize = 64;
                let chunks: Vec<(usize, Vec<f32>)> = (0..rows.div_ceil(CHUNK))
                    .into_par_iter()
                    .map(|c| {
                        let start = c * CHUNK;
                        let end = (start + CHUNK).min(rows);
                        let width = end - start;
                        let mut part = vec![0f32; n * width];
                        for r in start..end {
                            let w = &data[r * row_bytes..(r + 1) * row_bytes];
                            let mut t = 0;
                            if let (OwnFormat::Blocks(f), Some(q8)) = (format, &q8) {
                                // Four activation rows per pass over the weight row.
                                while t + 4 <= n {
                                    let rows4 = [q8[t], q8[t + 1], q8[t + 2], q8[t + 3]];
                                    for (i, v) in f.dot4(w, rows4).into_iter().enumerate() {
                                        part[(t + i) * width + (r - start)] = v;
                                    }
                                    t += 4;
                                }
                            }
                            for t in t..n {
                                part[t * width + (r - start)] = dot(w, t);
                            }
                        }
                        (start, part)
                    })
                    .collect();
                for (start, part) in chunks {
                    let width = part.len() / n;
                    for t in 0..n {
                        out[t * rows + start..t * rows + start + width]
                            .copy_from_slice(&part[t * width..(t + 1) * width]);
                    }
                }
                Ok(out)
            }
        }
    }
}
