//! Q2_K, Q3_K, Q5_K and IQ4_XS weights (K-quant super-blocks) interleaved sixteen rows at a
//! time, one weight row per 32-bit lane, for CPUs with AVX2: Q2_K and Q3_K wherever the CPU
//! has it, Q5_K and IQ4_XS where it lacks AVX-512 VNNI (there they take the two-row layout
//! of [`super::pair_lanes`]). As in [`super::q4k_lanes`], a 64-byte
//! line is two 256-bit halves of eight rows each, and the kernel ([`avx2`]) multiplies four
//! values of eight rows by the same four activations (broadcast): every lane keeps one
//! weight row's sums, and the only sums across lanes are the one-row arithmetic's last
//! eight. Where the CPU has AVX-512 VNNI, Q2_K's and Q3_K's kernels ([`vnni`]) take a
//! whole line, sixteen rows, as one vector.
//!
//! llama.cpp's AVX2 dot products (`ggml_vec_dot_q3_K_q8_K` and its Q5_K and IQ4_XS twins)
//! take a matrix row after row: 32 bytes of one row against 32 activations, and a
//! horizontal sum to end every row. ferrite's AVX2 kernels for Q5_K and IQ4_XS did the same
//! until this layout replaced them, and Q2_K and Q3_K had portable code only; on a Zen 3
//! core (`matmul_kernels`, one thread) they ran 15, 18, 1.3 and 0.8 giga multiply-adds a
//! second for one activation row (BENCHMARKS-history.md, 2026-11-27).
//!
//! Per group of sixteen rows (the last one padded with zero rows) and per super-block,
//! [`block_lines`] lines:
//! - a header: the rows' `d` (the file's `f16`) at `2r`, Q2_K's and Q5_K's `dmin` at
//!   `32 + 2r`;
//! - lines of scales as bytes, per sub-block the sixteen rows' (the sixteen sub-blocks of
//!   16 of Q2_K and Q3_K in four lines, the eight of 32 of Q5_K and IQ4_XS in two): Q2_K's
//!   file bytes (scale and minimum, four bits each), the others' signed (Q3_K's and
//!   IQ4_XS's less 32);
//! - for Q5_K, two lines of minimums, per pair of sub-blocks each row's two as bytes;
//! - per chunk `j` of 32 values, in order (the kernel reads a super-block front to back,
//!   one stream for the hardware's prefetchers), its "quads" `q` (values `4q..4q + 4`),
//!   row `r`'s four values of a quad in the four bytes at `4r` of a line:
//!   - Q5_K: a line of fifth bits (quad `q`'s at bit `q`), then four lines of the low four
//!     bits (quads `2i` and `2i + 1` in line `i`'s low and high nibbles);
//!   - IQ4_XS: the four lines of 4-bit table indices likewise ("values" in IQ4_XS's order: a
//!     sub-block's sixteen low nibbles, then its sixteen high ones);
//!   - Q3_K: a line of high bits (quad `q`'s at bit `q`), then two lines of the low two
//!     bits (quad `q` in line `q / 4`, at bits `2(q % 4)`). A value is those three bits
//!     less 4.
//!   - Q2_K: the two lines of two bits alone.
//!
//! The arithmetic is that of the portable kernels, two plans as in llama.cpp: rows of
//! micro-batches of 8 or more take its tiled matmul's (`crate::quant::formats::q3_k::dot_tiled`,
//! `q5_k::dot_tiled`, `crate::quant::formats::iq4_xs::dot_tiled`: one exact integer sum per super-block); the
//! rest its dot product's (`crate::quant::formats::q3_k::dot`, `q5_k::dot`,
//! `crate::quant::formats::iq4_xs::dot`): eight integer lanes per super-block, lane `q` taking quad `q` of
//! every chunk. The integer sums are exact whatever their order, and the floating-point
//! steps are the same operations on the same values, one weight row per vector lane, so
//! results are bit-identical. Q2_K follows llama.cpp's repacked kernels instead
//! (`crate::quant::formats::q2_k::dot_repacked`, which llama.cpp runs where the rows are a multiple of
//! eight, as they are wherever this layout takes it): per half super-block one integer sum
//! of the scaled values and one of the minimums, folded in per half for a row of a four-row
//! group and per super-block otherwise.

use std::marker::PhantomData;
use std::ops::Range;

use crate::quant::formats::iq4_xs::Iq4Xs;
use crate::quant::formats::kquant::{self, SuperBlock};
use crate::quant::formats::q2_k::Q2K;
use crate::quant::formats::q3_k::Q3K;
use crate::quant::formats::q5_k::Q5K;
use crate::quant::formats::view;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod vnni;

use super::act_tile::Line;

use super::layout::Layout;
#[cfg(target_arch = "x86_64")]
use super::layout::{lane_groups, lane_groups_by_plan, LANE_ROWS};
use super::output::Columns;
use super::{Activations, RowKernel};

/// Weight rows per group: one per 32-bit lane of a 512-bit vector.
pub use crate::simd::LANES_512 as ROWS;
/// Where a super-block's lines of scales and (Q5_K's) minimums start.
const SCALES: usize = 1;
const MINS: usize = 3;

/// How a format's values are held in a chunk's lines (see the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bits {
    /// Two lines of two bits (Q2_K's unsigned values).
    Two,
    /// A line of high bits, then two lines of two bits (Q3_K's values, less 4).
    Three,
    /// Four lines of 4-bit indices into IQ4_NL's table (IQ4_XS's).
    Table,
    /// A line of fifth bits, then four lines of the low four (Q5_K's unsigned values).
    Five,
}

/// A format this layout holds, as its kernels are written over it (llama.cpp's repack
/// templates are over the block type): the layout and the kernels are generic over it,
/// and each format's facts are its impl below.
pub(in crate::quant) trait KLane: SuperBlock {
    /// How its values are held.
    const BITS: Bits;
    /// Where the file's `d` sits in a super-block, and its `dmin` where it has one.
    const D: (usize, Option<usize>);
    /// Its sub-blocks' scales, as the layout stores them (a byte each): sixteen for
    /// sub-blocks of 16 values (Q2_K, Q3_K), eight for sub-blocks of 32.
    fn scales(block: &[u8]) -> Vec<i32>;
    /// Its sub-blocks' minimums where they are apart from the scales (Q5_K's).
    fn minimums(_block: &[u8]) -> Option<[u8; 8]> {
        None
    }
    /// Value `e` of chunk `j` (values `32j..32j + 32`), all its bits (Q3_K's stored 4
    /// higher).
    fn value(block: &[u8], j: usize, e: usize) -> u8;
}

impl KLane for Q2K {
    const BITS: Bits = Bits::Two;
    const D: (usize, Option<usize>) = (80, Some(82));
    /// A byte a sub-block of 16: its scale, and its minimum on top.
    fn scales(block: &[u8]) -> Vec<i32> {
        block[0..16].iter().map(|&both| both as i32).collect()
    }
    fn value(block: &[u8], j: usize, e: usize) -> u8 {
        (block[16 + 32 * (j / 4) + e] >> (2 * (j % 4))) & 3
    }
}

impl KLane for Q3K {
    const BITS: Bits = Bits::Three;
    const D: (usize, Option<usize>) = (108, None);
    fn scales(block: &[u8]) -> Vec<i32> {
        view::<Q3K>(block).scales().to_vec()
    }
    fn value(block: &[u8], j: usize, e: usize) -> u8 {
        let (hmask, qs) = (&block[0..32], &block[32..96]);
        let low = (qs[32 * (j / 4) + e] >> (2 * (j % 4))) & 3;
        low | (((hmask[e] >> j) & 1) << 2)
    }
}

impl KLane for Q5K {
    const BITS: Bits = Bits::Five;
    const D: (usize, Option<usize>) = (0, Some(2));
    fn scales(block: &[u8]) -> Vec<i32> {
        (0..8)
            .map(|j| kquant::scale_min_k4(j, &block[4..16]).0)
            .collect()
    }
    fn minimums(block: &[u8]) -> Option<[u8; 8]> {
        Some(std::array::from_fn(|j| {
            kquant::scale_min_k4(j, &block[4..16]).1 as u8
        }))
    }
    fn value(block: &[u8], j: usize, e: usize) -> u8 {
        let (qh, qs) = (&block[16..48], &block[48..176]);
        let low = (qs[(j / 2) * 32 + e] >> (4 * (j % 2))) & 0x0F;
        low | (((qh[e] >> j) & 1) << 4)
    }
}

impl KLane for Iq4Xs {
    const BITS: Bits = Bits::Table;
    const D: (usize, Option<usize>) = (0, None);
    fn scales(block: &[u8]) -> Vec<i32> {
        (0..8).map(|j| view::<Iq4Xs>(block).scale(j)).collect()
    }
    /// The indices in IQ4_XS's order: a sub-block's sixteen low nibbles, then its sixteen
    /// high ones.
    fn value(block: &[u8], j: usize, e: usize) -> u8 {
        let byte = block[8 + 16 * j + e % 16];
        if e < 16 {
            byte & 0x0F
        } else {
            byte >> 4
        }
    }
}

/// Where chunk `j`'s lines (values `32j..32j + 32`) start in a super-block's lines of `F`:
/// after the header, the lines of scales and (Q5_K's) minimums, and the earlier chunks;
/// Q3_K's high bits or Q5_K's fifth bits first, then the rest.
pub(super) const fn chunk_line<F: KLane>(j: usize) -> usize {
    match F::BITS {
        Bits::Two => 5 + 2 * j,
        Bits::Three => 5 + 3 * j,
        Bits::Five => 5 + 5 * j,
        Bits::Table => 3 + 4 * j,
    }
}

/// Lines per group and super-block.
pub(super) const fn block_lines<F: KLane>() -> usize {
    chunk_line::<F>(8)
}

/// Chunk `j`'s line of 4-bit values `8i..8i + 8` (Q5_K, IQ4_XS).
pub(super) const fn nibble_line<F: KLane>(j: usize, i: usize) -> usize {
    chunk_line::<F>(j + 1) - 4 + i
}

/// Chunk `j`'s line `k` (0 or 1) of 2-bit values, quads `4k..4k + 4` (Q2_K, Q3_K).
pub(super) const fn two_bit_line<F: KLane>(j: usize, k: usize) -> usize {
    chunk_line::<F>(j + 1) - 2 + k
}

/// A matrix of format `F` (Q2_K, Q3_K, Q5_K or IQ4_XS) in the sixteen-row layout (see
/// the module).
pub struct KLanes<F> {
    blocks: usize,
    lines: Vec<Line>,
    format: PhantomData<F>,
}

impl<F: KLane> KLanes<F> {
    /// Interleaves row-major super-blocks of `F` (`rows` rows of `blocks` each).
    pub fn new(raw: &[u8], rows: usize, blocks: usize) -> Self {
        let block_bytes = size_of::<F>();
        assert_eq!(raw.len(), rows * blocks * block_bytes);
        let per = block_lines::<F>();
        let groups = rows.div_ceil(ROWS);
        let mut lines = vec![Line([0; 64]); groups * blocks * per];
        for r in 0..rows {
            let (g, lane) = (r / ROWS, r % ROWS);
            for b in 0..blocks {
                let block = &raw[(r * blocks + b) * block_bytes..][..block_bytes];
                let out = &mut lines[(g * blocks + b) * per..][..per];
                for (s, value) in F::scales(block).into_iter().enumerate() {
                    out[SCALES + s / 4].0[(s % 4) * ROWS + lane] = value as i8 as u8;
                }
                let (d, dmin) = F::D;
                out[0].0[2 * lane..2 * lane + 2].copy_from_slice(&block[d..d + 2]);
                if let Some(dmin) = dmin {
                    let at = 32 + 2 * lane;
                    out[0].0[at..at + 2].copy_from_slice(&block[dmin..dmin + 2]);
                }
                if let Some(minimums) = F::minimums(block) {
                    for (j, &min) in minimums.iter().enumerate() {
                        let pair = j / 2;
                        out[MINS + pair / 2].0[32 * (pair % 2) + 2 * lane + j % 2] = min;
                    }
                }
                for j in 0..8 {
                    let first = chunk_line::<F>(j);
                    for e in 0..32 {
                        // Values 4q..4q + 4 of the chunk: the dot product's lane q.
                        let (q, at, u) = (e / 4, 4 * lane + e % 4, F::value(block, j, e));
                        match F::BITS {
                            Bits::Two | Bits::Three => {
                                if F::BITS == Bits::Three {
                                    out[first].0[at] |= (u >> 2) << q;
                                }
                                let line = two_bit_line::<F>(j, q / 4);
                                out[line].0[at] |= (u & 3) << (2 * (q % 4));
                            }
                            Bits::Five | Bits::Table => {
                                out[nibble_line::<F>(j, q / 2)].0[at] |=
                                    (u & 0x0F) << (4 * (q % 2));
                                if F::BITS == Bits::Five {
                                    out[first].0[at] |= (u >> 4) << q;
                                }
                            }
                        }
                    }
                }
            }
        }
        Self {
            blocks,
            lines,
            format: PhantomData,
        }
    }

    /// Group `g`'s lines, super-block after super-block.
    fn group(&self, g: usize) -> &[Line] {
        let len = self.blocks * block_lines::<F>();
        &self.lines[g * len..(g + 1) * len]
    }
}

impl<F: KLane> Layout for KLanes<F> {
    fn back_with_huge_pages(&self) {
        crate::huge_pages::back(&self.lines);
    }

    fn chunk(&self, acts: &Activations, kernels: &[RowKernel], range: Range<usize>, out: &Columns) {
        let Activations::Q8K(a, _) = acts else {
            unreachable!("these formats take Q8_K activations");
        };
        #[cfg(target_arch = "x86_64")]
        {
            let m = self;
            let groups = (|g| m.group(g), m.blocks);
            // Q2_K and Q3_K have VNNI kernels; Q5_K and IQ4_XS take this layout only
            // without VNNI.
            let vnni = crate::simd::vnni();
            if F::BITS == Bits::Two {
                // Q2_K follows llama.cpp's repacked kernels, whose rounding each row's
                // kernel names: every row, four a pass.
                let all: Vec<usize> = (0..kernels.len()).collect();
                lane_groups(out, range, &all, 4, groups, |g, four, soon| {
                    let mut got = [[0f32; LANE_ROWS]; 4];
                    // SAFETY: the layout is only built where the CPU has AVX2, and the VNNI
                    // kernel only runs where it has AVX-512 VNNI.
                    with_row_count!(four.len(), got, T => unsafe {
                        let a = std::array::from_fn(|k| &a[four[k]]);
                        let kernels = std::array::from_fn(|k| kernels[four[k]]);
                        match vnni {
                            true => vnni::dot_group_q2k::<T, F>(m, g, a, kernels, soon),
                            false => avx2::dot_group_q2k::<T, F>(m, g, a, kernels, soon),
                        }
                    });
                    got
                });
                return;
            }
            let vnni = vnni && F::BITS == Bits::Three;
            let tiled = |g, four: &[usize], soon| {
                let mut got = [[0f32; LANE_ROWS]; 4];
                // SAFETY: the layout is only built where the CPU has AVX2, and the VNNI
                // kernel only runs where it has AVX-512 VNNI.
                with_row_count!(four.len(), got, T => unsafe {
                    let a = std::array::from_fn(|k| &a[four[k]]);
                    match vnni {
                        true => vnni::dot_group_q3k::<T, true, F>(m, g, a, soon),
                        false => avx2::dot_group::<T, true, F>(m, g, a, soon),
                    }
                });
                got
            };
            // SAFETY: as above.
            let dot = |g, t: usize, soon| unsafe {
                match vnni {
                    true => vnni::dot_group_q3k::<1, false, F>(m, g, [&a[t]], soon)[0],
                    false => avx2::dot_group::<1, false, F>(m, g, [&a[t]], soon)[0],
                }
            };
            lane_groups_by_plan(out, range, kernels, groups, tiled, dot);
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
    use crate::quant::formats::{iq4_xs, q2_k, q3_k, q5_k};

    use crate::quant::q8k::quantize_row_q8k;
    use crate::quant::q8k::Q8KRow;
    use crate::quant::q8k::QK_K;
    use crate::quant::sample::{self, Xorshift};
    use crate::quant::OwnFormat;
    use crate::simd::prefetch::Upcoming;

    /// A kernel's results on one group for the activation rows `acts` (four of them):
    /// row 2 by the dot product's plan, then by the tiled plan rows 0, 1, 2, 3; 3, 1, 0;
    /// 2, 0; and 1 (every position of a pass).
    type Plans = (
        [[f32; ROWS]; 1],
        [[f32; ROWS]; 4],
        [[f32; ROWS]; 3],
        [[f32; ROWS]; 2],
        [[f32; ROWS]; 1],
    );

    /// `$kernel::<T, TILED>` in the passes [`Plans`] lists.
    macro_rules! plans {
        ($($kernel:ident)::+, $m:expr, $g:expr, $acts:expr) => {{
            let (m, g, acts): (&KLanes<_>, usize, &[Q8KRow]) = ($m, $g, $acts);
            let soon = || Upcoming::new(m.group(0), 3);
            let a = |t: [usize; 4]| t.map(|t| &acts[t]);
            (
                $($kernel)::+::<1, false, _>(m, g, [&acts[2]], soon()),
                $($kernel)::+::<4, true, _>(m, g, a([0, 1, 2, 3]), soon()),
                $($kernel)::+::<3, true, _>(m, g, [&acts[3], &acts[1], &acts[0]], soon()),
                $($kernel)::+::<2, true, _>(m, g, [&acts[2], &acts[0]], soon()),
                $($kernel)::+::<1, true, _>(m, g, [&acts[1]], soon()),
            )
        }};
    }

    /// Both plans of a kernel (`kernel`, see [`Plans`]) for `F` (random blocks of `own`):
    /// every row of every group (a ragged last one) equals the portable dot product `dot`
    /// (one activation row) and the portable tiled product `tiled` (one to four rows, in
    /// every position of a pass) bit for bit, over activations of very different scales.
    fn assert_plans_match_the_portable_ones<F: KLane>(
        own: &OwnFormat,
        (dot, tiled): (Dot, Dot),
        kernel: unsafe fn(&KLanes<F>, usize, &[Q8KRow]) -> Plans,
    ) {
        let mut rng = Xorshift::new(31);
        let (rows, cols) = (37, 3 * QK_K);
        let mut raw = sample::weights(own, rows, cols, &mut rng);
        let row_bytes = own.row_bytes(cols);
        if F::BITS == Bits::Three {
            // Row 5's values all the lowest (-4: high bits and low bits clear), its
            // scales as they were; row 6's scales all the lowest (-32), row 7's all the
            // highest (31).
            for block in raw[5 * row_bytes..6 * row_bytes].chunks_exact_mut(q3_k::BYTES) {
                block[..96].fill(0);
            }
            for (r, byte) in [(6, 0x00), (7, 0xff)] {
                for block in raw[r * row_bytes..(r + 1) * row_bytes].chunks_exact_mut(q3_k::BYTES) {
                    block[96..108].fill(byte);
                }
            }
        }
        let m = KLanes::<F>::new(&raw, rows, cols / QK_K);
        let mut acts: Vec<Q8KRow> = [4.0, 0.01, 300.0, 1.0]
            .iter()
            .map(|&scale| {
                let values = sample::activations(1, cols, scale, &mut rng);
                quantize_row_q8k(&values, RowKernel::Gemv)
            })
            .collect();
        // Activation row 2, which the dot product's plan takes too, all the lowest (its
        // sums kept consistent).
        acts[2].qs.fill(-127);
        acts[2].bsums.fill(-127 * 16);
        let row = |r: usize| &raw[r * row_bytes..][..row_bytes];
        for g in 0..rows.div_ceil(ROWS) {
            // SAFETY: the caller checked the CPU.
            let (one, four, three, two, alone) = unsafe { kernel(&m, g, &acts) };
            for lane in 0..ROWS {
                let r = g * ROWS + lane;
                let real = r < rows;
                let want = |f: Dot, t: usize| if real { f(row(r), &acts[t]) } else { 0.0 };
                let at = format!("{} row {r}", F::NAME);
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

    /// A portable dot product of one weight row and one activation row.
    type Dot = fn(&[u8], &Q8KRow) -> f32;

    /// Both plans of the AVX2 kernel, for Q3_K, Q5_K and IQ4_XS.
    #[test]
    fn avx2_kernels_are_bit_identical_to_the_portable_ones() {
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().avx2, "avx2") {
            return;
        }
        assert_plans_match_the_portable_ones::<Q3K>(
            OwnFormat::Q3_K,
            (q3_k::dot, q3_k::dot_tiled),
            // SAFETY: the kernel's CPU features were checked above.
            |m, g, acts| unsafe { plans!(avx2::dot_group, m, g, acts) },
        );
        assert_plans_match_the_portable_ones::<Q5K>(
            OwnFormat::Q5_K,
            (q5_k::dot, q5_k::dot_tiled),
            // SAFETY: the kernel's CPU features were checked above.
            |m, g, acts| unsafe { plans!(avx2::dot_group, m, g, acts) },
        );
        assert_plans_match_the_portable_ones::<Iq4Xs>(
            OwnFormat::IQ4_XS,
            (iq4_xs::dot, iq4_xs::dot_tiled),
            // SAFETY: the kernel's CPU features were checked above.
            |m, g, acts| unsafe { plans!(avx2::dot_group, m, g, acts) },
        );
    }

    /// Both plans of the AVX-512 VNNI Q3_K kernel.
    #[test]
    fn q3k_vnni_kernel_is_bit_identical_to_the_portable_ones() {
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().vnni, "vnni") {
            return;
        }
        assert_plans_match_the_portable_ones::<Q3K>(
            OwnFormat::Q3_K,
            (q3_k::dot, q3_k::dot_tiled),
            // SAFETY: the kernel's CPU features were checked above.
            |m, g, acts| unsafe { plans!(vnni::dot_group_q3k, m, g, acts) },
        );
    }

    /// A Q2_K kernel's group of sixteen rows against one to four activation rows.
    type Q2kKernel = unsafe fn(&KLanes<Q2K>, usize, &[&Q8KRow], &[RowKernel]) -> Vec<[f32; ROWS]>;

    /// Every row of every group (a ragged last one) against one to four activation rows of
    /// each rounding and of very different scales, in every position of a pass, equals the
    /// portable repacked dot product bit for bit.
    fn assert_q2k_kernel_matches_the_portable_one(kernel: Q2kKernel) {
        let mut rng = Xorshift::new(37);
        let (rows, cols) = (37, 3 * QK_K);
        let mut raw = sample::weights(OwnFormat::Q2_K_REPACKED, rows, cols, &mut rng);
        // Row 5's values, scales and minimums all the highest.
        let row_bytes = OwnFormat::Q2_K_REPACKED.row_bytes(cols);
        for block in raw[5 * row_bytes..6 * row_bytes].chunks_exact_mut(q2_k::BYTES) {
            block[..80].fill(0xff);
        }
        let m = KLanes::<Q2K>::new(&raw, rows, cols / QK_K);
        let kernels = [
            RowKernel::Gemm4,
            RowKernel::Gemv,
            RowKernel::Gemm4InWideBatch,
            RowKernel::GemvInWideBatch,
        ];
        let mut acts: Vec<Q8KRow> = kernels
            .iter()
            .zip([4.0, 0.01, 300.0, 1.0])
            .map(|(&k, scale)| quantize_row_q8k(&sample::activations(1, cols, scale, &mut rng), k))
            .collect();
        // Activation row 2 all the lowest (its sums kept consistent).
        acts[2].qs.fill(-127);
        acts[2].bsums.fill(-127 * 16);
        for g in 0..rows.div_ceil(ROWS) {
            for order in [&[0, 1, 2, 3][..], &[3, 1, 0], &[2, 0], &[1], &[0]] {
                let a: Vec<&Q8KRow> = order.iter().map(|&t| &acts[t]).collect();
                let k: Vec<RowKernel> = order.iter().map(|&t| kernels[t]).collect();
                // SAFETY: the caller checked the CPU.
                let got = unsafe { kernel(&m, g, &a, &k) };
                for (got, &t) in got.iter().zip(order) {
                    for (lane, got) in got.iter().enumerate() {
                        let r = g * ROWS + lane;
                        let want = match r < rows {
                            true => q2_k::dot_repacked(
                                &raw[r * row_bytes..][..row_bytes],
                                &acts[t],
                                kernels[t],
                            ),
                            false => 0.0,
                        };
                        let at = format!("row {r}, act {t} of {order:?}");
                        assert_eq!(want.to_bits(), got.to_bits(), "{at}");
                    }
                }
            }
        }
    }

    /// The AVX2 Q2_K kernel.
    #[test]
    fn q2k_avx2_kernel_is_bit_identical_to_the_portable_one() {
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().avx2, "avx2") {
            return;
        }
        // SAFETY: the kernel's CPU features were checked above.
        assert_q2k_kernel_matches_the_portable_one(|m, g, a, k| unsafe {
            by_row_count!(
                avx2::dot_group_q2k[Q2K],
                (m, g),
                Upcoming::new(m.group(0), 3),
                a,
                k
            )
        });
    }

    /// The AVX-512 VNNI Q2_K kernel.
    #[test]
    fn q2k_vnni_kernel_is_bit_identical_to_the_portable_one() {
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().vnni, "vnni") {
            return;
        }
        // SAFETY: the kernel's CPU features were checked above.
        assert_q2k_kernel_matches_the_portable_one(|m, g, a, k| unsafe {
            by_row_count!(
                vnni::dot_group_q2k[Q2K],
                (m, g),
                Upcoming::new(m.group(0), 3),
                a,
                k
            )
        });
    }

    /// The layout's fields land where the module says, for a hand-made Q5_K super-block
    /// whose every value, scale and minimum differs.
    #[test]
    fn q5k_layout_puts_each_field_where_the_module_says() {
        let mut block = vec![0u8; q5_k::BYTES];
        block[0..4].copy_from_slice(&[0x11, 0x22, 0x33, 0x44]);
        for (i, b) in block[4..16].iter_mut().enumerate() {
            *b = (7 * i + 3) as u8;
        }
        for (i, b) in block[16..].iter_mut().enumerate() {
            *b = (37 * i + 11) as u8;
        }
        // Two rows: the block as row 1, zeros as row 0.
        let mut raw = vec![0u8; q5_k::BYTES];
        raw.extend_from_slice(&block);
        let m = KLanes::<Q5K>::new(&raw, 2, 1);
        let lines = m.group(0);
        let lane = 1;
        assert_eq!(&lines[0].0[2..4], &block[0..2]);
        assert_eq!(&lines[0].0[34..36], &block[2..4]);
        for j in 0..8 {
            let (scale, min) = kquant::scale_min_k4(j, &block[4..16]);
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
