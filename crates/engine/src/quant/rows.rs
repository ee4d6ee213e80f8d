//! Quantized weights row after row, as the GGUF file holds them: the layout of the K-quant
//! and IQ formats, Q5_1 and repacked Q4_0 on CPUs without AVX2 (with AVX2 each has a lane
//! layout). The other block-of-32 formats are always `packed` or `block_lanes`, the float
//! ones `float_rows`. Its portable
//! kernels take one weight row by up to four activation rows. Q3_K, Q5_K, Q6_K and IQ4_XS
//! rows of a micro-batch of 8 or more take the arithmetic of llama.cpp's tiled kernel.

use std::ops::Range;

use super::formats::block32;
use super::formats::iq4_nl::Iq4Nl;
use super::formats::q4_0::Q4_0;
use super::formats::q5_1::Q5_1;
use super::formats::table4;
use super::layout::Layout;
use super::output::Columns;
use super::{Activations, OwnFormat, RowKernel, ACT_TILE};

/// A matrix of `format` row after row.
pub struct RowMajor {
    format: OwnFormat,
    data: Vec<u8>,
    row_bytes: usize,
}

impl RowMajor {
    /// The raw rows (`cols` values each) of `format`, copied.
    pub fn new(format: OwnFormat, data: &[u8], cols: usize) -> Self {
        Self {
            format,
            data: data.to_vec(),
            row_bytes: format.row_bytes(cols),
        }
    }
}

impl Layout for RowMajor {
    fn back_with_huge_pages(&self) {
        crate::huge_pages::back(&self.data);
    }

    fn chunk(&self, acts: &Activations, kernels: &[RowKernel], range: Range<usize>, out: &Columns) {
        let (format, data, row_bytes) = (&self.format, &self.data, self.row_bytes);
        let (n, start, end) = (kernels.len(), range.start, range.end);
        match acts {
            Activations::Q8(a, _, _) => {
                for r in start..end {
                    let w = &data[r * row_bytes..(r + 1) * row_bytes];
                    for (t, a) in a.iter().enumerate() {
                        let v = match format {
                            OwnFormat::Q5_1 => block32::dot::<Q5_1>(w, a),
                            OwnFormat::Iq4NlRepacked => table4::dot::<Iq4Nl>(w, a),
                            // Repacked Q4_0 on CPUs without AVX2 (`block_lanes` elsewhere).
                            _ => block32::dot_repacked::<Q4_0>(w, a),
                        };
                        out.set(t, r, v);
                    }
                }
            }
            Activations::Q8K(a, _) => {
                // One weight row by up to four activation rows (the layout of the K-quants
                // without a lane layout on this CPU): each super-block is decoded once for
                // all of them.
                let a: Vec<&crate::quant::q8k::Q8KRow> = a.iter().collect();
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
                            let got = match format {
                                OwnFormat::Q4K => crate::quant::formats::q4_k::dot_tile(
                                    w,
                                    &a[g.clone()],
                                    &kernels[g.clone()],
                                ),
                                OwnFormat::Q5K => {
                                    crate::quant::formats::q5_k::dot_tile(w, &a[g.clone()], wide)
                                }
                                OwnFormat::Q3K => {
                                    crate::quant::formats::q3_k::dot_tile(w, &a[g.clone()], wide)
                                }
                                OwnFormat::Iq4Xs => {
                                    crate::quant::formats::iq4_xs::dot_tile(w, &a[g.clone()], wide)
                                }
                                OwnFormat::Q2KRepacked => {
                                    let mut got = [0f32; 4];
                                    for (k, t) in g.clone().enumerate() {
                                        got[k] = crate::quant::formats::q2_k::dot_repacked(
                                            w, a[t], kernels[t],
                                        );
                                    }
                                    got
                                }
                                _ => crate::quant::formats::q6_k::dot_tile(w, &a[g.clone()], wide),
                            };
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
