//! Quantized weight matrices and their products with f32 activations.
//!
//! For the block formats whose kernels we own (Q4_1, Q5_0, Q8_0) the arithmetic follows
//! ggml's x86 kernels step for step: activations are quantized to Q8 blocks the same way
//! (scale `127/amax`, round half to even), each block's integer dot product is split into
//! the same eight lanes, lanes are accumulated with fused multiply-adds and summed in the
//! same order. The small models served here are chaotic enough that this is what keeps
//! greedy output identical to llama.cpp's; it also makes every row's result independent
//! of the other rows in the batch. Other formats (the K-quants) use candle's kernels.

mod dot;
mod q8;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use rayon::prelude::*;

use crate::model::ops;
use crate::EngineError;

pub use dot::{BlockFormat, Q4_1, Q5_0, Q8_0};

/// A weight matrix of `rows` output features by `cols` inputs.
pub enum QMatrix {
    /// A format with our own kernels: raw blocks, `row_bytes` per row.
    Own {
        /// Block format of the rows.
        format: BlockFormat,
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
            GgmlDType::Q4_1 => Some(BlockFormat::Q4_1),
            GgmlDType::Q5_0 => Some(BlockFormat::Q5_0),
            GgmlDType::Q8_0 => Some(BlockFormat::Q8_0),
            _ => None,
        };
        match format {
            Some(format) => {
                let (rows, cols) = tensor.shape().dims2()?;
                if cols % 32 != 0 {
                    return Err(EngineError::InvalidModel(format!(
                        "row width {cols} is not a multiple of 32"
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

    /// `x · Wᵀ` for `n` activation rows of `x` (row-major): an `n × rows` result.
    pub fn matmul(&self, x: &[f32], n: usize) -> Result<Vec<f32>, EngineError> {
        match self {
            Self::Candle(m) => ops::linear(m, x, n),
            Self::Own {
                format,
                data,
                rows,
                cols,
            } => {
                let (rows, cols) = (*rows, *cols);
                let acts: Vec<q8::Q8Row> = x
                    .chunks_exact(cols)
                    .map(|r| format.quantize_activations(r))
                    .collect();
                let row_bytes = format.row_bytes(cols);
                let mut out = vec![0f32; n * rows];
                // Split the output features into chunks; every chunk computes all
                // activation rows, so each weight row is read once per step.
                const CHUNK: usize = 64;
                let chunks: Vec<(usize, Vec<f32>)> = (0..rows.div_ceil(CHUNK))
                    .into_par_iter()
                    .map(|c| {
                        let start = c * CHUNK;
                        let end = (start + CHUNK).min(rows);
                        let mut part = vec![0f32; n * (end - start)];
                        for r in start..end {
                            let w = &data[r * row_bytes..(r + 1) * row_bytes];
                            for (t, act) in acts.iter().enumerate() {
                                part[t * (end - start) + (r - start)] = format.dot(w, act);
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
