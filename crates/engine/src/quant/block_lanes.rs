//! Q8_0, Q4_1, Q5_0, Q4_0, Q5_1 and IQ4_NL weights interleaved sixteen rows at a time, one
//! weight row per 32-bit lane. With AVX-512 VNNI one multiply-add instruction takes four
//! consecutive values of each of sixteen rows against the same four activations
//! (broadcast); CPUs with AVX2 alone take the same layout eight rows (half a line) at a
//! time ([`avx2`], whose module says where its arithmetic differs: below is the VNNI
//! kernel's).
//!
//! Per group of sixteen rows (the last one padded with zero rows), the weights are one
//! stream of 64-byte lines, a unit of blocks after another (decoding reads them in order;
//! three separate streams of scales, minimums and values cost single-stream decode 8%):
//! - Q8_0, a unit of two blocks of 32: one line of the sixteen rows' scales `d` (the
//!   file's f16) for each block, then each block's eight lines of values;
//! - Q4_1, a unit of one block: one line of the sixteen scales `d` and minimums `m`, then
//!   four lines of values;
//! - Q5_0, a unit of two blocks: one line of scales for both, then per block one line of
//!   fifth bits and four lines of values;
//! - Q4_0, a unit of two blocks: one line of scales for both, then per block four lines of
//!   values;
//! - Q5_1, a unit of one block: Q4_1's line of scales and minimums, then Q5_0's line of
//!   fifth bits and four lines of values;
//! - IQ4_NL, as Q4_0 (its blocks are Q4_0's bytes: a scale, then 16 bytes of indices).
//!
//! Row `r`'s four bytes are at `4r..4r + 4` of each line of values:
//! - Q8_0: eight lines, line `q` holding values `4q..4q + 4`, each stored 128 higher (an
//!   unsigned byte, which is what the instruction's unsigned operand takes). The
//!   activations are the signed operand, and each lane starts from `-128 ·` the sum of its
//!   four activations ([`lane_starts`]), so the integer it ends with is the four products'
//!   exact sum.
//! - Q4_1: four lines, line `h` holding the file's bytes `4h..4h + 4`: values `4h..4h + 4`
//!   in the low nibbles and `4h + 16..4h + 20` in the high ones, unsigned already.
//! - Q5_0: four lines of nibbles as Q4_1's, and a line of eight 64-bit masks, mask `q`
//!   holding the fifth bits of values `4q..4q + 4` of every row (row `r`'s at bits
//!   `4r..4r + 4`: a byte mask for the instruction's operand); with it a value is
//!   stored 16 higher, unsigned, and the lanes start from `-16 ·` the activations' sum.
//!   Against more than four activation rows (more than one on AVX2) a chunk decodes each
//!   group once into Q8_0's lines (bytes 16 higher) and reads those as Q8_0 with Q5_0's
//!   starts: at 16 rows the VNNI kernel ran 87 against 69 giga multiply-adds a second
//!   decoding the group again for every pair of rows (`matmul_kernels`, one thread); at 4
//!   rows the two are even.
//!
//!   Where the AVX2 kernel reads the lines (a CPU without VNNI), the
//!   line of fifth bits is a bit plane instead ([`Kernel`]): row `r`'s bytes
//!   `4r..4r + 4` again, byte `4r + i` holding in bit `2l` the fifth bit of value `4l + i`
//!   (a low nibble of line `l`) and in bit `2l + 1` that of value `16 + 4l + i` (its high
//!   nibble), so that one 16-bit shift and a mask put a value's fifth bit at 16, beside
//!   its nibble: from the masks it took four instructions (`bit_bytes`).
//! - Q4_0: four lines of nibbles as Q4_1's, values stored 8 higher (the file's nibbles),
//!   each block's lanes starting from `-8 ·` the sum of its activations.
//! - Q5_1: Q5_0's lines, its five bits being its values (unsigned, no offset).
//! - IQ4_NL: Q4_0's lines of indices, which the kernels look up in the table: the VNNI
//!   kernel in a copy of it 128 higher (unsigned bytes, `vpshufb` picking a value per
//!   byte), each block's lanes starting from `-128 ·` the sum of its activations.
//!
//! Each format's starts are computed once per product ([`StartsOnce`]): Q5_0's lanes
//! shifting Q8_0's by three in the kernel cost a scalar shift and a broadcast per lane
//! and activation row, a quarter of its one-row speed (39 against 51).
//!
//! That integer is llama.cpp's lane: `ggml_vec_dot_q8_0_q8_0` (and `_q4_1_q8_1`,
//! `_q5_0_q8_0`) sums each block in eight lanes of four products, adds `d_w · d_a ·` the
//! lane into that lane's float accumulator with one fused multiply-add, and ends with
//! `hsum_float_8` of the eight (Q4_1 adds its minimums' `m · s`, one fused multiply-add
//! per block, after).
//! Here a group's eight accumulators per activation row are the eight lanes of sixteen
//! weight rows at once, the same operations on the same values in the same order, and
//! the horizontal sum is seven vector additions in `hsum_float_8`'s order; so results are
//! bit-identical to [`BlockFormat::dot_portable`].
//!
//! Q4_0 follows llama.cpp's other Q4_0 kernel, the one it uses once it has repacked a
//! matrix eight rows at a time (x86 with AVX2, rows a multiple of eight, so every Q4_0
//! matrix of a real model; [`super::formats::block32::dot_repacked`]): a block's 32 products are
//! one integer per row, converted and folded into the row's one float accumulator with a
//! fused multiply-add by `d_w · d_a`. Here the eight multiply-adds of a block go into one
//! integer lane per row, and nothing is summed across lanes at all. Against the eight-row
//! layout (`packed`), which converts and scales the integer lanes of one (weight row,
//! activation row) pair per instruction, this needs no per-pair scale vector and no
//! horizontal sums per block, and a group's weights are one contiguous stream.
//!
//! Q5_1 is Q4_1's arithmetic on Q5_0's values (llama.cpp's `ggml_vec_dot_q5_1_q8_1`, as
//! [`super::formats::block32::dot`]); IQ4_NL is Q4_0's repacked arithmetic on the table's values
//! ([`super::iq4::dot_iq4_nl_repacked`]).

use std::ops::Range;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx2;

use super::act_tile::Line;
use super::formats::block_format::BlockFormat;
use super::layout::Layout;
#[cfg(target_arch = "x86_64")]
use super::layout::{lane_groups, LANE_ROWS};
use super::output::Columns;
use super::q8::Q8Row;
use super::{Activations, RowKernel};

/// Weight rows per group: one per 32-bit lane of a 512-bit vector.
pub use crate::simd::LANES_512 as ROWS;
/// Groups of four values per block: the kernel's lanes.
const QUADS: usize = 8;

/// The formats this layout holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneFormat {
    /// 8-bit values with a scale.
    Q8_0,
    /// 4-bit values with a scale and a minimum.
    Q4_1,
    /// 5-bit values less 16, with a scale.
    Q5_0,
    /// 4-bit values less 8, with a scale, in llama.cpp's repacked arithmetic.
    Q4_0,
    /// 5-bit values with a scale and a minimum.
    Q5_1,
    /// 4-bit indices into IQ4_NL's table, with a scale, in llama.cpp's repacked
    /// arithmetic.
    Iq4Nl,
}

impl LaneFormat {
    /// Bytes per block of 32 values in the file.
    fn block_bytes(self) -> usize {
        match self {
            Self::Q8_0 => BlockFormat::Q8_0.block_bytes(),
            Self::Q4_1 => BlockFormat::Q4_1.block_bytes(),
            Self::Q5_0 => BlockFormat::Q5_0.block_bytes(),
            Self::Q4_0 => BlockFormat::Q4_0.block_bytes(),
            Self::Q5_1 => super::formats::block32::block_bytes::<super::formats::q5_1::Q5_1>(),
            Self::Iq4Nl => super::iq4::IQ4_NL,
        }
    }
}

impl From<BlockFormat> for LaneFormat {
    fn from(format: BlockFormat) -> Self {
        match format {
            BlockFormat::Q8_0 => Self::Q8_0,
            BlockFormat::Q4_1 => Self::Q4_1,
            BlockFormat::Q5_0 => Self::Q5_0,
            BlockFormat::Q4_0 => Self::Q4_0,
        }
    }
}

/// How a format's blocks are grouped into units of lines: (blocks per unit, value lines
/// per block); a unit is one header line and its blocks' value lines.
fn unit(format: LaneFormat) -> (usize, usize) {
    match format {
        LaneFormat::Q8_0 => (2, 8),
        LaneFormat::Q4_1 => (1, 4),
        LaneFormat::Q5_0 => (2, 5),
        LaneFormat::Q4_0 | LaneFormat::Iq4Nl => (2, 4),
        LaneFormat::Q5_1 => (1, 5),
    }
}

/// Where block `b` of a group is: (its unit's header line, the byte of its scales in that
/// line, its first value line), in lines and bytes from the group's start.
#[inline(always)]
fn place(format: LaneFormat, b: usize) -> (usize, usize, usize) {
    let (per_unit, value_lines) = unit(format);
    let header = b / per_unit * (1 + per_unit * value_lines);
    let within = b % per_unit;
    (header, 32 * within, header + 1 + within * value_lines)
}

/// A matrix of one of the [`LaneFormat`]s in the sixteen-row layout.
pub struct BlockLanes {
    format: LaneFormat,
    /// The kernel that reads it, which Q5_0's and Q5_1's fifth bits are laid out for.
    kernel: Kernel,
    blocks: usize,
    /// Lines per group.
    group_lines: usize,
    lines: Vec<Line>,
}

/// Which kernel reads a matrix, chosen once at load. It decides how a block's fifth bits
/// (Q5_0's and Q5_1's) are laid out in their line (see the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// The AVX-512 VNNI kernel: fifth bits as eight 64-bit masks, for its masked additions.
    Vnni,
    /// The AVX2 kernel: fifth bits as a bit plane, for its shifts.
    Avx2,
}

impl Kernel {
    /// The kernel this CPU runs (each takes every format).
    fn for_this_cpu() -> Self {
        #[cfg(target_arch = "x86_64")]
        let vnni = crate::simd::vnni();
        #[cfg(not(target_arch = "x86_64"))]
        let vnni = false;
        match vnni {
            true => Self::Vnni,
            false => Self::Avx2,
        }
    }
}

impl BlockLanes {
    /// Interleaves row-major blocks of `format` (`rows` rows of `cols / 32` blocks each)
    /// for the kernel this CPU runs on it.
    pub fn new(format: LaneFormat, raw: &[u8], rows: usize, cols: usize) -> Self {
        Self::for_kernel(format, Kernel::for_this_cpu(), raw, rows, cols)
    }

    /// [`BlockLanes::new`] for the kernel `kernel`.
    fn for_kernel(
        format: LaneFormat,
        kernel: Kernel,
        raw: &[u8],
        rows: usize,
        cols: usize,
    ) -> Self {
        let bytes = format.block_bytes();
        let (per_unit, value_lines) = unit(format);
        let blocks = cols / 32;
        assert_eq!(raw.len(), rows * blocks * bytes);
        let group_lines = blocks.div_ceil(per_unit) * (1 + per_unit * value_lines);
        let minimums = matches!(format, LaneFormat::Q4_1 | LaneFormat::Q5_1);
        // Padding rows keep zero bytes: their scales are zero, so their values never count.
        let mut lines = vec![Line([0; 64]); rows.div_ceil(ROWS) * group_lines];
        for r in 0..rows {
            let (g, lane) = (r / ROWS, r % ROWS);
            let group = &mut lines[g * group_lines..][..group_lines];
            for b in 0..blocks {
                let block = &raw[(r * blocks + b) * bytes..][..bytes];
                let (header, at, values) = place(format, b);
                let header = &mut group[header].0;
                header[at + 2 * lane..at + 2 * lane + 2].copy_from_slice(&block[..2]);
                if minimums {
                    header[32 + 2 * lane..32 + 2 * lane + 2].copy_from_slice(&block[2..4]);
                }
                let (quants, values) = match format {
                    LaneFormat::Q8_0 | LaneFormat::Q4_0 | LaneFormat::Iq4Nl => {
                        (&block[2..], values)
                    }
                    LaneFormat::Q4_1 => (&block[4..], values),
                    LaneFormat::Q5_0 | LaneFormat::Q5_1 => {
                        // Value j's fifth bit is bit j of the block's qh (after the scale,
                        // and Q5_1's minimum).
                        let at = if minimums { 4 } else { 2 };
                        let qh = u32::from_le_bytes(block[at..at + 4].try_into().unwrap());
                        let line = &mut group[values].0;
                        for j in 0..32 {
                            let (byte, bit) = match kernel {
                                Kernel::Vnni => {
                                    let bit = 64 * (j / 4) + 4 * lane + j % 4;
                                    (bit / 8, bit % 8)
                                }
                                // Nibble line (j % 16) / 4, the high nibble from 16 on.
                                Kernel::Avx2 => (4 * lane + j % 4, 2 * (j % 16 / 4) + j / 16),
                            };
                            let set = ((qh >> j) & 1) as u8;
                            line[byte] = (line[byte] & !(1 << bit)) | (set << bit);
                        }
                        (&block[at + 4..], values + 1)
                    }
                };
                for (l, four) in quants.chunks_exact(4).enumerate() {
                    let line = &mut group[values + l].0[4 * lane..4 * lane + 4];
                    for (to, &v) in line.iter_mut().zip(four) {
                        *to = if format == LaneFormat::Q8_0 {
                            v ^ 0x80
                        } else {
                            v
                        };
                    }
                }
            }
        }
        Self {
            format,
            kernel,
            blocks,
            group_lines,
            lines,
        }
    }

    /// Group `g`'s lines.
    fn group(&self, g: usize) -> &[Line] {
        &self.lines[g * self.group_lines..(g + 1) * self.group_lines]
    }
}

/// What the values the VNNI kernel multiplies are above the values they stand for: 128
/// for Q8_0 (as stored) and IQ4_NL (as looked up), 16 for Q5_0, 8 for Q4_0 (Q4_1's and
/// Q5_1's bits are their values).
fn offset(format: LaneFormat) -> i32 {
    match format {
        LaneFormat::Q8_0 | LaneFormat::Iq4Nl => 128,
        LaneFormat::Q5_0 => 16,
        LaneFormat::Q4_0 => 8,
        LaneFormat::Q4_1 | LaneFormat::Q5_1 => 0,
    }
}

/// How many starts a block of `format` takes: one per group of four values (a lane of
/// the kernel), Q4_0's and IQ4_NL's one for the block (their one integer per row and
/// block).
fn starts_per_block(format: LaneFormat) -> usize {
    match format {
        LaneFormat::Q4_0 | LaneFormat::Iq4Nl => 1,
        _ => QUADS,
    }
}

/// Where the kernel's integers start for activation row `a` (its first `blocks` blocks)
/// against a matrix of `format`: per block, and per group of four values but for Q4_0
/// and IQ4_NL ([`starts_per_block`]), `-offset ·` the values' sum, so that the offset the
/// kernel's weights carry ([`offset`]) cancels (all zero for the formats without one).
pub fn lane_starts(a: &Q8Row, blocks: usize, format: LaneFormat) -> Vec<i32> {
    let offset = offset(format);
    a.qs[..blocks * 32]
        .chunks_exact(32 / starts_per_block(format))
        .map(|values| -offset * values.iter().map(|&v| v as i32).sum::<i32>())
        .collect()
}

/// Whether each activation row `a[t]` has `blocks` blocks (scales, sums, values) and its
/// `starts[t]` the `per_block` lane starts of each: what a kernel reads of them.
#[cfg(target_arch = "x86_64")]
fn rows_cover(a: &[&Q8Row], starts: &[&[i32]], blocks: usize, per_block: usize) -> bool {
    a.len() == starts.len()
        && a.iter().zip(starts).all(|(a, s)| {
            a.d.len() >= blocks
                && a.s.len() >= blocks
                && a.qs.len() >= blocks * 32
                && s.len() >= blocks * per_block
        })
}

/// Group `g` of a Q5_0 matrix written out, into `into`, as the lines of a Q8_0 group: the
/// same header lines, and each block's values as eight lines of bytes, each value stored
/// 16 higher. For more than a few activation rows, decoding a group's nibbles and fifth
/// bits once and reading the result as Q8_0 takes fewer instructions than decoding them
/// again for every pass. `write(from, q, to)` is an instruction set's decoding: line `to`
/// from values `4q..4q + 4` of the block whose line of fifth bits (masks or a plane, as the
/// instruction set's kernel reads them) and nibble lines are `from`.
#[cfg(target_arch = "x86_64")]
fn expand_q5_0_with(
    m: &BlockLanes,
    g: usize,
    into: &mut Vec<Line>,
    mut write: impl FnMut(&[Line], usize, &mut Line),
) {
    assert_eq!(m.format, LaneFormat::Q5_0);
    let (blocks, group) = (m.blocks, m.group(g));
    let (per_unit, value_lines) = unit(LaneFormat::Q8_0);
    // Every line a block reads is written below: a buffer of the right length is reused
    // as it is (an odd last block's second half is never read).
    into.resize(
        blocks.div_ceil(per_unit) * (1 + per_unit * value_lines),
        Line([0; 64]),
    );
    for b in 0..blocks {
        let (header, _, values) = place(LaneFormat::Q5_0, b);
        let (to_header, _, to_values) = place(LaneFormat::Q8_0, b);
        if b % per_unit == 0 {
            into[to_header] = group[header];
        }
        for q in 0..QUADS {
            write(&group[values..values + 5], q, &mut into[to_values + q]);
        }
    }
}

/// Every row's [`lane_starts`] for one matrix product, Q8_0's, Q5_0's, Q4_0's and
/// IQ4_NL's, each computed by the first chunk that needs them and shared by the others.
#[derive(Default)]
pub struct StartsOnce([OnceLock<Vec<Vec<i32>>>; 4]);

impl StartsOnce {
    /// The starts of the rows `a` (which must be the rows they were first asked for)
    /// against a matrix of `format` (Q8_0, Q5_0, Q4_0 or IQ4_NL).
    pub fn get(&self, a: &[Q8Row], blocks: usize, format: LaneFormat) -> &[Vec<i32>] {
        let once = match format {
            LaneFormat::Q5_0 => &self.0[1],
            LaneFormat::Q4_0 => &self.0[2],
            LaneFormat::Iq4Nl => &self.0[3],
            _ => &self.0[0],
        };
        assert!(offset(format) > 0, "{format:?} has no lane starts");
        let starts = once.get_or_init(|| {
            a.iter()
                .map(|row| lane_starts(row, blocks, format))
                .collect()
        });
        let per_row = blocks * starts_per_block(format);
        assert!(starts.len() == a.len() && starts.iter().all(|s| s.len() == per_row));
        starts
    }
}

#[cfg(target_arch = "x86_64")]
pub use vnni::{dot_expanded, dot_group, expand_q5_0, starts_taken};

/// The formats as the kernels' const parameter (a `LaneFormat` cannot be one).
#[cfg(target_arch = "x86_64")]
mod kernel_format {
    use super::LaneFormat;

    pub const Q8_0: u8 = 0;
    pub const Q4_1: u8 = 1;
    pub const Q5_0: u8 = 2;
    pub const Q4_0: u8 = 3;
    /// Q5_0 written out as Q8_0's lines, values 16 higher (`expand_q5_0_with`): the AVX2
    /// kernel reads it as a format of its own, the VNNI one as Q8_0.
    pub const EXPANDED: u8 = 4;
    pub const Q5_1: u8 = 5;
    pub const IQ4_NL: u8 = 6;

    /// The format whose lines a kernel of parameter `f` reads.
    pub fn of(f: u8) -> LaneFormat {
        match f {
            Q8_0 | EXPANDED => LaneFormat::Q8_0,
            Q4_1 => LaneFormat::Q4_1,
            Q4_0 => LaneFormat::Q4_0,
            Q5_1 => LaneFormat::Q5_1,
            IQ4_NL => LaneFormat::Iq4Nl,
            _ => LaneFormat::Q5_0,
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni;

impl Layout for BlockLanes {
    fn back_with_huge_pages(&self) {
        crate::huge_pages::back(&self.lines);
    }

    fn chunk(&self, acts: &Activations, kernels: &[RowKernel], range: Range<usize>, out: &Columns) {
        let Activations::Q8(a, _, starts) = acts else {
            unreachable!("block-of-32 formats take Q8 activations");
        };
        #[cfg(target_arch = "x86_64")]
        {
            let vnni = self.kernel == Kernel::Vnni;
            let needs_starts = match vnni {
                true => starts_taken(self.format) > 0,
                false => avx2::starts_taken(self.format) > 0,
            };
            let starts = match needs_starts {
                true => starts.get(a, self.blocks, self.format),
                false => &[],
            };
            let start = |t: usize| starts.get(t).map_or(&[][..], Vec::as_slice);
            let n = kernels.len();
            // Activation rows a pass, and whether Q5_0's groups are decoded once
            // (`expand_q5_0`) for them all:
            // - VNNI: two rows a pass (sixteen accumulators stay in registers), decoded once
            //   against more than two pairs;
            // - AVX2: one row a pass (eight accumulators for one half's rows; two a pass,
            //   spilling them, measured no faster on a Zen 3, and four a pass taking one
            //   group of four values at a time across eight blocks, with one accumulator
            //   per row live, slower: 16 rows Q4_1 31 against 34-42, Q5_0 decoded once 27
            //   against 33), Q4_0's and IQ4_NL's four, decoded once against more than one row.
            let (per_pass, expand) = match vnni {
                true => (2, self.format == LaneFormat::Q5_0 && n > 4),
                false => match self.format {
                    LaneFormat::Q4_0 | LaneFormat::Iq4Nl => (4, false),
                    format => (1, format == LaneFormat::Q5_0 && n > 1),
                },
            };
            let all: Vec<usize> = (0..n).collect();
            let (mut expanded, mut decoded) = (Vec::new(), None);
            // The kernel asks for its share of the next group once a unit.
            let (group, units) = (|g| self.group(g), self.blocks.div_ceil(unit(self.format).0));
            lane_groups(
                out,
                range,
                &all,
                per_pass,
                (group, units),
                |g, pass, soon| {
                    if expand && decoded != Some(g) {
                        // SAFETY: the layout is only built where the CPU has AVX2, and the VNNI
                        // kernels only run where it has AVX-512 VNNI.
                        unsafe {
                            match vnni {
                                true => expand_q5_0(self, g, &mut expanded),
                                false => avx2::expand_q5_0(self, g, &mut expanded),
                            }
                        }
                        decoded = Some(g);
                    }
                    let mut got = [[0f32; LANE_ROWS]; 4];
                    // SAFETY: as above, and the activations are the quantizer's (-127..=127).
                    with_row_count!(pass.len(), got, T => unsafe {
                        let rows = std::array::from_fn(|i| &a[pass[i]]);
                        let starts = std::array::from_fn(|i| start(pass[i]));
                        let blocks = self.blocks;
                        match (vnni, expand) {
                            (true, true) => dot_expanded::<T>(&expanded, blocks, rows, starts, soon),
                            (true, false) => dot_group::<T>(self, g, rows, starts, soon),
                            (false, true) => {
                                avx2::dot_expanded::<T>(&expanded, blocks, rows, starts, soon)
                            }
                            (false, false) => avx2::dot_group::<T>(self, g, rows, starts, soon),
                        }
                    });
                    got
                },
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (a, starts, kernels, range, out);
            unreachable!("the layout is only built where the CPU has AVX2");
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::quant::formats::iq4_nl::Iq4Nl;
    use crate::quant::formats::{block32, q4_0::Q4_0, q4_1::Q4_1, q5_0::Q5_0, q5_1::Q5_1};
    use crate::quant::formats::{q8_0::Q8_0, table4};
    use crate::quant::q8::quantize_row;
    use crate::quant::sample::{self, Xorshift};
    use crate::quant::OwnFormat;
    use crate::simd::prefetch::Upcoming;

    /// A kernel's group of sixteen rows against one to four activation rows, given their
    /// lane starts for the matrix's format.
    type GroupKernel = fn(&BlockLanes, usize, &[&Q8Row], &[&[i32]]) -> Vec<[f32; ROWS]>;

    /// Every row of every group, against one to four activation rows (in every position of
    /// a pass), equals the portable dot product bit for bit (Q4_0's and IQ4_NL's repacked
    /// one), for every format of `formats` laid out for `kernel` (Q5_0 also decoded once,
    /// `expanded`), the
    /// extreme values included: -128 and 127 in Q8_0's weights, the lowest and highest of
    /// the others' (IQ4_NL's -127 and 113), 127 and `lowest` in the activations (-128 for a
    /// kernel that takes it; the quantizer never makes it). The kernel gets the lane
    /// starts only where `takes_starts` says its format needs them, as a chunk passes them
    /// (Q5_0's always: decoded once, it needs them too).
    fn assert_matches_the_portable_kernel(
        formats: &[LaneFormat],
        kernel: Kernel,
        lowest: i8,
        takes_starts: fn(LaneFormat) -> bool,
        dot: GroupKernel,
        expanded: GroupKernel,
    ) {
        for (seed, &format) in (21..).zip(formats) {
            let mut rng = Xorshift::new(seed);
            let (rows, cols) = (37, 7 * 32);
            // The matrix's format, and its portable kernel (Q4_0's and IQ4_NL's the
            // repacked kernels' arithmetic, see the module).
            type Portable = fn(&[u8], &Q8Row) -> f32;
            let (own, portable): (&OwnFormat, Portable) = match format {
                LaneFormat::Q8_0 => (OwnFormat::Q8_0, block32::dot::<Q8_0>),
                LaneFormat::Q4_1 => (OwnFormat::Q4_1, block32::dot::<Q4_1>),
                LaneFormat::Q5_0 => (OwnFormat::Q5_0, block32::dot::<Q5_0>),
                LaneFormat::Q4_0 => (OwnFormat::Q4_0_REPACKED, block32::dot_repacked::<Q4_0>),
                LaneFormat::Q5_1 => (OwnFormat::Q5_1, block32::dot::<Q5_1>),
                LaneFormat::Iq4Nl => (OwnFormat::IQ4_NL_REPACKED, table4::dot::<Iq4Nl>),
            };
            let mut raw = sample::weights(own, rows, cols, &mut rng);
            let (blocks, bytes) = (cols / 32, format.block_bytes());
            // Row 3's values all the lowest, row 4's all the highest (Q5_0's fifth bits,
            // bytes 2..6, with its nibbles).
            let (from, lowest_weight, highest_weight) = match format {
                LaneFormat::Q8_0 => (2, 0x80u8, 0x7f),
                // Bytes 4.. (Q5_1's fifth bits among them).
                LaneFormat::Q4_1 | LaneFormat::Q5_1 => (4, 0x00, 0xff),
                // Bytes 2.. (Q5_0's fifth bits among them).
                _ => (2, 0x00, 0xff),
            };
            for (r, v) in [(3usize, lowest_weight), (4, highest_weight)] {
                for b in 0..blocks {
                    raw[(r * blocks + b) * bytes + from..][..bytes - from].fill(v);
                }
            }
            let m = BlockLanes::for_kernel(format, kernel, &raw, rows, cols);
            let mut acts: Vec<Q8Row> = (0..4)
                .map(|_| quantize_row(&sample::activations(1, cols, 4.0, &mut rng)))
                .collect();
            acts[2].qs.fill(lowest);
            acts[3].qs.fill(127);
            let starts: Vec<Vec<i32>> = acts
                .iter()
                .map(|a| match takes_starts(format) {
                    true => lane_starts(a, blocks, format),
                    false => Vec::new(),
                })
                .collect();
            let row_bytes = blocks * bytes;
            for g in 0..rows.div_ceil(ROWS) {
                for (first, end) in [(0, 4), (1, 2), (0, 3), (2, 4), (3, 4), (0, 1)] {
                    let a: Vec<&Q8Row> = acts[first..end].iter().collect();
                    let s: Vec<&[i32]> = starts[first..end].iter().map(Vec::as_slice).collect();
                    let mut results = vec![("", dot(&m, g, &a, &s))];
                    if format == LaneFormat::Q5_0 {
                        results.push((", decoded once", expanded(&m, g, &a, &s)));
                    }
                    for (how, got) in results {
                        for (got, t) in got.iter().zip(first..end) {
                            for (lane, got) in got.iter().enumerate() {
                                let r = g * ROWS + lane;
                                let w = || &raw[r * row_bytes..][..row_bytes];
                                let want = match r < rows {
                                    true => portable(w(), &acts[t]),
                                    false => 0.0,
                                };
                                assert_eq!(
                                    want.to_bits(),
                                    got.to_bits(),
                                    "{format:?} row {r}, act {t} of {first}..{end}{how}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The AVX-512 VNNI kernels.
    #[test]
    fn vnni_kernels_are_bit_identical_to_the_portable_ones() {
        // Whatever FERRITE_CPU says: this compares the kernel the CPU can run.
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().vnni, "vnni") {
            return;
        }
        // Upcoming lines from the group itself: asking for them changes nothing.
        // SAFETY (both): VNNI was checked.
        let formats = [
            LaneFormat::Q8_0,
            LaneFormat::Q4_1,
            LaneFormat::Q5_0,
            LaneFormat::Q4_0,
            LaneFormat::Q5_1,
            LaneFormat::Iq4Nl,
        ];
        assert_matches_the_portable_kernel(
            &formats,
            Kernel::Vnni,
            -128,
            |format| starts_taken(format) > 0,
            // SAFETY: the kernel's CPU features were checked above; the activations are in range.
            |m, g, a, s| unsafe {
                by_row_count!(dot_group, (m, g), Upcoming::new(m.group(0), 3), a, s)
            },
            // SAFETY: the kernel's CPU features were checked above; the activations are in range.
            |m, g, a, s| unsafe {
                let mut lines = Vec::new();
                expand_q5_0(m, g, &mut lines);
                by_row_count!(dot_expanded, (&lines, m.blocks), Upcoming::NONE, a, s)
            },
        );
    }

    /// The AVX2 kernels.
    #[test]
    fn avx2_kernels_are_bit_identical_to_the_portable_ones() {
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().avx2, "avx2") {
            return;
        }
        // SAFETY (both): AVX2 was checked; the activations are in -127..=127.
        assert_matches_the_portable_kernel(
            &[
                LaneFormat::Q8_0,
                LaneFormat::Q4_1,
                LaneFormat::Q5_0,
                LaneFormat::Q4_0,
                LaneFormat::Q5_1,
                LaneFormat::Iq4Nl,
            ],
            Kernel::Avx2,
            -127,
            |format| avx2::starts_taken(format) > 0,
            // SAFETY: the kernel's CPU features were checked above; the activations are in range.
            |m, g, a, s| unsafe {
                by_row_count!(avx2::dot_group, (m, g), Upcoming::new(m.group(0), 3), a, s)
            },
            // SAFETY: the kernel's CPU features were checked above; the activations are in range.
            |m, g, a, s| unsafe {
                let mut lines = Vec::new();
                avx2::expand_q5_0(m, g, &mut lines);
                by_row_count!(avx2::dot_expanded, (&lines, m.blocks), Upcoming::NONE, a, s)
            },
        );
    }
}
