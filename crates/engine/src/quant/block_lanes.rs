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
//! bit-identical to the family's `dot` (`formats/block32.rs`).
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

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx2;

use super::act_tile::Line;
use super::formats::block32::block_bytes;
use super::formats::iq4_nl::Iq4Nl;
use super::formats::{q4_0::Q4_0, q4_1::Q4_1, q5_0::Q5_0, q5_1::Q5_1, q8_0::Q8_0};
use super::iq4;
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

/// How a format's values sit in a group's value lines (see the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// Eight lines of bytes, each value stored [`LaneBlock::OFFSET`] higher: Q8_0's (128
    /// higher, the file's signed bytes flipped) and Q5_0's decoded once (16 higher).
    Bytes,
    /// Four lines of nibbles: Q4_1's and Q4_0's.
    Nibbles,
    /// A line of fifth bits, then four lines of nibbles: Q5_0's and Q5_1's.
    FiveBits,
    /// Four lines of nibbles that index IQ4_NL's table.
    Table,
}

/// A format this layout holds, as its kernels are written over it (llama.cpp's repack
/// templates are over the block type): the layout and the kernels are generic over it,
/// and each format's facts are its impl below.
pub trait LaneBlock: Send + Sync + 'static {
    /// ggml's name.
    const NAME: &'static str;
    /// Bytes per block of 32 values in the file: an f16 scale, then (with a minimum) an
    /// f16 minimum, then (with fifth bits) their four bytes, then the values.
    const BLOCK_BYTES: usize;
    /// How its values sit in the lines.
    const VALUES: Values;
    /// Whether a block has a minimum (its rows add `m · s_a`): Q4_1's and Q5_1's.
    const MINIMUMS: bool;
    /// Whether a block's 32 products are one integer per row, as in llama.cpp's repacked
    /// arithmetic (Q4_0's, IQ4_NL's), rather than eight lanes of four.
    const ONE_SUM: bool;
    /// What the values the VNNI kernel multiplies are above the values they stand for;
    /// the lanes start from `-OFFSET ·` their activations' sum ([`lane_starts`]).
    const OFFSET: i32;
}

impl LaneBlock for Q8_0 {
    const NAME: &'static str = "Q8_0";
    const BLOCK_BYTES: usize = block_bytes::<Self>();
    const VALUES: Values = Values::Bytes;
    const MINIMUMS: bool = false;
    const ONE_SUM: bool = false;
    const OFFSET: i32 = 128;
}

impl LaneBlock for Q4_1 {
    const NAME: &'static str = "Q4_1";
    const BLOCK_BYTES: usize = block_bytes::<Self>();
    const VALUES: Values = Values::Nibbles;
    const MINIMUMS: bool = true;
    const ONE_SUM: bool = false;
    const OFFSET: i32 = 0;
}

impl LaneBlock for Q5_0 {
    const NAME: &'static str = "Q5_0";
    const BLOCK_BYTES: usize = block_bytes::<Self>();
    const VALUES: Values = Values::FiveBits;
    const MINIMUMS: bool = false;
    const ONE_SUM: bool = false;
    const OFFSET: i32 = 16;
}

/// Q4_0 in llama.cpp's repacked arithmetic (the layout holds the matrices it repacks).
impl LaneBlock for Q4_0 {
    const NAME: &'static str = "Q4_0";
    const BLOCK_BYTES: usize = block_bytes::<Self>();
    const VALUES: Values = Values::Nibbles;
    const MINIMUMS: bool = false;
    const ONE_SUM: bool = true;
    const OFFSET: i32 = 8;
}

impl LaneBlock for Q5_1 {
    const NAME: &'static str = "Q5_1";
    const BLOCK_BYTES: usize = block_bytes::<Self>();
    const VALUES: Values = Values::FiveBits;
    const MINIMUMS: bool = true;
    const ONE_SUM: bool = false;
    const OFFSET: i32 = 0;
}

/// IQ4_NL in llama.cpp's repacked arithmetic; the VNNI kernel looks its indices up in a
/// copy of the table 128 higher.
impl LaneBlock for Iq4Nl {
    const NAME: &'static str = "IQ4_NL";
    const BLOCK_BYTES: usize = iq4::IQ4_NL;
    const VALUES: Values = Values::Table;
    const MINIMUMS: bool = false;
    const ONE_SUM: bool = true;
    const OFFSET: i32 = 128;
}

/// A Q5_0 group decoded once into Q8_0's lines, each value 16 higher
/// (`expand_q5_0_with`): what the kernels read it as.
#[cfg(target_arch = "x86_64")]
struct Expanded;

#[cfg(target_arch = "x86_64")]
impl LaneBlock for Expanded {
    const NAME: &'static str = "Q5_0 decoded once";
    // Never laid out from a file.
    const BLOCK_BYTES: usize = block_bytes::<Q5_0>();
    const VALUES: Values = Values::Bytes;
    const MINIMUMS: bool = false;
    const ONE_SUM: bool = false;
    const OFFSET: i32 = 16;
}

/// How `L`'s blocks are grouped into units of lines: (blocks per unit, value lines per
/// block); a unit is one header line (sixteen scales for each of its blocks, or sixteen
/// scales and sixteen minimums) and its blocks' value lines.
const fn unit<L: LaneBlock>() -> (usize, usize) {
    let value_lines = match L::VALUES {
        Values::Bytes => 8,
        Values::FiveBits => 5,
        Values::Nibbles | Values::Table => 4,
    };
    (if L::MINIMUMS { 1 } else { 2 }, value_lines)
}

/// Whether `L`'s groups are decoded once into bytes against many activation rows
/// ([`Expanded`]): five-bit values with an offset, Q5_0's.
const fn expands<L: LaneBlock>() -> bool {
    matches!(L::VALUES, Values::FiveBits) && L::OFFSET != 0
}

/// Where block `b` of a group is: (its unit's header line, the byte of its scales in that
/// line, its first value line), in lines and bytes from the group's start.
#[inline(always)]
fn place<L: LaneBlock>(b: usize) -> (usize, usize, usize) {
    let (per_unit, value_lines) = unit::<L>();
    let header = b / per_unit * (1 + per_unit * value_lines);
    let within = b % per_unit;
    (header, 32 * within, header + 1 + within * value_lines)
}

/// A matrix of format `L` in the sixteen-row layout.
pub struct BlockLanes<L> {
    /// The kernel that reads it, which Q5_0's and Q5_1's fifth bits are laid out for.
    kernel: Kernel,
    blocks: usize,
    /// Lines per group.
    group_lines: usize,
    lines: Vec<Line>,
    format: PhantomData<L>,
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

impl<L: LaneBlock> BlockLanes<L> {
    /// Interleaves row-major blocks of `L` (`rows` rows of `cols / 32` blocks each) for
    /// the kernel this CPU runs on it.
    pub fn new(raw: &[u8], rows: usize, cols: usize) -> Self {
        Self::for_kernel(Kernel::for_this_cpu(), raw, rows, cols)
    }

    /// [`BlockLanes::new`] for the kernel `kernel`.
    fn for_kernel(kernel: Kernel, raw: &[u8], rows: usize, cols: usize) -> Self {
        let bytes = L::BLOCK_BYTES;
        let (per_unit, value_lines) = unit::<L>();
        let blocks = cols / 32;
        assert_eq!(raw.len(), rows * blocks * bytes);
        let group_lines = blocks.div_ceil(per_unit) * (1 + per_unit * value_lines);
        let minimums = L::MINIMUMS;
        // Padding rows keep zero bytes: their scales are zero, so their values never count.
        let mut lines = vec![Line([0; 64]); rows.div_ceil(ROWS) * group_lines];
        for r in 0..rows {
            let (g, lane) = (r / ROWS, r % ROWS);
            let group = &mut lines[g * group_lines..][..group_lines];
            for b in 0..blocks {
                let block = &raw[(r * blocks + b) * bytes..][..bytes];
                let (header, at, values) = place::<L>(b);
                let header = &mut group[header].0;
                header[at + 2 * lane..at + 2 * lane + 2].copy_from_slice(&block[..2]);
                if minimums {
                    header[32 + 2 * lane..32 + 2 * lane + 2].copy_from_slice(&block[2..4]);
                }
                // The values (or their low four bits) follow the scale and the minimum.
                let at = if minimums { 4 } else { 2 };
                let (quants, values) = match L::VALUES {
                    Values::Bytes | Values::Nibbles | Values::Table => (&block[at..], values),
                    Values::FiveBits => {
                        // Value j's fifth bit is bit j of the block's qh (after the scale,
                        // and Q5_1's minimum).
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
                        // Q8_0's signed bytes, 128 higher.
                        *to = if matches!(L::VALUES, Values::Bytes) {
                            v ^ 0x80
                        } else {
                            v
                        };
                    }
                }
            }
        }
        Self {
            kernel,
            blocks,
            group_lines,
            lines,
            format: PhantomData,
        }
    }

    /// Group `g`'s lines.
    fn group(&self, g: usize) -> &[Line] {
        &self.lines[g * self.group_lines..(g + 1) * self.group_lines]
    }
}

/// How many starts a block of `L` takes: one per group of four values (a lane of the
/// kernel), or one for the block where its products are one integer per row
/// ([`LaneBlock::ONE_SUM`]).
const fn starts_per_block<L: LaneBlock>() -> usize {
    if L::ONE_SUM {
        1
    } else {
        QUADS
    }
}

/// Where the kernel's integers start for activation row `a` (its first `blocks` blocks)
/// against a matrix of `L`: per block, and per group of four values where it has lanes
/// ([`starts_per_block`]), `-OFFSET ·` the values' sum, so that the offset the kernel's
/// weights carry ([`LaneBlock::OFFSET`]) cancels (all zero for the formats without one).
pub fn lane_starts<L: LaneBlock>(a: &Q8Row, blocks: usize) -> Vec<i32> {
    let offset = L::OFFSET;
    a.qs[..blocks * 32]
        .chunks_exact(32 / starts_per_block::<L>())
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
fn expand_q5_0_with<L: LaneBlock>(
    m: &BlockLanes<L>,
    g: usize,
    into: &mut Vec<Line>,
    mut write: impl FnMut(&[Line], usize, &mut Line),
) {
    assert!(expands::<L>(), "{} is not decoded once", L::NAME);
    let (blocks, group) = (m.blocks, m.group(g));
    let (per_unit, value_lines) = unit::<Expanded>();
    // Every line a block reads is written below: a buffer of the right length is reused
    // as it is (an odd last block's second half is never read).
    into.resize(
        blocks.div_ceil(per_unit) * (1 + per_unit * value_lines),
        Line([0; 64]),
    );
    for b in 0..blocks {
        let (header, _, values) = place::<L>(b);
        let (to_header, _, to_values) = place::<Expanded>(b);
        if b % per_unit == 0 {
            into[to_header] = group[header];
        }
        for q in 0..QUADS {
            write(&group[values..values + 5], q, &mut into[to_values + q]);
        }
    }
}

/// Every row's [`lane_starts`] for one matrix product, one slot for each kind the formats
/// take (Q8_0's, Q5_0's, Q4_0's and IQ4_NL's), each computed by the first chunk that needs
/// them and shared by the others.
#[derive(Default)]
pub struct StartsOnce([OnceLock<Vec<Vec<i32>>>; 4]);

impl StartsOnce {
    /// The starts of the rows `a` (which must be the rows they were first asked for)
    /// against a matrix of `L`.
    pub fn get<L: LaneBlock>(&self, a: &[Q8Row], blocks: usize) -> &[Vec<i32>] {
        // The starts depend on the offset and on how many a block takes, nothing else.
        let once = match (L::OFFSET, starts_per_block::<L>()) {
            (128, QUADS) => &self.0[0],
            (16, QUADS) => &self.0[1],
            (8, 1) => &self.0[2],
            (128, 1) => &self.0[3],
            kind => unreachable!("{}'s starts {kind:?} have no slot", L::NAME),
        };
        let starts =
            once.get_or_init(|| a.iter().map(|row| lane_starts::<L>(row, blocks)).collect());
        let per_row = blocks * starts_per_block::<L>();
        assert!(starts.len() == a.len() && starts.iter().all(|s| s.len() == per_row));
        starts
    }
}

#[cfg(target_arch = "x86_64")]
pub use vnni::{dot_expanded, dot_group, expand_q5_0, starts_taken};

#[cfg(target_arch = "x86_64")]
mod vnni;

impl<L: LaneBlock> Layout for BlockLanes<L> {
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
                true => starts_taken::<L>() > 0,
                false => avx2::starts_taken::<L>() > 0,
            };
            let starts = match needs_starts {
                true => starts.get::<L>(a, self.blocks),
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
            let (per_pass, expand) = match (vnni, L::ONE_SUM) {
                (true, _) => (2, expands::<L>() && n > 4),
                (false, true) => (4, false),
                (false, false) => (1, expands::<L>() && n > 1),
            };
            let all: Vec<usize> = (0..n).collect();
            let (mut expanded, mut decoded) = (Vec::new(), None);
            // The kernel asks for its share of the next group once a unit.
            let (group, units) = (|g| self.group(g), self.blocks.div_ceil(unit::<L>().0));
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
                            (true, false) => dot_group::<T, L>(self, g, rows, starts, soon),
                            (false, true) => {
                                avx2::dot_expanded::<T>(&expanded, blocks, rows, starts, soon)
                            }
                            (false, false) => avx2::dot_group::<T, L>(self, g, rows, starts, soon),
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
mod tests;
