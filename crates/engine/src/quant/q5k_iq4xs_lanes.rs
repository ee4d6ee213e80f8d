//! Q5_K and IQ4_XS weights interleaved sixteen rows at a time, one weight row per 32-bit
//! lane, for CPUs with AVX2 but without AVX-512 VNNI (those take the two-row layout of
//! [`super::pair_lanes`]). As in [`super::q4k_lanes`], a 64-byte line is two 256-bit halves
//! of eight rows each, and the kernel ([`avx2`]) multiplies four values of eight rows by
//! the same four activations (broadcast): every lane keeps one weight row's sums, and the
//! only sums across lanes are the one-row arithmetic's last eight.
//!
//! llama.cpp's AVX2 dot products (`ggml_vec_dot_q5_K_q8_K`, `ggml_vec_dot_iq4_xs_q8_K`)
//! take a matrix row after row: 32 bytes of one row against 32 activations, and a
//! horizontal sum to end every row. ferrite's AVX2 kernels did the same until this layout
//! replaced them; on a Zen 3 core (`matmul_kernels`, one thread) they ran 15 and 18 giga
//! multiply-adds a second for one activation row and 23–26 for sixteen, this layout 28–35
//! and 57–62 (BENCHMARKS.md, 2026-11-27).
//!
//! Per group of sixteen rows (the last one padded with zero rows) and per super-block,
//! [`LaneFormat::sixteen_row_lines`] lines:
//! - a header: the rows' `d` (the file's `f16`) at `2r`, Q5_K's `dmin` at `32 + 2r`;
//! - two lines of scales, per sub-block of 32 the sixteen rows' bytes (Q5_K's 6-bit
//!   scales; IQ4_XS's, less 32, as signed bytes);
//! - for Q5_K, two lines of minimums, per pair of sub-blocks each row's two as bytes;
//! - per sub-block `j` of 32, in order (the kernel reads a super-block front to back, one
//!   stream for the hardware's prefetchers):
//!   - for Q5_K, a line of fifth bits: byte `4r + t` holds at bit `2i + n` the fifth bit of
//!     the value in nibble `n` of byte `4r + t` of the sub-block's line of values `i`;
//!   - four lines of 4-bit values (Q5_K's low four bits; IQ4_XS's table indices): line `i`
//!     holds values `8i..8i + 8`, row `r`'s four bytes at `4r` with values `8i..8i + 4` in
//!     the low nibbles and `8i + 4..8i + 8` in the high ones ("values" in IQ4_XS's order:
//!     a sub-block's sixteen low nibbles, then its sixteen high ones).
//!
//! The arithmetic is that of the portable kernels, two plans as in llama.cpp: rows of
//! micro-batches of 8 or more take its tiled matmul's (`kquant::dot_q5k_tiled`,
//! `iq4::dot_iq4_xs_tiled`: one exact integer sum per super-block); the rest its dot
//! product's (`kquant::dot_q5k_portable`, `iq4::dot_iq4_xs`): eight integer lanes per
//! super-block, lane `l` taking values `4l..4l + 4` of every sub-block, which in this layout
//! are the low (`l` even) or high nibbles of line `l / 2`. The integer sums are exact
//! whatever their order, and the floating-point steps are the same operations on the same
//! values, one weight row per vector lane, so results are bit-identical.

use std::ops::Range;

#[cfg(target_arch = "x86_64")]
mod avx2;

use super::act_tile::Line;
use super::iq4::{xs_scale, IQ4_XS};
use super::kquant::{scale_min_k4, Q5_K};
use super::layout::Layout;
#[cfg(target_arch = "x86_64")]
use super::layout::{lane_groups_by_plan, LANE_ROWS};
use super::output::Columns;
use super::pair_lanes::LaneFormat;
use super::{Activations, RowKernel};

/// Weight rows per group.
pub const ROWS: usize = 16;
/// Where a super-block's lines of scales and (Q5_K's) minimums start.
const SCALES: usize = 1;
const MINS: usize = 3;

impl LaneFormat {
    /// Lines per group and super-block in the sixteen-row layout.
    pub(super) fn sixteen_row_lines(self) -> usize {
        self.sub_block_line(8)
    }

    /// Lines of a sub-block: its four of values, and Q5_K's one of fifth bits.
    fn sub_block_lines(self) -> usize {
        match self {
            Self::Q5K => 5,
            Self::Iq4Xs => 4,
        }
    }

    /// Where sub-block `j`'s lines start (its fifth bits' line, for Q5_K).
    fn sub_block_line(self, j: usize) -> usize {
        let first = match self {
            Self::Q5K => 5,
            Self::Iq4Xs => 3,
        };
        first + j * self.sub_block_lines()
    }

    /// Sub-block `j`'s line `i` of values (values `8i..8i + 8`).
    fn value_line(self, j: usize, i: usize) -> usize {
        self.sub_block_line(j + 1) - 4 + i
    }
}

/// A Q5_K or IQ4_XS matrix in the sixteen-row layout (see the module).
pub struct Q5kIq4xsLanes {
    format: LaneFormat,
    blocks: usize,
    lines: Vec<Line>,
}

impl Q5kIq4xsLanes {
    /// Interleaves row-major super-blocks of `format` (`rows` rows of `blocks` each).
    pub fn new(format: LaneFormat, raw: &[u8], rows: usize, blocks: usize) -> Self {
        let block_bytes = match format {
            LaneFormat::Q5K => Q5_K,
            LaneFormat::Iq4Xs => IQ4_XS,
        };
        assert_eq!(raw.len(), rows * blocks * block_bytes);
        let per = format.sixteen_row_lines();
        let groups = rows.div_ceil(ROWS);
        let mut lines = vec![Line([0; 64]); groups * blocks * per];
        for r in 0..rows {
            let (g, lane) = (r / ROWS, r % ROWS);
            for b in 0..blocks {
                let block = &raw[(r * blocks + b) * block_bytes..][..block_bytes];
                let out = &mut lines[(g * blocks + b) * per..][..per];
                out[0].0[2 * lane..2 * lane + 2].copy_from_slice(&block[0..2]);
                // Value `e` of sub-block `j`, all its bits.
                let value: Box<dyn Fn(usize, usize) -> u8> = match format {
                    LaneFormat::Q5K => {
                        out[0].0[32 + 2 * lane..34 + 2 * lane].copy_from_slice(&block[2..4]);
                        for j in 0..8 {
                            let (scale, min) = scale_min_k4(j, &block[4..16]);
                            out[SCALES + j / 4].0[(j % 4) * ROWS + lane] = scale as u8;
                            let pair = j / 2;
                            out[MINS + pair / 2].0[32 * (pair % 2) + 2 * lane + j % 2] = min as u8;
                        }
                        let (qh, qs) = (&block[16..48], &block[48..176]);
                        Box::new(move |j, e| {
                            let low = (qs[(j / 2) * 32 + e] >> (4 * (j % 2))) & 0x0F;
                            low | (((qh[e] >> j) & 1) << 4)
                        })
                    }
                    LaneFormat::Iq4Xs => {
                        for j in 0..8 {
                            let scale = xs_scale(block, j) as i8 as u8;
                            out[SCALES + j / 4].0[(j % 4) * ROWS + lane] = scale;
                        }
                        let qs = &block[8..136];
                        Box::new(move |j, e| {
                            let byte = qs[16 * j + e % 16];
                            if e < 16 {
                                byte & 0x0F
                            } else {
                                byte >> 4
                            }
                        })
                    }
                };
                for j in 0..8 {
                    for i in 0..4 {
                        for t in 0..4 {
                            let at = 4 * lane + t;
                            let (low, high) = (value(j, 8 * i + t), value(j, 8 * i + 4 + t));
                            out[format.value_line(j, i)].0[at] = (low & 0x0F) | (high << 4);
                            if format == LaneFormat::Q5K {
                                let fifth = (low >> 4) << (2 * i) | (high >> 4) << (2 * i + 1);
                                out[format.sub_block_line(j)].0[at] |= fifth;
                            }
                        }
                    }
                }
            }
        }
        Self {
            format,
            blocks,
            lines,
        }
    }

    /// Group `g`'s lines, super-block after super-block.
    fn group(&self, g: usize) -> &[Line] {
        let len = self.blocks * self.format.sixteen_row_lines();
        &self.lines[g * len..(g + 1) * len]
    }
}

impl Layout for Q5kIq4xsLanes {
    fn back_with_huge_pages(&self) {
        crate::huge_pages::back(&self.lines);
    }

    fn chunk(&self, acts: &Activations, kernels: &[RowKernel], range: Range<usize>, out: &Columns) {
        let Activations::Q8K(a, _) = acts else {
            unreachable!("Q5_K and IQ4_XS take Q8_K activations");
        };
        #[cfg(target_arch = "x86_64")]
        {
            let m = self;
            let tiled = |g, four: &[usize], soon| {
                let mut got = [[0f32; LANE_ROWS]; 4];
                // SAFETY: the layout is only built where the CPU has AVX2.
                with_row_count!(four.len(), got, T => unsafe {
                    avx2::dot_group::<T, true>(m, g, std::array::from_fn(|k| &a[four[k]]), soon)
                });
                got
            };
            // SAFETY: as above.
            let dot =
                |g, t: usize, soon| unsafe { avx2::dot_group::<1, false>(m, g, [&a[t]], soon)[0] };
            lane_groups_by_plan(out, range, kernels, (|g| m.group(g), m.blocks), tiled, dot);
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (a, kernels, range, out);
            unreachable!("the layout is only built where the CPU has AVX2");
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::quant::iq4::{dot_iq4_xs, dot_iq4_xs_tiled};
    use crate::quant::kquant::{dot_q5k_portable, dot_q5k_tiled, quantize_row_q8k, Q8KRow, QK_K};
    use crate::quant::sample::{self, Xorshift};
    use crate::quant::simd::Upcoming;
    use crate::quant::OwnFormat;

    /// Both plans of the AVX2 kernel, for both formats: every row of every group (a
    /// ragged last one) equals the portable dot product (one activation row) and the
    /// portable tiled product (one to four rows, in every position of a pass) bit for bit,
    /// over activations of very different scales.
    #[test]
    fn avx2_kernels_are_bit_identical_to_the_portable_ones() {
        if crate::cpu::lacks(crate::cpu::detected().avx2, "avx2") {
            return;
        }
        type Dot = fn(&[u8], &Q8KRow) -> f32;
        let cases: [(LaneFormat, OwnFormat, Dot, Dot); 2] = [
            (
                LaneFormat::Q5K,
                OwnFormat::Q5K,
                dot_q5k_portable,
                dot_q5k_tiled,
            ),
            (
                LaneFormat::Iq4Xs,
                OwnFormat::Iq4Xs,
                dot_iq4_xs,
                dot_iq4_xs_tiled,
            ),
        ];
        for (format, own, dot, tiled) in cases {
            let mut rng = Xorshift::new(31);
            let (rows, cols) = (37, 3 * QK_K);
            let raw = sample::weights(own, rows, cols, &mut rng);
            let m = Q5kIq4xsLanes::new(format, &raw, rows, cols / QK_K);
            let acts: Vec<Q8KRow> = [4.0, 0.01, 300.0, 1.0]
                .iter()
                .map(|&scale| {
                    let values = sample::activations(1, cols, scale, &mut rng);
                    quantize_row_q8k(&values, RowKernel::Gemv)
                })
                .collect();
            let row_bytes = own.row_bytes(cols);
            let row = |r: usize| &raw[r * row_bytes..][..row_bytes];
            for g in 0..rows.div_ceil(ROWS) {
                let soon = || Upcoming::new(m.group(0), 3);
                let a = |t: [usize; 4]| t.map(|t| &acts[t]);
                // SAFETY: AVX2 was checked.
                let (one, four, three, two, alone) = unsafe {
                    (
                        avx2::dot_group::<1, false>(&m, g, [&acts[2]], soon()),
                        avx2::dot_group::<4, true>(&m, g, a([0, 1, 2, 3]), soon()),
                        avx2::dot_group::<3, true>(&m, g, [&acts[3], &acts[1], &acts[0]], soon()),
                        avx2::dot_group::<2, true>(&m, g, [&acts[2], &acts[0]], soon()),
                        avx2::dot_group::<1, true>(&m, g, [&acts[1]], soon()),
                    )
                };
                for lane in 0..ROWS {
                    let r = g * ROWS + lane;
                    let real = r < rows;
                    let want = |f: Dot, t: usize| if real { f(row(r), &acts[t]) } else { 0.0 };
                    let at = format!("{format:?} row {r}");
                    assert_eq!(want(dot, 2).to_bits(), one[0][lane].to_bits(), "{at}, dot");
                    let passes: [(&[usize], &[[f32; ROWS]]); 4] = [
                        (&[0, 1, 2, 3], &four),
                        (&[3, 1, 0], &three),
                        (&[2, 0], &two),
                        (&[1], &alone),
                    ];
                    for (order, got) in passes {
                        for (k, &t) in order.iter().enumerate() {
                            let (want, got) = (want(tiled, t), got[k][lane]);
                            assert_eq!(want.to_bits(), got.to_bits(), "{at}, act {t} of {order:?}");
                        }
                    }
                }
            }
        }
    }

    /// The layout's fields land where the module says, for a hand-made Q5_K super-block
    /// whose every value, scale and minimum differs.
    #[test]
    fn q5k_layout_puts_each_field_where_the_module_says() {
        let mut block = vec![0u8; Q5_K];
        block[0..4].copy_from_slice(&[0x11, 0x22, 0x33, 0x44]);
        for (i, b) in block[4..16].iter_mut().enumerate() {
            *b = (7 * i + 3) as u8;
        }
        for (i, b) in block[16..].iter_mut().enumerate() {
            *b = (37 * i + 11) as u8;
        }
        // Two rows: the block as row 1, zeros as row 0.
        let mut raw = vec![0u8; Q5_K];
        raw.extend_from_slice(&block);
        let m = Q5kIq4xsLanes::new(LaneFormat::Q5K, &raw, 2, 1);
        let lines = m.group(0);
        let lane = 1;
        assert_eq!(&lines[0].0[2..4], &block[0..2]);
        assert_eq!(&lines[0].0[34..36], &block[2..4]);
        for j in 0..8 {
            let (scale, min) = scale_min_k4(j, &block[4..16]);
            assert_eq!(lines[SCALES + j / 4].0[(j % 4) * ROWS + lane], scale as u8);
            let pair = j / 2;
            assert_eq!(
                lines[MINS + pair / 2].0[32 * (pair % 2) + 2 * lane + j % 2],
                min as u8
            );
            for e in 0..32 {
                let low = (block[48 + (j / 2) * 32 + e] >> (4 * (j % 2))) & 0x0F;
                let want = low | (((block[16 + e] >> j) & 1) << 4);
                let (i, n, t) = (e / 8, (e % 8) / 4, e % 4);
                let byte = 4 * lane + t;
                let nibble = (lines[5 + 5 * j + 1 + i].0[byte] >> (4 * n)) & 0x0F;
                let fifth = (lines[5 + 5 * j].0[byte] >> (2 * i + n)) & 1;
                assert_eq!(nibble | fifth << 4, want, "sub-block {j}, value {e}");
            }
        }
        // Row 0 (lane 0) is zeros in every line of values and of fifth bits.
        assert!(lines[5..].iter().all(|line| line.0[0..4] == [0; 4]));
    }
}
