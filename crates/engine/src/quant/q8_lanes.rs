//! Q8_0 weights interleaved sixteen rows at a time, one weight row per 32-bit lane, for the
//! AVX-512 VNNI kernel: one multiply-add instruction takes four consecutive values of each
//! of sixteen rows against the same four activations (broadcast).
//!
//! Per group of sixteen rows (the last one padded with zero rows) and per block of 32:
//! the sixteen rows' scales `d` (the file's f16, 32 bytes, in their own array), and eight
//! 64-byte lines of values: line `q` holds values `4q..4q + 4` of every row, row `r`'s at
//! bytes `4r..4r + 4`, each stored 128 higher (as an unsigned byte), which is what the
//! instruction's unsigned operand takes. The activations are the signed operand, and each
//! lane starts from `-128 ·` the sum of its four activations ([`lane_starts`]), so the
//! integer it ends with is the four products' exact sum.
//!
//! That integer is llama.cpp's lane: `ggml_vec_dot_q8_0_q8_0` sums each block in eight
//! lanes of four products, adds `d_w · d_a ·` the lane into that lane's float accumulator
//! with one fused multiply-add, and ends with `hsum_float_8` of the eight. Here a group's
//! eight accumulators per activation row are the eight lanes of sixteen weight rows at
//! once, the same operations on the same values in the same order, and the horizontal sum
//! is seven vector additions in `hsum_float_8`'s order; so results are bit-identical to
//! [`super::dot::BlockFormat::dot_portable`]. Against the eight-row layout (`packed`),
//! which converts and scales the integer lanes of one (weight row, activation row) pair
//! per instruction, this needs no per-pair scale vector and no horizontal sums per block,
//! and a group's weights are one contiguous stream.

use std::ops::Range;
use std::sync::OnceLock;

use super::act_tile::Line;
use super::layout::Layout;
#[cfg(target_arch = "x86_64")]
use super::layout::{lane_groups, LANE_ROWS};
use super::output::Columns;
use super::q8::Q8Row;
use super::{Activations, RowKernel};

/// Weight rows per group (one per 32-bit lane of a 512-bit vector).
pub const ROWS: usize = 16;
/// Value lines per group and block: four values of each row per line.
pub const LINES: usize = 8;
/// Bytes of a Q8_0 block in the file: an f16 scale and 32 signed values.
const BLOCK_BYTES: usize = 34;

/// A Q8_0 matrix in the sixteen-row layout (see the module).
pub struct Q8Lanes {
    blocks: usize,
    /// Per group and block, the sixteen rows' scales.
    scales: Vec<half::f16>,
    /// Per group and block, [`LINES`] lines of values.
    values: Vec<Line>,
}

impl Q8Lanes {
    /// Interleaves row-major Q8_0 blocks (`rows` rows of `cols / 32` blocks each).
    pub fn new(raw: &[u8], rows: usize, cols: usize) -> Self {
        let blocks = cols / 32;
        assert_eq!(raw.len(), rows * blocks * BLOCK_BYTES);
        let groups = rows.div_ceil(ROWS);
        let mut scales = vec![half::f16::ZERO; groups * blocks * ROWS];
        // Padding rows hold the value 0 (stored as 128) with a zero scale.
        let mut values = vec![Line([0x80; 64]); groups * blocks * LINES];
        for r in 0..rows {
            let (g, lane) = (r / ROWS, r % ROWS);
            for b in 0..blocks {
                let block = &raw[(r * blocks + b) * BLOCK_BYTES..][..BLOCK_BYTES];
                let at = g * blocks + b;
                scales[at * ROWS + lane] = half::f16::from_le_bytes([block[0], block[1]]);
                for q in 0..LINES {
                    for k in 0..4 {
                        values[at * LINES + q].0[4 * lane + k] = block[2 + 4 * q + k] ^ 0x80;
                    }
                }
            }
        }
        Self {
            blocks,
            scales,
            values,
        }
    }

    /// Group `g`'s scales and value lines, block after block.
    fn group(&self, g: usize) -> (&[half::f16], &[Line]) {
        let (s, v) = (self.blocks * ROWS, self.blocks * LINES);
        (
            &self.scales[g * s..(g + 1) * s],
            &self.values[g * v..(g + 1) * v],
        )
    }
}

/// Per block and group of four values of `a`'s first `blocks` blocks, `-128 ·` their sum:
/// where a lane of the kernel starts, so that the weights' offset of 128 cancels.
pub fn lane_starts(a: &Q8Row, blocks: usize) -> Vec<i32> {
    a.qs[..blocks * 32]
        .chunks_exact(4)
        .map(|four| -128 * four.iter().map(|&v| v as i32).sum::<i32>())
        .collect()
}

/// Every row's [`lane_starts`] for one matrix product, computed by the first chunk that
/// needs them and shared by the others.
#[derive(Default)]
pub struct StartsOnce(OnceLock<Vec<Vec<i32>>>);

impl StartsOnce {
    /// The starts of the rows `a` (which must be the rows they were first asked for).
    pub fn get(&self, a: &[Q8Row], blocks: usize) -> &[Vec<i32>] {
        let starts = self
            .0
            .get_or_init(|| a.iter().map(|row| lane_starts(row, blocks)).collect());
        assert!(starts.len() == a.len() && starts.iter().all(|s| s.len() == blocks * 8));
        starts
    }
}

#[cfg(target_arch = "x86_64")]
pub use simd::dot_group;

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{Line, Q8Lanes, LINES, ROWS};
    use crate::quant::q8::Q8Row;
    use crate::quant::simd::prefetch_span;

    /// Group `g`'s sixteen rows against `T` activation rows (`starts`: each one's
    /// [`super::lane_starts`]): `out[t][r]` is row `16g + r` · `a[t]` (zero past the
    /// matrix).
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 (F, VL, BW, VNNI) must be available
    /// ([`crate::quant::simd::vnni_available`]).
    pub unsafe fn dot_group<const T: usize>(
        m: &Q8Lanes,
        g: usize,
        a: [&Q8Row; T],
        starts: [&[i32]; T],
    ) -> [[f32; ROWS]; T] {
        let blocks = m.blocks;
        assert!(a.iter().zip(&starts).all(|(a, s)| a.d.len() >= blocks
            && a.qs.len() >= blocks * 32
            && s.len() >= blocks * 8));
        let (scales, values) = m.group(g);
        group_vnni(scales, values, blocks, a, starts)
    }

    /// [`dot_group`] on a group's scales and lines. Per block: the rows' scales times each
    /// activation row's (one multiplication per activation row), then per line of values
    /// and activation row one integer multiply-add (four activations broadcast), its
    /// conversion, and one fused multiply-add into that line's accumulator.
    // Indexed loops: each line of weights goes to every activation row's accumulator.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl,avx512bw")]
    unsafe fn group_vnni<const T: usize>(
        scales: &[half::f16],
        values: &[Line],
        blocks: usize,
        a: [&Q8Row; T],
        starts: [&[i32]; T],
    ) -> [[f32; ROWS]; T] {
        let ahead = crate::cpu::prefetch_ahead();
        assert!(scales.len() >= blocks * ROWS && values.len() >= blocks * LINES);
        let mut acc = [[_mm512_setzero_ps(); LINES]; T];
        for b in 0..blocks {
            let lines = values.as_ptr().add(b * LINES);
            prefetch_span(lines, LINES * 64, ahead);
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(
                scales.as_ptr().add(b * ROWS) as *const __m256i
            ));
            let scale: [__m512; T] =
                std::array::from_fn(|t| _mm512_mul_ps(d, _mm512_set1_ps(*a[t].d.get_unchecked(b))));
            for q in 0..LINES {
                let w = _mm512_load_si512(lines.add(q) as *const __m512i);
                for t in 0..T {
                    let four = a[t].qs.as_ptr().add(b * 32 + 4 * q) as *const i32;
                    let start = _mm512_set1_epi32(*starts[t].get_unchecked(b * LINES + q));
                    let lane =
                        _mm512_dpbusd_epi32(start, w, _mm512_set1_epi32(four.read_unaligned()));
                    acc[t][q] = _mm512_fmadd_ps(scale[t], _mm512_cvtepi32_ps(lane), acc[t][q]);
                }
            }
        }
        let mut out = [[0f32; ROWS]; T];
        for (out, l) in out.iter_mut().zip(&acc) {
            // hsum_float_8: lanes i and i + 4 first, then (0 + 2) + (1 + 3).
            let even = _mm512_add_ps(_mm512_add_ps(l[0], l[4]), _mm512_add_ps(l[2], l[6]));
            let odd = _mm512_add_ps(_mm512_add_ps(l[1], l[5]), _mm512_add_ps(l[3], l[7]));
            _mm512_storeu_ps(out.as_mut_ptr(), _mm512_add_ps(even, odd));
        }
        out
    }
}

impl Layout for Q8Lanes {
    fn chunk(&self, acts: &Activations, kernels: &[RowKernel], range: Range<usize>, out: &Columns) {
        let Activations::Q8(a, _, starts) = acts else {
            unreachable!("Q8_0 takes Q8 activations");
        };
        #[cfg(target_arch = "x86_64")]
        {
            let starts = starts.get(a, self.blocks);
            // Sixteen weight rows (one per lane) by two activation rows at a time: their
            // sixteen accumulators stay in registers.
            let all: Vec<usize> = (0..kernels.len()).collect();
            lane_groups(out, range, &all, |g, four| {
                let mut got = [[0f32; LANE_ROWS]; 4];
                for (k, two) in four.chunks(2).enumerate() {
                    let row = |i: usize| (&a[two[i]], starts[two[i]].as_slice());
                    // SAFETY: the layout is only built where the CPU has AVX-512 VNNI.
                    let pair = unsafe {
                        match two.len() {
                            2 => {
                                dot_group::<2>(self, g, [row(0).0, row(1).0], [row(0).1, row(1).1])
                            }
                            _ => {
                                let [one] = dot_group::<1>(self, g, [row(0).0], [row(0).1]);
                                [one, [0.0; LANE_ROWS]]
                            }
                        }
                    };
                    got[2 * k..2 * k + two.len()].copy_from_slice(&pair[..two.len()]);
                }
                got
            });
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (a, starts, kernels, range, out);
            unreachable!("the layout is only built where the CPU has AVX-512 VNNI");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dot::BlockFormat;
    use crate::quant::q8::quantize_row;
    use crate::quant::sample::{self, Xorshift};
    use crate::quant::OwnFormat;

    /// Every row of every group, against one and two activation rows, equals the portable
    /// dot product bit for bit, the extreme values (-128 and 127, in weights and
    /// activations) included.
    #[test]
    fn lanes_kernel_is_bit_identical_to_the_portable_one() {
        // Whatever FERRITE_CPU says: this compares the kernel the CPU can run.
        if crate::cpu::lacks(crate::cpu::detected().vnni, "vnni") {
            return;
        }
        let mut rng = Xorshift::new(21);
        let (rows, cols) = (37, 7 * 32);
        let mut raw = sample::weights(OwnFormat::Blocks(BlockFormat::Q8_0), rows, cols, &mut rng);
        // Row 3's values all -128, row 4's all 127.
        let blocks = cols / 32;
        for (r, v) in [(3usize, 0x80u8), (4, 0x7f)] {
            for b in 0..blocks {
                raw[(r * blocks + b) * BLOCK_BYTES + 2..][..32].fill(v);
            }
        }
        let m = Q8Lanes::new(&raw, rows, cols);
        let mut acts: Vec<Q8Row> = (0..3)
            .map(|_| quantize_row(&sample::activations(1, cols, 4.0, &mut rng)))
            .collect();
        // Activation row 2's values all -128 (the quantizer never makes it).
        acts[2].qs.fill(-128);
        let starts: Vec<Vec<i32>> = acts.iter().map(|a| lane_starts(a, blocks)).collect();
        let row_bytes = blocks * BLOCK_BYTES;
        for g in 0..rows.div_ceil(ROWS) {
            for (first, second) in [(0, 1), (2, 0), (1, 2)] {
                // SAFETY: VNNI was checked.
                let got = unsafe {
                    dot_group::<2>(
                        &m,
                        g,
                        [&acts[first], &acts[second]],
                        [&starts[first], &starts[second]],
                    )
                };
                let one = unsafe { dot_group::<1>(&m, g, [&acts[first]], [&starts[first]]) };
                for lane in 0..ROWS {
                    let r = g * ROWS + lane;
                    for (t, &k) in [first, second].iter().enumerate() {
                        let want = match r < rows {
                            true => BlockFormat::Q8_0
                                .dot_portable(&raw[r * row_bytes..][..row_bytes], &acts[k]),
                            false => 0.0,
                        };
                        assert_eq!(want.to_bits(), got[t][lane].to_bits(), "row {r}, act {k}");
                        if t == 0 {
                            assert_eq!(want.to_bits(), one[0][lane].to_bits(), "row {r} alone");
                        }
                    }
                }
            }
        }
    }
}
