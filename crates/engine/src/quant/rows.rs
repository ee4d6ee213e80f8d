//! Quantized weights row after row, as the GGUF file holds them: the layout of the K-quant
//! and IQ formats, Q5_1 and repacked Q4_0 on CPUs without AVX2 (with AVX2 each has a lane
//! layout). The other block-of-32 formats are always `packed` or `block_lanes`, the float
//! ones `float_rows`. Its portable
//! kernels take one weight row by up to four activation rows. Q3_K, Q5_K, Q6_K and IQ4_XS
//! rows of a micro-batch of 8 or more take the arithmetic of llama.cpp's tiled kernel.

use std::ops::Range;

use super::layout::Layout;
use super::output::Columns;
use super::q8::Q8Row;
use super::q8k::Q8KRow;
use super::{Activations, RowKernel, ACT_TILE};

/// One weight row by up to four Q8_K activation rows, given their kernels and whether
/// they are in a wide micro-batch.
pub type TileDot = fn(&[u8], &[&Q8KRow], &[RowKernel], bool) -> [f32; 4];

/// A format's portable kernel, as this layout calls it.
#[derive(Clone, Copy)]
pub enum RowDot {
    /// One weight row by one Q8 activation row.
    Q8(fn(&[u8], &Q8Row) -> f32),
    /// One weight row by up to four Q8_K activation rows (a super-block decoded once for
    /// them all).
    Q8K(TileDot),
}

/// A matrix row after row, with its format's portable kernel.
pub struct RowMajor {
    dot: RowDot,
    data: Vec<u8>,
    row_bytes: usize,
}

impl RowMajor {
    /// The raw rows (`rows` of them), copied.
    pub fn new(dot: RowDot, data: &[u8], rows: usize) -> Self {
        Self {
            dot,
            data: data.to_vec(),
            row_bytes: data.len().checked_div(rows).unwrap_or(0),
        }
    }
}

impl Layout for RowMajor {
    fn back_with_huge_pages(&self) {
        crate::huge_pages::back(&self.data);
    }

    fn chunk(&self, acts: &Activations, kernels: &[RowKernel], range: Range<usize>, out: &Columns) {
        let (data, row_bytes) = (&self.data, self.row_bytes);
        let (n, start, end) = (kernels.len(), range.start, range.end);
        match acts {
            Activations::Q8(a, _, _) => {
                let RowDot::Q8(dot) = self.dot else {
                    unreachable!("Q8 activations go to a Q8 kernel");
                };
                for r in start..end {
                    let w = &data[r * row_bytes..(r + 1) * row_bytes];
                    for (t, a) in a.iter().enumerate() {
                        out.set(t, r, dot(w, a));
                    }
                }
            }
            Activations::Q8K(a, _) => {
                let RowDot::Q8K(dot) = self.dot else {
                    unreachable!("Q8_K activations go to a Q8_K kernel");
                };
                // One weight row by up to four activation rows (the layout of the K-quants
                // without a lane layout on this CPU): each super-block is decoded once for
                // all of them.
                let a: Vec<&Q8KRow> = a.iter().collect();
                for t0 in (0..n).step_by(ACT_TILE) {
                    let t1 = (t0 + ACT_TILE).min(n);
                    for r in start..end {
                        let w = &data[r * row_bytes..(r + 1) * row_bytes];
                        let mut t = t0;
                        while t < t1 {
                            // Q3_K, Q5_K, Q6_K and IQ4_XS rows of wide micro-batches take the
                            // arithmetic of llama.cpp's tiled kernel, as on AVX-512 VNNI
                            // (`pair_lanes::tiled`): a group ends where the width changes.
                            let wide = kernels[t].in_wide_batch();
                            let stop = (t..(t + 4).min(t1))
                                .find(|&k| kernels[k].in_wide_batch() != wide)
                                .unwrap_or((t + 4).min(t1));
                            let g = t..stop;
                            let got = dot(w, &a[g.clone()], &kernels[g.clone()], wide);
                            for (k, &v) in got.iter().enumerate().take(g.len()) {
                                out.set(t + k, r, v);
                            }
                            t = g.end;
                        }
                    }
                }
            }
            Activations::Float(_) | Activations::Half(..) | Activations::Brain(..) => {
                unreachable!("quantized formats take quantized activations")
            }
        }
    }
}
